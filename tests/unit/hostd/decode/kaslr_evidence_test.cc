#include "kaslr_evidence.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "boot_range_decode.h"
#include "hostd/decode/capture_pipeline_fixture.h"

namespace hvtrace::hostd {
namespace {

// The fixture's kallsyms with every core address moved by -|delta| (the
// harvest booted |delta| lower than the captured boot).
[[maybe_unused]] std::string Moved(const std::string& kallsyms, uint64_t delta) {
  std::string out;
  for (const std::string& line : Lines(kallsyms)) {
    if (line.size() < 17) continue;
    char hex[17];
    std::snprintf(
        hex, sizeof hex, "%016llx",
        static_cast<unsigned long long>(std::stoull(line.substr(0, 16), nullptr, 16) - delta));
    out += hex + line.substr(16) + "\n";
  }
  return out;
}

struct Fixture {
  std::vector<std::byte> region;
  KernelFormats formats;
  BootMap map;
};

Fixture Load(const std::string& dir) {
  Fixture f;
  f.region = Unzstd(dir + "/region.bin.zst");
  Result<KernelFormats> formats = KernelFormatsFromDirectory(dir);
  EXPECT_TRUE(formats.ok()) << formats.error().message;
  if (formats.ok()) f.formats = std::move(*formats);
  BootMapOptions options;
  options.layout = PageLayout::Default();
  Result<BootMap> map = ReadBootMap(f.region, options);
  EXPECT_TRUE(map.ok()) << map.error().message;
  if (map.ok()) f.map = std::move(*map);
  return f;
}

// Decodes |f|'s range into |dir| as every reader does (DecodeBootRange, with
// the fixture's formats given); returns the manifest's extra.boots.
json DecodeFixture(const Fixture& f, const fs::path& dir) {
  CaptureManifest manifest;
  DecodeBootRange(f.region, {.formats = std::make_shared<const KernelFormats>(f.formats)}, dir,
                  manifest);
  EXPECT_EQ(manifest.extra["formats"]["decoded"], true) << manifest.extra["formats"].dump(2);
  return manifest.extra.value("boots", json::array());
}

// The two-boot fixture: the guest kexec'ed into the same kernel, which
// appended to the buffer. Its kallsyms are the second boot's; the guest's own
// last_boot_info says the second boot ran 507510784 (0x1e400000) bytes above
// the first. Each boot's own evidence (the marker ip in tracing_mark_write,
// the keyboard tasklet's callback kbd_bh) finds exactly that.
TEST(KaslrEvidenceFixture, EachKexecBootGetsItsOwnOffset) {
  Fixture f = Load(kDir + "kexec");
  ASSERT_EQ(f.map.boots, 2u);
  const std::string meta = ReadText(kDir + "kexec/meta.json");
  ASSERT_NE(meta.find("text delta:\\t507510784"), std::string::npos);
  const int64_t want[] = {-507510784, 0};
  for (uint32_t b = 0; b < 2; ++b) {
    KaslrVerdict v = EstablishKaslr(f.map, b, f.formats, std::nullopt, false);
    std::printf("kexec fixture boot %u: %s\n", b, v.manifest.dump().c_str());
    EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
    EXPECT_EQ(v.delta, want[b]);
    EXPECT_EQ(v.manifest["evidence"]["marker_ip"], 1);
    EXPECT_EQ(v.manifest["evidence"]["function_pointer"], 1);
    // The same harvest from a boot 30 MiB lower: both deltas move with it.
    KernelFormats lower = f.formats;
    lower.kallsyms = Moved(f.formats.kallsyms, 0x1e00000);
    KaslrVerdict moved = EstablishKaslr(f.map, b, lower, std::nullopt, false);
    EXPECT_TRUE(moved.use_symbols) << moved.manifest.dump();
    EXPECT_EQ(moved.delta, want[b] + 0x1e00000);
  }
}

// Through the pipeline: every marker line of both boots names
// tracing_mark_write (the guest's own trace printed the second boot's raw),
// and the tasklet callback names kbd_bh in both.
TEST(KaslrEvidenceFixture, KexecFixtureNamesEveryMarkerInBothBoots) {
  Fixture f = Load(kDir + "kexec");
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("kaslr-evidence-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const json boots = DecodeFixture(f, dir);
  ASSERT_EQ(boots.size(), 2u);
  for (uint32_t b = 0; b < 2; ++b) {
    SCOPED_TRACE("boot " + std::to_string(b));
    CmdRun report = RunCommand("trace-cmd report -i '" +
                               (dir / boots[b]["file"].get<std::string>()).string() + "'");
    ASSERT_EQ(report.status, 0);
    size_t markers = 0, named = 0, kbd = 0;
    for (const std::string& line : Lines(report.out)) {
      if (line.find("hvtrace-marker-boot") != std::string::npos) {
        ++markers;
        if (line.find("tracing_mark_write: hvtrace-marker-boot" + std::to_string(b)) !=
            std::string::npos) {
          ++named;
        }
      }
      if (line.find("tasklet_entry:") != std::string::npos &&
          line.find("function=kbd_bh") != std::string::npos) {
        ++kbd;
      }
    }
    EXPECT_GT(markers, 0u);
    EXPECT_EQ(named, markers) << report.out.substr(0, 4000);
    EXPECT_EQ(kbd, 1u);
  }
  fs::remove_all(dir);
}

// The kallsyms of another build (tracing_mark_write and kbd_bh 0x40 further
// on): no offset explains the boots' values, so neither trace.dat carries
// symbols and trace-cmd prints raw addresses, never a wrong name.
TEST(KaslrEvidenceFixture, AnotherBuildsKallsymsPrintRawNeverWrong) {
  Fixture f = Load(kDir + "kexec");
  std::string other;
  for (const std::string& line : Lines(f.formats.kallsyms)) {
    if (line.size() < 17) continue;
    uint64_t addr = std::stoull(line.substr(0, 16), nullptr, 16);
    if (line.ends_with(" tracing_mark_write") || line.ends_with(" kbd_bh")) addr += 0x40;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(addr));
    other += hex + line.substr(16) + "\n";
  }
  f.formats.kallsyms = other;
  const fs::path dir = fs::path(::testing::TempDir()) / ("kaslr-other-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const json boots = DecodeFixture(f, dir);
  ASSERT_EQ(boots.size(), 2u);
  for (const json& boot : boots) {
    const std::string file = boot["file"];
    SCOPED_TRACE(file);
    EXPECT_EQ(boot["decoded_with"]["kaslr"]["raw"], true) << boot["decoded_with"].dump();
    Result<TraceDat> t = TraceDat::Open((dir / file).string());
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_TRUE(t->kallsyms().empty());
    CmdRun report = RunCommand("trace-cmd report -i '" + (dir / file).string() + "'");
    ASSERT_EQ(report.status, 0);
    EXPECT_EQ(report.out.find("tracing_mark_write"), std::string::npos);
    EXPECT_EQ(report.out.find("kbd_bh"), std::string::npos);
    EXPECT_NE(report.out.find(": hvtrace-marker-boot"), std::string::npos);
  }
  fs::remove_all(dir);
}

// --- Synthetic kernels -----------------------------------------------------

constexpr uint64_t kText = 0xffffffff9a800000ull;
constexpr uint64_t kTextSize = 16ull << 20;
constexpr int64_t kMiB2 = 2 << 20;

// A kallsyms like 6.12.95's: _stext/_etext 16 MiB apart, function starts on
// 16-byte slots with the harvest's density (~1 in 20), each with its __pfx_
// padding symbol 16 bytes before; |seed| picks another "build".
struct SyntheticKernel {
  std::string kallsyms;
  std::vector<uint64_t> starts;
};
SyntheticKernel MakeKernel(uint32_t seed, uint32_t period_slots = 0) {
  SyntheticKernel k;
  char line[96];
  std::snprintf(line, sizeof line, "%016llx T _stext\n", static_cast<unsigned long long>(kText));
  k.kallsyms += line;
  uint32_t x = seed;
  for (uint64_t slot = 2; slot < kTextSize / 16; ++slot) {
    x = x * 1664525u + 1013904223u;
    const bool start = period_slots != 0 ? slot % period_slots == 0 : (x >> 16) % 20 == 0;
    if (!start) continue;
    const uint64_t a = kText + slot * 16;
    k.starts.push_back(a);
    std::snprintf(line, sizeof line, "%016llx t __pfx_fn_%llu\n%016llx t fn_%llu\n",
                  static_cast<unsigned long long>(a - 16), static_cast<unsigned long long>(slot),
                  static_cast<unsigned long long>(a), static_cast<unsigned long long>(slot));
    k.kallsyms += line;
  }
  std::snprintf(line, sizeof line, "%016llx T _etext\n",
                static_cast<unsigned long long>(kText + kTextSize));
  k.kallsyms += line;
  return k;
}

constexpr const char* kHrtimerFormat =
    "name: hrtimer_expire_entry\nID: 100\nformat:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
    "\tfield:void * hrtimer;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\tfield:s64 now;\toffset:16;\tsize:8;\tsigned:1;\n"
    "\tfield:void * function;\toffset:24;\tsize:8;\tsigned:0;\n\n"
    "print fmt: \"hrtimer=%p function=%ps now=%llu\", REC->hrtimer, REC->function, REC->now\n";

// One boot whose hrtimer_expire_entry records carry |functions|.
struct SyntheticBoot {
  std::vector<std::vector<std::byte>> payloads;
  BootMap map;
  KernelFormats formats;
};
std::unique_ptr<SyntheticBoot> MakeBoot(const std::string& kallsyms,
                                        const std::vector<uint64_t>& functions) {
  auto b = std::make_unique<SyntheticBoot>();
  b->formats.kallsyms = kallsyms;
  CachedEventFormat ev;
  ev.system = "timer";
  ev.name = "hrtimer_expire_entry";
  ev.id = 100;
  ev.text = kHrtimerFormat;
  b->formats.events.push_back(ev);
  for (uint64_t fn : functions) {
    std::vector<std::byte> p(32);
    const uint16_t type = 100;
    std::memcpy(p.data(), &type, sizeof type);
    std::memcpy(p.data() + 24, &fn, sizeof fn);
    b->payloads.push_back(std::move(p));
  }
  b->map.boots = 1;
  b->map.layout = "linux-6.12";
  BootMapCpu cpu;
  for (const auto& p : b->payloads) cpu.records.push_back({0, 0, 0, p});
  b->map.cpu.push_back(std::move(cpu));
  return b;
}

std::vector<uint64_t> Shifted(const std::vector<uint64_t>& starts, std::vector<size_t> picks,
                              int64_t delta) {
  std::vector<uint64_t> out;
  for (size_t i : picks) out.push_back(starts.at(i) + static_cast<uint64_t>(delta));
  return out;
}

const SyntheticKernel& Kernel() {
  static const SyntheticKernel k = MakeKernel(1);
  return k;
}

TEST(KaslrEvidence, FourFunctionPointersProveTheOffset) {
  const int64_t delta = 13 * kMiB2;
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {100, 9000, 30000, 52000}, delta));
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, std::nullopt, false);
  EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
  EXPECT_EQ(v.delta, delta);
  EXPECT_EQ(v.manifest["source"], "evidence");
  EXPECT_EQ(v.manifest["evidence"]["function_pointer"], 4);
  EXPECT_LT(v.manifest["chance"].get<double>(), 1e-3);
  EXPECT_NE(v.manifest["runner_up"]["contradicted"], 0);
}

