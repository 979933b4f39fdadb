// hvtraced's core: the state directory, the control socket, the per-VM
// supervisors, and the threads they run on.
//
// Threads: one I/O thread runs the io_context (socket, signals, QMP sessions);
// a small pool runs everything slow (captures, listing the disk). Control
// commands are answered on the I/O thread only when that is cheap; the rest
// is posted to the pool and answered from there.
//
// Commands (args in parentheses):
//   ping, version, list, status (name), captures (name), shutdown,
//   boot (name, kernel, initrd, append, cpus, memory_mib, trace_size_mib,
//   events, accel), adopt (name, qmp, boot_region), capture (name),
//   stop (name) — the last four in boot_vm.cc; adopt (name, domain) for a
//   libvirt domain and stop of one in daemon_libvirt.cc; attach (name, qmp,
//   size_mib, events, pump_interval_ms, wait_ms), detach (name, timeout_ms),
//   stream (name, format, from) — in attach_vm.cc.
#ifndef HVTRACE_HOSTD_DAEMON_H_
#define HVTRACE_HOSTD_DAEMON_H_

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "boot_vm.h"
#include "capture_store.h"
#include "config.h"
#include "control_server.h"
#include "formats_service.h"
#include "hvtrace/result.h"
#include "qmp_vm.h"
#include "state_dir.h"
#include "supervisor.h"

namespace hvtrace::hostd {

class DaemonLibvirt;

inline constexpr int kControlProtocolVersion = 1;
std::string_view HvtraceVersion();

class Daemon {
 public:
  explicit Daemon(Config config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Prepares the state dir, takes the socket lock (one daemon per socket),
  // registers the VMs found in the state dir, and starts listening.
  Status Start();

  // Serves until SIGTERM/SIGINT or the `shutdown` command, then stops the
  // supervisors and waits for in-flight captures.
  void Run();

  // Thread-safe.
  void RequestShutdown(std::string reason);

  SupervisorRegistry& registry() { return registry_; }
  boost::asio::io_context& io() { return io_; }
  boost::asio::thread_pool& pool() { return pool_; }
  const Config& config() const { return config_; }

  // Creates, registers and starts a supervisor for |name| with |backend|.
  Status AddVm(const std::string& name, std::unique_ptr<VmBackend> backend);

 private:
  void HandleRequest(const Request& request, const PeerCredentials& peer,
                     const std::shared_ptr<Responder>& responder);
  // Finds the VM named by args.name, or fails |responder| and returns null.
  std::shared_ptr<VmSupervisor> VmFromArgs(const Request& request, Responder& responder);
  // boot/adopt/capture/stop (boot_vm.cc); false when |request| is not one.
  bool HandleVmCommand(const Request& request, const std::shared_ptr<Responder>& responder);
  // attach/detach/stream (attach_vm.cc); false when |request| is not one.
  bool HandleAttachCommand(const Request& request, const std::shared_ptr<Responder>& responder);
  // boot: checks on the I/O thread, spawns QEMU on the pool, registers the
  // VM back on the I/O thread and answers from there (boot_vm.cc).
  void StartBoot(const std::string& name, const Request& request, const std::shared_ptr<Responder>& responder);
  // The pool part of boot: checks the backing path, starts QEMU, then posts
  // the registration and the reply back to the I/O thread.
  void LaunchBoot(const std::string& name, const BootRequest& boot, const BootPaths& paths,
                  const VmConfig& vm_config, Accel accel, const std::shared_ptr<Responder>& responder);
  // Registers a QMP VM (booted or adopted) and saves its spec for re-adoption.
  Status RegisterQmpVm(const std::string& name, const QmpVmSpec& spec, std::unique_ptr<Vm> vm);
  // Removes the files a dead daemon-booted QEMU left (never a live one's).
  void RemoveRemnants(const std::string& name);
  // Re-adopts a QMP VM remembered in its state dir whose QEMU still runs
  // (for a VM the daemon booted: the same process, checked by start time).
  void ReadoptVm(const std::string& name);
  void DoShutdown(const std::string& reason);
  void PollStop(std::chrono::steady_clock::time_point deadline);
  SupervisorOptions supervisor_options() const;

  Config config_;
  boost::asio::io_context io_;
  boost::asio::thread_pool pool_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer stop_timer_;
  StateDir state_;
  std::shared_ptr<FormatsService> formats_;  // The formats cache every VM decodes with.
  SupervisorRegistry registry_;
  std::unique_ptr<ControlServer> server_;
  int lock_fd_ = -1;
  HostTime started_;
  bool stopping_ = false;
  // libvirt domains (daemon_libvirt.h); null when config libvirt_uri is empty.
  std::unique_ptr<DaemonLibvirt> libvirt_;
  // Names whose boot or stop is under way on the pool (I/O thread only):
  // another boot/stop of the same name waits for it to finish.
  std::set<std::string, std::less<>> booting_;
  std::set<std::string, std::less<>> stopping_vms_;
};

// hvtraced's main: flags, config, Start, Run. Returns the exit status.
int DaemonMain(int argc, char** argv);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_H_
