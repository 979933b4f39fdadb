// trace.dat options (v6 and v7) and v7 sections (see the layout in
// tracedat.cc): a v7 file is a chain of options sections that point at the
// header, format, kallsyms, printk and cmdlines sections and, through BUFFER
// options, at the flyrecord data. Sections are read through
// TraceDat::Impl::Read like everything else, and decompressed with the sizes
// checked against the caps.
#include <charconv>
#include <future>
#include <set>
#include <system_error>
#include <utility>

#include "tracedat_impl.h"

namespace hvtrace {

void TraceDat::Impl::ParseOption(uint16_t id, std::span<const std::byte> data,
                                 uint64_t option_offset) {
  auto text = [&] {
    std::string s(reinterpret_cast<const char*>(data.data()),
                  std::min(data.size(), kMaxStringSize));
    return s.substr(0, s.find('\0'));
  };
  switch (id) {
    case kOptTraceClock:
      if (trace_clock.empty()) trace_clock = SelectedClock(text());
      break;
    case kOptOffset: {
      std::string s = text();
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc() && ptr != s.data()) {
        timestamp_offset = v;
      } else {
        Issue(-1, option_offset, "OFFSET option '" + s.substr(0, 40) + "' is not a number");
      }
      break;
    }
    default:
      break;  // Options we do not need are skipped, as the format intends.
  }
}

bool TraceDat::Impl::ReadSection(uint64_t offset, uint16_t want_id, std::vector<std::byte>* body,
                                 uint16_t* flags_out, ParseError* err) {
  uint8_t raw[16];
  if (!Read(offset, raw, sizeof(raw))) {
    *err = {offset, "section header past the end of the file"};
    return false;
  }
  uint16_t id, flags;
  uint64_t size;
  std::memcpy(&id, raw, 2);
  std::memcpy(&flags, raw + 2, 2);
  std::memcpy(&size, raw + 8, 8);
  if (id != want_id) {
    *err = {offset, "section id " + std::to_string(id) + ", expected " + std::to_string(want_id)};
    return false;
  }
  if (flags_out) *flags_out = flags;
  const uint64_t data_at = offset + 16;
  if (size > file_size - data_at) {
    *err = {offset, "section size " + std::to_string(size) + " runs past the end of the " +
                        std::to_string(file_size) + "-byte file"};
    return false;
  }
  if (!(flags & kSectionCompressed)) {
    return ReadBlob(data_at, size, kMaxSectionSize, body, err, "section");
  }
  uint32_t sizes[2];
  if (size < 8 || !Read(data_at, sizes, sizeof(sizes))) {
    *err = {data_at, "compressed section header past the end of the file"};
    return false;
  }
  if (uint64_t{sizes[0]} + 8 > size) {
    *err = {data_at, "compressed size " + std::to_string(sizes[0]) + " exceeds section size " +
                         std::to_string(size)};
    return false;
  }
  std::vector<std::byte> packed;
  if (!ReadBlob(data_at + 8, sizes[0], kMaxSectionSize, &packed, err, "compressed section")) {
    return false;
  }
  auto out = Decompress(compression, packed, sizes[1], kMaxSectionSize);
  if (!out.ok()) {
    *err = {data_at, "section: " + out.error().message};
    return false;
  }
  *body = std::move(out.value());
  return true;
}

