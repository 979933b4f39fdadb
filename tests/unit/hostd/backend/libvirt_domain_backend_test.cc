// LibvirtDomainBackend against a fake LibvirtDomain (hostd/libvirt/
// libvirt_domain.h): libvirt's events become the supervisor's, a panic is
// noted and described at capture, a reconnect looks at the domain off the
// event loop's thread, and attach/detach go through the one attach session.
// The real libvirt calls are covered by the libvirt e2e tests.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "libvirt_backend.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;
using Kind = LibvirtDomainEvent::Kind;

struct FakeDomain : LibvirtDomain {
  std::string name_ = "fake-dom", uuid_ = "0b6ee4d2-6c6e-4a52-9d3b-6f0c3a1e5d11";
  LibvirtDomainState state{"running", true, false};
  LibvirtClient::Listener listener;
  std::vector<std::string> calls;
  std::vector<std::thread::id> state_threads;
  Result<ShmemAttachment> attach_result = Error{"unset"};
  Status detach_result;
  std::vector<std::string> qemu_args;  // QEMU's command line as libvirt recorded it.
  std::string live_xml;                // What LiveXml returns ("" : an error).
  Result<std::string> LiveXml() const override {
    if (live_xml.empty()) return Error{"no XML"};
    return live_xml;
  }

  const std::string& name() const override { return name_; }
  const std::string& uuid() const override { return uuid_; }
  json Connection() const override {
    return {{"uri", "test:///fake"}, {"connected", true}, {"reconnects", 0}};
  }
  std::string uri() const override { return "test:///fake"; }
  Result<LibvirtDomainState> State() const override {
    const_cast<FakeDomain*>(this)->state_threads.push_back(std::this_thread::get_id());
    return state;
  }
  Result<uint32_t> VcpuCount() const override { return 3u; }
  Result<DomainQemu> Qemu() const override {
    DomainQemu qemu;
    qemu.pid = getpid();
    qemu.uid = geteuid();
    qemu.gid = getegid();
    qemu.args = qemu_args;
    return qemu;
  }
  Status Resume() override { return Call("resume"); }
  Status Destroy() override { return Call("destroy"); }
  Result<ShmemAttachment> AttachShmem(ShmemAttachRequest request) override {
    calls.push_back("attach " + request.shm_name + " " + std::to_string(request.size_bytes));
    return attach_result;
  }
  Status DetachShmem(const std::string& shm_name, std::chrono::milliseconds) override {
    calls.push_back("detach " + shm_name);
    return detach_result;
  }
  int Subscribe(LibvirtClient::Listener l) override {
    listener = std::move(l);
    return 1;
  }
  void Unsubscribe(int) override { listener = nullptr; }

  Status Call(const std::string& what) {
    calls.push_back(what);
    return {};
  }
};

struct RecordingSink : VmEventSink {
  std::mutex mu;
  std::vector<VmEvent> events;
  std::vector<std::string> gone;
  void OnVmEvent(VmEvent e) override {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  }
  void OnVmGone(std::string reason) override {
    std::lock_guard lock(mu);
    gone.push_back(std::move(reason));
  }
  void OnVmFailure(std::string) override {}
  std::vector<std::string> Names() {
    std::lock_guard lock(mu);
    std::vector<std::string> n;
    for (const VmEvent& e : events) n.push_back(e.name);
    return n;
  }
};

LibvirtDomainEvent Lifecycle(int event, int detail) {
  LibvirtDomainEvent e;
  e.kind = Kind::kLifecycle;
  e.event = event;
  e.detail = detail;
  e.received = std::chrono::steady_clock::now();
  return e;
}

LibvirtDomainEvent OfKind(Kind kind, std::string alias = {}) {
  LibvirtDomainEvent e;
  e.kind = kind;
  e.device_alias = std::move(alias);
  e.received = std::chrono::steady_clock::now();
  return e;
}

class LibvirtDomainBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto domain = std::make_unique<FakeDomain>();
    fake_ = domain.get();
    LibvirtBackendOptions options;
    options.blocking = io_.get_executor();
    backend_ = std::make_unique<LibvirtDomainBackend>(
        std::move(domain), LibvirtRegionSpec{"none", {}, 0, 0, std::nullopt, -1}, -1,
        LibvirtDomainFacts{"preserve", "", "", "", false}, options);
  }
  void TearDown() override {
    backend_.reset();
    fs::remove(shm_);
  }
  void Send(const LibvirtDomainEvent& e) {
    ASSERT_TRUE(fake_->listener) << "not subscribed";
    fake_->listener(e);
  }
  // Runs |call| and the I/O context until the reply comes, as hvtraced
  // sends it (MessageToJson).
  template <class Reply>
  Result<json> Run(const std::function<void(std::function<void(Result<Reply>)>)>& call) {
    std::optional<Result<json>> reply;
    call([&reply](Result<Reply> r) {
      reply = r.ok() ? Result<json>(MessageToJson(*r)) : Result<json>(r.error());
    });
    io_.restart();
    while (!reply && io_.run_one_for(5s) > 0) {
    }
    if (!reply) return Error{"no reply"};
    return *reply;
  }
  Result<json> Attach(const fs::path& path) {
    AttachOptions o;
    o.region_path = path;
    o.size_bytes = 1 << 20;
    o.wait = 0ms;
    return Run<AttachReply>([&](AttachDone done) { backend_->Attach(o, std::move(done)); });
  }

  boost::asio::io_context io_;
  FakeDomain* fake_ = nullptr;
  std::unique_ptr<LibvirtDomainBackend> backend_;
  RecordingSink sink_;
  fs::path shm_ = "/dev/shm/hvtrace-unit-" + std::to_string(getpid()) + "-attach";
};

TEST_F(LibvirtDomainBackendTest, APanicIsReportedAndDescribedAtCapture) {
  backend_->Start(sink_);
  Send(Lifecycle(VIR_DOMAIN_EVENT_CRASHED, VIR_DOMAIN_EVENT_CRASHED_PANICKED));
  Send(Lifecycle(VIR_DOMAIN_EVENT_STOPPED, VIR_DOMAIN_EVENT_STOPPED_DESTROYED));
  ASSERT_EQ(sink_.Names(), (std::vector<std::string>{"GUEST_PANICKED"}));
  EXPECT_EQ(sink_.events[0].data["libvirt_event"], "CRASHED/PANICKED");
  ASSERT_EQ(sink_.gone.size(), 1u);
  EXPECT_NE(sink_.gone[0].find("fake-dom"), std::string::npos) << sink_.gone[0];
  fake_->state = {"shut off (destroyed)", false, false};
  Result<CaptureInputs> in = backend_->PrepareCapture();
  ASSERT_TRUE(in.ok()) << in.error().message;
  const json& t = in->transport;
  EXPECT_EQ(t["kind"], "libvirt");
  EXPECT_EQ(t["domain"], "fake-dom");
  EXPECT_EQ(t["on_crash"], "preserve");
  EXPECT_EQ(t["state_at_capture"], "shut off (destroyed)");
  EXPECT_EQ(t["panic"]["event"], "CRASHED/PANICKED");
  EXPECT_EQ(t["panic"]["outcome"], "destroyed");
  EXPECT_EQ(t["panic"]["stopped_event"], "STOPPED/DESTROYED");
  EXPECT_FALSE(in->region_file.has_value());  // Kind "none": attach only.
}

