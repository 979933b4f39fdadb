// QmpVmBackend's attach mode against a scripted QMP peer (a fake QEMU on a
// real unix socket): what it asks QEMU, in which order, what it replies,
// what it saves for a restarted daemon, and how it fails. Real QEMUs are
// covered by the attach e2e tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <mutex>
#include <optional>
#include <vector>

#include "hostd/qemu/qmp_scripted_server.h"
#include "qmp_vm.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

struct NullSink : VmEventSink {
  void OnVmEvent(VmEvent) override {}
  void OnVmGone(std::string) override {}
  void OnVmFailure(std::string) override {}
};

// A fake QEMU: answers the attach commands; |machine| picks the board and
// |pci| what query-pci shows; errors per command can be set.
class FakeQemu {
 public:
  std::string machine = "pc-i440fx-7.2-machine";
  json pci = json::array();
  std::map<std::string, std::string> fail;  // command → error desc.
  bool delete_on_device_del = true;

  FakeQemu() : server_([this](int fd, const json& req) { Answer(fd, req); }) {}
  const std::string& path() const { return server_.path(); }
  std::vector<json> Requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }
  std::vector<std::string> Commands() {
    std::vector<std::string> c;
    for (const json& r : Requests()) c.push_back(r["execute"]);
    return c;
  }
  json Last(const std::string& command) {
    for (const json& r : Requests())
      if (r["execute"] == command) return r.value("arguments", json::object());
    return nullptr;
  }
  // QEMU's DEVICE_DELETED, as after the guest let go.
  void DeviceDeleted(const std::string& id) {
    std::lock_guard lock(mu_);
    if (fd_ >= 0) ScriptedServer::Write(fd_, Event(id));
  }

 private:
  static std::string Event(const std::string& id) {
    return json{{"event", "DEVICE_DELETED"},
                {"data", {{"device", id}, {"path", "/machine/peripheral/" + id}}},
                {"timestamp", {{"seconds", 1}, {"microseconds", 2}}}}
               .dump() +
           "\r\n";
  }
  void Answer(int fd, const json& req) {
    const std::string cmd = req.value("execute", "");
    {
      std::lock_guard lock(mu_);
      fd_ = fd;
      requests_.push_back(req);
    }
    if (fail.count(cmd)) {
      ScriptedServer::Write(
          fd, json{{"error", {{"class", "GenericError"}, {"desc", fail[cmd]}}}, {"id", req["id"]}}
                      .dump() +
                  "\r\n");
      return;
    }
    json ret = json::object();
    if (cmd == "query-status") ret = {{"status", "running"}, {"running", true}};
    if (cmd == "qom-get") ret = machine;
    if (cmd == "query-cpus-fast") ret = json::array({json::object(), json::object()});
    if (cmd == "query-pci") ret = pci;
    ScriptedServer::Write(fd, Reply(req, ret.dump()));
    if (cmd == "device_del" && delete_on_device_del) {
      ScriptedServer::Write(fd, Event(req["arguments"]["id"]));
    }
  }

  std::mutex mu_;
  std::vector<json> requests_;
  int fd_ = -1;
  ScriptedServer server_;
};

class QmpVmAttachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hvtrace-qmp-attach-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    options_.region_path = dir_ / "attach-region";
    options_.size_bytes = 1 << 20;
    options_.wait = 0ms;
  }
  void TearDown() override {
    backend_.reset();
    fs::remove_all(dir_);
  }
  void StartBackend(pid_t pid = -1) {
    QmpVmSpec spec;
    spec.qmp_socket = qemu_.path();
    spec.pid = pid;
    backend_ = std::make_unique<QmpVmBackend>(io_.get_executor(), spec, nullptr, dir_);
    backend_->Start(sink_);
  }
  // Runs |call| and the I/O context until the reply comes, as hvtraced
  // sends it (MessageToJson).
  template <class Reply>
  Result<json> Run(const std::function<void(std::function<void(Result<Reply>)>)>& call) {
    std::optional<Result<json>> reply;
    call([&reply](Result<Reply> r) {
      reply = r.ok() ? Result<json>(MessageToJson(*r)) : Result<json>(r.error());
    });
    while (!reply && io_.run_one_for(5s) > 0) {
    }
    if (!reply) return Error{"no reply"};
    return *reply;
  }
  Result<json> Attach() {
    return Run<AttachReply>([this](AttachDone d) { backend_->Attach(options_, std::move(d)); });
  }
  Result<json> Detach() {
    return Run<DetachReply>([this](DetachDone d) { backend_->Detach(2s, std::move(d)); });
  }

  fs::path dir_;
  AttachOptions options_;
  FakeQemu qemu_;
  boost::asio::io_context io_;
  NullSink sink_;
  std::unique_ptr<QmpVmBackend> backend_;
};

// An adopted VM's pid is a client's word: the backend never reads that
// process's memory as the guest's RAM (nor asks QEMU where its RAM is), even
// when the pid is the very process that answers on QMP (here, this one).
TEST_F(QmpVmAttachTest, Malicious_AnAdoptedVmsPidIsNeverReadAsItsGuestRam) {
  StartBackend(::getpid());
  json described;
  for (int i = 0; i < 200 && !described.contains("guest_ram"); ++i) {
    io_.run_for(10ms);
    described = backend_->Describe();
  }
  ASSERT_TRUE(described.contains("guest_ram")) << described.dump(2);
  EXPECT_EQ(described["guest_ram"]["error"], "hvtraced did not start this QEMU");
  EXPECT_EQ(backend_->guest_ram(), nullptr);
  for (const std::string& c : qemu_.Commands()) EXPECT_NE(c, "human-monitor-command");
}

