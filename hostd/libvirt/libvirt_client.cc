#include "libvirt_client.h"

#include <libvirt/virterror.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "libvirt_event_loop.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;

std::string LibvirtLastError() {
  virErrorPtr err = virGetLastError();
  if (err == nullptr || err->message == nullptr) return "no error details from libvirt";
  return err->message;
}

std::string LibvirtLifecycleName(int event, int detail) {
  static const char* const kEvents[] = {"DEFINED",   "UNDEFINED",   "STARTED",
                                        "SUSPENDED", "RESUMED",     "STOPPED",
                                        "SHUTDOWN",  "PMSUSPENDED", "CRASHED"};
  std::string name = event >= 0 && event < static_cast<int>(std::size(kEvents))
                         ? kEvents[event]
                         : "EVENT" + std::to_string(event);
  const char* d = nullptr;
  switch (event) {
    case VIR_DOMAIN_EVENT_CRASHED:
      if (detail == VIR_DOMAIN_EVENT_CRASHED_PANICKED) d = "PANICKED";
      if (detail == VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED) d = "CRASHLOADED";
      break;
    case VIR_DOMAIN_EVENT_STOPPED: {
      static const char* const k[] = {"SHUTDOWN", "DESTROYED", "CRASHED",      "MIGRATED",
                                      "SAVED",    "FAILED",    "FROM_SNAPSHOT"};
      if (detail >= 0 && detail < static_cast<int>(std::size(k))) d = k[detail];
      break;
    }
    case VIR_DOMAIN_EVENT_SHUTDOWN: {
      static const char* const k[] = {"FINISHED", "GUEST", "HOST"};
      if (detail >= 0 && detail < static_cast<int>(std::size(k))) d = k[detail];
      break;
    }
    case VIR_DOMAIN_EVENT_SUSPENDED: {
      static const char* const k[] = {"PAUSED",    "MIGRATED", "IOERROR",
                                      "WATCHDOG",  "RESTORED", "FROM_SNAPSHOT",
                                      "API_ERROR", "POSTCOPY", "POSTCOPY_FAILED"};
      if (detail >= 0 && detail < static_cast<int>(std::size(k))) d = k[detail];
      break;
    }
    case VIR_DOMAIN_EVENT_STARTED: {
      static const char* const k[] = {"BOOTED", "MIGRATED", "RESTORED", "FROM_SNAPSHOT", "WAKEUP"};
      if (detail >= 0 && detail < static_cast<int>(std::size(k))) d = k[detail];
      break;
    }
    case VIR_DOMAIN_EVENT_RESUMED: {
      static const char* const k[] = {"UNPAUSED", "MIGRATED", "FROM_SNAPSHOT", "POSTCOPY",
                                      "POSTCOPY_FAILED"};
      if (detail >= 0 && detail < static_cast<int>(std::size(k))) d = k[detail];
      break;
    }
    default:
      break;
  }
  return name + "/" + (d ? std::string(d) : std::to_string(detail));
}

Result<LibvirtConnectPtr> OpenLibvirtConnection(const std::string& uri) {
  virConnectPtr conn = virConnectOpen(uri.c_str());
  if (conn == nullptr) {
    return Error{"libvirt: cannot connect to '" + uri + "': " + LibvirtLastError()};
  }
  return LibvirtConnectPtr(conn);
}

namespace {

bool LooksLikeUuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    char c = s[i];
    if (dash ? c != '-' : !std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string DomainUuid(virDomainPtr dom) {
  char buf[VIR_UUID_STRING_BUFLEN] = {};
  if (virDomainGetUUIDString(dom, buf) != 0) return {};
  return buf;
}

std::string DomainName(virDomainPtr dom) {
  const char* name = virDomainGetName(dom);
  return name ? name : "";
}

}  // namespace

Result<LibvirtDomainPtr> LookupLibvirtDomain(virConnectPtr conn, std::string_view name_or_uuid,
                                             std::string_view uri) {
  std::string key(name_or_uuid);
  if (key.empty()) return Error{"libvirt: empty domain name"};
  if (virDomainPtr dom = virDomainLookupByName(conn, key.c_str())) return LibvirtDomainPtr(dom);
  std::string by_name_error = LibvirtLastError();
  if (LooksLikeUuid(key)) {
    if (virDomainPtr dom = virDomainLookupByUUIDString(conn, key.c_str())) {
      return LibvirtDomainPtr(dom);
    }
  }
  return Error{"libvirt: no domain named or with UUID '" + key + "' on '" + std::string(uri) +
               "' (" + by_name_error + ")"};
}

Result<std::string> LibvirtDomainXml(virDomainPtr domain, bool inactive) {
  char* xml = virDomainGetXMLDesc(domain, inactive ? VIR_DOMAIN_XML_INACTIVE : 0);
  if (xml == nullptr) {
    return Error{"libvirt: cannot read the XML of domain '" + DomainName(domain) +
                 "': " + LibvirtLastError()};
  }
  std::string out(xml);
  free(xml);
  return out;
}

struct LibvirtClient::Core : std::enable_shared_from_this<Core> {
  Core(Options opts, asio::any_io_executor executor)
      : options(std::move(opts)),
        strand(asio::make_strand(executor)),
        reconnect_timer(strand),
        backoff(options.reconnect_min) {}

