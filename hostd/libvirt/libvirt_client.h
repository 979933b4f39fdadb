// A libvirt connection for hvtraced: RAII handles, domain lookup, domain
// events, and reconnection when libvirtd restarts.
//
// LibvirtClient owns one virConnectPtr to |uri| (qemu:///system by default;
// qemu:///system?socket=PATH for a private daemon). It registers, for all
// domains, the lifecycle event (CRASHED/PANICKED, CRASHED/CRASHLOADED,
// STOPPED, SHUTDOWN, ...), REBOOT, DEVICE_ADDED and DEVICE_REMOVED, and hands
// them to subscribers on the libvirt event loop's thread
// (libvirt_event_loop.h). When the connection closes (libvirtd restarted or
// killed, keepalive timeout) subscribers get kDisconnected, the client
// reconnects with exponential backoff, registers its events again and sends
// kReconnected: events that happened while disconnected are lost, so a
// subscriber re-reads the domain's state then.
//
// Errors carry the URI, the domain and libvirt's own message.
#ifndef HVTRACE_HOSTD_LIBVIRT_CLIENT_H_
#define HVTRACE_HOSTD_LIBVIRT_CLIENT_H_

#include <libvirt/libvirt.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct LibvirtConnectCloser {
  void operator()(virConnectPtr conn) const { virConnectClose(conn); }
};
struct LibvirtDomainFreer {
  void operator()(virDomainPtr domain) const { virDomainFree(domain); }
};
using LibvirtConnectPtr = std::unique_ptr<virConnect, LibvirtConnectCloser>;
using LibvirtDomainPtr = std::unique_ptr<virDomain, LibvirtDomainFreer>;

// libvirt's last error on this thread ("no error details" when it has none).
std::string LibvirtLastError();

// "CRASHED/PANICKED", "STOPPED/DESTROYED", ... for a lifecycle event.
std::string LibvirtLifecycleName(int event, int detail);

// Opens |uri| read-write, without events (they need LibvirtClient).
Result<LibvirtConnectPtr> OpenLibvirtConnection(const std::string& uri);

// By name, or by UUID when |name_or_uuid| is one and no domain has that name.
Result<LibvirtDomainPtr> LookupLibvirtDomain(virConnectPtr conn, std::string_view name_or_uuid,
                                             std::string_view uri);

// The domain's live (or inactive) XML description; errors name the domain.
Result<std::string> LibvirtDomainXml(virDomainPtr domain, bool inactive = false);

struct LibvirtDomainEvent {
  enum class Kind {
    kLifecycle,
    kDeviceAdded,
    kDeviceRemoved,
    kReboot,
    kDisconnected,
    kReconnected
  };
  Kind kind = Kind::kLifecycle;
  std::string domain_name;  // Empty for kDisconnected/kReconnected.
  std::string domain_uuid;
  int event = 0;  // virDomainEventType, for kLifecycle.
  int detail = 0;
  std::string device_alias;  // For device events.
  std::string reason;        // For kDisconnected.
  std::chrono::steady_clock::time_point received;
};

class LibvirtClient {
 public:
  struct Options {
    std::string uri = "qemu:///system";
    std::chrono::milliseconds reconnect_min{100};
    std::chrono::milliseconds reconnect_max{2000};
    // libvirt keepalive: a daemon that stops answering is noticed after
    // interval * (count + 1) seconds.
    int keepalive_interval_s = 5;
    unsigned keepalive_count = 3;
  };
  using Listener = std::function<void(const LibvirtDomainEvent&)>;

  // Installs the event loop on a private thread if the daemon did not
  // install it on its own executor first, then connects. Sets SIGPIPE to
  // ignored if it is at its default (libvirt needs that: a write to a
  // restarting libvirtd would kill the process).
  static Result<std::shared_ptr<LibvirtClient>> Connect(Options options);
  ~LibvirtClient();
  LibvirtClient(const LibvirtClient&) = delete;
  LibvirtClient& operator=(const LibvirtClient&) = delete;

  const std::string& uri() const;
  bool connected() const;
  uint64_t reconnects() const;  // Successful reconnections so far.

  // Domain by name or UUID on the current connection.
  Result<LibvirtDomainPtr> FindDomain(std::string_view name_or_uuid) const;

  // |listener| gets every event of the domain with |uuid| (all domains when
  // empty) plus kDisconnected/kReconnected, on the event loop's thread. It
  // must be quick and must not block on another libvirt event.
  int Subscribe(std::string uuid, Listener listener);
  // After it returns the listener is not running and will not run again.
  void Unsubscribe(int id);

  // Stops reconnecting and closes the connection. Idempotent.
  void Close();

  struct Core;

 private:
  explicit LibvirtClient(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

// Collects one domain's events so a caller on another thread can wait for
// them (attach waits for DEVICE_ADDED, tests wait for CRASHED). Never wait
// on the event loop's thread.
class LibvirtEventWaiter {
 public:
  LibvirtEventWaiter(std::shared_ptr<LibvirtClient> client, std::string uuid);
  ~LibvirtEventWaiter();
  LibvirtEventWaiter(const LibvirtEventWaiter&) = delete;
  LibvirtEventWaiter& operator=(const LibvirtEventWaiter&) = delete;

  using Predicate = std::function<bool(const LibvirtDomainEvent&)>;
  // The first event not returned before that satisfies |match|, waiting up
  // to |timeout|. Errors say what was awaited and which events came.
  Result<LibvirtDomainEvent> Wait(const Predicate& match, std::chrono::milliseconds timeout,
                                  std::string_view what);

 private:
  struct State;
  std::shared_ptr<LibvirtClient> client_;
  std::shared_ptr<State> state_;
  int subscription_ = -1;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_CLIENT_H_
