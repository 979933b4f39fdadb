// GCC 12 reports -Wnull-dereference inside Asio's scheduler (Boost 1.74).
#pragma GCC diagnostic ignored "-Wnull-dereference"
// hvtrace's libvirt backend against a real libvirtd that each test starts
// for itself (libvirtd_fixture.h), with TCG domains running the 6.12 guest:
// hot-plug a shmem region by name, panic the guest under <on_crash>
// preserve and destroy, survive a libvirtd restart, and the errors people
// meet (unknown domain, no hotplug bus, stale file, denied connection).
#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <boost/asio/thread_pool.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "capture_store.h"
#include "domain_xml.h"
#include "libvirt_attach.h"
#include "libvirt_backend.h"
#include "libvirt_client.h"
#include "libvirtd_fixture.h"
#include "supervisor.h"

namespace hvtrace::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using hostd::LibvirtDomainEvent;

#define LV_SKIP_UNLESS_AVAILABLE()                                       \
  do {                                                                   \
    if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {   \
      GTEST_SKIP() << "private libvirtd cannot run here: " << why;       \
    }                                                                    \
  } while (0)

#define LV_ASSERT_OK(expr)                           \
  do {                                               \
    auto&& _s = (expr);                              \
    ASSERT_TRUE(_s.ok()) << _s.error().message;      \
  } while (0)

constexpr char kMarker[] = "hvtrace-libvirt-e2e-marker";

// Removes /dev/shm files the test created, whatever happens.
struct ShmCleanup {
  std::vector<std::string> paths;
  ~ShmCleanup() {
    for (const auto& p : paths) unlink(p.c_str());
  }
};

std::string ShmName(const std::string& tag) {
  return "hvt-lv-" + tag + "-" + std::to_string(getpid());
}

// Counts ivshmem-plain (1af4:1110) devices the guest's PCI core sees.
Result<int> GuestIvshmemCount(TestDomain& domain) {
  Result<hostd::GuestConsole::CommandResult> r = domain.console().Run(
      "n=0; for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor):$(cat $d/device)\" = "
      "0x1af4:0x1110 ] && n=$((n+1)); done; echo IVSHMEM=$n",
      kCommandTimeout);
  if (!r.ok()) return r.error();
  size_t at = r->output.find("IVSHMEM=");
  if (at == std::string::npos) return Error{"no IVSHMEM= in: " + r->output};
  return std::atoi(r->output.c_str() + at + 8);
}

// The guest's ACPI hotplug handler runs after DEVICE_ADDED (QEMU's side is
// done then); under TCG on a loaded host it can take a while.
Result<int> WaitGuestIvshmemCount(TestDomain& domain, int expected) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (true) {
    Result<int> n = GuestIvshmemCount(domain);
    if (!n.ok() || *n == expected || std::chrono::steady_clock::now() > deadline) return n;
    std::this_thread::sleep_for(200ms);
  }
}

Status WriteMarker(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error{"open " + path + ": " + std::strerror(errno)};
  ssize_t n = pwrite(fd, kMarker, sizeof kMarker, 4096);
  close(fd);
  if (n != static_cast<ssize_t>(sizeof kMarker)) return Error{"short write to " + path};
  return {};
}

std::string ReadFile(const std::filesystem::path& p) { return ReadWhole(p.string()); }

// The daemon side as hvtraced runs it: a supervisor over the backend, with
// its capture store.
struct Served {
  boost::asio::thread_pool pool{2};
  std::string captures_dir;
  std::shared_ptr<hostd::VmSupervisor> supervisor;

  Served(const std::string& dir, const std::string& name,
         std::unique_ptr<hostd::LibvirtDomainBackend> backend)
      : captures_dir(dir + "/captures-" + name) {
    std::filesystem::create_directories(captures_dir);
    supervisor = std::make_shared<hostd::VmSupervisor>(
        name, std::move(backend), pool.get_executor(), hostd::CaptureStore(captures_dir),
        hostd::SupervisorOptions{});
    supervisor->Start();
  }
  ~Served() {
    supervisor->Stop();
    pool.join();
  }
  // Waits for the first committed capture.
  Result<hostd::CaptureEntry> WaitForCapture(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      Result<std::vector<hostd::CaptureEntry>> list = supervisor->ListCaptures();
      if (list.ok() && !list->empty()) return list->front();
      std::this_thread::sleep_for(50ms);
    }
    return Error{"no capture within " + std::to_string(timeout.count()) +
                 " ms; status: " + supervisor->StatusJson().dump()};
  }
};

