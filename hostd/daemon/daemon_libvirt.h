// hvtraced's libvirt side (issue #6): one LibvirtClient shared by every
// domain the daemon serves, and the control commands for domains served by
// name.
//
// The connection is made in the background: libvirt's event loop runs on the
// daemon's io_context (LibvirtEventLoop::Install), and a libvirtd that is down
// when hvtraced starts is retried with backoff, never fatal (`ping`/`version`
// say `libvirt: {uri, connected, error}`). Once connected, LibvirtClient
// itself reconnects after libvirtd restarts.
//
// The command handlers (commands.cc, boot_commands.cc, attach_commands.cc)
// call Adopt for `adopt NAME [--domain D]` and for `attach NAME` on a domain
// hvtraced does not serve yet; everything else reaches a domain through its
// VmBackend like any VM.
// Served domains are remembered in <state_dir>/vms/NAME/libvirt_vm.json, so
// a restarted daemon re-adopts them as soon as libvirt answers.
#ifndef HVTRACE_HOSTD_DAEMON_LIBVIRT_H_
#define HVTRACE_HOSTD_DAEMON_LIBVIRT_H_

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "control_server.h"
#include "hvtrace/result.h"
#include "libvirt_backend.h"
#include "libvirt_client.h"
#include "replies.h"
#include "state_dir.h"

namespace hvtrace::hostd {

class Daemon;

// What the daemon remembers about a libvirt VM it serves.
struct LibvirtVmRecord {
  std::string domain;  // libvirt's name when adopted.
  std::string uuid;    // Looked up by this on re-adopt (names can change).
  std::string uri;

  nlohmann::json ToJson() const;
  static Result<LibvirtVmRecord> FromJson(const nlohmann::json& j);
};
std::filesystem::path LibvirtVmRecordPath(const std::filesystem::path& vm_dir);
Status SaveLibvirtVmRecord(const std::filesystem::path& vm_dir, const LibvirtVmRecord& record);
Result<LibvirtVmRecord> LoadLibvirtVmRecord(const std::filesystem::path& vm_dir);

class DaemonLibvirt {
 public:
  // |daemon| outlives this object; its config names the URI.
  DaemonLibvirt(Daemon& daemon, StateDir state);
  ~DaemonLibvirt();
  DaemonLibvirt(const DaemonLibvirt&) = delete;
  DaemonLibvirt& operator=(const DaemonLibvirt&) = delete;

  // On the I/O thread: installs libvirt's event loop on the daemon's
  // io_context and starts connecting.
  Status Start();
  // Re-adopts the domain on record as VM |name| (its libvirt_vm.json) once
  // connected, or now (on the pool) if already; any thread.
  void QueueReadopt(const std::string& name);
  // Stops retrying and closes the connection (after the supervisors stopped).
  void Stop();

  // Blocking (libvirt calls): run it on the pool. Serves the running domain
  // |domain| (libvirt name or UUID) as VM |name|, with the region found from
  // its live XML (an hvtrace shmem device, else a boot range made by
  // `hvtrace domain-xml`); with |allow_no_region| a domain without one is
  // served too (attach adds one). Returns the adopt reply.
  Result<AdoptReply> Adopt(const std::string& name, const std::string& domain,
                           bool allow_no_region = false);

  // The connected client, or why there is none (`hvtrace setup`); any thread.
  Result<std::shared_ptr<LibvirtClient>> Connected() const;

  // {uri, connected, error, reconnects}; any thread.
  nlohmann::json StatusJson() const;

 private:
  void TryConnect();
  void ScheduleRetry();
  void OnConnected(std::shared_ptr<LibvirtClient> client);
  std::shared_ptr<LibvirtClient> client() const;
  LibvirtBackendOptions backend_options() const;
  void Readopt(const std::string& name);

  Daemon& daemon_;
  StateDir state_;
  const std::string uri_;
  boost::asio::steady_timer retry_timer_;
  std::chrono::milliseconds retry_delay_{250};

  mutable std::mutex mu_;  // Guards the fields below.
  std::shared_ptr<LibvirtClient> client_;
  std::string last_error_;
  uint64_t connect_attempts_ = 0;
  bool stopping_ = false;
  std::vector<std::string> pending_readopt_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_LIBVIRT_H_