  Options options;
  asio::strand<asio::any_io_executor> strand;
  asio::steady_timer reconnect_timer;  // Strand only.
  std::chrono::milliseconds backoff;   // Strand only.

  mutable std::mutex mu;  // Guards conn, callback_ids, closed.
  virConnectPtr conn = nullptr;
  std::vector<int> callback_ids;
  bool closed = false;
  std::atomic<uint64_t> reconnects{0};

  std::mutex subs_mu;
  std::map<int, std::pair<std::string, std::shared_ptr<Listener>>> subs;
  int next_sub = 1;
  // Held while listeners run, so Unsubscribe can wait for a running one.
  // Recursive: a listener may unsubscribe itself.
  std::recursive_mutex dispatch_mu;

  using WeakSelf = std::weak_ptr<Core>;
  static void FreeWeak(void* opaque) { delete static_cast<WeakSelf*>(opaque); }
  static std::shared_ptr<Core> Lock(void* opaque) { return static_cast<WeakSelf*>(opaque)->lock(); }
  void* NewOpaque() { return new WeakSelf(weak_from_this()); }

  static int OnLifecycle(virConnectPtr, virDomainPtr dom, int event, int detail, void* opaque) {
    if (auto self = Lock(opaque)) {
      LibvirtDomainEvent e;
      e.kind = LibvirtDomainEvent::Kind::kLifecycle;
      e.event = event;
      e.detail = detail;
      self->DispatchDomain(dom, std::move(e));
    }
    return 0;
  }
  static void OnReboot(virConnectPtr, virDomainPtr dom, void* opaque) {
    if (auto self = Lock(opaque)) {
      LibvirtDomainEvent e;
      e.kind = LibvirtDomainEvent::Kind::kReboot;
      self->DispatchDomain(dom, std::move(e));
    }
  }
  static void OnDeviceAdded(virConnectPtr, virDomainPtr dom, const char* alias, void* opaque) {
    if (auto self = Lock(opaque)) {
      LibvirtDomainEvent e;
      e.kind = LibvirtDomainEvent::Kind::kDeviceAdded;
      e.device_alias = alias ? alias : "";
      self->DispatchDomain(dom, std::move(e));
    }
  }
  static void OnDeviceRemoved(virConnectPtr, virDomainPtr dom, const char* alias, void* opaque) {
    if (auto self = Lock(opaque)) {
      LibvirtDomainEvent e;
      e.kind = LibvirtDomainEvent::Kind::kDeviceRemoved;
      e.device_alias = alias ? alias : "";
      self->DispatchDomain(dom, std::move(e));
    }
  }
  static void OnClose(virConnectPtr conn, int reason, void* opaque) {
    auto self = Lock(opaque);
    if (!self) return;
    // libvirt holds its own locks here; tear the connection down later.
    asio::post(self->strand, [self, conn, reason] { self->HandleClosed(conn, reason); });
  }

  void DispatchDomain(virDomainPtr dom, LibvirtDomainEvent e) {
    e.received = std::chrono::steady_clock::now();
    e.domain_name = DomainName(dom);
    e.domain_uuid = DomainUuid(dom);
    Dispatch(e);
  }

  void Dispatch(const LibvirtDomainEvent& e) {
    std::vector<std::shared_ptr<Listener>> targets;
    {
      std::lock_guard lock(subs_mu);
      for (auto& [id, sub] : subs) {
        if (sub.first.empty() || e.domain_uuid.empty() || sub.first == e.domain_uuid) {
          targets.push_back(sub.second);
        }
      }
    }
    std::lock_guard dispatching(dispatch_mu);
    for (auto& listener : targets) (*listener)(e);
  }

