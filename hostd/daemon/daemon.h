// hvtraced's core: the state directory, the control socket, the per-VM
// supervisors, the capture service, and the threads they run on.
//
// Threads: one I/O thread runs the io_context (socket, signals, QMP sessions,
// libvirt's event loop); a small pool runs everything slow (captures, QEMU
// start-up, libvirt calls, listing the disk). Control commands are answered
// on the I/O thread only when that is cheap; the rest is posted to the pool.
//
// Requests are routed by one command table (commands.cc): one handler per
// command, each reaching the VM through its VmBackend, whatever kind it is.
#ifndef HVTRACE_HOSTD_DAEMON_H_
#define HVTRACE_HOSTD_DAEMON_H_

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "access.h"
#include "boot_request.h"
#include "capture_service.h"
#include "capture_store.h"
#include "config.h"
#include "control_server.h"
#include "formats_service.h"
#include "hvtrace/result.h"
#include "log_watcher.h"
#include "qmp_vm.h"
#include "replies.h"
#include "requests.h"
#include "state_dir.h"
#include "supervisor.h"
#include "uploader.h"

namespace hvtrace::hostd {

class DaemonLibvirt;

inline constexpr int kControlProtocolVersion = 1;
std::string_view HvtraceVersion();
// The effective configuration, as `version` and `hvtraced --check-config` show it.
nlohmann::json ConfigJson(const Config& config);

// The kinds of VM backend hvtraced adopts (VmBackend::kind()).
enum class VmKind { kQmp, kLibvirt };

class Daemon {
 public:
  // Where a reload (SIGHUP) reads the configuration from: the same file and
  // command-line overrides as at start; an error leaves everything as is.
  using ConfigSource = std::function<Result<Config>()>;
  explicit Daemon(Config config, ConfigSource reload_source = {});
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
  // The configuration now in force (a reload replaces it); thread-safe.
  std::shared_ptr<const Config> config() const { return config_.load(); }

  // Re-reads the configuration (SIGHUP): the keys that can change live take
  // effect; the others are logged as needing a restart and keep their value.
  // I/O thread only. Returns the keys that changed.
  std::vector<std::string> Reload();

  // Registers |name| with |backend| in place of whatever had that name (the
  // old supervisor is stopped), loads its kernel's formats and sizes the
  // capture buffers, then starts it. A null |backend| lists |name| offline
  // with its captures (SetOffline).
  Status ReplaceVm(const std::string& name, std::unique_ptr<VmBackend> backend);
  Status SetOffline(const std::string& name) { return ReplaceVm(name, nullptr); }
  // True while a shutdown is under way: long-running work (streams) ends.
  bool stopping() const { return stopping_.load(); }

  // Test seam: faults the capture service injects (capture_service.h).
  // Call before Start.
  void SetCaptureFaults(CaptureFaults faults);

 private:
  // One handler per control command (commands.cc, boot_commands.cc,
  // attach_commands.cc, formats_commands.cc, setup_commands.cc), each taking
  // its typed message (control/requests.h). The command table parses the
  // request's args into that message once (Dispatch) and routes to them.
  using Dispatcher = void (*)(Daemon&, const Request&, const std::shared_ptr<Responder>&);
  // A command's dispatcher and the role it needs (access.h); kNone: no one.
  struct Command {
    Dispatcher dispatch = nullptr;
    Role role = Role::kNone;
  };
  template <class Message, void (Daemon::*Handler)(const Request&, const Message&,
                                                   const std::shared_ptr<Responder>&)>
  static void Dispatch(Daemon& daemon, const Request& request,
                       const std::shared_ptr<Responder>& responder);
  static const std::map<std::string, Command, std::less<>>& CommandTable();
  static const Command* FindCommand(std::string_view cmd);
  static std::string CommandNames();
  using ResponderPtr = std::shared_ptr<Responder>;
  void HandlePing(const Request&, const PingRequest&, const ResponderPtr& responder);
  void HandleVersion(const Request&, const VersionRequest&, const ResponderPtr& responder);
  void HandleList(const Request&, const ListRequest&, const ResponderPtr& responder);
  void HandleStatus(const Request&, const StatusRequest& args, const ResponderPtr& responder);
  void HandleCaptures(const Request&, const CapturesRequest& args, const ResponderPtr& responder);
  void HandleCaptureFiles(const Request& request, const CaptureFilesRequest& args,
                          const ResponderPtr& responder);
  void HandleShutdown(const Request&, const ShutdownRequest&, const ResponderPtr& responder);
  void HandleBoot(const Request& request, const BootRequest& args, const ResponderPtr& responder);
  void HandleAdopt(const Request& request, const AdoptRequest& args, const ResponderPtr& responder);
  void HandleCapture(const Request&, const ManualCaptureRequest& args,
                     const ResponderPtr& responder);
  void HandleStop(const Request&, const StopRequest& args, const ResponderPtr& responder);
  void HandleAttach(const Request& request, const AttachRequest& args,
                    const ResponderPtr& responder);
  void HandleDetach(const Request&, const DetachRequest& args, const ResponderPtr& responder);
  void HandleStream(const Request&, const StreamRequest& args, const ResponderPtr& responder);
  void HandleSetup(const Request&, const SetupRequest& args, const ResponderPtr& responder);
  void HandleFormatsList(const Request&, const FormatsListRequest&, const ResponderPtr& responder);
  void HandleFormatsHarvest(const Request& request, const FormatsHarvestRequest& args,
                            const ResponderPtr& responder);
  // Where formats-harvest copies a client's kernel (0700, emptied at start).
  std::filesystem::path HarvestInputsDir() const;