TEST(KaslrEvidence, OneFunctionPointerIsTooLittle) {
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {4242}, 7 * kMiB2));
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, std::nullopt, false);
  EXPECT_FALSE(v.use_symbols) << v.manifest.dump();
  EXPECT_EQ(v.manifest["raw"], true);
}

TEST(KaslrEvidence, NoEvidencePrintsRawEvenWithAMeta) {
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, {});
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, TextAddrDelta{0}, false);
  EXPECT_FALSE(v.use_symbols) << v.manifest.dump();
  EXPECT_NE(v.manifest["why"].get<std::string>().find("no evidence"), std::string::npos);
}

// Two function pointers alone leave ~2% for a coincidence; the meta's
// agreeing text_addr makes that enough, a disagreeing one does not.
TEST(KaslrEvidence, TheMetaAgreeingTipsTwoFunctionPointers) {
  const int64_t delta = -40 * kMiB2;
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {1234, 40000}, delta));
  KaslrVerdict alone = EstablishKaslr(b->map, 0, b->formats, std::nullopt, false);
  EXPECT_FALSE(alone.use_symbols) << alone.manifest.dump();
  KaslrVerdict agreeing = EstablishKaslr(b->map, 0, b->formats, TextAddrDelta{delta}, false);
  EXPECT_TRUE(agreeing.use_symbols) << agreeing.manifest.dump();
  EXPECT_EQ(agreeing.delta, delta);
  EXPECT_EQ(agreeing.manifest["meta_text_addr"], "agrees");
  KaslrVerdict stale =
      EstablishKaslr(b->map, 0, b->formats, TextAddrDelta{delta + 100 * kMiB2}, false);
  EXPECT_FALSE(stale.use_symbols) << stale.manifest.dump();
}