  // Sets up a fresh connection: keepalive, close callback, domain events.
  // On failure the connection is closed and the error returned.
  Status Attach(virConnectPtr c) {
    std::vector<int> ids;
    auto fail = [&](const std::string& what) -> Status {
      std::string msg = "libvirt: " + what + " on '" + options.uri + "': " + LibvirtLastError();
      for (int id : ids) virConnectDomainEventDeregisterAny(c, id);
      virConnectClose(c);
      return Error{msg};
    };
    if (virConnectSetKeepAlive(c, options.keepalive_interval_s, options.keepalive_count) < 0) {
      return fail("cannot enable keepalive");
    }
    struct Reg {
      int id;
      virConnectDomainEventGenericCallback cb;
      const char* name;
    };
    const Reg regs[] = {
        {VIR_DOMAIN_EVENT_ID_LIFECYCLE, VIR_DOMAIN_EVENT_CALLBACK(&OnLifecycle), "lifecycle"},
        {VIR_DOMAIN_EVENT_ID_REBOOT, VIR_DOMAIN_EVENT_CALLBACK(&OnReboot), "reboot"},
        {VIR_DOMAIN_EVENT_ID_DEVICE_ADDED, VIR_DOMAIN_EVENT_CALLBACK(&OnDeviceAdded),
         "device-added"},
        {VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, VIR_DOMAIN_EVENT_CALLBACK(&OnDeviceRemoved),
         "device-removed"},
    };
    for (const Reg& r : regs) {
      int id = virConnectDomainEventRegisterAny(c, nullptr, r.id, r.cb, NewOpaque(), &FreeWeak);
      if (id < 0) return fail(std::string("cannot register the ") + r.name + " event");
      ids.push_back(id);
    }
    if (virConnectRegisterCloseCallback(c, &OnClose, NewOpaque(), &FreeWeak) < 0) {
      return fail("cannot register the close callback");
    }
    {
      std::lock_guard lock(mu);
      if (!closed) {
        conn = c;
        callback_ids = std::move(ids);
        return {};
      }
    }
    // Close() ran while we connected.
    for (int id : ids) virConnectDomainEventDeregisterAny(c, id);
    virConnectUnregisterCloseCallback(c, &OnClose);
    virConnectClose(c);
    return Error{"libvirt: client for '" + options.uri + "' closed while connecting"};
  }

  // Takes the connection out (under |mu|) and closes it outside the lock.
  void Detach() {
    virConnectPtr c;
    std::vector<int> ids;
    {
      std::lock_guard lock(mu);
      c = std::exchange(conn, nullptr);
      ids = std::move(callback_ids);
      callback_ids.clear();
    }
    if (c == nullptr) return;
    for (int id : ids) virConnectDomainEventDeregisterAny(c, id);
    virConnectUnregisterCloseCallback(c, &OnClose);
    virConnectClose(c);
  }

  // On the strand.
  void HandleClosed(virConnectPtr c, int reason) {
    {
      std::lock_guard lock(mu);
      if (closed || conn != c) return;  // Old connection, or we closed it.
    }
    Detach();
    static const char* const kReasons[] = {"error", "end of file (libvirtd went away)",
                                           "keepalive timeout", "client closed"};
    LibvirtDomainEvent e;
    e.kind = LibvirtDomainEvent::Kind::kDisconnected;
    e.reason = reason >= 0 && reason < 4 ? kReasons[reason] : "reason " + std::to_string(reason);
    e.received = std::chrono::steady_clock::now();
    Dispatch(e);
    backoff = options.reconnect_min;
    ScheduleReconnect();
  }

  // On the strand.
  void ScheduleReconnect() {
    reconnect_timer.expires_after(backoff);
    reconnect_timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->TryReconnect();
    });
  }

  // On the strand.
  void TryReconnect() {
    {
      std::lock_guard lock(mu);
      if (closed || conn != nullptr) return;
    }
    virConnectPtr c = virConnectOpen(options.uri.c_str());
    if (c == nullptr || !Attach(c).ok()) {
      backoff = std::min(backoff * 2, options.reconnect_max);
      ScheduleReconnect();
      return;
    }
    reconnects.fetch_add(1);
    LibvirtDomainEvent e;
    e.kind = LibvirtDomainEvent::Kind::kReconnected;
    e.received = std::chrono::steady_clock::now();
    Dispatch(e);
  }

  bool IsClosed() const {
    std::lock_guard lock(mu);
    return closed;
  }

  void Close() {
    {
      std::lock_guard lock(mu);
      if (closed) return;
      closed = true;
    }
    asio::post(strand, [self = shared_from_this()] { self->reconnect_timer.cancel(); });
    Detach();
  }
};

Result<std::shared_ptr<LibvirtClient>> LibvirtClient::Connect(Options options) {
  // libvirt writes to its socket with plain write(): when libvirtd goes away
  // mid-call the process would die of SIGPIPE (seen here when libvirtd
  // restarts). libvirt asks applications to ignore it; do so unless the
  // program installed a handler of its own.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
  if (!LibvirtEventLoop::installed()) {
    if (Status s = LibvirtEventLoop::EnsureInstalled(); !s.ok()) return s.error();
  }
  auto core = std::make_shared<Core>(std::move(options), LibvirtEventLoop::executor());
  virConnectPtr c = virConnectOpen(core->options.uri.c_str());
  if (c == nullptr) {
    return Error{"libvirt: cannot connect to '" + core->options.uri + "': " + LibvirtLastError()};
  }
  if (Status s = core->Attach(c); !s.ok()) return s.error();
  return std::shared_ptr<LibvirtClient>(new LibvirtClient(std::move(core)));
}

