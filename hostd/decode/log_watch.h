// Trouble a running guest survives, seen from the host: an oops, BUG or
// WARNING in the kernel log its boot range records (the printk:console
// events the guest kernel writes into host memory), found with no help from
// the guest and without pausing it. With panic_on_oops=0 a guest lives on
// after an oops and QEMU reports nothing; this is how hvtraced still takes
// an `oops` or `warn` capture of it (the daemon looks at every running VM's
// range once per `log_watch_interval`; supervisor.h rate-limits the
// captures).
//
// One look reads a private copy of the whole range (ReadBootMap, as a
// capture does: the guest's bytes are hostile and bounded the same way) and
// takes the console records of the range's newest boot that are newer, per
// CPU, than the previous look's. The first look takes everything the newest
// boot logged: trouble from before the watch began (a daemon restarted while
// the guest ran) is reported once per watch. A boot that appears (kexec,
// reboot), or a CPU whose newest records are older than what was seen (the
// range started over with as many boots), is read from its start. Lines of a look that also holds a
// panic line are not reported: the panic is captured by its own trigger (GUEST_PANICKED), with the
// guest paused.
//
// An oops is reported once its report has ended ("---[ end trace" after its
// call trace), so that its capture holds the frames: the console lines of
// one report reach the range over a serial console's time (hundreds of ms),
// and a look between its BUG line and its call trace made a capture without
// frames (LogWatchE2e on a Debian 13 host, 2026-12-03). A report that never
// ends (the guest stopped in it) is reported kOopsWaitLooks looks later.
//
// Cost, measured on the CI-sized machine (2 cores), 16 MiB range of a
// booted 6.12 guest: see docs/postmortem.md ("Oops and WARN without a
// panic").
#ifndef HVTRACE_HOSTD_DECODE_LOG_WATCH_H_
#define HVTRACE_HOSTD_DECODE_LOG_WATCH_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "formats_cache.h"

namespace hvtrace::hostd {

struct LogTrouble {
  std::string trigger;  // "oops" (Oops, BUG, kernel BUG, GPF) or "warn" (WARNING).
  std::string line;     // The line, printable (PrintableLogText).
  uint32_t boot = 0;    // In the range (0 = oldest).
  int32_t cpu = -1;
  uint64_t ts_ns = 0;  // On the guest's trace clock.
};

struct LogLook {
  // The first oops line and the first WARNING line among the new lines
  // (at most one of each: a storm makes one capture per interval anyway,
  // supervisor.h), oldest first.
  std::vector<LogTrouble> troubles;
  uint64_t trouble_lines = 0;  // Oops, BUG and WARNING lines among the new ones.
  uint64_t new_lines = 0;      // Console lines new since the last look.
  bool panic_seen = false;     // A panic line among them (troubles left out).
  std::string error;           // Why nothing could be read; empty when read.
};

class KernelLogWatch {
 public:
  // One look at |range|, a private copy of the VM's whole boot range,
  // decoded with |formats| (its header_page and printk:console format).
  // |cpus|: the guest's CPU count when known, 0 derives it.
  LogLook Look(std::span<const std::byte> range, const KernelFormats& formats, int cpus);

  static constexpr int kOopsWaitLooks = 2;

 private:
  // Takes |line| of a look into |look| (its trouble, an open oops's end).
  void Take(const std::string& line, uint32_t boot, int32_t cpu, uint64_t ts_ns, LogLook& look);

  uint32_t boots_ = 0;                   // Boots the range held at the last look.
  std::map<int32_t, uint64_t> seen_ns_;  // Per CPU: newest boot's last console time seen.
  std::optional<LogTrouble> open_oops_;  // Seen, its report not ended yet.
  int open_looks_ = 0;                   // Looks that ended with it open.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DECODE_LOG_WATCH_H_
