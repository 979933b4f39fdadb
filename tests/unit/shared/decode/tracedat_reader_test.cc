#include <event-parse.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"

// trace-cmd.h pulls in tracefs.h, which does not compile as C++; declare the
// few libtracecmd calls used here (trace-cmd.h, libtracecmd 1.3).
extern "C" {
struct tracecmd_input;
tracecmd_input* tracecmd_open(const char* file, int flags);
void tracecmd_close(tracecmd_input* handle);
tep_record* tracecmd_read_cpu_first(tracecmd_input* handle, int cpu);
tep_record* tracecmd_read_data(tracecmd_input* handle, int cpu);
void tracecmd_free_record(tep_record* record);
}
constexpr int kTracecmdNoPlugins = 1 << 0;        // TRACECMD_FL_LOAD_NO_PLUGINS
constexpr int kTracecmdNoSystemPlugins = 1 << 1;  // TRACECMD_FL_LOAD_NO_SYSTEM_PLUGINS

// libtracecmd's own leak is suppressed for LeakSanitizer in
// tests/unit/lsan_suppressions.cc.
namespace hvtrace {
namespace {

using Bytes = std::vector<std::byte>;

std::string Fixture(const std::string& name) {
  return std::string(HVTRACE_FIXTURES_DIR) + "/" + name;
}

Bytes ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  std::string s = out.str();
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

template <typename T>
T Get(const Bytes& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}
template <typename T>
void Set(Bytes& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}
size_t Find(const Bytes& b, std::string_view needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end(),
                        [](std::byte x, char y) { return x == static_cast<std::byte>(y); });
  return it == b.end() ? std::string::npos : static_cast<size_t>(it - b.begin());
}

// Per CPU id: time stamps of every record, in order.
using Times = std::map<uint32_t, std::vector<uint64_t>>;

struct OurRead {
  Times times;
  std::map<uint32_t, std::vector<std::string>> payloads;
  PageStats stats;
};

OurRead ReadOurs(TraceDat& dat) {
  OurRead out;
  auto layout = PageLayout::FromHeaderPage(dat.header_page(), dat.page_size());
  EXPECT_TRUE(layout.ok()) << layout.error().message;
  if (!layout.ok()) return out;
  for (size_t i = 0; i < dat.cpus().size(); ++i) {
    const uint32_t cpu = dat.cpus()[i].cpu;
    auto& times = out.times[cpu];
    auto& payloads = out.payloads[cpu];
    Status s = dat.ForEachPage(i, [&](std::span<const std::byte> page, uint64_t) {
      EXPECT_EQ(page.size(), dat.page_size());
      WalkPage(page, *layout, &out.stats, [&](const RawRecord& rec) {
        times.push_back(rec.timestamp + static_cast<uint64_t>(dat.timestamp_offset()));
        payloads.emplace_back(reinterpret_cast<const char*>(rec.payload.data()),
                              rec.payload.size());
      });
      return true;
    });
    EXPECT_TRUE(s.ok());
  }
  return out;
}

// libtracecmd's view of the same file: the oracle we did not write.
Times ReadLibtracecmd(const std::string& path, const std::vector<TraceDatCpu>& cpus) {
  Times out;
  tracecmd_input* handle =
      tracecmd_open(path.c_str(), kTracecmdNoPlugins | kTracecmdNoSystemPlugins);
  EXPECT_NE(handle, nullptr) << path;
  if (!handle) return out;
  for (const TraceDatCpu& cpu : cpus) {
    auto& times = out[cpu.cpu];
    for (tep_record* rec = tracecmd_read_cpu_first(handle, static_cast<int>(cpu.cpu)); rec;
         rec = tracecmd_read_data(handle, static_cast<int>(cpu.cpu))) {
      times.push_back(rec->ts);
      tracecmd_free_record(rec);
    }
  }
  tracecmd_close(handle);
  return out;
}

struct FixtureCase {
  const char* file;
  int version;
  const char* compression;
};

class RealTraceDatTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(RealTraceDatTest, AgreesWithLibtracecmd) {
  const FixtureCase& fc = GetParam();
  const std::string path = Fixture(fc.file);
  auto dat = TraceDat::Open(path);
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_EQ(dat->version(), fc.version);
  EXPECT_EQ(dat->compression(), fc.compression);
  EXPECT_EQ(dat->data_compressed(), std::string(fc.compression) != "none");
  EXPECT_FALSE(dat->big_endian());
  EXPECT_EQ(dat->long_size(), 8u);
  EXPECT_EQ(dat->page_size(), 4096u);
  EXPECT_EQ(dat->trace_clock(), "local");
  EXPECT_NE(dat->header_page().find("commit"), std::string::npos);
  EXPECT_NE(dat->header_event().find("type_len"), std::string::npos);
  EXPECT_NE(dat->cmdlines().size(), 0u);
  EXPECT_NE(dat->printk_formats().size(), 0u);
  size_t ftrace = 0, sched_switch = 0;
  for (const FormatText& f : dat->formats()) {
    if (f.system == "ftrace") ++ftrace;
    if (f.system == "sched" && f.text.find("name: sched_switch\n") != std::string::npos) {
      ++sched_switch;
    }
  }
  EXPECT_GT(ftrace, 5u);
  EXPECT_EQ(sched_switch, 1u);
  EXPECT_EQ(dat->cpus().size(), 2u);
  EXPECT_TRUE(dat->issues().empty()) << dat->issues()[0].message;