// Boots a domain, attaches a region by name, and panics the guest; returns
// the capture's manifest. Shared by the preserve and destroy cases.
void AttachAndPanic(const std::string& on_crash, bool restart_libvirtd_first) {
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  const std::string tag = on_crash.substr(0, 4) + (restart_libvirtd_first ? "r" : "");
  Result<std::unique_ptr<PrivateLibvirtd>> daemon = PrivateLibvirtd::Start(tag);
  LV_ASSERT_OK(daemon);
  TestDomain domain(**daemon, tag);
  TestDomainOptions options;
  options.on_crash = on_crash;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;

  hostd::LibvirtClient::Options client_options;
  client_options.uri = (*daemon)->uri();
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(client_options);
  LV_ASSERT_OK(client);

  ShmCleanup cleanup;
  hostd::ShmemAttachRequest req;
  req.domain = domain.name();
  req.shm_name = ShmName(tag);
  req.size_bytes = 4u << 20;
  const std::string shm_path = "/dev/shm/" + req.shm_name;
  cleanup.paths.push_back(shm_path);

  // A leftover from an "earlier run": refused, then replaced on request.
  {
    int fd = open(shm_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "old", 3), 3);
    close(fd);
  }
  Result<hostd::ShmemAttachment> refused = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("stale"));
  EXPECT_THAT(refused.error().message, HasSubstr(shm_path));
  req.replace_stale = true;
  Result<hostd::ShmemAttachment> attached = hostd::AttachShmem(*client, req);
  ASSERT_TRUE(attached.ok()) << attached.error().message << "\n" << domain.Diagnostics();
  EXPECT_THAT(attached->stale_note, HasSubstr("removed stale"));
  EXPECT_EQ(attached->path, shm_path);
  EXPECT_EQ(attached->owner_uid, 0u);  // qemu.conf: user = "root".
  std::printf("[ metric ] libvirt attach (AttachDeviceFlags -> DEVICE_ADDED): %.1f ms\n",
              attached->attach_ms);
  Result<int> seen = WaitGuestIvshmemCount(domain, 1);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 1) << "the guest should see PCI 1af4:1110";
  LV_ASSERT_OK(WriteMarker(shm_path));

  // Attaching the same name again is refused with the reason.
  req.replace_stale = false;
  Result<hostd::ShmemAttachment> twice = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.error().message, HasSubstr("already has a shmem device"));

  // What `adopt DOMAIN` does: the region is found from the domain's XML.
  Result<std::unique_ptr<hostd::LibvirtDomainBackend>> backend =
      hostd::AdoptLibvirtDomain(*client, domain.name());
  LV_ASSERT_OK(backend);
  EXPECT_EQ((*backend)->Describe()["region"]["path"], shm_path);
  EXPECT_EQ((*backend)->Describe()["region"]["size"], 4u << 20);
  std::mutex hook_mu;
  std::optional<hostd::LibvirtPanicRecord> hook_record;
  (*backend)->SetPanicHook([&](const hostd::LibvirtPanicRecord& r) {
    std::lock_guard lock(hook_mu);
    hook_record = r;
    hook_record->region.clear();  // Only the metadata matters here.
  });
  hostd::LibvirtEventWaiter waiter(*client, "");
  Served served((*daemon)->dir(), domain.name(), std::move(*backend));

  if (restart_libvirtd_first) {
    auto t0 = std::chrono::steady_clock::now();
    LV_ASSERT_OK((*daemon)->RestartLibvirtd());
    Result<LibvirtDomainEvent> down = waiter.Wait(
        [](const LibvirtDomainEvent& e) { return e.kind == LibvirtDomainEvent::Kind::kDisconnected; },
        30s, "disconnect");
    LV_ASSERT_OK(down);
    Result<LibvirtDomainEvent> up = waiter.Wait(
        [](const LibvirtDomainEvent& e) { return e.kind == LibvirtDomainEvent::Kind::kReconnected; },
        60s, "reconnect");
    ASSERT_TRUE(up.ok()) << up.error().message << "\n" << (*daemon)->LogTail();
    EXPECT_TRUE((*client)->connected());
    EXPECT_GE((*client)->reconnects(), 1u);
    std::printf("[ metric ] libvirtd restart -> backend reconnected: %.0f ms\n",
                std::chrono::duration<double, std::milli>(up->received - t0).count());
  }

  // Panic the guest.
  LV_ASSERT_OK(domain.console().Send("echo c > /proc/sysrq-trigger\n"));
  Result<LibvirtDomainEvent> panicked = waiter.Wait(
      [](const LibvirtDomainEvent& e) {
        return e.kind == LibvirtDomainEvent::Kind::kLifecycle &&
               e.event == VIR_DOMAIN_EVENT_CRASHED && e.detail == VIR_DOMAIN_EVENT_CRASHED_PANICKED;
      },
      60s, "CRASHED/PANICKED");
  ASSERT_TRUE(panicked.ok()) << panicked.error().message << "\n" << domain.Diagnostics();

  Result<hostd::CaptureEntry> capture = served.WaitForCapture(30s);
  ASSERT_TRUE(capture.ok()) << capture.error().message;
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(capture->dir / "manifest.json"));
  EXPECT_EQ(manifest["trigger"], "panic");
  const nlohmann::json& lv = manifest["extra"]["libvirt"];
  EXPECT_EQ(lv["domain"], domain.name());
  EXPECT_EQ(lv["on_crash"], on_crash);
  EXPECT_EQ(lv["panic"]["copied_in_event_callback"], true);
  EXPECT_EQ(lv["panic"]["outcome"], on_crash == "preserve" ? "preserved" : "destroyed")
      << manifest.dump(2);
  std::printf("[ metric ] on_crash=%s: region copied %.2f ms after CRASHED/PANICKED; state then: %s\n",
              on_crash.c_str(), lv["panic"]["copy_ms_after_event"].get<double>(),
              lv["panic"]["state_at_copy"].get<std::string>().c_str());

  // The capture holds the region's bytes, marker included.
  std::string region = ReadFile(capture->dir / "region.bin");
  ASSERT_EQ(region.size(), 4u << 20);
  EXPECT_EQ(region.compare(4096, sizeof kMarker - 1, kMarker), 0);
  {
    std::lock_guard lock(hook_mu);
    ASSERT_TRUE(hook_record.has_value());
    EXPECT_EQ(hook_record->event, "CRASHED/PANICKED");
  }

  // The region file survives the panic either way.
  struct stat st {};
  ASSERT_EQ(stat(shm_path.c_str(), &st), 0) << shm_path << " is gone after the panic";
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4u << 20);
  if (on_crash == "destroy") {
    Result<LibvirtDomainEvent> stopped = waiter.Wait(
        [](const LibvirtDomainEvent& e) {
          return e.kind == LibvirtDomainEvent::Kind::kLifecycle && e.event == VIR_DOMAIN_EVENT_STOPPED;
        },
        30s, "STOPPED after destroy");
    EXPECT_TRUE(stopped.ok()) << stopped.error().message;
  } else {
    Result<hostd::LibvirtDomainPtr> dom = (*client)->FindDomain(domain.name());
    LV_ASSERT_OK(dom);
    int state = 0, reason = 0;
    ASSERT_EQ(virDomainGetState(dom->get(), &state, &reason, 0), 0);
    // libvirt 9.0 keeps QEMU (stopped by pvpanic) and calls the state
    // "crashed (panicked)".
    EXPECT_EQ(state, VIR_DOMAIN_CRASHED);
    EXPECT_EQ(reason, VIR_DOMAIN_CRASHED_PANICKED);
    EXPECT_EQ(virDomainIsActive(dom->get()), 1);
  }
}