// 6.15+: the scratch area's _text is the newest boot's own. Alone (no value
// to check it against) it names the boot; one agreeing pointer confirms it;
// evidence that disagrees wins over it.
TEST(KaslrEvidence, TheScratchTextAddrIsThisBootsOwnUnlessContradicted) {
  const int64_t delta = 7 * kMiB2;
  const auto& k = Kernel();
  const TextAddrDelta scratch{delta, "scratch_text_addr", true};
  auto none = MakeBoot(k.kallsyms, {});
  KaslrVerdict alone = EstablishKaslr(none->map, 0, none->formats, scratch, false);
  EXPECT_TRUE(alone.use_symbols) << alone.manifest.dump();
  EXPECT_EQ(alone.delta, delta);
  EXPECT_EQ(alone.manifest["source"], "scratch_text_addr");
  EXPECT_EQ(alone.manifest["scratch_text_addr"], "alone (no value to check it against)");
  auto one = MakeBoot(k.kallsyms, Shifted(k.starts, {4321}, delta));
  KaslrVerdict confirmed = EstablishKaslr(one->map, 0, one->formats, scratch, false);
  EXPECT_TRUE(confirmed.use_symbols) << confirmed.manifest.dump();
  EXPECT_EQ(confirmed.manifest["scratch_text_addr"], "agrees (no value contradicts it)");
  auto other = MakeBoot(k.kallsyms, Shifted(k.starts, {10, 20000, 30001, 50000, 51000}, -delta));
  KaslrVerdict overruled = EstablishKaslr(other->map, 0, other->formats, scratch, false);
  EXPECT_TRUE(overruled.use_symbols) << overruled.manifest.dump();
  EXPECT_EQ(overruled.delta, -delta);
  EXPECT_EQ(overruled.manifest["scratch_text_addr"], "disagrees (not this boot's)");
  // Not this boot's (an older boot of the range): a witness only, as on 6.12.
  KaslrVerdict witness =
      EstablishKaslr(none->map, 0, none->formats, TextAddrDelta{delta, "scratch_text_addr"}, false);
  EXPECT_FALSE(witness.use_symbols) << witness.manifest.dump();
}

