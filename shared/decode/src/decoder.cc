// EventDecoder: libtraceevent set up the way trace-cmd sets it up, our own
// line prefix and JSON, and compiled printers (event_printer.h) for the print
// formats they cover.
#include "hvtrace/decoder.h"

#include <traceevent/event-parse.h>
#include <traceevent/trace-seq.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "event_printer.h"
#include "event_text.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/run_isolated.h"
#include "hvtrace/tep_symbols.h"
#include "lazy_formats.h"
#include "line_prefix.h"
#include "num_expr.h"
#include "tep_setup.h"
#include "zeroed_scratch.h"

namespace hvtrace {
namespace {

// libtraceevent's parsers keep their input in static variables (the format
// tokenizer's input_buf) and its plugin loader keeps global option lists, so
// decoders on several threads (a parallel report) take turns in them.
// Printing a parsed event uses neither.
std::mutex& ParserMutex() {
  static std::mutex mu;
  return mu;
}

// A record larger than this is cut to it before printing; kernel sub-buffers
// are at most a few pages, so only a hostile file gets here.
constexpr size_t kMaxPayload = 1 << 20;
// Reach of a __data_loc / __rel_loc reference past its base: 16-bit offset
// plus 16-bit length.
constexpr size_t kMaxDynamicReach = 2 << 16;
// How long libtraceevent may take over one format in a trial run (Load).
constexpr unsigned kTrialSeconds = 5;
constexpr size_t kScratchSize = kMaxPayload + kMaxFieldEnd + kMaxDynamicReach + 64;

struct EventInfo {
  EventFormat format;
  tep_event* event = nullptr;             // libtraceevent's view; null if it has none.
  std::unique_ptr<EventPrinter> printer;  // Null: libtraceevent prints it.
  std::string name_column;                // " name: " padded as trace-cmd does.
  bool name_plain = false;                // name_column is LinePrefix::PlainAscii.
  // The smallest record the format describes: the end of its last field
  // (the start, for an open-ended field such as print's "char buf[]").
  uint32_t min_size = 0;
  // libtraceevent parses the format on first use: trace-cmd stores every
  // format of the system (thousands), while a trace uses a few dozen.
  std::string text;
  bool loaded = false;
  // libtraceevent's parser crashed on the format in a trial run: the events
  // print their fields raw and libtraceevent never sees the format.
  bool raw_only = false;
  // The caller ran this text's trial already (FormatText::trial_passed).
  bool trial_passed = false;
  size_t source_index = 0;  // In TraceMetadata::formats.
  // Printing the event changes what later records print (PrepareText).
  bool in_order = false;
  bool prepared = false;  // PrepareLoad ran.
  // Where the print format's per-record hazards live (EventFormat::
  // divisor_fields and length_fields): {offset, size}.
  std::vector<std::pair<uint32_t, uint32_t>> divisors;
  std::vector<std::pair<uint32_t, uint32_t>> lengths;

  // Why libtraceevent must not print this record, or nullptr.
  const char* PrintHazard(const unsigned char* data, bool little_endian) const {
    if (raw_only) return "libtraceevent cannot parse this format";
    if (!format.unchecked_print.empty()) return "print fmt not used";
    for (auto [offset, size] : divisors) {
      if (ReadUnsigned(data + offset, size, little_endian) == 0) return "print fmt divides by zero";
    }
    for (auto [offset, size] : lengths) {
      if (ReadUnsigned(data + offset, size, little_endian) > kMaxPrintLength)
        return "print fmt length too large";
    }
    return nullptr;
  }
};

// The format text with its print fmt emptied: what libtraceevent gets for a
// format whose divisions it could not survive (its fields still print).
std::string WithoutPrintFormat(std::string_view text) {
  size_t at = text.find("print fmt:");
  std::string out(text.substr(0, at));
  out += "print fmt: \"\"\n";
  return out;
}

}  // namespace

struct EventDecoder::Impl {
  tep_handle* tep = nullptr;
  tep_plugin_list* plugins = nullptr;
  std::vector<std::string> warnings;
  // A leader's formats, each parsed on its event's first use (Event). The
  // warnings Create used to give for them go after the first
  // |create_warnings_at| of |warnings| (New's) in the list warnings()
  // returns, |all_warnings|.
  std::unique_ptr<LazyFormats> formats;
  size_t create_warnings_at = 0;
  std::vector<std::string> all_warnings;
  // Set in a follower (CreateFollower): the decoder whose parsed formats,
  // symbols and trial runs it takes, and the metadata both were made from.
  const Impl* leader = nullptr;
  const std::vector<FormatText>* leader_formats = nullptr;

