// hvtraced configuration: defaults, the config file, and command-line
// overrides.
//
// File format (default /etc/hvtrace/hvtraced.conf): one "key = value" per
// line; '#' starts a comment line; blank lines are ignored; a value may be
// wrapped in double quotes to keep leading/trailing spaces. Unknown keys and
// repeated keys are errors (a typo must not silently fall back to a default).
// Keys and defaults:
//   state_dir           = /var/lib/hvtrace      captures, per-VM state
//   run_dir             = /run/hvtrace          socket and lock file
//   socket              = <run_dir>/hvtraced.sock
//   socket_group        = hvtrace               observers: may connect, list,
//                                               stream and read captures
//                                               (empty: only root and the
//                                               daemon's user)
//   admin_group         = hvtrace-admin         admins: may also boot, adopt,
//                                               attach, capture, stop, shut
//                                               down (root always may)
// A group is a name or a numeric gid.
//   capture_retention   = 20                    captures kept per VM (0: all)
//   capture_bytes_per_vm = 4G                   bytes of captures kept per VM
//                                               (0: no limit)
//   capture_bytes_total = 16G                   bytes of captures of all VMs
//                                               (0: no limit)
//   capture_free_reserve = 256M                 free space a capture leaves on
//                                               the state_dir filesystem
//   console_log_size    = 8M                    a booted guest's console.log
//                                               is rotated at this size …
//   console_log_files   = 2                     … keeping this many files
//                                               (console.log, console.log.1)
// Sizes take ParseSize's units (16M, 1G, 4096). Retention and the budgets go
// by class: a capture of a cheaper trigger (crashloaded, reset, manual, …)
// never evicts a panic capture (panic, panic-while-away, crash); see
// capture_budget.h.
//   guest_capture_interval = 10s                a guest's own triggers
//                                               (crashloaded, reset, oops,
//                                               warn, guest-leaving) start at
//                                               most one capture per interval;
//                                               more meanwhile make one at its
//                                               end (ParseDuration units)
//   log_watch           = oops,warn             what in a running guest's kernel
//                                               log (its boot range, host memory)
//                                               takes a capture without a panic:
//                                               oops (Oops, BUG), warn (WARNING),
//                                               both, or off (log_watch.h); a
//                                               guest trigger, so at most one
//                                               per guest_capture_interval
//   log_watch_interval  = 1s                    how often each range is looked at
//                                               (100ms .. 1h)
//   panic_policy        = pause                 after a panic capture:
//                                               pause | resume | quit
//   vmcore              = off                   off | on-panic: at a panic, a
//                                               kdump-compressed dump of guest
//                                               memory (QEMU dump-guest-memory)
//                                               as the capture's `vmcore`; per
//                                               VM: `hvtrace boot --vmcore`
//   accel               = auto                  for VMs hvtraced boots: tcg |
//                                               kvm | auto (KVM only when a
//                                               probe guest runs at speed)
//   vm_on_shutdown      = keep                  what a daemon exit does to the
//                                               QEMUs it booted: keep (they run
//                                               on; the next hvtraced re-adopts
//                                               them) | stop (quit them)
//   worker_threads      = 2                     pool for copying/decoding
//   max_connections     = 32                    control clients at once
//   max_requests_per_connection = 16            in flight per client
//   libvirt_uri         = qemu:///system        libvirt connection for
//                                               domains served by name
//                                               (empty: libvirt off)
//   libvirt_qemu_log_dir = /var/log/libvirt/qemu where that libvirtd's QEMU
//                                               driver keeps DOMAIN.log: QEMU's
//                                               boot-handshake trace lines of
//                                               a domain `hvtrace setup` set up
//   cache_dir           = (see below)           kernel formats cache root
//                                               (holds formats/<key>/)
//   harvest_initrd      = (see below)           the project's own initramfs
//                                               background harvests boot
//   log_level           = info                  err | warning | notice | info
//                                               | debug (--verbose: debug)
//   qemu_sandbox        = on                    on | off: QEMUs hvtraced boots
//                                               run with -sandbox on,... (their
//                                               seccomp filter)
//   qemu_user           =                       the user QEMUs hvtraced boots
//                                               drop to (-run-with user= or
//                                               -runas); empty: hvtrace-qemu if
//                                               it exists, else root (warned);
//                                               root: root (warned) (qemu_user.h)
//   qemu_binary         = qemu-system-x86_64    the QEMU hvtraced boots (a path,
//                                               or a name looked up in PATH);
//                                               probed for what it supports
//                                               (qemu_caps.h)
// Fleet upload (docs/fleet.md): every committed capture also goes to an
// S3-compatible bucket (Ceph RGW, MinIO, AWS S3), from a persistent queue
// (<state_dir>/upload-queue); the local copy is kept by retention until the
// upload is confirmed.
//   upload_endpoint     =                       http(s)://host[:port] (path-style
//                                               requests); empty: no upload
//   upload_bucket       =                       the bucket (must exist)
//   upload_region       = us-east-1             the SigV4 region (Ceph RGW:
//                                               its zonegroup, "default")
//   upload_credentials  = /etc/hvtrace/upload-credentials
//                                               "access_key = …" and
//                                               "secret_key = …" lines; owned by
//                                               root (or the daemon's user),
//                                               mode 0600 or stricter
//   upload_prefix       = hvtrace               keys are <prefix>/<host>/<vm>/<id>/…
//   upload_retry_max    = 60s                   a failed upload is retried after
//                                               1 s, doubling up to this
//
// Under systemd: $STATE_DIRECTORY, $RUNTIME_DIRECTORY and $CACHE_DIRECTORY
// (the unit's StateDirectory=, RuntimeDirectory=, CacheDirectory=) are the
// defaults of state_dir, run_dir and cache_dir; a key in the file wins
// (ServiceDefaults). SIGHUP re-reads the file: the keys that can change
// live do, the others keep their value until a restart (daemon.h Reload).
//
// cache_dir has no fixed default: hvtrace and hvtraced resolve the formats
// cache with one rule (formats_cache.h ResolveCacheRoot): $HVTRACE_CACHE_DIR,
// else this key, else $XDG_CACHE_HOME/hvtrace, else ~/.cache/hvtrace (root's:
// /root/.cache/hvtrace). The CLI reads the key from the default config file.
//
// harvest_initrd: a harvest trusts what the booted guest reports, so the
// daemon boots a kernel only with this initramfs (qemu-scripts/build-guest.sh
// builds it), never with a VM's own initrd. Default: guest/6.12/initrd.img
// beside the directory hvtraced runs from (build/bin → build/guest), else
// the package's /usr/lib/hvtrace/harvest-initrd.img.
#ifndef HVTRACE_HOSTD_CONFIG_H_
#define HVTRACE_HOSTD_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "daemon_log.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr std::string_view kDefaultConfigPath = "/etc/hvtrace/hvtraced.conf";
inline constexpr std::string_view kSocketEnvVar = "HVTRACE_SOCKET";