// A meta text_addr contradicted by four function pointers is not this boot's.
TEST(KaslrEvidence, EvidenceOverrulesAStaleMeta) {
  const int64_t delta = 3 * kMiB2;
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {10, 20000, 30001, 50000, 51000}, delta));
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, TextAddrDelta{-2 * kMiB2}, false);
  EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
  EXPECT_EQ(v.delta, delta);
  EXPECT_EQ(v.manifest["meta_text_addr"], "disagrees (not this boot's)");
}

// Functions every 320 bytes: a 10 MiB shift (5 * 2 MiB = 32768 * 320) puts
// every function pointer on another start, so two offsets explain the
// values equally: raw, never a guess.
TEST(KaslrEvidence, Malicious_AmbiguousOffsetsPrintRaw) {
  const SyntheticKernel k = MakeKernel(1, 20);
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {5, 100, 500, 1000, 2000}, 4 * kMiB2));
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, std::nullopt, false);
  EXPECT_FALSE(v.use_symbols) << v.manifest.dump();
  EXPECT_NE(v.manifest["why"].get<std::string>().find("ambiguous"), std::string::npos);
}

// The meta is the guest's: any delta it implies is only a candidate.
TEST(KaslrEvidence, Malicious_ExtremeMetaDeltasAreOnlyCandidates) {
  const int64_t delta = 9 * kMiB2;
  const auto& k = Kernel();
  auto b = MakeBoot(k.kallsyms, Shifted(k.starts, {3, 33, 333, 3333}, delta));
  for (int64_t meta : {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                       int64_t{-1}, int64_t{1} << 40}) {
    KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, TextAddrDelta{meta}, false);
    EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
    EXPECT_EQ(v.delta, delta);
    EXPECT_EQ(v.manifest["meta_text_addr"], "disagrees (not this boot's)");
  }
}

// Module (and BPF) addresses are not in the harvest's image: they neither
// prove nor veto.
TEST(KaslrEvidence, ModuleAddressesDoNotVeto) {
  const int64_t delta = 5 * kMiB2;
  const auto& k = Kernel();
  std::vector<uint64_t> values = Shifted(k.starts, {77, 7777, 27777, 47777}, delta);
  values.push_back(0xffffffffc0731230ull);
  values.push_back(0xffffffffc0731237ull);
  values.push_back(0);
  auto b = MakeBoot(k.kallsyms, values);
  KaslrVerdict v = EstablishKaslr(b->map, 0, b->formats, std::nullopt, false);
  EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
  EXPECT_EQ(v.delta, delta);
  EXPECT_EQ(v.manifest["distinct"], 4);
}