void TraceDat::Impl::ParseBufferOptionV7(std::span<const std::byte> data, uint64_t option_offset) {
  MemCursor c(data, option_offset);
  ParseError err;
  uint64_t section = 0;
  std::string name, clock;
  uint32_t buffer_page_size = 0, count = 0;
  if (!c.Int(&section, &err, "buffer section") || !c.CString(&name, &err, "buffer name") ||
      !c.CString(&clock, &err, "buffer clock") ||
      !c.Int(&buffer_page_size, &err, "buffer page size") || !c.Int(&count, &err, "cpu count")) {
    Issue(-1, err.offset, "BUFFER option: " + err.what);
    return;
  }
  if (!name.empty()) {
    instances.push_back(name);
    return;
  }
  if (have_top_buffer) {
    Issue(-1, option_offset, "second BUFFER option for the top instance ignored");
    return;
  }
  have_top_buffer = true;
  if (!clock.empty()) trace_clock = SelectedClock(clock);
  if (buffer_page_size != page_size) {
    Issue(-1, option_offset,
          "BUFFER page size " + std::to_string(buffer_page_size) + " differs from the file's " +
              std::to_string(page_size) + "; using the file's");
  }
  if (count > kMaxCpus || count > c.remaining() / 20) {
    Issue(-1, c.file_offset() - 4, "BUFFER CPU count " + std::to_string(count) + " is absurd");
    return;
  }
  uint16_t flags = 0;
  uint8_t raw[16];
  if (Read(section, raw, sizeof(raw))) {
    uint16_t id;
    std::memcpy(&id, raw, 2);
    std::memcpy(&flags, raw + 2, 2);
    if (id != kOptBuffer) {
      Issue(-1, section, "flyrecord section id " + std::to_string(id) + ", expected 3");
    }
  } else {
    Issue(-1, section, "flyrecord section header past the end of the file");
  }
  data_compressed = (flags & kSectionCompressed) != 0;
  if (data_compressed && compression == "none") {
    Issue(-1, section, "compressed flyrecord data in a file without a compression algorithm");
  }
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < count; ++i) {
    TraceDatCpu cpu;
    if (!c.Int(&cpu.cpu, &err, "cpu id") || !c.Int(&cpu.offset, &err, "cpu offset") ||
        !c.Int(&cpu.size, &err, "cpu size")) {
      Issue(-1, err.offset, "BUFFER option: " + err.what);
      return;
    }
    if (!seen.insert(cpu.cpu).second) {
      Issue(static_cast<int>(cpu.cpu), option_offset, "CPU listed twice; second entry ignored");
      continue;
    }
    cpus.push_back(cpu);
  }
}

Status TraceDat::Impl::ParseV7(uint64_t pos) {
  std::vector<std::byte> head;
  ParseError err;
  const uint64_t want = std::min<uint64_t>(file_size - pos, 2 * kMaxStringSize + 8);
  if (!ReadBlob(pos, want, want, &head, &err, "compression header")) return Fail(err);
  MemCursor c(head, pos);
  std::string algorithm, algorithm_version;
  uint64_t options = 0;
  if (!c.CString(&algorithm, &err, "compression name") ||
      !c.CString(&algorithm_version, &err, "compression version") ||
      !c.Int(&options, &err, "options offset")) {
    return Fail(err);
  }
  if (algorithm != "none" && algorithm != "zstd" && algorithm != "zlib") {
    return Error{Where(pos) + ": unsupported compression '" + algorithm.substr(0, 32) + "'"};
  }
  compression = algorithm;

  // Section offsets found in the options, parsed after the options walk.
  uint64_t header_info = 0, ftrace = 0, events = 0, ksyms = 0, printk = 0, cmdl = 0;
  std::set<uint64_t> visited;
  for (uint32_t n = 0; options != 0; ++n) {
    if (n >= kMaxOptionsSections || !visited.insert(options).second) {
      Issue(-1, options, "options sections loop or too many; stopped");
      break;
    }
    std::vector<std::byte> body;
    if (!ReadSection(options, kOptDone, &body, nullptr, &err)) {
      if (n == 0) return Fail(err);
      Issue(-1, err.offset, "options section: " + err.what);
      break;
    }
    MemCursor oc(body, options + 16);
    uint64_t next = 0;
    while (!oc.at_end()) {
      uint16_t id = 0;
      uint32_t size = 0;
      std::span<const std::byte> data;
      const uint64_t at = oc.file_offset();
      if (!oc.Int(&id, &err, "option id") || !oc.Int(&size, &err, "option size") ||
          !oc.Bytes(size, &data, &err, "option")) {
        Issue(-1, err.offset, "options section: " + err.what);
        break;
      }
      uint64_t value = 0;
      if (size >= 8) std::memcpy(&value, data.data(), 8);
      switch (id) {
        case kOptDone:
          next = value;
          break;
        case kOptHeaderInfo:
          header_info = value;
          break;
        case kOptFtraceEvents:
          ftrace = value;
          break;
        case kOptEventFormats:
          events = value;
          break;
        case kOptKallsyms:
          ksyms = value;
          break;
        case kOptPrintk:
          printk = value;
          break;
        case kOptCmdlines:
          cmdl = value;
          break;
        case kOptBuffer:
          ParseBufferOptionV7(data, at + 6);
          break;
        default:
          ParseOption(id, data, at);
          break;
      }
      if (id == kOptDone) break;
    }
    options = next;
  }

  if (header_info == 0) return Error{Where(0) + ": no HEADER_INFO option"};
  if (Status s = ReadMetadataSections(header_info, ftrace, events, ksyms, printk, cmdl); !s.ok())
    return s;
  if (!have_top_buffer) Issue(-1, 0, "no BUFFER option for the top instance: no trace data");
  return {};
}