// A node-1 file as libvirt makes one per run, mapped by this process (the
// fake's QEMU pid) so the open's "QEMU maps it" check holds.
struct Node1File {
  fs::path path;
  void* map = MAP_FAILED;
  Node1File(const fs::path& p, char first_byte) : path(p) {
    std::ofstream(path).close();
    fs::resize_file(path, 64u << 20);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    map = mmap(nullptr, 64u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED) static_cast<char*>(map)[0] = first_byte;
  }
  ~Node1File() {
    if (map != MAP_FAILED) munmap(map, 64u << 20);
    fs::remove(path);
  }
  std::string Object(bool share = true) const {
    return json{{"qom-type", "memory-backend-file"},
                {"id", "ram-node1"},
                {"mem-path", path.string()},
                {"share", share},
                {"size", 64u << 20}}
        .dump();
  }
};

char FirstByte(const CaptureInputs& in) {
  char c = 0;
  EXPECT_EQ(pread(in.region_file->file->fd(), &c, 1, static_cast<off_t>(in.region_file->offset)),
            1);
  return c;
}

// Adopted before it starts (the range from its NUMA cell, no file yet), then
// started: this run's node-1 file is found and opened off the event loop.
// A restart switches to the new run's file while a capture handed the old
// one keeps reading it; a run whose file cannot be used leaves no file at
// all, never the last run's.
TEST_F(LibvirtDomainBackendTest, ABootRangeAdoptedBeforeStartIsOpenedForEachRun) {
  const std::string tag = "/tmp/hvt-unit-node1-" + std::to_string(getpid());
  Node1File run1(tag + "-1", 'A'), run2(tag + "-2", 'B');
  ASSERT_NE(run1.map, MAP_FAILED);
  ASSERT_NE(run2.map, MAP_FAILED);
  auto domain = std::make_unique<FakeDomain>();
  FakeDomain* fake = domain.get();
  fake->state = {"shut off", false, false};
  LibvirtRegionSpec range;
  range.kind = "boot-range";
  range.size = 16u << 20;
  range.gpa = 0x1c000000;
  LibvirtBackendOptions options;
  options.blocking = io_.get_executor();
  backend_ = std::make_unique<LibvirtDomainBackend>(
      std::move(domain), range, -1, LibvirtDomainFacts{"preserve", "", "", "", false}, options);
  backend_->Start(sink_);
  // `status` says shut off until it starts (the supervisor's state).
  EXPECT_EQ(sink_.Names(), (std::vector<std::string>{"HVTRACE_FOUND_SHUTOFF"}));
  EXPECT_EQ(backend_->Describe()["region"]["open"], false);
  Result<CaptureInputs> none = backend_->PrepareCapture();
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->region_file.has_value());
  EXPECT_TRUE(none->transport.contains("region_error")) << none->transport.dump(2);

  auto start = [&](const std::string& object) {
    fake->state = {"running", true, false};
    fake->qemu_args = {"qemu-system-x86_64", "-object", object};
    fake->listener(Lifecycle(VIR_DOMAIN_EVENT_STARTED, VIR_DOMAIN_EVENT_STARTED_BOOTED));
    io_.restart();
    io_.run();
  };
  start(run1.Object());
  json d = backend_->Describe();
  EXPECT_EQ(d["region"]["path"], run1.path.string()) << d.dump(2);
  EXPECT_EQ(d["region"]["open"], true);
  EXPECT_EQ(sink_.Names().back(), "HVTRACE_BOOT_RANGE_OPENED");
  Result<CaptureInputs> first = backend_->PrepareCapture();
  ASSERT_TRUE(first.ok() && first->region_file) << d.dump(2);
  EXPECT_EQ(first->region_file->gpa, 0x1c000000u);
  EXPECT_EQ(first->region_file->size, 16u << 20);
  EXPECT_EQ(FirstByte(*first), 'A');

  fake->listener(Lifecycle(VIR_DOMAIN_EVENT_STOPPED, VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN));
  start(run2.Object());
  EXPECT_EQ(backend_->Describe()["region"]["path"], run2.path.string());
  Result<CaptureInputs> second = backend_->PrepareCapture();
  ASSERT_TRUE(second.ok() && second->region_file);
  EXPECT_EQ(FirstByte(*second), 'B');
  EXPECT_EQ(FirstByte(*first), 'A');  // Still open for the capture that holds it.

  // A run whose node 1 is not shared: reported, and no file at all.
  start(run1.Object(/*share=*/false));
  EXPECT_EQ(sink_.Names().back(), "HVTRACE_BOOT_RANGE_ERROR");
  d = backend_->Describe();
  EXPECT_EQ(d["region"]["open"], false);
  EXPECT_NE(d["region"]["error"].get<std::string>().find("share=off"), std::string::npos)
      << d.dump(2);
  Result<CaptureInputs> third = backend_->PrepareCapture();
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->region_file.has_value());
}