  void HandleRequest(const Request& request, const PeerCredentials& peer,
                     const std::shared_ptr<Responder>& responder);
  // Finds the VM |name| (validated by its request's Check), or fails
  // |responder| and returns null.
  std::shared_ptr<VmSupervisor> VmNamed(const std::string& name, Responder& responder);
  // The checks before a boot or adopt of |name|: a valid name, nothing of
  // that name under way or live, and (|make_dir|) its state dir made. Fails
  // |responder|. A libvirt adopt makes the dir only once the domain is found.
  bool ReadyForNewVm(const std::string& name, Responder& responder, bool make_dir = true);
  // The pool part of boot: checks the backing path, starts QEMU, then posts
  // the registration and the reply back to the I/O thread.
  void LaunchBoot(const std::string& name, const BootRequest& boot, const BootPaths& paths,
                  const VmConfig& vm_config, Accel accel,
                  const std::shared_ptr<Responder>& responder);
  // Registers a QMP VM (booted or adopted) and saves its spec for re-adoption.
  // |region_fd| >= 0: the region file as the adopting client opened it.
  Status RegisterQmpVm(const std::string& name, QmpVmSpec spec, std::unique_ptr<Vm> vm,
                       int region_fd = -1);
  // A QMP socket a client named (adopt/attach --qmp) must be served by that
  // client's uid or by root, checked on a connection (client_files.h).
  Status CheckQmpPeer(const Request& request, const std::string& socket) const;
  // The backend that adopts |name| for |command| (adopt, attach): the kind
  // on record when hvtraced has served |name| before (RecordedKind), and a
  // request naming the other kind is refused; else what the request names
  // (a QMP socket: a QEMU; none: a libvirt domain).
  Result<VmKind> AdoptKind(const std::string& command, const std::string& name, bool qmp_given);
  // The kind of VM |name| is on record: its backend's, else the record its
  // state dir keeps (a QMP spec or a libvirt domain record); none for a name
  // hvtraced never served, or forgot (`stop`).
  std::optional<VmKind> RecordedKind(const std::string& name);
  // attach on a VM hvtraced does not serve yet: adopts it as |kind| (QMP
  // with args.qmp, or a libvirt domain) on the pool, then |then| on the pool.
  void AdoptForAttach(const Request& request, const AttachRequest& args, VmKind kind,
                      const ResponderPtr& responder, std::function<void()> then);
  // adopt, by kind (boot_commands.cc).
  void AdoptQmp(const Request& request, const AdoptRequest& args, const ResponderPtr& responder);
  void AdoptLibvirt(const AdoptRequest& args, const ResponderPtr& responder);
  // Removes the files a dead daemon-booted QEMU left (never a live one's).
  void RemoveRemnants(const std::string& name);
  // Re-adopts a VM remembered in its state dir, as the kind its record says
  // (RecordedKind): a QMP VM now (ReadoptQmpVm), a libvirt domain once
  // libvirt answers (DaemonLibvirt::QueueReadopt).
  void ReadoptVm(const std::string& name);
  // A QMP VM whose QEMU still runs (for a VM the daemon booted: the same
  // process, checked by start time), or whose region file it left.
  void ReadoptQmpVm(const std::string& name);
  // Finishes the captures an earlier run died in, on the pool; then runs
  // |then| on the I/O thread.
  void RecoverCaptures(const std::vector<std::string>& names, std::function<void()> then);
  void DoShutdown(const std::string& reason);
  // Every second: caps each VM's console.log (console_log_size/_files).
  void ScheduleConsoleRotation();
  // Keeps every VM's region file mapped with its page tables filled as its
  // guest writes it (RegionFile::Warm), on the pool, every few seconds.
  void ScheduleRegionWarming();
  // Every log_watch_interval: each running VM's kernel log looked at for an
  // oops or WARNING (log_watcher.h), on the pool.
  void ScheduleLogWatch();
  // Looks at (*vms)[next] on the pool, then posts the next: one VM per job.
  void WatchLogsFrom(std::shared_ptr<const std::vector<std::shared_ptr<VmSupervisor>>> vms,
                     size_t next, LogWatchSettings settings);
  // Waits (until |deadline|) for streams to end, then FinishShutdown.
  void DrainStreams(std::chrono::steady_clock::time_point deadline);
  // Closes the socket and lets every VM go (vm_on_shutdown), after the
  // captures in flight; then AfterVmsLetGo, on the I/O thread.
  void FinishShutdown();
  void AfterVmsLetGo();
  void PollStop(std::chrono::steady_clock::time_point deadline);
  SupervisorOptions supervisor_options() const;
  // Gives the state dir to the observer group (setgid dirs, so captures
  // written later inherit it): `hvtrace show` works without root.
  void ShareStateDir() const;
  // The file behind the descriptor |key|_fd of |request| (fd_passing.h),
  // checked: a regular file, opened for reading, at most |max_bytes|.
  Result<SharedFd> RequestFile(const Request& request, const std::string& key, uint64_t max_bytes,
                               bool required) const;