  static Result<std::unique_ptr<Impl>> New(const TraceMetadata& metadata);
  void Finish(const TraceMetadata& metadata, const TepSymbols* built);
  std::unordered_map<uint32_t, std::unique_ptr<EventInfo>> events;
  std::vector<EventInfo*> by_id;  // Dense index for the hot path.
  ZeroedScratch scratch;
  std::unique_ptr<SymbolCache> symbols;
  // The file's kallsyms as libtraceevent's function resolver; null when
  // libtraceevent parsed it itself (TepSymbols::Build refused the text).
  // A follower uses its leader's.
  const TepSymbols* kernel_symbols = nullptr;
  std::unique_ptr<TepSymbols> own_symbols;
  // Print-format atoms naming symbols (RegisterSymbolAtoms): every name
  // seen, and the values compiled printers may use.
  std::unordered_set<std::string> atom_names;
  event_printer_internal::AtomValues atom_values;
  // Comms found by tep_data_comm_from_pid(), direct-mapped by pid. Only hits
  // are cached: libtraceevent never replaces a registered comm (plugins call
  // tep_register_comm, which keeps the first), and its strings do not move,
  // while a miss can turn into a hit when a plugin registers the pid later.
  struct CommEntry {
    int pid = -1;
    const char* comm = nullptr;
  };
  static constexpr size_t kCommEntries = 4096;
  std::vector<CommEntry> comm_cache = std::vector<CommEntry>(kCommEntries);

  const char* Comm(int pid) {
    CommEntry& e = comm_cache[static_cast<uint32_t>(pid) % kCommEntries];
    if (e.pid == pid && e.comm != nullptr) return e.comm;
    const char* comm = tep_data_comm_from_pid(tep, pid);
    if (pid != 0 && std::strcmp(comm, "<...>") != 0) {
      e.pid = pid;
      e.comm = comm;
    }
    return comm;
  }
  trace_seq seq{};
  bool time_in_usecs = true;
  bool fast_paths = true;
  bool little_endian = true;
  uint64_t fast_count = 0;
  uint64_t slow_count = 0;

  ~Impl() {
    trace_seq_destroy(&seq);
    std::lock_guard<std::mutex> lock(ParserMutex());
    if (tep != nullptr) {
      if (plugins != nullptr) tep_unload_plugins(plugins, tep);
      tep_free(tep);
    }
  }

  EventInfo* Find(uint32_t id) const { return id < by_id.size() ? by_id[id] : nullptr; }

  // Adds event |format| (parsed from |text|, metadata.formats[|index|]);
  // false when its id is taken.
  bool AddEvent(EventFormat format, const FormatText& text, size_t index) {
    const uint32_t id = format.id;
    auto info = std::make_unique<EventInfo>();
    info->format = std::move(format);
    info->text = text.text;
    info->trial_passed = text.trial_passed;
    info->source_index = index;
    for (const FieldFormat& f : info->format.fields) {
      info->min_size = std::max(info->min_size, f.offset + f.size);
    }
    const std::string& name = info->format.name;
    info->name_column = " " + name + ": ";
    if (name.size() < 20) info->name_column.append(20 - name.size(), ' ');
    info->name_plain = LinePrefix::PlainAscii(info->name_column);
    EventInfo* raw = info.get();
    if (!events.emplace(id, std::move(info)).second) return false;
    if (id < by_id.size()) by_id[id] = raw;
    return true;
  }

  // Event |id|: in a leader, its format parsed on first use (LazyFormats);
  // in a follower, made on its first record from the leader's parsed
  // format (a follower parses none: ParseEventFormat of every format was
  // 136 M instructions of `hvtrace report` on bench/large.dat, for the few
  // dozen a trace uses). The leader adds an event when it prepares its
  // first record and changes it no more; a follower copies it only for a
  // record handed over after that (ReportPrinter's batches, under a mutex).
  // The known event is inline: Event runs for every record.
  EventInfo* Event(uint32_t id) {
    EventInfo* info = Find(id);
    return info != nullptr || id >= by_id.size() ? info : NewEvent(id);
  }
  [[gnu::noinline]] EventInfo* NewEvent(uint32_t id) {
    if (formats != nullptr) {
      const size_t index = formats->Resolve(id);
      if (index == LazyFormats::kNone) return nullptr;
      AddEvent(*formats->Parsed(index), formats->text(index), index);
      return Find(id);
    }
    if (leader == nullptr) return nullptr;
    const EventInfo* theirs = leader->Find(id);
    if (theirs == nullptr) return nullptr;
    AddEvent(theirs->format, (*leader_formats)[theirs->source_index], theirs->source_index);
    return Find(id);
  }