  OurRead ours = ReadOurs(*dat);
  EXPECT_TRUE(dat->issues().empty()) << dat->issues()[0].message;
  EXPECT_EQ(ours.stats.rejected_total(), 0u);
  Times theirs = ReadLibtracecmd(path, dat->cpus());
  size_t total = 0;
  for (const auto& [cpu, times] : theirs) {
    SCOPED_TRACE("cpu " + std::to_string(cpu));
    EXPECT_EQ(ours.times[cpu].size(), times.size());
    EXPECT_EQ(ours.times[cpu], times);
    for (size_t i = 1; i < ours.times[cpu].size(); ++i) {
      ASSERT_GE(ours.times[cpu][i], ours.times[cpu][i - 1]) << i;
    }
    total += times.size();
  }
  EXPECT_GT(total, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealTraceDatTest,
                         ::testing::Values(FixtureCase{"tracedat/real-v6.dat", 6, "none"},
                                           FixtureCase{"tracedat/real-v7.dat", 7, "none"},
                                           FixtureCase{"tracedat/real-v7-zstd.dat", 7, "zstd"},
                                           FixtureCase{"tracedat/instance-v7-zstd.dat", 7, "zstd"},
                                           FixtureCase{"fuzz/tracedat/tiny-v6.dat", 6, "none"},
                                           FixtureCase{"fuzz/tracedat/tiny-v7.dat", 7, "none"},
                                           FixtureCase{"fuzz/tracedat/tiny-v7-zstd.dat", 7,
                                                       "zstd"}));

TEST(TraceDatTest, VersionsAndCompressionHoldTheSameRecords) {
  auto v6 = TraceDat::Open(Fixture("tracedat/real-v6.dat"));
  auto v7 = TraceDat::Open(Fixture("tracedat/real-v7.dat"));
  auto zstd = TraceDat::Open(Fixture("tracedat/real-v7-zstd.dat"));
  ASSERT_TRUE(v6.ok() && v7.ok() && zstd.ok());
  OurRead a = ReadOurs(*v6), b = ReadOurs(*v7), c = ReadOurs(*zstd);
  EXPECT_EQ(a.times, b.times);
  EXPECT_EQ(a.times, c.times);
  EXPECT_EQ(a.payloads, b.payloads);
  EXPECT_EQ(a.payloads, c.payloads);
  EXPECT_EQ(v6->formats().size(), zstd->formats().size());
  EXPECT_EQ(v6->kallsyms(), zstd->kallsyms());
  EXPECT_EQ(v6->cmdlines(), zstd->cmdlines());
  EXPECT_GT(a.stats.pages_with_missed_events, 0u);  // The fixture overflowed.
}

TEST(TraceDatTest, InstancesAreListed) {
  auto dat = TraceDat::Open(Fixture("tracedat/instance-v7-zstd.dat"));
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  ASSERT_EQ(dat->instances().size(), 1u);
  EXPECT_EQ(dat->instances()[0], "hvfix");
}

TEST(TraceDatTest, OpenBufferReadsLikeOpen) {
  const std::string path = Fixture("tracedat/real-v7-zstd.dat");
  auto from_file = TraceDat::Open(path);
  auto from_memory = TraceDat::OpenBuffer(ReadBytes(path), "memory.dat");
  ASSERT_TRUE(from_file.ok() && from_memory.ok());
  EXPECT_EQ(from_memory->path(), "memory.dat");
  EXPECT_EQ(ReadOurs(*from_file).times, ReadOurs(*from_memory).times);
}

TEST(TraceDatTest, OpenPagesReadsThePagesOpenReads) {
  for (const char* name : {"tracedat/real-v6.dat", "tracedat/real-v7.dat",
                           "tracedat/real-v7-zstd.dat", "tracedat/instance-v7-zstd.dat"}) {
    SCOPED_TRACE(name);
    auto full = TraceDat::Open(Fixture(name));
    auto pages = TraceDat::OpenPages(Fixture(name));
    ASSERT_TRUE(full.ok() && pages.ok());
    OurRead a = ReadOurs(*full), b = ReadOurs(*pages);
    EXPECT_EQ(a.times, b.times);
    EXPECT_EQ(a.payloads, b.payloads);
    EXPECT_EQ(full->cpus().size(), pages->cpus().size());
    EXPECT_EQ(full->timestamp_offset(), pages->timestamp_offset());
    // v7 keeps the metadata sections apart; they are skipped.
    if (full->version() == 7) {
      EXPECT_TRUE(pages->kallsyms().empty());
      EXPECT_TRUE(pages->formats().empty());
    }
  }
}

TEST(TraceDatTest, OpenWithoutSymbolsReadsAllButTheSymbols) {
  for (const char* name : {"tracedat/real-v6.dat", "tracedat/real-v7.dat",
                           "tracedat/real-v7-zstd.dat", "tracedat/instance-v7-zstd.dat"}) {
    SCOPED_TRACE(name);
    auto full = TraceDat::Open(Fixture(name));
    auto lean = TraceDat::OpenWithoutSymbols(Fixture(name));
    ASSERT_TRUE(full.ok() && lean.ok());
    OurRead a = ReadOurs(*full), b = ReadOurs(*lean);
    EXPECT_EQ(a.times, b.times);
    EXPECT_EQ(a.payloads, b.payloads);
    ASSERT_EQ(full->formats().size(), lean->formats().size());
    for (size_t i = 0; i < full->formats().size(); ++i)
      EXPECT_EQ(full->formats()[i].text, lean->formats()[i].text);
    EXPECT_EQ(full->header_page(), lean->header_page());
    EXPECT_EQ(full->trace_clock(), lean->trace_clock());
    EXPECT_EQ(full->cmdlines(), lean->cmdlines());
    if (full->version() == 7) {
      EXPECT_FALSE(full->kallsyms().empty());
      EXPECT_TRUE(lean->kallsyms().empty());
      EXPECT_TRUE(lean->printk_formats().empty());
    }
  }
}

TEST(TraceDatTest, StopsWhenTheCallbackSaysSo) {
  auto dat = TraceDat::Open(Fixture("tracedat/real-v6.dat"));
  ASSERT_TRUE(dat.ok());
  int pages = 0;
  ASSERT_TRUE(dat->ForEachPage(0,
                               [&](std::span<const std::byte>, uint64_t) {
                                 ++pages;
                                 return false;
                               })
                  .ok());
  EXPECT_EQ(pages, 1);
  EXPECT_FALSE(dat->ForEachPage(2, [](std::span<const std::byte>, uint64_t) { return true; }).ok());
}

TEST(TraceDatTest, MissingFileNamesThePath) {
  auto dat = TraceDat::Open("/nonexistent/x.dat");
  ASSERT_FALSE(dat.ok());
  EXPECT_NE(dat.error().message.find("/nonexistent/x.dat"), std::string::npos);
}

// ---- A small v7 writer for crafted files --------------------------------

struct CraftedV7 {
  std::string compression = "none";  // none, zstd, zlib.
  bool compress_sections = false;
  size_t pages_per_chunk = 2;
  std::vector<std::vector<Bytes>> cpu_pages;  // Per CPU, its pages.
};

Bytes Pack(const std::string& algorithm, const Bytes& in) {
  Bytes out;
  if (algorithm == "zstd") {
    out.resize(ZSTD_compressBound(in.size()));
    out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
  } else {
    uLongf n = compressBound(static_cast<uLong>(in.size()));
    out.resize(n);
    compress2(reinterpret_cast<Bytef*>(out.data()), &n, reinterpret_cast<const Bytef*>(in.data()),
              static_cast<uLong>(in.size()), 6);
    out.resize(n);
  }
  return out;
}

void Append(Bytes& b, const void* p, size_t n) {
  const auto* s = static_cast<const std::byte*>(p);
  b.insert(b.end(), s, s + n);
}
template <typename T>
void AppendInt(Bytes& b, T v) {
  Append(b, &v, sizeof(v));
}
void AppendStr(Bytes& b, std::string_view s) {
  Append(b, s.data(), s.size());
  b.push_back(std::byte{0});
}

constexpr char kHeaderPage[] =
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";

// Offsets of interesting places in a crafted file, for tests that corrupt it.
struct CraftedLayout {
  size_t options_offset_field = 0;
  size_t header_section = 0;
  size_t first_options_section = 0;
  size_t done_option_value = 0;
  size_t buffer_cpu_count = 0;
  std::vector<size_t> cpu_data;  // Start of each CPU's data (chunk count).
};

Bytes BuildV7(const CraftedV7& spec, CraftedLayout* layout = nullptr) {
  CraftedLayout lay;
  Bytes f;
  Append(f, "\x17\x08\x44tracing", 10);
  AppendStr(f, "7");
  f.push_back(std::byte{0});
  f.push_back(std::byte{8});
  AppendInt<uint32_t>(f, 4096);
  AppendStr(f, spec.compression);
  AppendStr(f, spec.compression == "none" ? "" : "1");
  lay.options_offset_field = f.size();
  AppendInt<uint64_t>(f, 0);  // Patched below.

  auto section = [&](uint16_t id, const Bytes& body, bool compress) {
    size_t at = f.size();
    AppendInt<uint16_t>(f, id);
    AppendInt<uint16_t>(f, compress ? 1 : 0);
    AppendInt<uint32_t>(f, 0);
    if (compress) {
      Bytes packed = Pack(spec.compression, body);
      AppendInt<uint64_t>(f, packed.size() + 8);
      AppendInt<uint32_t>(f, static_cast<uint32_t>(packed.size()));
      AppendInt<uint32_t>(f, static_cast<uint32_t>(body.size()));
      Append(f, packed.data(), packed.size());
    } else {
      AppendInt<uint64_t>(f, body.size());
      Append(f, body.data(), body.size());
    }
    return at;
  };

  Bytes header;
  AppendStr(header, "header_page");
  AppendInt<uint64_t>(header, sizeof(kHeaderPage) - 1);
  Append(header, kHeaderPage, sizeof(kHeaderPage) - 1);
  AppendStr(header, "header_event");
  AppendInt<uint64_t>(header, 4);
  Append(header, "none", 4);
  lay.header_section = section(16, header, spec.compress_sections);

  // Trace data: section header, then each CPU's data (chunked when the file
  // is compressed).
  const bool chunked = spec.compression != "none";
  size_t flyrecord = f.size();
  AppendInt<uint16_t>(f, 3);
  AppendInt<uint16_t>(f, chunked ? 1 : 0);
  AppendInt<uint32_t>(f, 0);
  AppendInt<uint64_t>(f, 0);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& pages : spec.cpu_pages) {
    size_t start = f.size();
    lay.cpu_data.push_back(start);
    if (!chunked) {
      for (const Bytes& p : pages) Append(f, p.data(), p.size());
    } else {
      const size_t n = (pages.size() + spec.pages_per_chunk - 1) / spec.pages_per_chunk;
      AppendInt<uint32_t>(f, static_cast<uint32_t>(n));
      for (size_t c = 0; c < n; ++c) {
        Bytes raw;
        for (size_t i = c * spec.pages_per_chunk;
             i < std::min(pages.size(), (c + 1) * spec.pages_per_chunk); ++i) {
          Append(raw, pages[i].data(), pages[i].size());
        }
        Bytes packed = Pack(spec.compression, raw);
        AppendInt<uint32_t>(f, static_cast<uint32_t>(packed.size()));
        AppendInt<uint32_t>(f, static_cast<uint32_t>(raw.size()));
        Append(f, packed.data(), packed.size());
      }
    }
    // As trace-cmd: the size of chunked data leaves out the chunk count.
    ranges.push_back({start, f.size() - start - (chunked ? 4 : 0)});
  }
  Set<uint64_t>(f, flyrecord + 8, f.size() - flyrecord - 16);