// Parsed in the order of a v6 file's; a reader of pages needs none of them
// (OpenPages). The kallsyms section (5.4 of bench/large.dat's 7.4 MB of
// metadata, ~2/3 of Open's 65 M instructions, callgrind) is read,
// decompressed and copied out on a thread of its own while this one does
// the others; its issue, if any, still goes in its place in the list.
Status TraceDat::Impl::ReadMetadataSections(uint64_t header_info, uint64_t ftrace, uint64_t events,
                                            uint64_t ksyms, uint64_t printk, uint64_t cmdl) {
  ParseError err;
  std::vector<std::byte> body;
  if (!ReadSection(header_info, kOptHeaderInfo, &body, nullptr, &err)) return Fail(err);
  {
    MemCursor hc(body, header_info + 16);
    if (!ParseHeaderInfo(hc, &err)) return Fail(err);
  }
  // The rest is optional: a bad section is an issue, the file stays usable.
  if (pages_only) ftrace = events = ksyms = printk = cmdl = 0;
  if (!symbols) ksyms = printk = 0;
  struct Text {
    bool ok = false;
    std::string text;
    ParseError err;
  };
  // ReadSection and ParseSizedText read the file and their arguments only.
  auto read_kallsyms = [this, ksyms] {
    Text t;
    std::vector<std::byte> b;
    if (!ReadSection(ksyms, kOptKallsyms, &b, nullptr, &t.err)) return t;
    MemCursor sc(b, ksyms + 16);
    t.ok = ParseSizedText(sc, 4, &t.text, &t.err, "kallsyms");
    return t;
  };
  std::future<Text> kallsyms_read;
  if (ksyms != 0) {
    try {
      kallsyms_read = std::async(std::launch::async, read_kallsyms);
    } catch (const std::system_error&) {
      // No thread to be had: read in its place below.
    }
  }
  auto optional = [&](uint64_t offset, uint16_t id, const char* what, auto&& parse) {
    if (offset == 0) return;
    std::vector<std::byte> b;
    ParseError e;
    if (!ReadSection(offset, id, &b, nullptr, &e)) {
      Issue(-1, e.offset, std::string(what) + ": " + e.what);
      return;
    }
    MemCursor sc(b, offset + 16);
    if (!parse(sc, &e)) Issue(-1, e.offset, std::string(what) + ": " + e.what);
  };
  optional(ftrace, kOptFtraceEvents, "ftrace formats",
           [&](MemCursor& sc, ParseError* e) { return ParseFtraceFormats(sc, e); });
  optional(events, kOptEventFormats, "event formats",
           [&](MemCursor& sc, ParseError* e) { return ParseEventFormats(sc, e); });
  if (ksyms != 0) {
    Text t = kallsyms_read.valid() ? kallsyms_read.get() : read_kallsyms();
    if (t.ok) {
      kallsyms = std::move(t.text);
    } else {
      Issue(-1, t.err.offset, "kallsyms: " + t.err.what);
    }
  }
  optional(printk, kOptPrintk, "printk formats", [&](MemCursor& sc, ParseError* e) {
    return ParseSizedText(sc, 4, &printk_formats, e, "printk formats");
  });
  optional(cmdl, kOptCmdlines, "cmdlines", [&](MemCursor& sc, ParseError* e) {
    return ParseSizedText(sc, 8, &cmdlines, e, "cmdlines");
  });
  return {};
}

}  // namespace hvtrace