  // What Load and the trial run need before the parse (once per copy of
  // |info|: the trial child calls it on its own copy).
  void PrepareLoad(EventInfo* info) {
    if (info->prepared) return;
    info->prepared = true;
    // ParseEventFormat checked that every listed field exists and is a scalar.
    for (const std::string& name : info->format.divisor_fields) {
      const FieldFormat* f = info->format.FindField(name);
      info->divisors.emplace_back(f->offset, f->size);
    }
    for (const std::string& name : info->format.length_fields) {
      const FieldFormat* f = info->format.FindField(name);
      info->lengths.emplace_back(f->offset, f->size);
    }
    if (!info->format.unchecked_print.empty()) {
      info->text = WithoutPrintFormat(info->text);
      warnings.push_back(source + ": " + info->format.system + "/" + info->format.name + ": " +
                         info->format.unchecked_print + "; its events print their fields raw");
    }
  }

  // Hands the format to libtraceevent and compiles its printer (once).
  void Load(EventInfo* info) {
    std::lock_guard<std::mutex> lock(ParserMutex());
    info->loaded = true;
    const std::string& sys = info->format.system;
    PrepareLoad(info);
    // libtraceevent's parser has no defence against hostile text (it has
    // crashed on formats that pass ParseEventFormat), so a forked copy of
    // this decoder parses the format and prints two made-up records of it
    // first; only a format that survives reaches this process's handle.
    // A follower takes the verdict of its leader, which has loaded every
    // format before a follower sees a record of it.
    const EventInfo* vetted = leader != nullptr ? leader->Find(info->format.id) : nullptr;
    std::string crashed;
    if (vetted != nullptr && vetted->loaded) {
      if (vetted->raw_only) crashed = "crashed (the leader's trial run)";
    } else if (!info->trial_passed) {
      crashed = Trial(info->format.id);
      if (!keep_trial_child) trials->End();
    }
    if (!crashed.empty()) {
      warnings.push_back(source + ": " + sys + "/" + info->format.name + ": libtraceevent " +
                         crashed +
                         " on this format in a trial run; its events print their fields raw");
      info->raw_only = true;
      std::string().swap(info->text);
      return;
    }
    if (tep_parse_event(tep, info->text.data(), info->text.size(), sys.c_str()) != 0) {
      // libtraceevent keeps events it could only partly parse (flagged
      // TEP_EVENT_FL_FAILED) and prints them raw, as trace-cmd does.
      warnings.push_back(source + ": libtraceevent could not fully parse " + sys + "/" +
                         info->format.name);
    }
    info->event = tep_find_event(tep, static_cast<int>(info->format.id));
    info->in_order = info->event != nullptr && info->event->handler != nullptr &&
                     !(info->event->flags & TEP_EVENT_FL_NOHANDLE) &&
                     !IsKmemCallSiteEvent(info->format.system, info->format.name);
    if (info->event != nullptr && kernel_symbols != nullptr) RegisterSymbolAtoms(info->event);
    // No compiled printer while fast paths are off: a decoder that prints a
    // handful of records (the crash summary's) saves compiling one per
    // event (0.85 M instructions at a 6.12 panic, callgrind).
    if (info->event != nullptr && little_endian && info->format.unchecked_print.empty() &&
        fast_paths) {
      info->printer =
          EventPrinter::Compile(tep, info->event, info->format, symbols.get(), &atom_values);
    }
    std::string().swap(info->text);
  }
  // libtraceevent evaluates a print-format atom that is not a number as the
  // address of the kernel symbol of that name (test_for_symbol), searching
  // the symbols tep_parse_kallsyms registered; with our resolver it has
  // none, so the names the event's atoms use are registered here, before
  // its first record prints, with the value libtraceevent would find.
  // (Only a name given to symbols at several addresses depends on when
  // libtraceevent first looks it up; its value is fixed here as of Load.)
  void RegisterSymbolAtoms(tep_event* event) {
    event_printer_internal::ForEachSymbolAtom(event->print_fmt.args, [this](const char* name) {
      if (!atom_names.insert(name).second) return;
      bool certain = false;
      const uint64_t value = kernel_symbols->AtomValue(name, kernel_symbols->looked_up(), &certain);
      if (value != 0) tep_register_function(tep, const_cast<char*>(name), value, nullptr);
      if (certain) atom_values.emplace(name, value);
    });
  }
  std::string source;
  size_t source_formats = 0;  // TraceMetadata::formats.size().
  // The child process that trial-parses formats (Load).
  std::unique_ptr<IsolatedWorker> trials;
  bool keep_trial_child = false;

