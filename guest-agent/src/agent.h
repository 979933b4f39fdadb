// hvtrace-agent's core: attach to the hvtrace region (an ivshmem BAR), tell
// the host who the guest is, publish event formats, enable what the host asks
// for and pump every CPU's trace_pipe_raw pages into the region.
//
// Its own tracefs instance: everything the agent records and reads goes
// through /sys/kernel/tracing/instances/hvtrace (AgentOptions::instance),
// created at start if absent: events, trace_clock, tracing_on, the per-CPU
// trace_pipe_raw and the backlog clear are that instance's. The top-level
// buffer and every other instance belong to their users (trace-cmd, perf,
// the boot range): the agent never writes them, but for one line at its
// start in the boot instance (boot_marker.h). It reads the global
// saved_cmdlines (the kernel has one list for all buffers) and raises the
// global saved_cmdlines_size only when that cannot cost anyone a name (see
// RaiseSavedCmdlines). A guest service whose line should reach hvtrace
// writes instances/hvtrace/trace_marker. The agent never removes its
// instance: a user may read it, and a successor agent continues it.
//
// Restarts lose nothing: an agent that exits (signal, --run-for) leaves the
// instance recording with the events it had enabled; the next agent (the
// systemd unit after the initramfs one) takes those events over, and keeps
// what the kernel buffered meanwhile unless the region changed in between
// (the region id the backlog belongs to is kept in <pointer dir>/backlog).
//
// One thread, one poll loop: the uevent socket, the per-CPU pipes (readable
// once buffer_percent is reached) and a timer at the host's pump interval,
// so partial pages are pushed at least that often; the largest gap between
// two pushes is published as the loss window a sudden panic can cost. Page
// buffers are allocated at attach time; the pump path does not allocate.
//
// Lifecycle: at start, and on every "add" uevent of a PCI 1af4:1110 device,
// the agent waits for resource2 (the kernel announces the device before it
// assigns the BAR), maps it, and checks the magic; a BAR that is not an
// hvtrace region is left alone. On the device's "remove" uevent it unmaps at
// once: a new device may land at the same address. The kernel zaps the BAR
// mapping before it sends that uevent, so an access in between would raise
// SIGBUS; the mapping is guarded (GuardRegionMapping) and every tick first
// checks that the region is still there. After a region went away its events
// are disabled and the instance's backlog is discarded at the next attach, so
// a new region never receives events recorded for none. While attached it
// writes /run/hvtrace/region for direct-write programs (hvtrace/dwtrace.hpp)
// and frees direct-write rings of threads that are gone.
//
// The metadata channel (meta_sender.h), in the same loop and independent of
// any region: the boot archive, task names and clock samples over a
// virtio-serial port, for hosts that decode this boot without a region.
//
// Events that come later (a module with trace events loaded after the
// agent started): the loop looks at the set of events once a second
// (event_set_watch.h) and on a change re-publishes both the channel's
// archive and, for the host's standing request, the region's formats.
//
// Names for the host (region text areas): the kernel's text symbols, read
// and compressed once on a worker thread and written when ready, and
// saved_cmdlines, republished before a pump whenever it changed, so the
// pages the host reads find their tasks named.
#ifndef HVTRACE_AGENT_AGENT_H_
#define HVTRACE_AGENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "event_set_watch.h"
#include "hvtrace/region_writer.h"
#include "hvtrace/result.h"
#include "meta_sender.h"
#include "text_areas.h"
#include "tracefs.h"
#include "uevent.h"

namespace hvtrace::agent {

struct AgentOptions {
  std::string sysfs_pci_devices = "/sys/bus/pci/devices";
  std::string tracefs = "/sys/kernel/tracing";
  std::string instance = "hvtrace";  // The agent's own instance under tracefs/instances.
  std::string proc = "/proc";
  std::string kallsyms = "/proc/kallsyms";        // Published to the symbol area.
  std::string pointer_file = kRegionPointerFile;  // "" to not write one.
  std::string region_path;                        // Fixed region file: no PCI discovery (tests).
  bool set_mono_clock = true;  // The instance's trace clock "mono", as direct-write uses.
  uint64_t run_for_ms = 0;     // Stop after this long (0: forever).
  bool verbose = false;
  // The persistent boot instance that gets the "started" line (boot_marker.h);
  // "" for none.
  std::string boot_instance = "boot_map";
  // The metadata channel (meta_sender.h); its |verbose| follows the agent's.
  // Its archive reads the top level of |tracefs| and |proc|.
  MetaOptions meta;
};

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();

