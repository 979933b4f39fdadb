#include "qmp_attach.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <vector>

#include "qemu_user.h"
#include "units.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kConnectWait = std::chrono::seconds(10);
constexpr auto kCommandTimeout = std::chrono::seconds(5);
// QEMU's ids for a pcie-root-port (Red Hat's PCI vendor, device 0x000c).
constexpr uint64_t kRootPortVendor = 0x1b36;
constexpr uint64_t kRootPortDevice = 0x000c;

// A free pcie-root-port of a q35 VM (query-pci), with the size of its
// 64-bit prefetchable window (0 when the firmware gave it none).
struct RootPort {
  std::string id;
  uint64_t pref_window = 0;
};

uint64_t PrefetchWindow(const json& bridge) {
  const json range = bridge.value("/bus/prefetchable_range"_json_pointer, json::object());
  if (!range.is_object()) return 0;
  const uint64_t base = range.value("base", uint64_t{0});
  const uint64_t limit = range.value("limit", uint64_t{0});
  return limit > base ? limit - base + 1 : 0;
}

void FindRootPorts(const json& devices, std::vector<RootPort>* free_ports, int* busy_ports) {
  if (!devices.is_array()) return;
  for (const json& d : devices) {
    if (!d.is_object() || !d.contains("pci_bridge") || !d["pci_bridge"].is_object()) continue;
    const json& bridge = d["pci_bridge"];
    const json id = d.value("id", json::object());
    const bool root_port = id.is_object() && id.value("vendor", uint64_t{0}) == kRootPortVendor &&
                           id.value("device", uint64_t{0}) == kRootPortDevice;
    const json children = bridge.value("devices", json::array());
    if (root_port && children.is_array() && !children.empty()) {
      ++*busy_ports;
    } else if (root_port) {
      free_ports->push_back({d.value("qdev_id", std::string()), PrefetchWindow(bridge)});
    }
    FindRootPorts(children, free_ports, busy_ports);
  }
}

std::string NoRootPortMessage(const std::string& machine, uint64_t need,
                              const std::vector<RootPort>& ports, int busy) {
  std::string seen;
  for (const RootPort& p : ports) {
    seen += (seen.empty() ? "" : ", ") + (p.id.empty() ? std::string("(no id)") : p.id) +
            " window " + (p.pref_window ? SizeText(p.pref_window) : std::string("none"));
  }
  return "machine " + machine +
         " (q35) has no free pcie-root-port with a 64-bit prefetchable window of " +
         SizeText(need) + " for the region (free ports: " + (seen.empty() ? "none" : seen) +
         "; ports in use: " + std::to_string(busy) +
         "). Start QEMU with a spare port, e.g. -device "
         "pcie-root-port,id=hvtrace-rp0,bus=pcie.0,chassis=9,pref64-reserve=" +
         SizeText(need) + ", or use the pc machine type";
}

}  // namespace

struct QmpRegionTransport::Probing {
  uint64_t size_bytes = 0;
  Then<PlugTarget> done;
  Clock::time_point start = Clock::now();
  PlugTarget target;
  std::string machine;
  std::unique_ptr<boost::asio::steady_timer> timer;
};

QmpRegionTransport::QmpRegionTransport(boost::asio::any_io_executor io, std::string qmp_socket,
                                       std::function<bool()> connected, Remember remember)
    : io_(std::move(io)),
      qmp_socket_(std::move(qmp_socket)),
      connected_(std::move(connected)),
      remember_(std::move(remember)) {}

QmpRegionTransport::~QmpRegionTransport() = default;

void QmpRegionTransport::SetClient(std::shared_ptr<QmpClient> qmp) { qmp_ = std::move(qmp); }