// The metadata channel's socket: libvirt names one per run, so a domain
// adopted before it starts has none until it starts, and each run's is read
// from the live XML; the function the receiver holds sees the change and
// outlives the backend.
TEST_F(LibvirtDomainBackendTest, TheMetaChannelSocketIsReadForEachRun) {
  const std::string tag = "/tmp/hvt-unit-meta-node1-" + std::to_string(getpid());
  Node1File run1(tag + "-1", 'A'), run2(tag + "-2", 'B');
  ASSERT_NE(run1.map, MAP_FAILED);
  auto domain = std::make_unique<FakeDomain>();
  FakeDomain* fake = domain.get();
  fake->state = {"shut off", false, false};
  LibvirtRegionSpec range;
  range.kind = "boot-range";
  range.size = 16u << 20;
  range.gpa = 0x1c000000;
  LibvirtBackendOptions options;
  options.blocking = io_.get_executor();
  backend_ = std::make_unique<LibvirtDomainBackend>(
      std::move(domain), range, -1, LibvirtDomainFacts{"preserve", "", "", "", true}, options);
  backend_->Start(sink_);
  std::function<MetaSocketTarget()> target = backend_->meta_socket();
  ASSERT_TRUE(target);
  EXPECT_EQ(target().path, "");
  // Through QEMU's root (its mount namespace), and only QEMU may hold it.
  const std::string root = "/proc/" + std::to_string(getpid()) + "/root";
  auto socket = [&] {
    const MetaSocketTarget t = target();
    EXPECT_EQ(t.peer_pid, getpid());
    return t.path;
  };
  const auto xml = [](const std::string& path) {
    return "<domain type='qemu' id='4'><name>fake-dom</name><devices><channel type='unix'>"
           "<source mode='bind' path='" +
           path +
           "'/><target type='virtio' "
           "name='org.hvtrace.agent.0'/></channel></devices></domain>";
  };
  auto start = [&](const std::string& object, const std::string& path) {
    fake->state = {"running", true, false};
    fake->qemu_args = {"qemu-system-x86_64", "-object", object};
    fake->live_xml = xml(path);
    fake->listener(Lifecycle(VIR_DOMAIN_EVENT_STARTED, VIR_DOMAIN_EVENT_STARTED_BOOTED));
    io_.restart();
    io_.run();
  };
  start(run1.Object(), "/run/libvirt/qemu/channel/4-fake-dom/org.hvtrace.agent.0");
  EXPECT_EQ(socket(), root + "/run/libvirt/qemu/channel/4-fake-dom/org.hvtrace.agent.0");
  fake->listener(Lifecycle(VIR_DOMAIN_EVENT_STOPPED, VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN));
  start(run2.Object(), "/run/libvirt/qemu/channel/5-fake-dom/org.hvtrace.agent.0");
  EXPECT_EQ(socket(), root + "/run/libvirt/qemu/channel/5-fake-dom/org.hvtrace.agent.0");
  // Memory reads go to the domain (the fake has none: an error, never a crash).
  GuestMemoryReader read = backend_->guest_memory_reader();
  ASSERT_TRUE(read);
  EXPECT_FALSE(read(0xffffffff82000000ull, 4096).ok());
  backend_.reset();
  EXPECT_EQ(socket(), root + "/run/libvirt/qemu/channel/5-fake-dom/org.hvtrace.agent.0");
  // A domain without the channel has no receiver at all.
  LibvirtBackendOptions plain;
  plain.blocking = io_.get_executor();
  LibvirtDomainBackend none(std::make_unique<FakeDomain>(), LibvirtRegionSpec{}, -1,
                            LibvirtDomainFacts{"preserve", "", "", "", false}, plain);
  EXPECT_FALSE(none.meta_socket());
}

