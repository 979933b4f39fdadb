// The metadata receiver against a test that plays QEMU: it listens on the
// chardev's unix socket, the receiver connects, and the test sends good and
// lying frames, drops the connection and accepts the reconnect.
#include "meta_receiver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "hostd/meta/meta_fixture.h"
#include "hvtrace/meta_leaving.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::MetaBootMembers;
using test_support::TestBootId;
using test_support::UstarArchive;
using ::testing::HasSubstr;

// A kernel .notes with |hex| as its GNU build id.
std::vector<std::byte> NotesWithBuildId(const std::string& hex) {
  std::string desc;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    desc += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  const uint32_t h[3] = {4, static_cast<uint32_t>(desc.size()), 3};
  std::string notes(reinterpret_cast<const char*>(h), 12);
  notes += std::string("GNU\0", 4) + desc;
  notes.resize(4096, '\0');
  const auto* b = reinterpret_cast<const std::byte*>(notes.data());
  return {b, b + notes.size()};
}

class MetaReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvtrace-meta-recv-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    socket_path_ = root_ / "meta.sock";
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listener_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(listener_, 4), 0);
    io_thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (receiver_) receiver_->Stop();
    if (conn_ >= 0) ::close(conn_);
    guard_.reset();
    io_thread_.join();
    pool_.join();
    ::close(listener_);
    fs::remove_all(root_);
  }

  void StartReceiver(std::function<Result<std::vector<std::byte>>(uint64_t, size_t)> read = nullptr,
                     pid_t qemu_pid = getpid()) {
    MetaReceiverOptions o;
    o.vm = "vm1";
    o.socket = [path = socket_path_.string(), qemu_pid] {
      return MetaSocketTarget{path, qemu_pid};
    };
    o.meta_dir = root_ / "vms" / "vm1" / "meta";
    o.min_backoff = std::chrono::milliseconds(20);
    o.max_backoff = std::chrono::milliseconds(200);
    o.read_guest_memory = std::move(read);
    o.leaving = leaving_;
    o.log = [this](LogLevel, const std::string& m) {
      std::lock_guard lock(log_mu_);
      log_ += m + "\n";
    };
    receiver_ = MetaReceiver::Create(io_.get_executor(), pool_.get_executor(), o);
    receiver_->Start();
  }

  // Accepts the receiver's (next) connection, like QEMU's chardev server.
  bool Accept() {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) return false;
    conn_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    return conn_ >= 0;
  }
  void Send(std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(conn_, bytes.data() + done, bytes.size() - done);
      ASSERT_GT(n, 0);
      done += static_cast<size_t>(n);
    }
  }
  void SendFrame(meta::MetaType type, const meta::BootId& id, uint32_t seq,
                 const std::string& payload) {
    Send(meta::EncodeMetaFrame(type, id, seq, payload, true));
  }
  // Waits until the receiver's status satisfies |pred| (bounded; the test
  // fails on the status it saw last).
  json WaitStatus(const std::function<bool(const json&)>& pred) {
    json s;
    for (int i = 0; i < 3000; ++i) {
      receiver_->Drain(std::chrono::seconds(10));
      s = receiver_->Status();
      if (pred(s)) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "status never matched: " << s.dump();
    return s;
  }
  std::string Log() {
    std::lock_guard lock(log_mu_);
    return log_;
  }
  // The receiver's leaving captures are recorded here (call before
  // StartReceiver): how many it asked for, and the ack of the |i|-th.
  void RecordLeaving() {
    leaving_ = [this](std::function<void(bool)> ack) {
      std::lock_guard lock(log_mu_);
      asked_.push_back(std::move(ack));
    };
  }
  size_t Asked() {
    std::lock_guard lock(log_mu_);
    return asked_.size();
  }
  std::function<void(bool)> AskedAck(size_t i) {
    std::lock_guard lock(log_mu_);
    return asked_.at(i);
  }

  fs::path root_, socket_path_;
  int listener_ = -1, conn_ = -1;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_{
      io_.get_executor()};
  boost::asio::thread_pool pool_{2};
  std::thread io_thread_;
  std::shared_ptr<MetaReceiver> receiver_;
  std::function<void(std::function<void(bool)>)> leaving_;  // Set before StartReceiver.
  std::vector<std::function<void(bool)>> asked_;            // Guarded by log_mu_.
  std::mutex log_mu_;
  std::string log_;
};

uint64_t N(const json& s, const char* key) { return s.value(key, uint64_t{0}); }