  // The trial run of event |id| in the worker child (started on first use):
  // "" when libtraceevent survived it, else what ended the child.
  std::string Trial(uint32_t id) {
    if (trials == nullptr) {
      trials = std::make_unique<IsolatedWorker>(
          [this](uint32_t event_id) {
            EventInfo* copy = Find(event_id);  // The child's copy, as of its fork.
            if (copy == nullptr && formats != nullptr) {
              // Resolved in the parent after the fork: parsed again here.
              auto parsed = formats->ResolveInChild(event_id);
              if (!parsed) return;
              AddEvent(std::move(parsed->first), formats->text(parsed->second), parsed->second);
              copy = Find(event_id);
            }
            if (copy == nullptr) return;
            PrepareLoad(copy);
            TrialParse(*copy);
          },
          kTrialSeconds);
    }
    return trials->Run(id);
  }

  // Runs in a forked child (Load): what Load and AppendText would make
  // libtraceevent do with this format, on records of all zeros and all ones.
  void TrialParse(EventInfo& info) {
    tep_parse_event(tep, info.text.data(), info.text.size(), info.format.system.c_str());
    if (tep_find_event(tep, static_cast<int>(info.format.id)) == nullptr) return;
    for (unsigned char fill : {0x00, 0xff}) {
      const uint32_t size = std::max<uint32_t>(info.min_size, 64);
      std::memset(scratch.data(), fill, size);
      scratch[0] = static_cast<unsigned char>(info.format.id & 0xff);
      scratch[1] = static_cast<unsigned char>(info.format.id >> 8);
      if (info.PrintHazard(scratch.data(), little_endian) != nullptr) continue;
      tep_record rec{};
      rec.data = scratch.data();
      rec.size = static_cast<int>(size);
      rec.record_size = rec.size;
      trace_seq_reset(&seq);
      tep_print_event(tep, &seq, &rec, "%s", TEP_PRINT_INFO);
    }
  }

  // Copies |payload| into the zero-padded scratch area and returns the size
  // used; every reader works on the scratch copy.
  uint32_t Stage(std::span<const std::byte> payload) {
    size_t n = std::min(payload.size(), kMaxPayload);
    // An empty span may carry a null data(); memcpy forbids null even for 0.
    if (n != 0) std::memcpy(scratch.data(), payload.data(), n);
    return static_cast<uint32_t>(n);
  }
  void Unstage(uint32_t n) { std::memset(scratch.data(), 0, n); }

  static uint32_t U16At(const unsigned char* p, bool little_endian) {
    return little_endian ? (p[0] | p[1] << 8) : (p[1] | p[0] << 8);
  }
  static int32_t S32At(const unsigned char* p, bool little_endian) {
    uint32_t v = little_endian
                     ? (p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24)
                     : (p[3] | p[2] << 8 | p[1] << 16 | static_cast<uint32_t>(p[0]) << 24);
    return static_cast<int32_t>(v);
  }
  uint32_t ReadU16(size_t off) const { return U16At(scratch.data() + off, little_endian); }
  int32_t ReadS32(size_t off) const { return S32At(scratch.data() + off, little_endian); }
  // A record's size (as printed), type and pid, the values AppendText reads
  // from its zero-padded scratch copy, from a zero-padded copy of the first
  // 8 bytes: the Prepare* steps run on every record of a report and need
  // only these.
  struct Head {
    size_t size;
    uint32_t id;
    int pid;
  };
  Head ReadHead(std::span<const std::byte> payload) const {
    const size_t size = std::min(payload.size(), kMaxPayload);
    unsigned char head[8] = {};
    if (size != 0) std::memcpy(head, payload.data(), std::min<size_t>(size, sizeof head));
    return {size, U16At(head, little_endian), S32At(head + 4, little_endian)};
  }

  std::optional<LinePrefix> prefix;  // Set in New.