TEST(LibvirtE2e, AttachByNameThenPanicWithOnCrashDestroy) {
  LV_SKIP_UNLESS_AVAILABLE();
  AttachAndPanic("destroy", false);
}

TEST(LibvirtE2e, LibvirtdRestartThenPanicWithOnCrashPreserve) {
  LV_SKIP_UNLESS_AVAILABLE();
  AttachAndPanic("preserve", true);
}

// A domain from `hvtrace domain-xml` (MakeBootBufferDomainXml): the kernel's
// persistent ring buffer lives in the libvirt-made node-1 file from early
// boot; a panic under <on_crash>destroy</on_crash> still yields its events,
// because the backend holds the file open (libvirt deletes it with the
// domain).
TEST(LibvirtE2e, BootRangeDomainPanicCapturesEarlyBootEvents) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> daemon = PrivateLibvirtd::Start("boot");
  LV_ASSERT_OK(daemon);
  TestDomain domain(**daemon, "boot");
  hostd::BootBufferDomainRequest req;
  req.name = domain.name();
  req.kernel = image->kernel;
  req.initrd = image->initrd;
  req.memory_bytes = 512ull << 20;
  req.range_bytes = 16ull << 20;
  req.events = "sched:sched_switch,irq";
  req.on_crash = "destroy";
  req.console_socket = domain.console_socket();
  req.console_log = domain.console_log();
  Result<hostd::BootBufferDomainXml> xml = hostd::MakeBootBufferDomainXml(req);
  LV_ASSERT_OK(xml);
  TestDomainOptions options;
  options.raw_xml = xml->domain_xml;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message << "\n" << xml->domain_xml;

  hostd::LibvirtClient::Options o;
  o.uri = (*daemon)->uri();
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(o);
  LV_ASSERT_OK(client);
  Result<hostd::LibvirtDomainPtr> dom = (*client)->FindDomain(domain.name());
  LV_ASSERT_OK(dom);
  Result<std::string> live = hostd::LibvirtDomainXml(dom->get());
  LV_ASSERT_OK(live);
  Result<hostd::DomainXmlInfo> info = hostd::ParseDomainXml(*live);
  LV_ASSERT_OK(info);
  Result<hostd::LibvirtRegionSpec> region = hostd::FindBootRangeRegion(*info);
  ASSERT_TRUE(region.ok()) << region.error().message;
  EXPECT_EQ(region->size, 16ull << 20);
  EXPECT_EQ(region->offset, 0u);  // The range sits at the start of node 1.
  EXPECT_THAT(region->path.string(), HasSubstr((*daemon)->dir() + "/ram/"));
  EXPECT_THAT(region->path.string(), HasSubstr("ram-node1"));
  std::printf("[ metric ] libvirt boot range file: %s\n", region->path.c_str());

  // The guest sees its instance.
  Result<hostd::GuestConsole::CommandResult> inst =
      domain.console().Run("cat /sys/kernel/tracing/instances/boot_map/buffer_size_kb", kCommandTimeout);
  ASSERT_TRUE(inst.ok()) << inst.error().message;

  Result<std::unique_ptr<hostd::LibvirtDomainBackend>> backend =
      hostd::AdoptLibvirtDomain(*client, domain.name());
  LV_ASSERT_OK(backend);
  EXPECT_EQ((*backend)->Describe()["region"]["kind"], "boot-range");
  EXPECT_EQ((*backend)->Describe()["region"]["path"], region->path.string());
  hostd::LibvirtEventWaiter waiter(*client, "");
  Served served((*daemon)->dir(), domain.name(), std::move(*backend));
  LV_ASSERT_OK(domain.console().Send("echo c > /proc/sysrq-trigger\n"));
  Result<hostd::CaptureEntry> capture = served.WaitForCapture(90s);
  ASSERT_TRUE(capture.ok()) << capture.error().message << "\n" << domain.Diagnostics();
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(capture->dir / "manifest.json"));
  EXPECT_EQ(manifest["trigger"], "panic");
  EXPECT_EQ(manifest["extra"]["libvirt"]["panic"]["outcome"], "destroyed") << manifest.dump(2);
  EXPECT_EQ(manifest["validation"]["reader"], "boot_map") << manifest.dump(2);
  EXPECT_EQ(manifest["validation"]["layout"].get<std::string>().rfind("linux-6.12", 0), 0u)
      << manifest.dump(2);
  uint64_t events = 0;
  for (const auto& cpu : manifest["cpus"]) events += cpu["events"].get<uint64_t>();
  EXPECT_GT(events, 100u) << manifest.dump(2);
  std::printf("[ metric ] boot-range capture after panic+destroy: %llu events over %zu CPUs\n",
              static_cast<unsigned long long>(events), manifest["cpus"].size());
  // libvirt removes the node-1 file with the domain; the capture did not need it.
  Result<LibvirtDomainEvent> stopped = waiter.Wait(
      [](const LibvirtDomainEvent& e) {
        return e.kind == LibvirtDomainEvent::Kind::kLifecycle && e.event == VIR_DOMAIN_EVENT_STOPPED;
      },
      30s, "STOPPED after destroy");
  EXPECT_TRUE(stopped.ok()) << stopped.error().message;
  std::printf("[ metric ] node-1 file after destroy: %s\n",
              std::filesystem::exists(region->path) ? "still there" : "deleted by libvirt");
}