// What the receiver wrote to the guest: its hellos (counted) and acks.
struct ToGuest {
  size_t hellos = 0;
  std::string hello;  // The last one's payload.
  std::vector<std::pair<meta::MetaFrame, meta::LeaveAck>> acks;
};

// Reads the receiver's end of the socket until |acks| acks (and a hello)
// came, the socket stayed quiet for 300 ms after the first frame, or 10 s
// passed.
ToGuest ReadToGuest(int fd, size_t acks) {
  ToGuest out;
  meta::MetaDecoder d(meta::MetaDirection::kToGuest);
  char buf[4096];
  int quiet = 0;
  for (int i = 0; i < 100 && (out.acks.size() < acks || out.hellos == 0) && quiet < 3; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) {
      if (out.hellos + out.acks.size() != 0) ++quiet;
      continue;
    }
    quiet = 0;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    d.Feed(std::span(reinterpret_cast<const std::byte*>(buf), static_cast<size_t>(n)));
    while (auto f = d.Next()) {
      EXPECT_TRUE(f->ok()) << f->error().message;
      if (!f->ok()) continue;
      if ((*f)->type == meta::MetaType::kHello) {
        EXPECT_TRUE(out.acks.empty()) << "the hello comes first";
        ++out.hellos;
        out.hello = (*f)->payload;
        continue;
      }
      Result<meta::LeaveAck> ack = meta::ParseLeaveAck((*f)->payload);
      EXPECT_TRUE(ack.ok());
      if (ack.ok()) out.acks.emplace_back(std::move(**f), *ack);
    }
  }
  return out;
}

TEST_F(MetaReceiverTest, KeepsGoodBootsRefusesLiesAndReconnects) {
  StartReceiver();
  ASSERT_TRUE(Accept());
  const meta::BootId a = TestBootId(1), liar = TestBootId(2), b = TestBootId(3);
  const std::string good = UstarArchive(MetaBootMembers(test_support::kMetaFixtures, a));
  SendFrame(meta::MetaType::kBoot, a, 0, good);
  SendFrame(meta::MetaType::kComms, a, 1, "1 systemd\n77 hvtrace-agent\n");
  SendFrame(meta::MetaType::kClock, a, 2, R"({"samples": []})");
  // Line noise between frames costs nothing but itself.
  const std::string noise = "garbage garbage garbage";
  Send(std::as_bytes(std::span(noise)));
  auto lying = MetaBootMembers(test_support::kMetaFixtures, liar);
  const std::string field =
      "sched/sched_switch/format:\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;";
  lying["formats"].replace(
      lying["formats"].find(field), field.size(),
      "sched/sched_switch/format:\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:0;");
  SendFrame(meta::MetaType::kBoot, liar, 0, UstarArchive(lying));
  SendFrame(meta::MetaType::kComms, liar, 1, "1 evil\n");

  json s = WaitStatus([](const json& st) {
    return N(st, "boots_accepted") == 1 && N(st, "boots_refused") == 1 && N(st, "dropped") == 1;
  });
  EXPECT_EQ(s["state"], "connected");
  EXPECT_EQ(N(s, "comms_updates"), 1u);
  EXPECT_EQ(N(s, "clock_updates"), 1u);
  EXPECT_THAT(s.value("last_refusal", std::string()),
              HasSubstr("fingerprint of sched/sched_switch does not match its format"));
  EXPECT_THAT(Log(), HasSubstr("VM vm1: meta: refused: boot " + meta::BootIdString(liar)));
  EXPECT_EQ(s["last_boot"]["verified"]["build_id"], "unverified");

  // QEMU goes away (a restart): the receiver comes back, the agent resends
  // its boot, then the guest reboots and a new boot arrives.
  ::close(conn_);
  conn_ = -1;
  ASSERT_TRUE(Accept());
  // Each connection starts with the host's hello: the agent may not have
  // seen the old one go.
  const ToGuest hello = ReadToGuest(conn_, 0);
  EXPECT_EQ(hello.hellos, 1u);
  EXPECT_EQ(hello.hello, "hvtraced");
  SendFrame(meta::MetaType::kBoot, a, 3, good);
  SendFrame(meta::MetaType::kBoot, b, 0,
            UstarArchive(MetaBootMembers(test_support::kMetaFixtures, b)));
  s = WaitStatus([](const json& st) { return N(st, "boots_accepted") == 2; });
  EXPECT_EQ(N(s, "boots_resent"), 1u);
  EXPECT_GE(N(s, "connects"), 2u);

  MetaStore store(root_ / "vms" / "vm1" / "meta");
  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].boot_id, meta::BootIdString(a));
  EXPECT_EQ((*list)[1].boot_id, meta::BootIdString(b));
  Result<std::string> comms = store.LoadComms((*list)[0]);
  ASSERT_TRUE(comms.ok());
  EXPECT_EQ(*comms, "1 systemd\n77 hvtrace-agent\n");
  EXPECT_FALSE(fs::exists(store.dir() / meta::BootIdString(liar)));
}