TEST_F(QmpVmAttachTest, OnPcTheRegionIsAFileBackendAndAnIvshmemDevice) {
  StartBackend();
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  const json memdev = qemu_.Last("object-add");
  EXPECT_EQ(memdev["qom-type"], "memory-backend-file");
  EXPECT_EQ(memdev["mem-path"], options_.region_path.string());
  EXPECT_EQ(memdev["size"], options_.size_bytes);
  EXPECT_EQ(memdev["share"], true);
  const json dev = qemu_.Last("device_add");
  EXPECT_EQ(dev["driver"], "ivshmem-plain");
  EXPECT_EQ(dev["memdev"], memdev["id"]);
  EXPECT_FALSE(dev.contains("bus"));
  EXPECT_EQ((*r)["device"]["id"], dev["id"]);
  EXPECT_EQ((*r)["transport"]["kind"], "qmp");
  EXPECT_EQ((*r)["transport"]["machine"], "pc-i440fx-7.2-machine");
  EXPECT_EQ(backend_->live_region()->geometry().max_cpus, 2u);  // query-cpus-fast.
  // A restarted daemon maps it again from the saved spec.
  Result<QmpVmSpec> saved = LoadQmpVmSpec(dir_);
  ASSERT_TRUE(saved.ok()) << saved.error().message;
  EXPECT_EQ(saved->attach_region, options_.region_path.string());
  EXPECT_EQ(saved->attach_device, dev["id"].get<std::string>());
  EXPECT_EQ(saved->attach_memdev, memdev["id"].get<std::string>());
}

TEST_F(QmpVmAttachTest, OnQ35ItNeedsAFreeRootPortWithAWindowForTheBar) {
  qemu_.machine = "pc-q35-7.2-machine";
  auto port = [](const std::string& id, uint64_t window, json children) {
    return json{{"qdev_id", id},
                {"id", {{"vendor", 0x1b36}, {"device", 0x000c}}},
                {"pci_bridge",
                 {{"bus", {{"prefetchable_range", {{"base", 0}, {"limit", window - 1}}}}},
                  {"devices", children}}}};
  };
  qemu_.pci =
      json::array({{{"devices", json::array({port("busy", 1 << 22, json::array({json::object()})),
                                             port("small", 1 << 16, json::array())})}}});
  StartBackend();
  Result<json> refused = Attach();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("no free pcie-root-port"), std::string::npos);
  EXPECT_NE(refused.error().message.find("small window 64K"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("ports in use: 1"), std::string::npos);
  EXPECT_FALSE(fs::exists(options_.region_path));

  qemu_.pci[0]["devices"].push_back(port("hvtrace-rp0", 1 << 21, json::array()));
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(qemu_.Last("device_add")["bus"], "hvtrace-rp0");
  EXPECT_EQ((*r)["device"]["bus"], "hvtrace-rp0");
}

TEST_F(QmpVmAttachTest, AFailedDeviceAddDropsTheBackendAndTheFile) {
  qemu_.fail["device_add"] = "Bus 'pci.0' does not support hotplugging";
  StartBackend();
  Result<json> r = Attach();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not support hotplugging"), std::string::npos);
  EXPECT_FALSE(fs::exists(options_.region_path));
  for (int i = 0; i < 100 && qemu_.Commands().back() != "object-del"; ++i) io_.run_one_for(50ms);
  EXPECT_EQ(qemu_.Commands().back(), "object-del");
}

TEST_F(QmpVmAttachTest, DetachWaitsForDeviceDeletedThenDropsTheBackend) {
  StartBackend();
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::string device = (*r)["device"]["id"];
  Result<json> d = Detach();
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ((*d)["device"], device);
  EXPECT_EQ((*d)["region"]["kept_open"], true);
  EXPECT_FALSE(d->contains("object_del_error"));
  const std::vector<std::string> c = qemu_.Commands();
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[c.size() - 2], "device_del");
  EXPECT_EQ(c.back(), "object-del");
  EXPECT_TRUE(backend_->live_region()->detached());
  Result<QmpVmSpec> saved = LoadQmpVmSpec(dir_);
  ASSERT_TRUE(saved.ok());
  EXPECT_TRUE(saved->attach_region.empty());
}

TEST_F(QmpVmAttachTest, AGuestThatNeverLetsGoTimesOutAndStaysAttached) {
  qemu_.delete_on_device_del = false;
  StartBackend();
  ASSERT_TRUE(Attach().ok());
  Result<json> d = Detach();
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("no DEVICE_DELETED"), std::string::npos) << d.error().message;
  EXPECT_EQ(backend_->AttachStatus()["attached"], true);
}

TEST_F(QmpVmAttachTest, ADeviceDeletedNobodyAskedForDetachesAndDropsTheBackend) {
  StartBackend();
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  qemu_.DeviceDeleted((*r)["device"]["id"]);
  for (int i = 0; i < 100 && qemu_.Commands().back() != "object-del"; ++i) io_.run_one_for(50ms);
  EXPECT_EQ(qemu_.Commands().back(), "object-del");
  EXPECT_EQ(backend_->AttachStatus()["attached"], false);
  EXPECT_TRUE(Attach().ok());  // A new region may come.
}

}  // namespace
}  // namespace hvtrace::hostd
