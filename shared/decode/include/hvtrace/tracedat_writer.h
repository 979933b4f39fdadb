// Writes a trace-cmd trace.dat, version 6 (man 5 trace-cmd.dat.v6), that
// `trace-cmd report`, KernelShark and libtracecmd open directly:
//
//   "\x17\x08\x44tracing" "6\0" endian(0) long_size page_size:u32
//   "header_page\0" size:u64 text   "header_event\0" size:u64 text
//   ftrace formats: count:u32 {size:u64 text}
//   systems: count:u32 {"name\0" count:u32 {size:u64 text}}
//   kallsyms: size:u32 text   printk_formats: size:u32 text
//   cmdlines: size:u64 text   cpus:u32
//   "options  \0" {id:u16 size:u32 data} 0:u16     (TRACECLOCK = 4,
//                                                   LAST_BOOT_INFO = 24)
//   "flyrecord\0" {offset:u64 size:u64} per CPU, clock: size:u64 "[clock]"
//   padding to page_size, then each CPU's pages, page aligned.
//
// The pages are written as given: the caller passes pages it has already
// validated (e.g. by BootMap or the page walker), in a few writev calls that
// take them where they lie. The file is written under a temporary name in the
// same directory and renamed, so a reader never sees half a file; every
// failure (short write, disk full) names the path. The file is created 0640.
#ifndef HVTRACE_TRACEDAT_WRITER_H_
#define HVTRACE_TRACEDAT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "hvtrace/tracedat.h"

namespace hvtrace {

struct TraceDatWriterInput {
  uint32_t page_size = 4096;  // Sub-buffer size of every page below.
  uint32_t long_size = 8;     // The guest's userspace long (x86_64: 8).
  std::string header_page;    // events/header_page text.
  std::string header_event;   // events/header_event text.
  // Format files; system "ftrace" goes to the ftrace section, the others are
  // grouped by system in first-seen order.
  std::vector<FormatText> formats;
  std::string kallsyms;               // /proc/kallsyms text (may be empty).
  std::string printk_formats;         // printk_formats text (may be empty).
  std::string cmdlines;               // saved_cmdlines text, "pid comm\n" lines.
  std::string trace_clock = "local";  // The clock name, e.g. "local", "global".
  // "<instance>:<text>" as trace-cmd 3.4 stores a persistent instance's
  // last_boot_info (option 24); empty: not written.
  std::string last_boot_info;
  // Per CPU (index = CPU number), the pages in read order; each exactly
  // |page_size| bytes.
  std::vector<std::vector<std::span<const std::byte>>> cpus;
};

// How durable WriteTraceDat leaves the file.
enum class TraceDatSync {
  kDurable,      // fsynced before the rename, the directory fsynced after.
  kCallerSyncs,  // Written back in the background only: the caller fsyncs the
                 // file and its directory before it relies on them (a capture
                 // does it once for all its files when it commits).
};

// Writes |input| to |path| (replacing it atomically). Fails with a message
// naming |path| and what went wrong; on failure no file is left at |path|
// and the temporary file is removed.
Status WriteTraceDat(const std::string& path, const TraceDatWriterInput& input,
                     TraceDatSync sync = TraceDatSync::kDurable);

// The bytes WriteTraceDat would write (for tests and fuzzers).
Result<std::string> EncodeTraceDat(const TraceDatWriterInput& input);

}  // namespace hvtrace

#endif  // HVTRACE_TRACEDAT_WRITER_H_