TEST(LibvirtE2e, DetachWaitsForDeviceRemoved) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> daemon = PrivateLibvirtd::Start("det");
  LV_ASSERT_OK(daemon);
  TestDomain domain(**daemon, "det");
  Status created = domain.Create(*image, TestDomainOptions{});
  ASSERT_TRUE(created.ok()) << created.error().message;
  hostd::LibvirtClient::Options o;
  o.uri = (*daemon)->uri();
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(o);
  LV_ASSERT_OK(client);
  ShmCleanup cleanup;
  hostd::ShmemAttachRequest req;
  req.domain = domain.name();
  req.shm_name = ShmName("det");
  cleanup.paths.push_back("/dev/shm/" + req.shm_name);
  Result<hostd::ShmemAttachment> attached = hostd::AttachShmem(*client, req);
  ASSERT_TRUE(attached.ok()) << attached.error().message;
  Result<int> seen = WaitGuestIvshmemCount(domain, 1);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 1);
  auto t0 = std::chrono::steady_clock::now();
  Status detached = hostd::DetachShmem(*client, domain.name(), req.shm_name);
  ASSERT_TRUE(detached.ok()) << detached.error().message;
  std::printf("[ metric ] libvirt detach -> DEVICE_REMOVED: %.1f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  seen = WaitGuestIvshmemCount(domain, 0);
  LV_ASSERT_OK(seen);
  EXPECT_EQ(*seen, 0);
  // libvirt leaves the file; a new attach under the same name calls it stale.
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + req.shm_name));
  Result<hostd::ShmemAttachment> again = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.error().message, HasSubstr("stale"));
  // Detaching what is not there is an error, not a silent success.
  Status twice = hostd::DetachShmem(*client, domain.name(), req.shm_name);
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.error().message, HasSubstr("no device with alias"));
}

