// QEMU's own trace events (hostd/qemu/qemu_trace_log.h) as a trace.dat that
// `trace-cmd report` and KernelShark open beside the guest's boot files.
//
// The events go into a synthetic system "qemu", one format per event name,
// its fields made from the "key value" arguments QEMU printed:
//
//   name: virtio_set_status
//   ID: 1
//   format:
//     field:unsigned short common_type; ... field:int common_pid (QEMU's TID)
//
//     field:u64 vdev;  offset:8;  size:8;  signed:0;    every value 0x-hex
//     field:u64 val;   offset:16; size:8;  signed:0;    every value decimal
//     field:__data_loc char[] args; ...                 anything else: text
//
//   print fmt: "vdev=0x%llx val=%llu", REC->vdev, REC->val
//
// A key is a number field only when every line of that event gives it a
// number of one kind (all hex or all decimal); otherwise it is text, so no
// value is ever printed other than as QEMU wrote it. Text that is not
// key/value pairs is one field "args". Time stamps are the host's
// CLOCK_REALTIME in ns (QEMU logs µs); the trace clock is named "realtime",
// which trace-cmd does not know, so it prints the raw ns count. All events
// are on one CPU stream, in time order (QEMU's threads write their lines in
// the order they get the log lock, which may differ by microseconds).
#ifndef HVTRACE_HOSTD_CAPTURE_HOST_TRACE_DAT_H_
#define HVTRACE_HOSTD_CAPTURE_HOST_TRACE_DAT_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "hvtrace/tracedat_writer.h"
#include "qemu_trace_log.h"

namespace hvtrace::hostd {

inline constexpr const char* kHostTraceClock = "realtime";
inline constexpr const char* kHostSystem = "qemu";
inline constexpr size_t kMaxHostEventNames = 1024;
inline constexpr size_t kMaxHostFields = 32;
inline constexpr size_t kMaxHostText = 1024;  // Bytes of one text value kept.

// The header_page / header_event text of an x86-64 kernel with 4 KiB
// sub-buffers (what PageWriter writes).
extern const char kHostHeaderPage[];
extern const char kHostHeaderEvent[];

struct HostTraceDat {
  TraceDatWriterInput input;                 // Ready for WriteTraceDat.
  std::deque<std::vector<std::byte>> pages;  // Owns what input.cpus points at.
  uint64_t events = 0;
  uint64_t dropped = 0;  // Events beyond the name cap or that did not fit a page.
  uint64_t first_ns = 0, last_ns = 0;
};

// Builds the trace.dat contents for |log|'s events.
HostTraceDat BuildHostTraceDat(const QemuTraceLog& log);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_HOST_TRACE_DAT_H_
