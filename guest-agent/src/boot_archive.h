// The kBoot payload of the metadata channel (hvtrace/meta_channel.h): what a
// host needs to decode this boot's events with names and symbols though it
// never had the kernel file. The members are a format harvest's
// (hostd/formats/formats_bundle.h, the same listing format, so the host reads
// them with the same parser) plus identity.json and fingerprints.
//
// Everything is read, never written: the top-level tracefs (events/*/*/format,
// events/header_page, events/header_event, printk_formats), /proc (kallsyms,
// version, modules, sys/kernel/random/boot_id), uname and the kernel's ELF
// notes (/sys/kernel/notes) for its build id. Building reads ~1500 format
// files and compresses ~8 MB: seconds under TCG, so BootArchiveSource does it
// on a worker thread, at the agent's start and again whenever the set of
// events changes (event_set_watch.h), while the pump goes on.
#ifndef HVTRACE_AGENT_BOOT_ARCHIVE_H_
#define HVTRACE_AGENT_BOOT_ARCHIVE_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "hvtrace/meta_channel.h"

namespace hvtrace::agent {

struct BootArchivePaths {
  std::string tracefs = "/sys/kernel/tracing";  // The top level, read only.
  std::string proc = "/proc";
  std::string kallsyms = "/proc/kallsyms";
  std::string notes = "/sys/kernel/notes";
};

// The hex of the NT_GNU_BUILD_ID note ("GNU") in an ELF note list (the
// contents of /sys/kernel/notes), or nullopt when there is none or the list
// is malformed (truncated, sizes that overrun it).
std::optional<std::string> GnuBuildId(std::string_view notes);

// The event formats under |events_dir| (a tracefs events/ directory) as the
// harvest's listing, "<system>/<event>/format:<line>\n" per line, sorted by
// system and event; and the fingerprints member, "<system>/<event> <id>
// <16 hex digits>\n" per event whose format parses (hvtrace/fingerprint.h).
struct FormatListing {
  std::string formats;
  std::string fingerprints;
  size_t events = 0;
  size_t unparsed = 0;  // Formats ParseEventFormat refused (listed, no fingerprint).
};
// |cancel|, when set, stops it between two systems (the agent is exiting).
FormatListing ListFormats(const std::string& events_dir, const std::atomic<bool>* cancel = nullptr);

struct BootArchive {
  meta::BootId boot_id{};
  std::string boot_id_text;      // As /proc says it; "" when unreadable.
  std::string tar;               // The kBoot payload (raw).
  std::vector<std::byte> frame;  // kBoot frame, sequence 0, compressed.
  std::string note;              // For the agent's log: sizes and times, or what is missing.
};

// Reads everything and builds the archive and its frame (sequence 0). When
// |cancel| is set before it is done it returns early with an empty frame.
BootArchive BuildBootArchive(const BootArchivePaths& paths,
                             const std::atomic<bool>* cancel = nullptr);

// BuildBootArchive on a worker thread, started on demand, and again when the
// set of events changed (Rebuild). The archive in use stays readable while a
// newer one is built; the loop installs a finished build with Poll().
class BootArchiveSource {
 public:
  explicit BootArchiveSource(BootArchivePaths paths) : paths_(std::move(paths)) {}
  ~BootArchiveSource();
  BootArchiveSource(const BootArchiveSource&) = delete;
  BootArchiveSource& operator=(const BootArchiveSource&) = delete;

  void Start();  // The first build; later calls do nothing.
  bool started() const { return started_; }
  // Builds again (a module with events came or went). While a build runs
  // the next one waits for it: one rebuild after the last change.
  void Rebuild();
  // Installs a finished build (joins its worker) and starts a waiting
  // rebuild. Returns true when a new archive became Ready(). Loop thread.
  bool Poll();
  // The newest finished archive, or null before the first one. Loop thread.
  const BootArchive* Ready() const { return ready_.get(); }
  // 1 for the first archive, +1 per rebuild installed.
  uint32_t revision() const { return revision_; }

 private:
  void Launch();

  BootArchivePaths paths_;
  std::thread worker_;
  bool started_ = false;
  bool again_ = false;                     // A Rebuild came while a build ran.
  std::atomic<bool> done_{false};          // The worker finished |building_|.
  std::atomic<bool> cancel_{false};        // Set by the destructor: an exiting agent does not wait.
  std::unique_ptr<BootArchive> building_;  // The worker's, until done_.
  std::unique_ptr<BootArchive> ready_;
  uint32_t revision_ = 0;
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_BOOT_ARCHIVE_H_