  std::atomic<std::shared_ptr<const Config>> config_;
  ConfigSource reload_source_;
  // Waits for the next SIGHUP (I/O thread).
  void WaitForReload();
  // formats-harvest requests queued or running (formats_commands.cc caps them).
  // Declared before the pools: their last callbacks may still count down.
  std::atomic<int> client_harvests_{0};
  boost::asio::io_context io_;
  boost::asio::thread_pool pool_;
  // Loads and harvests of kernel formats: a harvest boots a guest for up to a
  // minute, and on pool_ it would hold a thread an urgent capture may need.
  boost::asio::thread_pool formats_pool_{1};
  boost::asio::signal_set signals_;
  boost::asio::signal_set hup_;  // SIGHUP: Reload.
  boost::asio::steady_timer stop_timer_;
  // Keeps io_ running from FinishShutdown to AfterVmsLetGo (I/O thread).
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      vms_let_go_;
  boost::asio::steady_timer console_timer_;
  boost::asio::steady_timer warm_timer_;
  boost::asio::steady_timer log_watch_timer_;
  std::unique_ptr<LogWatcher> log_watcher_;      // Pool-only (one round at a time).
  std::set<std::string> console_errors_logged_;  // Pool-only (one round at a time).
  StateDir state_;
  std::shared_ptr<FormatsService> formats_;  // The formats cache every VM decodes with.
  std::shared_ptr<CaptureService> captures_;
  std::function<void()> before_upload_queued_;   // CaptureFaults' test seam.
  std::shared_ptr<CaptureBudget> budget_;        // Byte budgets and reserve (capture_budget.h).
  std::shared_ptr<CaptureQueue> capture_queue_;  // Every VM's captures, panics first.
  // The fleet upload (uploader.h); null when upload_endpoint is empty.
  std::unique_ptr<Uploader> uploader_;
  // Starts uploader_ from the configuration: the credentials file is checked
  // (root-only) and read here, so a bad one stops the start with its reason.
  Status StartUploader();
  SupervisorRegistry registry_;
  std::unique_ptr<ControlServer> server_;
  AccessPolicy access_;  // Who may do what (access.h), set by Start.
  int lock_fd_ = -1;
  HostTime started_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_streams_{0};  // `stream` sessions still running.
  // libvirt domains (daemon_libvirt.h); null when config libvirt_uri is empty.
  std::unique_ptr<DaemonLibvirt> libvirt_;
  // Names whose boot or stop is under way on the pool (I/O thread only):
  // another boot/stop of the same name waits for it to finish.
  std::set<std::string, std::less<>> booting_;
  std::set<std::string, std::less<>> stopping_vms_;
};

// hvtraced's main: flags, config, Start, Run. Returns the exit status.
// |faults| is the test seam of tests/tools/ (capture_service.h).
int DaemonMain(int argc, char** argv, CaptureFaults faults = {});

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_H_