void QmpRegionTransport::Probe(const AttachOptions& options, Then<PlugTarget> done) {
  auto probe = std::make_shared<Probing>();
  probe->size_bytes = options.size_bytes;
  probe->done = std::move(done);
  probe->target.transport = {{"kind", "qmp"}, {"qmp", qmp_socket_}};
  // Who QEMU is now, after any -runas: not the daemon's user means QEMU
  // opens the region file through its group (the daemon keeps the file).
  if (auto creds = ReadProcessCredentials(qemu_pid_); creds && creds->uid != ::geteuid()) {
    probe->target.qemu_group = creds->gid;
    probe->target.transport["qemu_uid"] = creds->uid;
    probe->target.transport["qemu_gid"] = creds->gid;
  }
  probe->timer = std::make_unique<boost::asio::steady_timer>(io_);
  std::weak_ptr<int> life = life_;
  boost::asio::post(io_, [this, life, probe] {
    if (!life.expired()) WhenConnected(probe);
  });
}

void QmpRegionTransport::WhenConnected(std::shared_ptr<Probing> probe) {
  if (qmp_ && connected_()) return CheckMachine(probe);
  if (Clock::now() - probe->start > kConnectWait) {
    return probe->done(Error{"QMP " + qmp_socket_ +
                             " is not connected (is QEMU running, and is no other client holding "
                             "its one QMP connection?)"});
  }
  probe->timer->expires_after(std::chrono::milliseconds(100));
  std::weak_ptr<int> life = life_;
  probe->timer->async_wait([this, life, probe](const boost::system::error_code& ec) {
    if (!ec && !life.expired()) WhenConnected(probe);
  });
}

void QmpRegionTransport::CheckMachine(std::shared_ptr<Probing> probe) {
  // Every QOM object has a "type" property: the machine's names its board
  // (pc-i440fx-7.2-machine, pc-q35-7.2-machine, ...).
  std::weak_ptr<int> life = life_;
  qmp_->AsyncExecute(
      "qom-get", {{"path", "/machine"}, {"property", "type"}}, kCommandTimeout,
      [this, life, probe](Result<json> type) {
        if (life.expired()) return;
        if (!type.ok()) {
          return probe->done(Error{"cannot read the machine type: " + type.error().message});
        }
        probe->machine = type->is_string() ? type->get<std::string>() : type->dump();
        probe->target.transport["machine"] = probe->machine;
        if (probe->machine.find("q35") == std::string::npos) return CountCpus(probe);
        FindRootPort(probe);
      });
}

void QmpRegionTransport::FindRootPort(std::shared_ptr<Probing> probe) {
  std::weak_ptr<int> life = life_;
  qmp_->AsyncExecute(
      "query-pci", json::object(), kCommandTimeout, [this, life, probe](Result<json> pci) {
        if (life.expired()) return;
        if (!pci.ok()) {
          return probe->done(Error{"q35 machine: cannot list PCI devices: " + pci.error().message});
        }
        std::vector<RootPort> ports;
        int busy = 0;
        for (const json& bus : pci->is_array() ? *pci : json::array()) {
          if (bus.is_object()) FindRootPorts(bus.value("devices", json::array()), &ports, &busy);
        }
        for (const RootPort& p : ports) {
          if (!p.id.empty() && p.pref_window >= probe->size_bytes) {
            probe->target.bus = p.id;
            return CountCpus(probe);
          }
        }
        probe->done(Error{NoRootPortMessage(probe->machine, probe->size_bytes, ports, busy)});
      });
}

void QmpRegionTransport::CountCpus(std::shared_ptr<Probing> probe) {
  std::weak_ptr<int> life = life_;
  qmp_->AsyncExecute("query-cpus-fast", json::object(), kCommandTimeout,
                     [life, probe](Result<json> cpus) {
                       if (life.expired()) return;
                       if (cpus.ok() && cpus->is_array() && !cpus->empty())
                         probe->target.cpus = static_cast<uint32_t>(cpus->size());
                       probe->done(std::move(probe->target));
                     });
}