  // Options: HEADER_INFO, BUFFER, DONE.
  Bytes opts;
  AppendInt<uint16_t>(opts, 16);
  AppendInt<uint32_t>(opts, 8);
  AppendInt<uint64_t>(opts, lay.header_section);
  Bytes buffer;
  AppendInt<uint64_t>(buffer, flyrecord);
  AppendStr(buffer, "");
  AppendStr(buffer, "local");
  AppendInt<uint32_t>(buffer, 4096);
  size_t count_in_buffer = buffer.size();
  AppendInt<uint32_t>(buffer, static_cast<uint32_t>(ranges.size()));
  for (size_t i = 0; i < ranges.size(); ++i) {
    AppendInt<uint32_t>(buffer, static_cast<uint32_t>(i));
    AppendInt<uint64_t>(buffer, ranges[i].first);
    AppendInt<uint64_t>(buffer, ranges[i].second);
  }
  AppendInt<uint16_t>(opts, 3);
  AppendInt<uint32_t>(opts, static_cast<uint32_t>(buffer.size()));
  size_t buffer_at = opts.size();
  Append(opts, buffer.data(), buffer.size());
  AppendInt<uint16_t>(opts, 0);
  AppendInt<uint32_t>(opts, 8);
  size_t done_at = opts.size();
  AppendInt<uint64_t>(opts, 0);
  lay.first_options_section = section(0, opts, false);
  lay.buffer_cpu_count = lay.first_options_section + 16 + buffer_at + count_in_buffer;
  lay.done_option_value = lay.first_options_section + 16 + done_at;
  Set<uint64_t>(f, lay.options_offset_field, lay.first_options_section);
  if (layout) *layout = lay;
  return f;
}

Bytes MakePage(uint64_t t0, int records) {
  Bytes page(4096);
  PageWriter w(page, PageLayout::Default(), t0);
  for (int i = 0; i < records; ++i) {
    Bytes payload(16, std::byte{static_cast<unsigned char>(i)});
    if (!w.Append(t0 + static_cast<uint64_t>(i) * 1000, payload)) break;
  }
  w.Finish();
  return page;
}

CraftedV7 TwoCpus(const std::string& compression, bool compress_sections = false) {
  CraftedV7 spec;
  spec.compression = compression;
  spec.compress_sections = compress_sections;
  for (int cpu = 0; cpu < 2; ++cpu) {
    std::vector<Bytes> pages;
    for (int p = 0; p < 5; ++p) pages.push_back(MakePage(1'000'000ull * (p + 1) + cpu, 10));
    spec.cpu_pages.push_back(pages);
  }
  return spec;
}

size_t CountRecords(TraceDat& dat, size_t cpu_index) {
  PageStats stats;
  auto layout = PageLayout::FromHeaderPage(dat.header_page(), dat.page_size());
  if (!layout.ok()) return 0;
  (void)dat.ForEachPage(cpu_index, [&](std::span<const std::byte> page, uint64_t) {
    WalkPage(page, *layout, &stats, [](const RawRecord&) {});
    return true;
  });
  return stats.records;
}

TEST(CraftedTraceDatTest, ReadsEveryCompression) {
  for (const char* algorithm : {"none", "zstd", "zlib"}) {
    for (bool compress_sections : {false, true}) {
      if (std::string(algorithm) == "none" && compress_sections) continue;
      SCOPED_TRACE(std::string(algorithm) + (compress_sections ? " +sections" : ""));
      auto dat = TraceDat::OpenBuffer(BuildV7(TwoCpus(algorithm, compress_sections)), "crafted");
      ASSERT_TRUE(dat.ok()) << dat.error().message;
      EXPECT_EQ(dat->compression(), algorithm);
      EXPECT_EQ(dat->header_page(), kHeaderPage);
      ASSERT_EQ(dat->cpus().size(), 2u);
      EXPECT_EQ(CountRecords(*dat, 0), 50u);
      EXPECT_EQ(CountRecords(*dat, 1), 50u);
      EXPECT_TRUE(dat->issues().empty()) << dat->issues()[0].message;
    }
  }
}

// ---- Hostile files --------------------------------------------------------

bool HasIssue(const TraceDat& dat, int cpu, std::string_view text) {
  for (const TraceDatIssue& i : dat.issues()) {
    if (i.cpu == cpu && i.message.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(TraceDatTest, Malicious_BadInitialHeader) {
  Bytes good = ReadBytes(Fixture("fuzz/tracedat/tiny-v7.dat"));
  auto expect_fail = [](Bytes b, std::string_view text) {
    auto dat = TraceDat::OpenBuffer(std::move(b), "bad.dat");
    ASSERT_FALSE(dat.ok());
    EXPECT_NE(dat.error().message.find("bad.dat"), std::string::npos) << dat.error().message;
    EXPECT_NE(dat.error().message.find(text), std::string::npos) << dat.error().message;
  };
  expect_fail({}, "magic");
  Bytes b = good;
  b[3] = std::byte{'X'};
  expect_fail(b, "magic");
  b = good;
  b[10] = std::byte{'9'};
  expect_fail(b, "version");
  b = good;
  b[12] = std::byte{1};
  expect_fail(b, "big-endian");
  b = good;
  b[13] = std::byte{3};
  expect_fail(b, "long size");
  b = good;
  Set<uint32_t>(b, 14, 0);
  expect_fail(b, "page size");
  b = good;
  Set<uint32_t>(b, 14, 0x80000000u);
  expect_fail(b, "page size");
  b = Bytes(good.begin(), good.begin() + 12);
  expect_fail(b, "endian");
}

TEST(TraceDatTest, Malicious_TruncatedFilesNeverCrashAndKeepGoodData) {
  for (const char* name :
       {"tracedat/real-v6.dat", "tracedat/real-v7.dat", "tracedat/real-v7-zstd.dat"}) {
    Bytes whole = ReadBytes(Fixture(name));
    for (size_t cut = 0; cut < whole.size(); cut += whole.size() / 97 + 1) {
      Bytes part(whole.begin(), whole.begin() + static_cast<long>(cut));
      auto dat = TraceDat::OpenBuffer(std::move(part), name);
      if (!dat.ok()) {
        EXPECT_NE(dat.error().message.find(name), std::string::npos);
        continue;
      }
      for (size_t i = 0; i < dat->cpus().size(); ++i) CountRecords(*dat, i);
    }
  }
  // Cut inside the last CPU's data: the other CPU is whole, this one partial,
  // and the problem is reported with its CPU.
  auto full = TraceDat::Open(Fixture("tracedat/real-v6.dat"));
  ASSERT_TRUE(full.ok());
  const size_t cpu0_records = CountRecords(*full, 0);
  const TraceDatCpu last = full->cpus()[1];
  Bytes whole = ReadBytes(Fixture("tracedat/real-v6.dat"));
  whole.resize(last.offset + last.size / 2 + 100);
  auto dat = TraceDat::OpenBuffer(std::move(whole), "cut.dat");
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_EQ(CountRecords(*dat, 0), cpu0_records);
  EXPECT_GT(CountRecords(*dat, 1), 0u);
  EXPECT_LT(CountRecords(*dat, 1), CountRecords(*full, 1));
  EXPECT_TRUE(HasIssue(*dat, 1, "truncated"));
  EXPECT_TRUE(HasIssue(*dat, 1, "partial page"));
}

TEST(TraceDatTest, Malicious_V6CpuOffsetsAndCounts) {
  Bytes good = ReadBytes(Fixture("tracedat/real-v6.dat"));
  const size_t options = Find(good, std::string_view("options  \0", 10));
  const size_t flyrecord = Find(good, std::string_view("flyrecord\0", 10));
  ASSERT_NE(options, std::string::npos);
  ASSERT_NE(flyrecord, std::string::npos);
  auto full = TraceDat::OpenBuffer(good, "good.dat");
  ASSERT_TRUE(full.ok());
  const size_t cpu0_records = CountRecords(*full, 0);

  Bytes b = good;  // CPU 1 data offset past the end of the file.
  Set<uint64_t>(b, flyrecord + 10 + 16, uint64_t{1} << 62);
  auto dat = TraceDat::OpenBuffer(b, "off.dat");
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_TRUE(HasIssue(*dat, 1, "past the end"));
  EXPECT_EQ(CountRecords(*dat, 0), cpu0_records);
  EXPECT_EQ(CountRecords(*dat, 1), 0u);

  b = good;  // CPU 0 size beyond the file (offset + size overflow too).
  Set<uint64_t>(b, flyrecord + 10 + 8, ~uint64_t{0});
  dat = TraceDat::OpenBuffer(b, "size.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_TRUE(HasIssue(*dat, 0, "claims"));

  for (uint32_t absurd : {0xffffffffu, 100000u, 9000u}) {
    b = good;
    Set<uint32_t>(b, options - 4, absurd);
    dat = TraceDat::OpenBuffer(b, "cpus.dat");
    ASSERT_FALSE(dat.ok());
    EXPECT_NE(dat.error().message.find("CPU count"), std::string::npos) << dat.error().message;
  }
}

TEST(TraceDatTest, Malicious_V7SectionsPointingPastTheEnd) {
  CraftedLayout lay;
  Bytes good = BuildV7(TwoCpus("zstd", true), &lay);
  Bytes b = good;
  Set<uint64_t>(b, lay.options_offset_field, good.size() + 5);
  auto dat = TraceDat::OpenBuffer(b, "opts.dat");
  ASSERT_FALSE(dat.ok());
  EXPECT_NE(dat.error().message.find("past the end"), std::string::npos) << dat.error().message;

  b = good;  // Header section size beyond the file.
  Set<uint64_t>(b, lay.header_section + 8, uint64_t{1} << 40);
  dat = TraceDat::OpenBuffer(b, "hdr.dat");
  EXPECT_FALSE(dat.ok());

  b = good;  // A later options section that does not exist: an issue only.
  Set<uint64_t>(b, lay.done_option_value, good.size() * 2);
  dat = TraceDat::OpenBuffer(b, "next.dat");
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_TRUE(HasIssue(*dat, -1, "options section"));
  EXPECT_EQ(CountRecords(*dat, 0), 50u);

  b = good;  // Options sections chained into a loop.
  Set<uint64_t>(b, lay.done_option_value, lay.first_options_section);
  dat = TraceDat::OpenBuffer(b, "loop.dat");
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  EXPECT_TRUE(HasIssue(*dat, -1, "loop"));
  EXPECT_EQ(dat->cpus().size(), 2u);

  b = good;  // Absurd CPU count in the BUFFER option.
  Set<uint32_t>(b, lay.buffer_cpu_count, 0xfffffff0u);
  dat = TraceDat::OpenBuffer(b, "cpus.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_TRUE(HasIssue(*dat, -1, "absurd"));
  EXPECT_TRUE(dat->cpus().empty());
}

TEST(TraceDatTest, Malicious_DecompressionBombsAndLyingSizes) {
  CraftedLayout lay;
  const Bytes good = BuildV7(TwoCpus("zstd"), &lay);
  // The first chunk of CPU 0: {count}{csize, usize, data}.
  const size_t usize_at = lay.cpu_data[0] + 8;
  for (uint32_t lie : {0xffffffffu, 8192u + 1, 4096u, 0u}) {
    SCOPED_TRACE(lie);
    Bytes b = good;
    Set<uint32_t>(b, usize_at, lie);
    auto dat = TraceDat::OpenBuffer(b, "bomb.dat");
    ASSERT_TRUE(dat.ok()) << dat.error().message;
    // The bad chunk (2 pages) is skipped, the rest of CPU 0 and all of CPU 1
    // are read.
    EXPECT_EQ(CountRecords(*dat, 0), 30u);
    EXPECT_EQ(CountRecords(*dat, 1), 50u);
    EXPECT_TRUE(HasIssue(*dat, 0, "chunk 0"));
  }
  Bytes b = good;  // Chunk count far beyond what the data can hold.
  Set<uint32_t>(b, lay.cpu_data[0], 0x7fffffffu);
  auto dat = TraceDat::OpenBuffer(b, "chunks.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_EQ(CountRecords(*dat, 0), 0u);
  EXPECT_TRUE(HasIssue(*dat, 0, "chunk count"));
  EXPECT_EQ(CountRecords(*dat, 1), 50u);

  b = good;  // Compressed size running past the CPU's data.
  Set<uint32_t>(b, lay.cpu_data[0] + 4, 0x7fffffffu);
  dat = TraceDat::OpenBuffer(b, "csize.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_EQ(CountRecords(*dat, 0), 0u);
  EXPECT_TRUE(HasIssue(*dat, 0, "past the CPU data"));

  b = good;  // Garbage compressed bytes.
  for (size_t i = 0; i < 16; ++i) b[lay.cpu_data[0] + 12 + i] = std::byte{0x5a};
  dat = TraceDat::OpenBuffer(b, "garbage.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_EQ(CountRecords(*dat, 0), 30u);
  EXPECT_TRUE(HasIssue(*dat, 0, "zstd"));

  // A real bomb: 64 MiB + 1 of zeros compresses to a few KiB; the cap refuses
  // it before allocating.
  CraftedV7 spec = TwoCpus("zstd");
  spec.pages_per_chunk = 16385;
  spec.cpu_pages[0].assign(16385, Bytes(4096));
  dat = TraceDat::OpenBuffer(BuildV7(spec), "zeros.dat");
  ASSERT_TRUE(dat.ok());
  EXPECT_EQ(CountRecords(*dat, 0), 0u);
  EXPECT_TRUE(HasIssue(*dat, 0, "cap"));
}

TEST(TraceDatTest, Malicious_CompressedSectionLies) {
  CraftedLayout lay;
  const Bytes good = BuildV7(TwoCpus("zlib", true), &lay);
  Bytes b = good;
  Set<uint32_t>(b, lay.header_section + 20, 0xffffffffu);  // Uncompressed size.
  auto dat = TraceDat::OpenBuffer(b, "lie.dat");
  ASSERT_FALSE(dat.ok());
  EXPECT_NE(dat.error().message.find("cap"), std::string::npos) << dat.error().message;
  b = good;
  Set<uint32_t>(b, lay.header_section + 20, 10);  // Smaller than the truth.
  dat = TraceDat::OpenBuffer(b, "small.dat");
  ASSERT_FALSE(dat.ok());
  b = good;
  Set<uint32_t>(b, lay.header_section + 16, 0x7fffffff);  // Compressed size.
  dat = TraceDat::OpenBuffer(b, "csize.dat");
  ASSERT_FALSE(dat.ok());
  EXPECT_NE(dat.error().message.find("csize.dat"), std::string::npos);
}

TEST(TraceDatTest, Malicious_RandomMutationsStayInBounds) {
  std::mt19937_64 rng(7);
  for (const char* name : {"fuzz/tracedat/tiny-v6.dat", "fuzz/tracedat/tiny-v7.dat",
                           "fuzz/tracedat/tiny-v7-zstd.dat"}) {
    const Bytes good = ReadBytes(Fixture(name));
    int opened = 0;
    for (int round = 0; round < 300; ++round) {
      Bytes b = good;
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < flips; ++i) b[rng() % b.size()] = static_cast<std::byte>(rng());
      auto dat = TraceDat::OpenBuffer(std::move(b), name);
      if (!dat.ok()) continue;
      ++opened;
      for (size_t i = 0; i < dat->cpus().size(); ++i) CountRecords(*dat, i);
    }
    EXPECT_GT(opened, 0) << name;
  }
}

}  // namespace
}  // namespace hvtrace