TEST_F(LibvirtDomainBackendTest, ADomainFoundCrashedAtStartIsReported) {
  fake_->state = {"paused (crashed)", true, true};
  backend_->Start(sink_);
  ASSERT_EQ(sink_.Names(), (std::vector<std::string>{"HVTRACE_FOUND_PANICKED"}));
  EXPECT_EQ(sink_.events[0].data["libvirt_state"], "paused (crashed)");
}

TEST_F(LibvirtDomainBackendTest, AfterAReconnectTheDomainIsReadOffTheEventLoop) {
  backend_->Start(sink_);
  const size_t reads_at_start = fake_->state_threads.size();
  fake_->state = {"paused (crashed)", true, true};
  Send(OfKind(Kind::kDisconnected));
  Send(OfKind(Kind::kReconnected));
  // The event loop's thread (here: this one) only posts the look.
  EXPECT_EQ(fake_->state_threads.size(), reads_at_start);
  EXPECT_EQ(sink_.Names(),
            (std::vector<std::string>{"LIBVIRT_DISCONNECTED", "LIBVIRT_RECONNECTED"}));
  io_.run();
  EXPECT_EQ(fake_->state_threads.size(), reads_at_start + 1);
  EXPECT_EQ(sink_.Names().back(), "GUEST_PANICKED");
  EXPECT_EQ(backend_->Describe()["disconnects"], 1);
}

TEST_F(LibvirtDomainBackendTest, ADomainGoneWhileLibvirtdWasAwayIsReportedGone) {
  backend_->Start(sink_);
  fake_->state = {"shut off (destroyed)", false, false};
  Send(OfKind(Kind::kReconnected));
  io_.run();
  ASSERT_EQ(sink_.gone.size(), 1u);
  EXPECT_NE(sink_.gone[0].find("while libvirtd was away"), std::string::npos) << sink_.gone[0];
}

TEST_F(LibvirtDomainBackendTest, PanicPolicyActsOnlyOnARunningDomain) {
  backend_->ApplyPanicPolicy(PanicPolicy::kPause);
  backend_->ApplyPanicPolicy(PanicPolicy::kResume);
  backend_->ApplyPanicPolicy(PanicPolicy::kQuit);
  fake_->state = {"shut off (destroyed)", false, false};
  backend_->ApplyPanicPolicy(PanicPolicy::kResume);
  EXPECT_EQ(fake_->calls, (std::vector<std::string>{"resume", "destroy"}));
}