void QmpRegionTransport::Plug(const LiveRegion& region, const PlugTarget& target,
                              Then<PluggedDevice> done) {
  const std::string tag = HexId(region.geometry().region_id).substr(0, 8);
  PluggedDevice device;
  device.id = "hvtrace-ivs-" + tag;
  device.memdev = "hvtrace-mem-" + tag;
  device.bus = target.bus;
  json memdev = {{"qom-type", "memory-backend-file"},
                 {"id", device.memdev},
                 {"mem-path", region.path().string()},
                 {"size", region.size()},
                 {"share", true}};
  std::weak_ptr<int> life = life_;
  const LiveRegion* plugged_region = &region;  // The session holds it until done.
  qmp_->AsyncExecute(
      "object-add", memdev, kCommandTimeout,
      [this, life, device, done, plugged_region](Result<json> added) {
        if (life.expired()) return;
        if (!added.ok())
          return done(Error{"object-add " + device.memdev + ": " + added.error().message});
        json dev = {{"driver", "ivshmem-plain"}, {"memdev", device.memdev}, {"id", device.id}};
        if (!device.bus.empty()) dev["bus"] = device.bus;
        qmp_->AsyncExecute(
            "device_add", dev, kCommandTimeout,
            [this, life, device, done, plugged_region](Result<json> plugged) {
              if (life.expired()) return;
              if (plugged.ok()) {
                remember_(plugged_region, &device);
                return done(device);
              }
              qmp_->AsyncExecute("object-del", {{"id", device.memdev}}, kCommandTimeout,
                                 [](Result<json>) {});
              done(Error{"device_add " + device.id + ": " + plugged.error().message});
            });
      });
}

void QmpRegionTransport::Unplug(const PluggedDevice& device, std::chrono::milliseconds timeout,
                                Then<std::string> done) {
  auto timer = std::make_shared<boost::asio::steady_timer>(io_, timeout);
  {
    std::lock_guard lock(mu_);
    pending_ = PendingUnplug{device.id, std::move(done), timer};
  }
  // Whichever of the three answers first takes the pending unplug.
  auto take = [this](const std::string& id) -> Then<std::string> {
    std::lock_guard lock(mu_);
    if (!pending_ || pending_->device != id) return nullptr;
    Then<std::string> d = std::move(pending_->done);
    pending_->timer->cancel();
    pending_.reset();
    return d;
  };
  std::weak_ptr<int> life = life_;
  const std::string id = device.id;
  timer->async_wait([life, take, id, timeout](const boost::system::error_code& ec) {
    if (ec || life.expired()) return;
    if (Then<std::string> late = take(id)) {
      late(Error{"no DEVICE_DELETED for " + id + " within " + std::to_string(timeout.count()) +
                 " ms: the guest did not release the device (no ACPI PCI hot-plug in the guest?); "
                 "it stays plugged"});
    }
  });
  qmp_->AsyncExecute("device_del", {{"id", id}}, kCommandTimeout, [life, take, id](Result<json> r) {
    if (life.expired() || r.ok()) return;
    if (Then<std::string> failed = take(id))
      failed(Error{"device_del " + id + ": " + r.error().message});
  });
}

void QmpRegionTransport::Unplugged(const PluggedDevice& device) {
  remember_(nullptr, nullptr);
  Then<std::string> done;
  {
    std::lock_guard lock(mu_);
    if (pending_ && pending_->device == device.id) {
      done = std::move(pending_->done);
      pending_->timer->cancel();
      pending_.reset();
    }
  }
  if (!qmp_) return;
  // Only now does QEMU let the backend go ("in use" before DEVICE_DELETED).
  std::weak_ptr<int> life = life_;
  qmp_->AsyncExecute("object-del", {{"id", device.memdev}}, kCommandTimeout,
                     [life, device, done](Result<json> r) {
                       if (life.expired() || !done) return;
                       done(r.ok() ? std::string() : device.memdev + ": " + r.error().message);
                     });
}

}  // namespace hvtrace::hostd