TEST(LibvirtE2e, ClearErrors) {
  LV_SKIP_UNLESS_AVAILABLE();
  Result<GuestImage> image = FindGuestImage("6.12");
  LV_ASSERT_OK(image);
  Result<std::unique_ptr<PrivateLibvirtd>> daemon = PrivateLibvirtd::Start("err");
  LV_ASSERT_OK(daemon);
  hostd::LibvirtClient::Options o;
  o.uri = (*daemon)->uri();
  Result<std::shared_ptr<hostd::LibvirtClient>> client = hostd::LibvirtClient::Connect(o);
  LV_ASSERT_OK(client);

  // Unknown domain: the name and the URI are in the message.
  hostd::ShmemAttachRequest req;
  req.domain = "no-such-domain";
  req.shm_name = ShmName("err");
  Result<hostd::ShmemAttachment> r = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("'no-such-domain'"));
  EXPECT_THAT(r.error().message, HasSubstr((*daemon)->socket_path()));
  EXPECT_THAT(r.error().message, HasSubstr("Domain not found"));
  Result<std::unique_ptr<hostd::LibvirtDomainBackend>> b = hostd::LibvirtDomainBackend::Create(
      *client, "00000000-0000-0000-0000-000000000000", hostd::ShmemRegion("/dev/null", 1));
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.error().message, HasSubstr("00000000-0000-0000-0000-000000000000"));

  // q35 without a spare pcie-root-port: refused before touching libvirt's
  // device list (the domain need not even run).
  TestDomain q35(**daemon, "q35");
  TestDomainOptions qo;
  qo.machine = "q35";
  qo.start = false;
  // libvirt 9.0 gives a q35 domain one spare pcie-root-port on its own
  // (verified); a definition with no PCI device behind a port gets none.
  qo.extra_devices = "    <controller type='usb' model='none'/>\n";
  Status defined = q35.Create(*image, qo);
  ASSERT_TRUE(defined.ok()) << defined.error().message;
  req.domain = q35.name();
  r = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("no hot-pluggable PCI bus"));
  EXPECT_THAT(r.error().message, HasSubstr("pcie-root-port"));
  EXPECT_THAT(r.error().message, HasSubstr(q35.name()));

  // An inactive pc domain: refused as not running.
  TestDomain idle(**daemon, "idle");
  TestDomainOptions io;
  io.start = false;
  ASSERT_TRUE(idle.Create(*image, io).ok());
  req.domain = idle.name();
  r = hostd::AttachShmem(*client, req);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("not running"));

  // A socket that does not exist.
  hostd::LibvirtClient::Options bad;
  bad.uri = "qemu:///system?socket=" + (*daemon)->dir() + "/nowhere/sock";
  Result<std::shared_ptr<hostd::LibvirtClient>> c = hostd::LibvirtClient::Connect(bad);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.error().message, HasSubstr((*daemon)->dir() + "/nowhere/sock"));
  EXPECT_THAT(c.error().message, HasSubstr("No such file or directory"));

  // A caller the socket's permissions (0700 root) shut out. setfsuid is per
  // thread, so only this thread loses root's file access.
  std::string denied;
  std::thread([&] {
    setfsgid(65534);
    setfsuid(65534);
    Result<std::shared_ptr<hostd::LibvirtClient>> d = hostd::LibvirtClient::Connect(o);
    denied = d.ok() ? "connected" : d.error().message;
  }).join();
  EXPECT_THAT(denied, HasSubstr((*daemon)->socket_path()));
  EXPECT_THAT(denied, HasSubstr("Permission denied"));
}

}  // namespace
}  // namespace hvtrace::e2e