LibvirtClient::~LibvirtClient() { Close(); }

const std::string& LibvirtClient::uri() const { return core_->options.uri; }

bool LibvirtClient::connected() const {
  std::lock_guard lock(core_->mu);
  return core_->conn != nullptr;
}

uint64_t LibvirtClient::reconnects() const { return core_->reconnects.load(); }

Result<LibvirtDomainPtr> LibvirtClient::FindDomain(std::string_view name_or_uuid) const {
  virConnectPtr c;
  {
    std::lock_guard lock(core_->mu);
    if (core_->conn == nullptr) {
      return Error{"libvirt: not connected to '" + core_->options.uri +
                   "' (libvirtd restarting? reconnecting) while looking up domain '" +
                   std::string(name_or_uuid) + "'"};
    }
    c = core_->conn;
    virConnectRef(c);
  }
  LibvirtConnectPtr hold(c);
  return LookupLibvirtDomain(c, name_or_uuid, core_->options.uri);
}

int LibvirtClient::Subscribe(std::string uuid, Listener listener) {
  std::lock_guard lock(core_->subs_mu);
  int id = core_->next_sub++;
  core_->subs.emplace(
      id, std::make_pair(std::move(uuid), std::make_shared<Listener>(std::move(listener))));
  return id;
}

void LibvirtClient::Unsubscribe(int id) {
  {
    std::lock_guard lock(core_->subs_mu);
    core_->subs.erase(id);
  }
  // Wait out a dispatch that may still be calling it.
  std::lock_guard wait(core_->dispatch_mu);
}

void LibvirtClient::Close() { core_->Close(); }

struct LibvirtEventWaiter::State {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<LibvirtDomainEvent> events;
  std::vector<bool> consumed;
};

LibvirtEventWaiter::LibvirtEventWaiter(std::shared_ptr<LibvirtClient> client, std::string uuid)
    : client_(std::move(client)), state_(std::make_shared<State>()) {
  subscription_ =
      client_->Subscribe(std::move(uuid), [state = state_](const LibvirtDomainEvent& e) {
        std::lock_guard lock(state->mu);
        if (state->events.size() >= 4096) return;  // A waiter nobody drains must not grow forever.
        state->events.push_back(e);
        state->consumed.push_back(false);
        state->changed.notify_all();
      });
}

LibvirtEventWaiter::~LibvirtEventWaiter() { client_->Unsubscribe(subscription_); }

static std::string DescribeEvent(const LibvirtDomainEvent& e) {
  switch (e.kind) {
    case LibvirtDomainEvent::Kind::kLifecycle:
      return LibvirtLifecycleName(e.event, e.detail);
    case LibvirtDomainEvent::Kind::kDeviceAdded:
      return "DEVICE_ADDED(" + e.device_alias + ")";
    case LibvirtDomainEvent::Kind::kDeviceRemoved:
      return "DEVICE_REMOVED(" + e.device_alias + ")";
    case LibvirtDomainEvent::Kind::kReboot:
      return "REBOOT";
    case LibvirtDomainEvent::Kind::kDisconnected:
      return "DISCONNECTED(" + e.reason + ")";
    case LibvirtDomainEvent::Kind::kReconnected:
      return "RECONNECTED";
  }
  return "?";
}

Result<LibvirtDomainEvent> LibvirtEventWaiter::Wait(const Predicate& match,
                                                    std::chrono::milliseconds timeout,
                                                    std::string_view what) {
  if (LibvirtEventLoop::OnLoopThread()) {
    return Error{"libvirt: waiting for " + std::string(what) +
                 " on the event loop's own thread would never finish"};
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(state_->mu);
  while (true) {
    for (size_t i = 0; i < state_->events.size(); ++i) {
      if (!state_->consumed[i] && match(state_->events[i])) {
        state_->consumed[i] = true;
        return state_->events[i];
      }
    }
    if (state_->changed.wait_until(lock, deadline) == std::cv_status::timeout) {
      std::string seen;
      for (const auto& e : state_->events) seen += (seen.empty() ? "" : ", ") + DescribeEvent(e);
      return Error{"libvirt: no " + std::string(what) + " within " +
                   std::to_string(timeout.count()) +
                   " ms (events seen: " + (seen.empty() ? "none" : seen) + ")"};
    }
  }
}

}  // namespace hvtrace::hostd