  // The poll loop. Returns the exit status.
  int Run();

  // Steps of the loop, public for tests.
  Status Attach(const std::string& path);
  // |region_gone|: the region went away (or another replaces it), so what the
  // instance records from now on belongs to none: its events are disabled and
  // its backlog discarded at the next attach. Otherwise (the agent exits) the
  // instance records on for the next agent.
  void Detach(const char* why, bool region_gone);
  // Creates the agent's tracefs instance if absent; an error if tracefs has
  // no instances (or the name is not one).
  Status OpenInstance();
  // Applies new host requests, pumps when due (or |force|), heartbeats.
  void Tick(bool force);
  bool attached() const { return region_.has_value(); }
  uint32_t generation() const { return generation_; }
  // Reads every CPU pipe until it is empty; returns pages pushed.
  uint64_t PumpAll();
  // The set of trace events changed: re-publishes formats (the metadata
  // channel's archive, the region's table for the host's request).
  void EventsChanged();

 private:
  struct CpuPipe {
    unsigned cpu = 0;
    int fd = -1;
  };

  void Log(const std::string& message) const;
  void Announce();
  void SampleClocks();
  void PublishHeaders();
  void PublishEvent(const std::string& sys_event);
  void ApplyRequests(const region::HostRequests& requests);
  void DisableEvents();
  void AdoptEnabledEvents();
  bool KeepBacklogFor(uint64_t region_id);
  void SetBacklogOwner(const std::string& owner);
  void RaiseSavedCmdlines();
  void OpenPipes();
  void ClosePipes();
  void Heartbeat(uint64_t now);
  void ReapDwRings();
  void HandleUevent(const Uevent& event);
  void TryPendingAttach(uint64_t now);
  void ScanForDevices(uint64_t now);
  void PublishSymbols();
  void PublishComms();
  void WritePointerFile();
  void RemovePointerFile();

  AgentOptions options_;
  Tracefs tracefs_;   // Top level: read only, but for RaiseSavedCmdlines.
  Tracefs instance_;  // The agent's own instance.
  UeventSocket uevents_;
  RegionMapping mapping_;
  std::optional<GuestRegion> region_;
  std::string device_slot_;  // PCI slot of the mapped device ("" for a file).
  uint32_t generation_ = 0;
  uint32_t nr_cpus_ = 0;
  uint32_t page_size_ = 4096;
  std::vector<CpuPipe> pipes_;
  std::vector<std::byte> page_buffer_;  // One page; reused by the pump.
  std::set<std::string> enabled_;       // "sys/event" enabled in the instance.
  std::set<std::string> adopted_;       // Of those, found enabled (a previous agent's).
  uint64_t request_seq_ = 0;
  uint64_t snapshot_seq_ = 0;
  uint32_t pump_interval_ms_ = 100;
  bool stopped_ = false;
  bool discard_backlog_ = false;  // A region went away: clear the instance at the next attach.
  uint64_t next_pump_ns_ = 0;
  uint64_t last_push_ns_ = 0;
  uint64_t next_heartbeat_ns_ = 0;
  SymbolSource symbols_;
  MetaSender meta_;
  EventSetWatch event_set_;
  bool recheck_events_ = false;    // ApplyRequests again though the request is the same.
  bool symbols_written_ = false;   // For the current region.
  bool cmdlines_checked_ = false;  // RaiseSavedCmdlines ran (once: a resize clears the list).
  std::string comms_published_;    // saved_cmdlines text in the current region.
  std::vector<std::string> pending_slots_;  // Added devices waiting for resource2.
  uint64_t pending_deadline_ns_ = 0;
  uint64_t pending_retry_ns_ = 0;  // A failed attach of a pending slot is tried again then.
  std::string pending_error_;      // Its last error, logged once.
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_AGENT_H_