TEST(KaslrEvidence, RepeatedValuesCountOnceAndAtMost4096AreKept) {
  const int64_t delta = 9 * kMiB2;
  const auto& k = Kernel();
  std::vector<uint64_t> repeated = Shifted(k.starts, {11, 1111, 21111, 41111}, delta);
  repeated.insert(repeated.end(), repeated.begin(), repeated.end());
  auto few = MakeBoot(k.kallsyms, repeated);
  KaslrVerdict v = EstablishKaslr(few->map, 0, few->formats, std::nullopt, false);
  EXPECT_EQ(v.manifest["distinct"], 4) << v.manifest.dump();
  EXPECT_EQ(v.delta, delta);
  // More distinct values than are kept, each seen twice: the first 4096
  // distinct ones in record order decide.
  ASSERT_GT(k.starts.size(), 5000u);
  std::vector<size_t> picks(5000);
  for (size_t i = 0; i < picks.size(); ++i) picks[i] = i;
  std::vector<uint64_t> many = Shifted(k.starts, picks, delta);
  std::vector<uint64_t> twice;
  for (uint64_t x : many) twice.insert(twice.end(), {x, x});
  auto lots = MakeBoot(k.kallsyms, twice);
  v = EstablishKaslr(lots->map, 0, lots->formats, std::nullopt, false);
  EXPECT_EQ(v.manifest["distinct"], 4096) << v.manifest.dump();
  EXPECT_EQ(v.manifest["evidence"]["function_pointer"], 4096);
  EXPECT_EQ(v.delta, delta);
}

// Values from another kernel build (another random layout) against this
// harvest: over many boots with 4 to 8 callbacks, never a name.
TEST(KaslrEvidence, Malicious_AnotherBuildNeverYieldsANameAndTheRightOneAlwaysDoes) {
  const auto& k = Kernel();
  const SyntheticKernel other = MakeKernel(99);
  uint32_t x = 7;
  int proven = 0;
  for (int trial = 0; trial < 200; ++trial) {
    x = x * 1664525u + 1013904223u;
    const int64_t delta = static_cast<int64_t>((x >> 8) % 201) * kMiB2 - 100 * kMiB2;
    std::vector<size_t> picks;
    for (uint32_t n = 4 + (x >> 4) % 5; picks.size() < n;) {
      x = x * 1664525u + 1013904223u;
      picks.push_back((x >> 8) % other.starts.size() % k.starts.size());
    }
    auto wrong = MakeBoot(k.kallsyms, Shifted(other.starts, picks, delta));
    KaslrVerdict w = EstablishKaslr(wrong->map, 0, wrong->formats, std::nullopt, false);
    EXPECT_FALSE(w.use_symbols) << "trial " << trial << ": " << w.manifest.dump();
    auto right = MakeBoot(k.kallsyms, Shifted(k.starts, picks, delta));
    KaslrVerdict r = EstablishKaslr(right->map, 0, right->formats, std::nullopt, false);
    if (r.use_symbols) {
      EXPECT_EQ(r.delta, delta) << "trial " << trial;
      ++proven;
    }
  }
  EXPECT_EQ(proven, 200);
}

// The agent's own kallsyms: delta 0 unless the evidence objects.
TEST(KaslrEvidence, TheAgentsOwnSymbolsAreCheckedNotTrusted) {
  const auto& k = Kernel();
  auto own = MakeBoot(k.kallsyms, Shifted(k.starts, {1, 2}, 0));
  KaslrVerdict v = EstablishKaslr(own->map, 0, own->formats, std::nullopt, true);
  EXPECT_TRUE(v.use_symbols) << v.manifest.dump();
  EXPECT_EQ(v.delta, 0);
  EXPECT_EQ(v.manifest["source"], "agent metadata");
  // Another boot's symbols: the callbacks sit 6 MiB off.
  auto moved = MakeBoot(k.kallsyms, Shifted(k.starts, {10, 20000, 30001, 50000}, 3 * kMiB2));
  KaslrVerdict w = EstablishKaslr(moved->map, 0, moved->formats, std::nullopt, true);
  EXPECT_FALSE(w.use_symbols) << w.manifest.dump();
  EXPECT_EQ(w.manifest["raw"], true);
}

}  // namespace
}  // namespace hvtrace::hostd