TEST_F(MetaReceiverTest, ANewerBundleOfTheSameBootReplacesItAndALyingOneDoesNot) {
  StartReceiver();
  ASSERT_TRUE(Accept());
  const meta::BootId a = TestBootId(1);
  auto members = MetaBootMembers(test_support::kMetaFixtures, a);
  SendFrame(meta::MetaType::kBoot, a, 0, UstarArchive(members));
  SendFrame(meta::MetaType::kComms, a, 1, "1 init\n");
  // The guest's set of events changed: a newer archive, sequence 0 again.
  members["printk_formats"] = "0xffffffffc0a01000 : \"hvt_alpha %u\\n\"\n";
  SendFrame(meta::MetaType::kBoot, a, 0, UstarArchive(members));
  json s = WaitStatus([](const json& st) { return N(st, "boots_updated") == 1; });
  EXPECT_EQ(N(s, "boots_accepted"), 1u);
  EXPECT_EQ(N(s, "sequence_gaps"), 0u);
  EXPECT_EQ(s["last_boot"]["updated"], true);
  // A newer archive that lies is refused whole; the boot keeps the last good one.
  auto lying = members;
  lying["fingerprints"] += "sched/nonexistent 1 0000000000000000\n";
  SendFrame(meta::MetaType::kBoot, a, 0, UstarArchive(lying));
  s = WaitStatus([](const json& st) { return N(st, "boots_refused") == 1; });
  EXPECT_EQ(N(s, "boots_updated"), 1u);
  MetaStore store(root_ / "vms" / "vm1" / "meta");
  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].revision, 2u);
  Result<KernelFormats> f = store.LoadFormats((*list)[0]);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->printk_formats, members["printk_formats"]);
}

TEST_F(MetaReceiverTest, Malicious_ASocketNotHeldByTheVmsQemuIsNotRead) {
  // Another process (here: this test, not "QEMU" pid 1) listens on the path.
  StartReceiver(nullptr, 1);
  ASSERT_TRUE(Accept());  // Connected, then dropped before reading a byte.
  json s = WaitStatus([](const json& j) {
    return j.value("last_disconnect", "").find("not QEMU's pid 1") != std::string::npos;
  });
  EXPECT_EQ(N(s, "frames"), 0u) << s.dump();
  EXPECT_EQ(N(s, "connects"), 0u) << s.dump();
  EXPECT_NE(Log().find("not connecting"), std::string::npos) << Log();
}

TEST_F(MetaReceiverTest, Malicious_BuildIdOfAnotherKernel) {
  // Guest memory at __start_notes holds another build id than the bundle claims.
  StartReceiver([](uint64_t addr, size_t size) -> Result<std::vector<std::byte>> {
    if (addr != 0xffffffff82a00000ull || size != 4096) return Error{"unexpected read"};
    return NotesWithBuildId("ffffffffffffffffffffffffffffffffffffffff");
  });
  ASSERT_TRUE(Accept());
  const meta::BootId a = TestBootId(1);
  auto m = MetaBootMembers(test_support::kMetaFixtures, a);
  m["kallsyms"] += "ffffffff82a00000 R __start_notes\n";
  SendFrame(meta::MetaType::kBoot, a, 0, UstarArchive(m));
  json s = WaitStatus([](const json& st) { return N(st, "boots_refused") == 1; });
  EXPECT_THAT(s.value("last_refusal", std::string()),
              HasSubstr("build id " + std::string(test_support::kFixtureBuildId) +
                        " is not the running kernel's (ffffffffffffffffffffffffffffffffffffffff)"));
  EXPECT_EQ(N(s, "boots_accepted"), 0u);
}

std::vector<std::byte> Notice(const meta::BootId& id, uint32_t seq, uint64_t nonce) {
  return meta::EncodeMetaFrame(
      meta::MetaType::kLeaving, id, seq,
      meta::EncodeLeaveNotice({meta::LeaveReason::kStopSignal, 2000, nonce}), false);
}