// What the daemon does with a VM after capturing its panic.
enum class PanicPolicy { kPause, kResume, kQuit };
std::string_view PanicPolicyName(PanicPolicy policy);

// What a daemon exit does to the VMs it booted (adopted ones are never touched).
enum class VmOnShutdown { kKeep, kStop };
std::string_view VmOnShutdownName(VmOnShutdown value);

struct Config {
  std::filesystem::path state_dir = "/var/lib/hvtrace";
  std::filesystem::path run_dir = "/run/hvtrace";
  std::filesystem::path socket_path;  // Empty: run_dir / "hvtraced.sock".
  std::string socket_group = "hvtrace";
  std::string admin_group = "hvtrace-admin";
  int capture_retention = 20;
  uint64_t capture_bytes_per_vm = 4ull << 30;
  uint64_t capture_bytes_total = 16ull << 30;
  uint64_t capture_free_reserve = 256ull << 20;
  uint64_t console_log_size = 8ull << 20;
  int console_log_files = 2;
  PanicPolicy panic_policy = PanicPolicy::kPause;
  bool vmcore_on_panic = false;  // vmcore = on-panic.
  std::string accel = "auto";
  VmOnShutdown vm_on_shutdown = VmOnShutdown::kKeep;
  int worker_threads = 2;
  std::chrono::milliseconds guest_capture_interval{10000};
  bool log_watch_oops = true;  // log_watch holds oops.
  bool log_watch_warn = true;  // log_watch holds warn.
  std::chrono::milliseconds log_watch_interval{1000};
  int max_connections = 32;
  int max_requests_per_connection = 16;
  std::string libvirt_uri = "qemu:///system";
  std::filesystem::path libvirt_qemu_log_dir = "/var/log/libvirt/qemu";
  std::filesystem::path cache_dir;       // Empty: not set (see above).
  std::filesystem::path harvest_initrd;  // Empty: the default (see above).
  LogLevel log_level = LogLevel::kInfo;
  bool qemu_sandbox = true;
  std::string qemu_user;  // Empty: kDefaultQemuUser when it exists (qemu_user.h).
  std::string qemu_binary = "qemu-system-x86_64";
  std::string upload_endpoint;  // Empty: no fleet upload.
  std::string upload_bucket;
  std::string upload_region = "us-east-1";
  std::filesystem::path upload_credentials = "/etc/hvtrace/upload-credentials";
  std::string upload_prefix = "hvtrace";
  std::chrono::milliseconds upload_retry_max{60000};

  std::filesystem::path EffectiveSocketPath() const;
};

// config log_watch as the file spells it: "oops,warn", "oops", "warn" or "off".
std::string LogWatchName(const Config& config);

// Applies the settings in |text| on top of |base|. |origin| names the source
// (a file path) in error messages, which also carry the line number.
Result<Config> ParseConfig(std::string_view text, std::string_view origin, Config base = Config{});

// Reads |path|. A missing file is an error only when |must_exist| (the user
// named it); the default path may be absent, meaning "all defaults".
// |base| holds the defaults the file's keys override.
Result<Config> LoadConfigFile(const std::filesystem::path& path, bool must_exist,
                              Config base = Config{});

// The built-in defaults with systemd's directories: $STATE_DIRECTORY,
// $RUNTIME_DIRECTORY, $CACHE_DIRECTORY (their first path when several are
// listed, ':'-separated; only absolute paths) replace state_dir, run_dir and
// cache_dir. |getenv| is std::getenv outside tests.
Config ServiceDefaults(const std::function<const char*(const char*)>& getenv);

// The socket a client should use: |flag| if set, else $HVTRACE_SOCKET, else
// the socket named by the default config file, else the built-in default.
std::filesystem::path ResolveClientSocket(std::string_view flag);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONFIG_H_