TEST_F(LibvirtDomainBackendTest, AttachPlugsAShmemAndTheGuestEjectingItDetaches) {
  backend_->Start(sink_);
  ShmemAttachment plugged;
  plugged.alias = "ua-hvtrace-" + shm_.filename().string();
  plugged.attach_ms = 12.5;
  plugged.owner_uid = geteuid();
  fake_->attach_result = plugged;
  Result<json> r = Attach(shm_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(fake_->calls.at(0), "attach " + shm_.filename().string() + " 1048576");
  EXPECT_EQ((*r)["device"]["id"], plugged.alias);
  EXPECT_EQ((*r)["device"]["memdev"], "shmem " + shm_.filename().string());
  EXPECT_EQ((*r)["transport"]["kind"], "libvirt");
  EXPECT_EQ((*r)["transport"]["domain"], "fake-dom");
  EXPECT_EQ((*r)["transport"]["device_added_ms"], 12.5);
  ASSERT_NE(backend_->live_region(), nullptr);
  EXPECT_EQ(backend_->live_region()->geometry().max_cpus, 3u);  // VcpuCount.
  EXPECT_EQ(backend_->AttachStatus()["attached"], true);

  Send(OfKind(Kind::kDeviceRemoved, plugged.alias));
  EXPECT_EQ(sink_.Names().back(), "DEVICE_DELETED");
  EXPECT_EQ(backend_->AttachStatus()["attached"], false);
  EXPECT_TRUE(backend_->live_region()->detached());
}

TEST_F(LibvirtDomainBackendTest, AttachRefusesAPathOutsideDevShm) {
  Result<json> r = Attach(fs::temp_directory_path() / "not-shm");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("must be a valid name in /dev/shm"), std::string::npos);
  EXPECT_TRUE(fake_->calls.empty());
}

// libvirt's <shmem> must live in world-writable /dev/shm: a local user who
// creates the region's name first (a file, or a symlink to a file they want
// the root daemon to write) gets a clear refusal, and their file is left
// untouched; nothing is plugged. A stale region of the daemon's own is
// replaced by a fresh 0600 file.
TEST_F(LibvirtDomainBackendTest, Malicious_AttachRefusesANamePlantedInDevShm) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to plant a file as another user";
  struct Cleanup {
    fs::path a, b;
    ~Cleanup() {
      ::unlink(a.c_str());
      ::unlink(b.c_str());
    }
  } cleanup{shm_, fs::path(shm_.string() + "-target")};
  backend_->Start(sink_);
  std::ofstream(shm_) << "theirs";
  ASSERT_EQ(::chown(shm_.c_str(), 65534, 65534), 0);
  Result<json> r = Attach(shm_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("is not this daemon's"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("owned by uid 65534"), std::string::npos) << r.error().message;
  EXPECT_EQ(test_support::ReadText(shm_), "theirs");
  ::unlink(shm_.c_str());

  std::ofstream(cleanup.b) << "target";
  fs::create_symlink(cleanup.b, shm_);
  ASSERT_EQ(::lchown(shm_.c_str(), 65534, 65534), 0);
  r = Attach(shm_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("a symlink"), std::string::npos) << r.error().message;
  EXPECT_EQ(test_support::ReadText(cleanup.b), "target");
  EXPECT_TRUE(fake_->calls.empty());
  ::unlink(shm_.c_str());

  // The daemon's own stale file: replaced, 0600.
  std::ofstream(shm_) << "stale";
  ShmemAttachment plugged;
  plugged.alias = "ua-hvtrace-" + shm_.filename().string();
  fake_->attach_result = plugged;
  r = Attach(shm_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  struct stat st {};
  ASSERT_EQ(::stat(shm_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, 1 << 20);
}

TEST_F(LibvirtDomainBackendTest, DetachWaitsForLibvirtAndSaysWhyItFailed) {
  ShmemAttachment plugged;
  plugged.alias = "ua-hvtrace-" + shm_.filename().string();
  fake_->attach_result = plugged;
  ASSERT_TRUE(Attach(shm_).ok());
  fake_->detach_result = Error{"no DEVICE_REMOVED within 10000 ms"};
  Result<json> failed = Run<DetachReply>([&](DetachDone d) { backend_->Detach(1s, std::move(d)); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().message, "no DEVICE_REMOVED within 10000 ms");
  EXPECT_EQ(backend_->AttachStatus()["attached"], true);
  fake_->detach_result = {};
  Result<json> ok = Run<DetachReply>([&](DetachDone d) { backend_->Detach(1s, std::move(d)); });
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ((*ok)["device"], plugged.alias);
  EXPECT_EQ(fake_->calls.back(), "detach " + shm_.filename().string());
}

}  // namespace
}  // namespace hvtrace::hostd