// The guest says it is leaving: the VM's capture is asked for once, and
// the guest gets its ack (with its nonce and boot) when the copy is durable.
TEST_F(MetaReceiverTest, ALeavingGuestIsAckedOnceTheCopyIsDurable) {
  RecordLeaving();
  StartReceiver();
  ASSERT_TRUE(Accept());
  const meta::BootId a = TestBootId(1);
  Send(Notice(a, 0, 0xfeed));
  WaitStatus([](const json& st) { return N(st, "leaving_notices") == 1; });
  ASSERT_EQ(Asked(), 1u);
  AskedAck(0)(true);
  const ToGuest sent = ReadToGuest(conn_, 1);
  EXPECT_EQ(sent.hellos, 1u);
  const auto& acks = sent.acks;
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].first.boot_id, a);
  EXPECT_EQ(acks[0].second.nonce, 0xfeedu);
  EXPECT_EQ(acks[0].second.status, meta::AckStatus::kCopied);
  json s = WaitStatus([](const json& st) { return N(st, "leaving_acked_copied") == 1; });
  EXPECT_EQ(N(s, "frame_errors"), 0u) << s.dump();
  EXPECT_THAT(Log(), HasSubstr("is leaving its kernel (stop signal, waits up to 2000 ms)"));
}

// A guest announcing its leaving in a loop: one capture is asked for while
// it runs, the notices meanwhile wait for its answer (a bounded few, the
// newest kept), and bad notices are refused by name.
TEST_F(MetaReceiverTest, Malicious_ALeavingFloodAsksForOneCaptureAndAnswersABoundedFew) {
  RecordLeaving();
  StartReceiver();
  ASSERT_TRUE(Accept());
  const meta::BootId a = TestBootId(1);
  constexpr uint32_t kFlood = 1000;
  std::vector<std::byte> stream;
  for (uint32_t i = 0; i < kFlood; ++i) {
    auto f = Notice(a, i, 1000 + i);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  auto bad =
      meta::EncodeMetaFrame(meta::MetaType::kLeaving, a, kFlood, std::string(16, '\xff'), false);
  stream.insert(stream.end(), bad.begin(), bad.end());
  Send(stream);
  json s = WaitStatus([](const json& st) {
    return N(st, "leaving_notices") == kFlood && N(st, "leaving_refused") == 1;
  });
  EXPECT_EQ(N(s, "leaving_coalesced"), kFlood - 1);
  ASSERT_EQ(Asked(), 1u) << "one capture for the whole flood";
  EXPECT_THAT(Log(), HasSubstr("leaving notice version 65535 unknown"));
  AskedAck(0)(false);
  const auto acks = ReadToGuest(conn_, kMaxLeaveWaiters + 1).acks;
  ASSERT_EQ(acks.size(), kMaxLeaveWaiters);
  EXPECT_EQ(acks.front().second.nonce, 1000u);              // The notice that started the capture.
  EXPECT_EQ(acks.back().second.nonce, 1000u + kFlood - 1);  // The newest.
  for (const auto& [frame, a2] : acks) EXPECT_EQ(a2.status, meta::AckStatus::kNotCopied);
  // The next notice starts the next capture.
  Send(Notice(a, kFlood + 1, 7));
  WaitStatus([](const json& st) { return N(st, "leaving_notices") == kFlood + 1; });
  EXPECT_EQ(Asked(), 2u);
}

TEST(MetaVerifyTest, BuildIdFromGuestMemory) {
  const meta::BootId a = TestBootId(1);
  auto m = MetaBootMembers(test_support::kMetaFixtures, a);
  m["kallsyms"] += "ffffffff82a00000 R __start_notes\n";
  Result<MetaBoot> boot = ValidateMetaBoot(a, UstarArchive(m));
  ASSERT_TRUE(boot.ok()) << boot.error().message;
  Result<json> ok = VerifyBuildId(*boot, [](uint64_t, size_t) -> Result<std::vector<std::byte>> {
    return NotesWithBuildId(test_support::kFixtureBuildId);
  });
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)["build_id"], "verified");
  // Memory that cannot be read: kept, but marked unverified.
  Result<json> unread = VerifyBuildId(
      *boot,
      [](uint64_t, size_t) -> Result<std::vector<std::byte>> { return Error{"memsave failed"}; });
  ASSERT_TRUE(unread.ok());
  EXPECT_EQ((*unread)["build_id"], "unverified");
  EXPECT_THAT((*unread)["why"].get<std::string>(), HasSubstr("memsave failed"));
  // Memory with no note where kallsyms says the notes are: refused.
  Result<json> none = VerifyBuildId(*boot, [](uint64_t, size_t) -> Result<std::vector<std::byte>> {
    return std::vector<std::byte>(4096, std::byte{0x5a});
  });
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.error().message, HasSubstr("holds no build id"));
}

}  // namespace
}  // namespace hvtrace::hostd