  // trace-cmd report's latency column ("d.h2.": irqs off, need-resched,
  // hard/soft irq, preempt depth, migrate-disable), which trace-cmd 3.3
  // (libtracecmd 1.5, Debian 13) prints by default and 3.1 (libtracecmd 1.3,
  // Debian 12) does not: the text is that of the release built for
  // (shared/decode/CMakeLists.txt). libtraceevent writes it from the
  // record's common fields but its type and pid, so each combination is
  // asked once and kept.
#if defined(HVTRACE_LATENCY_COLUMN)
  static constexpr bool kLatencyColumn = true;
#else
  static constexpr bool kLatencyColumn = false;
#endif
  std::unordered_map<std::string, std::string> latency_texts;
  size_t common_end = 0;  // Of the common fields (at most 32); 0 until known.
  std::string_view Latency(const EventInfo& info, uint32_t size) {
    if (!kLatencyColumn) return {};
    if (common_end == 0 && info.event != nullptr) {
      common_end = 8;
      for (const tep_format_field* f = info.event->format.common_fields; f != nullptr;
           f = f->next) {
        if (f->offset >= 0 && f->size > 0 && f->offset + f->size <= 32)
          common_end = std::max<size_t>(common_end, static_cast<size_t>(f->offset + f->size));
      }
    }
    // The common bytes but the type (0-1) and the pid (4-7); the scratch
    // copy is zero past the record.
    const auto* bytes = reinterpret_cast<const char*>(scratch.data());
    std::string key(bytes + 2, 2);
    if (common_end > 8) key.append(bytes + 8, common_end - 8);
    auto it = latency_texts.find(key);
    if (it == latency_texts.end()) {
      // A guest may vary the common bytes at will: the kept texts stay few.
      if (latency_texts.size() >= 4096) latency_texts.clear();
      tep_record rec{};
      rec.data = scratch.data();
      rec.size = static_cast<int>(size);
      rec.record_size = static_cast<int>(size);
      trace_seq_reset(&seq);
      tep_print_event(tep, &seq, &rec, "%s", TEP_PRINT_LATENCY);
      it = latency_texts.emplace(std::move(key), std::string(seq.buffer, seq.len)).first;
    }
    return it->second;
  }
};

EventDecoder::EventDecoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EventDecoder::~EventDecoder() = default;

// libtraceevent's handle, set up as trace-cmd sets it up (tracecmd_alloc_fd:
// plugins first, then the file's description), without formats or symbols.
Result<std::unique_ptr<EventDecoder::Impl>> EventDecoder::Impl::New(const TraceMetadata& metadata) {
  auto impl = std::make_unique<Impl>();
  const std::string& src = metadata.source;
  if (metadata.long_size != 4 && metadata.long_size != 8) {
    return Error{src + ": unsupported long size " + std::to_string(metadata.long_size)};
  }
  std::lock_guard<std::mutex> parser_lock(ParserMutex());
  impl->tep = tep_alloc();
  if (impl->tep == nullptr) return Error{src + ": out of memory"};
  tep_handle* tep = impl->tep;
  impl->little_endian = !metadata.big_endian;
  impl->time_in_usecs = ClockInNanoseconds(metadata.trace_clock);
  impl->prefix.emplace(impl->time_in_usecs);
  impl->plugins = LoadTepPlugins(tep);
  tep_set_file_bigendian(tep, metadata.big_endian ? TEP_BIG_ENDIAN : TEP_LITTLE_ENDIAN);
  tep_set_local_bigendian(tep, TEP_LITTLE_ENDIAN);
  tep_set_long_size(tep, static_cast<int>(metadata.long_size));
  tep_set_page_size(tep, static_cast<int>(metadata.page_size));
  if (Result<std::vector<FieldFormat>> hp = ParseHeaderPage(metadata.header_page); !hp.ok()) {
    impl->warnings.push_back(src + ": " + hp.error().message);
  } else {
    std::string text = metadata.header_page;
    tep_parse_header_page(tep, text.data(), static_cast<unsigned long>(text.size()),
                          static_cast<int>(metadata.long_size));
  }
  impl->source = src;
  impl->source_formats = metadata.formats.size();
  return impl;
}

// The rest of Create, once the events are known (|by_id| sized): symbols
// (|built| from the kallsyms by TepSymbols::Build; null when it refused
// them), printk formats, comms, scratch.
void EventDecoder::Impl::Finish(const TraceMetadata& metadata, const TepSymbols* built) {
  if (!metadata.kallsyms.empty()) {
    kernel_symbols = built;
    if (built != nullptr) {
      built->Install(tep);
    } else {
      tep_parse_kallsyms(tep, metadata.kallsyms.c_str());
    }
  }
  if (!metadata.printk_formats.empty()) {
    std::lock_guard<std::mutex> lock(ParserMutex());
    LoadPrintkFormats(tep, metadata.printk_formats);
  }
  LoadCmdlines(tep, metadata.cmdlines);
  symbols = std::make_unique<SymbolCache>(tep);
  scratch.Allocate(kScratchSize);
  trace_seq_init(&seq);
}

Result<std::unique_ptr<EventDecoder>> EventDecoder::Create(const TraceMetadata& metadata) {
  Result<std::unique_ptr<Impl>> made = Impl::New(metadata);
  if (!made.ok()) return made.error();
  std::unique_ptr<Impl> impl = std::move(*made);
  // The kallsyms table is built on a second thread while this one reads the
  // formats' ids (LazyFormats: each format is parsed on its event's first
  // use). The table was 98 M instructions of `hvtrace report` on
  // bench/large.dat (callgrind), before its first record.
  auto build = [&metadata] {
    std::unique_ptr<TepSymbols> built;
    if (!metadata.kallsyms.empty()) built = TepSymbols::Build(metadata.kallsyms);
    return built;
  };
  std::future<std::unique_ptr<TepSymbols>> symbols;
  // A second thread pays for itself on a kernel's symbols, not on the
  // handful of a panic's crash summary (~0.3 ms to start and join one).
  constexpr size_t kKallsymsForAThread = 256 << 10;
  if (metadata.kallsyms.size() > kKallsymsForAThread) {
    try {
      symbols = std::async(std::launch::async, build);
    } catch (const std::system_error&) {
      // No thread to be had (a process at its limit): all of it here.
    }
  }
  impl->formats = std::make_unique<LazyFormats>(metadata.formats);
  impl->create_warnings_at = impl->warnings.size();
  impl->own_symbols = symbols.valid() ? symbols.get() : build();
  impl->by_id.assign(impl->formats->id_limit(), nullptr);
  impl->Finish(metadata, impl->own_symbols.get());
  impl->formats->StartBackground();
  return std::unique_ptr<EventDecoder>(new EventDecoder(std::move(impl)));
}

Result<std::unique_ptr<EventDecoder>> EventDecoder::CreateFollower(const EventDecoder& leader,
                                                                   const TraceMetadata& metadata) {
  Result<std::unique_ptr<Impl>> made = Impl::New(metadata);
  if (!made.ok()) return made.error();
  std::unique_ptr<Impl> impl = std::move(*made);
  const Impl& theirs = *leader.impl_;
  impl->leader = &theirs;
  impl->leader_formats = &metadata.formats;
  impl->fast_paths = theirs.fast_paths;
  impl->by_id.assign(theirs.by_id.size(), nullptr);
  impl->Finish(metadata, theirs.kernel_symbols);
  return std::unique_ptr<EventDecoder>(new EventDecoder(std::move(impl)));
}

bool EventDecoder::PrepareText(DecodedRecord* record) {
  Impl& m = *impl_;
  const Impl::Head head = m.ReadHead(record->payload);
  EventInfo* info = head.size >= 2 ? m.Event(head.id) : nullptr;
  if (info != nullptr && !info->loaded) m.Load(info);
  if (info == nullptr || (info->event == nullptr && !info->raw_only)) return false;
  if (record->comm == nullptr) record->comm = m.Comm(head.pid);
  return info->in_order;
}

void EventDecoder::PrepareJson(DecodedRecord* record) {
  Impl& m = *impl_;
  const Impl::Head head = m.ReadHead(record->payload);
  // The leader parses the format on first use; its followers copy it.
  if (head.size >= 2) m.Event(head.id);
  if (record->comm != nullptr) return;
  record->comm = m.Comm(head.size >= 8 ? head.pid : 0);  // AppendJson's pid.
}

const std::vector<std::string>& EventDecoder::warnings() const {
  Impl& m = *impl_;
  if (m.formats == nullptr) return m.warnings;
  // The formats' own warnings need every format parsed (most of them in
  // the background by now), in the place Create used to give them.
  m.formats->Complete();
  const std::vector<std::string> of_formats = m.formats->Warnings(m.source);
  const auto at = m.warnings.begin() + static_cast<std::ptrdiff_t>(m.create_warnings_at);
  m.all_warnings.assign(m.warnings.begin(), at);
  m.all_warnings.insert(m.all_warnings.end(), of_formats.begin(), of_formats.end());
  m.all_warnings.insert(m.all_warnings.end(), at, m.warnings.end());
  return m.all_warnings;
}

void EventDecoder::UpdateComms(std::string_view text) {
  // tep_override_comm frees the old string the comm cache may point at.
  std::fill(impl_->comm_cache.begin(), impl_->comm_cache.end(), Impl::CommEntry{});
  std::unordered_set<long> seen;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string line(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    char* after = nullptr;
    const long pid = std::strtol(line.c_str(), &after, 10);
    if (after == line.c_str() || *after != ' ' || after[1] == '\0' || pid < 0 || pid > INT32_MAX)
      continue;
    if (!seen.insert(pid).second) continue;
    tep_override_comm(impl_->tep, after + 1, static_cast<int>(pid));
  }
}

const EventFormat* EventDecoder::FindFormat(uint32_t id) const {
  // A leader parses the format on first use; a follower has only those of
  // the events it printed.
  EventInfo* info = impl_->formats != nullptr ? impl_->Event(id) : impl_->Find(id);
  return info ? &info->format : nullptr;
}

std::vector<bool> EventDecoder::TrialParseAll() {
  std::vector<bool> out(impl_->source_formats, false);
  if (impl_->formats != nullptr) {
    impl_->formats->Complete();
    for (auto [id, index] : impl_->formats->Defined()) impl_->Event(id);
  }
  for (const EventInfo* info : impl_->by_id) {
    if (info == nullptr || info->loaded) continue;
    // Per format, not for the whole run (~1,800 formats): another decoder's
    // Load (a panic's crash summary) waits only for one of them. The lock
    // matters when the child is forked: libtraceevent's statics are then
    // copied as no other thread is using them.
    std::lock_guard<std::mutex> lock(ParserMutex());
    out[info->source_index] = impl_->Trial(info->format.id).empty();
  }
  if (!impl_->keep_trial_child && impl_->trials != nullptr) impl_->trials->End();
  return out;
}

void EventDecoder::KeepTrialChild(bool keep) {
  std::lock_guard<std::mutex> lock(ParserMutex());
  impl_->keep_trial_child = keep;
  if (!keep && impl_->trials != nullptr) impl_->trials->End();
}

void EventDecoder::SetFastPathsEnabled(bool enabled) { impl_->fast_paths = enabled; }
uint64_t EventDecoder::fast_path_count() const { return impl_->fast_count; }
uint64_t EventDecoder::slow_path_count() const { return impl_->slow_count; }

void EventDecoder::AppendText(const DecodedRecord& record, std::string* out) {
  Impl& m = *impl_;
  size_t line_start = out->size();
  if (record.missed_events > 0) {
    out->append("CPU:");
    AppendInt(out, record.cpu);
    out->append(" [");
    AppendInt(out, record.missed_events);
    out->append(" EVENTS DROPPED]\n");
  } else if (record.missed_events < 0) {
    out->append("CPU:");
    AppendInt(out, record.cpu);
    out->append(" [EVENTS DROPPED]\n");
  }
  uint32_t size = m.Stage(record.payload);
  uint32_t id = size >= 2 ? m.ReadU16(0) : 0;
  EventInfo* info = size >= 2 ? m.Event(id) : nullptr;
  if (info != nullptr && !info->loaded) m.Load(info);
  if (info == nullptr || (info->event == nullptr && !info->raw_only)) {
    // tep_print_event() prints this for each part of the line when it has no
    // event for the record (trace-read.c, trace_show_data).
    out->append("[UNKNOWN EVENT][UNKNOWN EVENT] (NULL):               [UNKNOWN EVENT]\n");
    m.Unstage(size);
    m.slow_count++;
    return;
  }
  int pid = m.ReadS32(4);
  const bool prefix_plain =
      m.prefix->Append(record.comm != nullptr ? record.comm : m.Comm(pid), pid, record.cpu,
                       record.timestamp, m.Latency(*info, size), out);
  out->append(info->name_column);
  size_t info_start = out->size();
  bool printed_fast = false;
  if (size < info->min_size) {
    // libtraceevent trusts the record to hold its fields (an open-ended
    // field is copied with length size - offset, negative here), so a short
    // record is never handed to it. The kernel never writes one.
    out->append("[short record: ");
    AppendInt(out, size);
    out->append(" bytes, format needs ");
    AppendInt(out, info->min_size);
    out->append("]");
  } else if (const char* hazard = info->PrintHazard(m.scratch.data(), m.little_endian)) {
    // libtraceevent would die of SIGFPE or read past the record (format.h);
    // the fields are printed by our own bounded reader instead.
    out->append("[");
    out->append(hazard);
    out->append("]");
    for (const FieldFormat& f : info->format.fields) {
      if (f.is_common) continue;
      out->append(" ");
      out->append(f.name);
      out->append("=");
      AppendJsonFieldValue(out, f, m.scratch.data(), size, m.little_endian);
    }
    m.slow_count++;
  } else if (m.fast_paths && info->printer != nullptr) {
    info->printer->Print(m.scratch.data(), size, out);
    printed_fast = true;
    m.fast_count++;
  } else {
    tep_record rec{};
    rec.ts = record.timestamp;
    rec.cpu = static_cast<int>(record.cpu);
    rec.data = m.scratch.data();
    rec.size = static_cast<int>(size);
    rec.record_size = static_cast<int>(size);
    rec.missed_events = record.missed_events;
    trace_seq_reset(&m.seq);
    tep_print_event(m.tep, &m.seq, &rec, "%s", TEP_PRINT_INFO);
    out->append(m.seq.buffer, m.seq.len);
    m.slow_count++;
  }
  m.Unstage(size);
  // trace-cmd writes the line with "%.*s", so it ends at an embedded NUL, and
  // it drops one trailing newline before adding its own. Compiled printers
  // never emit a NUL (their strings stop at one), so only libtraceevent's
  // text is scanned.
  if (!printed_fast) {
    size_t nul = out->find('\0', info_start);
    if (nul != std::string::npos) out->resize(nul);
  }
  // Nothing the guest wrote reaches a terminal raw (escapes, C1 controls,
  // invalid UTF-8 as \xNN); trace-cmd prints the same bytes raw. A line
  // whose prefix and name column are printable ASCII (known per task and
  // per format) is scanned from its event text on: the bytes before are
  // left as they are either way, and no UTF-8 sequence spans the ASCII
  // column's end. Scanning them too was ~40 % of the scan's 177 M
  // instructions on bench/large.dat (callgrind).
  // A compiled printer that prints only numbers and plain literals (the
  // syscall events: 88 % of bench/large.dat's records) needs no scan at all
  // (80 instructions per record, callgrind).
  const bool head_plain = prefix_plain && info->name_plain;
  if (!(head_plain && printed_fast && info->printer->plain())) {
    MakePrintableFrom(out, head_plain ? info_start : line_start);
  }
  if (out->size() > line_start && out->back() == '\n') out->pop_back();
  out->push_back('\n');
}

void EventDecoder::AppendJson(const DecodedRecord& record, std::string* out) {
  Impl& m = *impl_;
  uint32_t size = m.Stage(record.payload);
  uint32_t id = size >= 2 ? m.ReadU16(0) : 0;
  EventInfo* info = size >= 2 ? m.Event(id) : nullptr;
  int pid = size >= 8 ? m.ReadS32(4) : 0;
  out->append("{\"cpu\":");
  AppendInt(out, record.cpu);
  out->append(",\"ts_ns\":");
  AppendInt(out, record.timestamp);
  if (info == nullptr) {
    out->append(",\"event\":null,\"id\":");
    AppendInt(out, id);
  } else {
    out->append(",\"event\":");
    AppendJsonString(out, info->format.name);
    out->append(",\"system\":");
    AppendJsonString(out, info->format.system);
  }
  out->append(",\"pid\":");
  AppendInt(out, pid);
  out->append(",\"comm\":");
  AppendJsonString(out, record.comm != nullptr ? record.comm : m.Comm(pid));
  if (record.missed_events != 0) {
    out->append(",\"missed_events\":");
    AppendInt(out, record.missed_events);
  }
  if (info != nullptr) {
    out->append(",\"fields\":{");
    bool first = true;
    for (const FieldFormat& f : info->format.fields) {
      if (f.is_common) continue;
      if (!first) out->push_back(',');
      first = false;
      AppendJsonString(out, f.name);
      out->push_back(':');
      AppendJsonFieldValue(out, f, m.scratch.data(), size, m.little_endian);
    }
    out->push_back('}');
  }
  out->append("}\n");
  m.Unstage(size);
}

}  // namespace hvtrace
