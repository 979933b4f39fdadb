#include "boot_kernels.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <boost/asio/thread_pool.hpp>
#include <fstream>
#include <sstream>

#include "capture_pipeline.h"
#include "event_id_table.h"
#include "fixture_bundle.h"
#include "formats_cache.h"
#include "formats_service.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/";

std::vector<std::byte> Unzstd(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string packed = ss.str();
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return {};
  std::vector<std::byte> out(size);
  const size_t n = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) return {};
  return out;
}

class BootKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    range_ = Unzstd(kDir + "region.bin.zst");
    ASSERT_FALSE(range_.empty());
    auto formats = KernelFormatsFromDirectory(kDir);
    ASSERT_TRUE(formats.ok()) << formats.error().message;
    formats_ = std::move(*formats);
    auto map = ReadBootMap(range_, {});
    ASSERT_TRUE(map.ok()) << map.error().message;
    map_ = std::move(*map);
    for (const BootMapCpu& c : map_.cpu) {
      for (const BootMapRecord& r : c.records) records_.push_back(&r);
    }
    ASSERT_GT(records_.size(), 1000u);
  }
  CachedEventFormat* Find(KernelFormats& f, const std::string& name) {
    for (CachedEventFormat& ev : f.events) {
      if (ev.name == name) return &ev;
    }
    return nullptr;
  }
  std::vector<std::byte> range_;
  KernelFormats formats_;
  BootMap map_;
  std::vector<const BootMapRecord*> records_;
};

TEST(ConsoleBanners, FindsTimeZeroBannersInOrderAndIgnoresEchoes) {
  const std::string console =
      "SeaBIOS (version 1.16.2)\r\n"
      "[    0.000000] Linux version 6.12.95+deb12-amd64 (debian-kernel@lists.debian.org) #1 SMP "
      "Debian 6.12.95-1~bpo12+1\r\n"
      "[    0.000000] Command line: console=ttyS0\r\n"
      "[   12.345678] Linux version 6.6.6 (a user's echo, not at time 0)\r\n"
      "Linux version 9.9 (no time stamp)\n"
      "[   20.000000] kexec_core: Starting new kernel\r\n"
      "[    0.000000] Linux version 6.12.117+deb12-amd64 (debian-kernel@lists.debian.org) #1 "
      "SMP Debian 6.12.117-1~deb12u1\r\n";
  std::vector<std::string> b = ConsoleBanners(console);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0],
            "Linux version 6.12.95+deb12-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian "
            "6.12.95-1~bpo12+1");
  EXPECT_EQ(b[1],
            "Linux version 6.12.117+deb12-amd64 (debian-kernel@lists.debian.org) #1 SMP Debian "
            "6.12.117-1~deb12u1");
  EXPECT_EQ(ConsoleBanners(console, 1).size(), 1u);
  EXPECT_EQ(ConsoleBanners(console, 1)[0], b[1]);
}

TEST(ConsoleBanners, Malicious_GarbageAndHugeLinesFindNothing) {
  std::string junk(1 << 20, '[');
  junk += "Linux version ";
  junk += std::string(100, ']');
  EXPECT_TRUE(ConsoleBanners(junk).empty());
  EXPECT_TRUE(ConsoleBanners("[] Linux version x\n[0.0x] Linux version y\n").empty());
  EXPECT_TRUE(ReadConsoleBanners("/nonexistent/console.log").empty());
}

TEST_F(BootKernelsTest, TheGuestsOwnFormatsFitEveryRecord) {
  FormatsFit fit = FitRecords(records_, formats_);
  EXPECT_TRUE(fit.ok()) << fit.ToJson().dump(2);
  EXPECT_EQ(fit.records, records_.size());
  EXPECT_GT(fit.ids, 3u);
  std::printf("[boot kernels] fixture: %llu records, %zu ids fit the guest's formats\n",
              static_cast<unsigned long long>(fit.records), fit.ids);
}

TEST_F(BootKernelsTest, SwappedIdsDoNotFit) {
  // Another build that gave sched_switch's id to irq_handler_entry and back: the
  // records of both no longer fit (their sizes differ).
  KernelFormats other = formats_;
  CachedEventFormat* sw = Find(other, "sched_switch");
  CachedEventFormat* wk = Find(other, "irq_handler_entry");
  ASSERT_TRUE(sw && wk);
  std::swap(sw->id, wk->id);
  auto replace_id = [](CachedEventFormat* ev, uint32_t id) {
    const size_t at = ev->text.find("ID: ");
    const size_t end = ev->text.find('\n', at);
    ev->text.replace(at, end - at, "ID: " + std::to_string(id));
  };
  replace_id(sw, sw->id);
  replace_id(wk, wk->id);
  FormatsFit fit = FitRecords(records_, other);
  EXPECT_FALSE(fit.ok());
  EXPECT_TRUE(fit.misfits.contains(sw->id) || fit.misfits.contains(wk->id)) << fit.ToJson().dump(2);
  std::printf("[boot kernels] swapped ids: %s\n", fit.ToJson().dump().c_str());
}

TEST_F(BootKernelsTest, MissingAndUnparsableFormatsDoNotFit) {
  KernelFormats other = formats_;
  CachedEventFormat* sw = Find(other, "sched_switch");
  ASSERT_TRUE(sw);
  const uint32_t id = sw->id;
  sw->parse_error = "refused";
  FormatsFit fit = FitRecords(records_, other);
  ASSERT_TRUE(fit.misfits.contains(id));
  EXPECT_NE(fit.misfits[id].reason.find("did not parse"), std::string::npos);
  std::erase_if(other.events, [&](const CachedEventFormat& e) { return e.id == id; });
  fit = FitRecords(records_, other);
  ASSERT_TRUE(fit.misfits.contains(id));
  EXPECT_NE(fit.misfits[id].reason.find("no event has this id"), std::string::npos);
}

TEST_F(BootKernelsTest, Malicious_ShortRecordAndDataLocPastTheEnd) {
  // A print record cut short, and an irq_handler_entry whose __data_loc
  // name points past the record: both are misfits, nothing is read out
  // of bounds.
  const CachedEventFormat* print = Find(formats_, "print");
  ASSERT_TRUE(print);
  std::vector<std::byte> small(8);
  const uint16_t pid = static_cast<uint16_t>(print->id);
  std::memcpy(small.data(), &pid, 2);
  BootMapRecord rec;
  rec.payload = small;
  const BootMapRecord* one[] = {&rec};
  FormatsFit fit = FitRecords(one, formats_);
  EXPECT_FALSE(fit.ok()) << fit.ToJson().dump();

  const CachedEventFormat* exec = Find(formats_, "irq_handler_entry");
  ASSERT_TRUE(exec);
  auto parsed = ParseEventFormat(exec->system, exec->text);
  ASSERT_TRUE(parsed.ok());
  const FieldFormat* name = parsed->FindField("name");
  ASSERT_TRUE(name);
  uint32_t end = 0;
  for (const FieldFormat& f : parsed->fields) end = std::max(end, f.offset + f.size);
  std::vector<std::byte> bad((end + 7) & ~7u);
  const uint16_t eid = static_cast<uint16_t>(exec->id);
  std::memcpy(bad.data(), &eid, 2);
  const uint32_t loc = (200u << 16) | end;  // 200 bytes at the record's end.
  std::memcpy(bad.data() + name->offset, &loc, 4);
  rec.payload = bad;
  fit = FitRecords(one, formats_);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.misfits.begin()->second.reason.find("points past the record"), std::string::npos);
}

TEST_F(BootKernelsTest, WithoutBannersTheFallbackIsCheckedAndMisfitsDropped) {
  KernelFormats other = formats_;
  CachedEventFormat* sw = Find(other, "sched_switch");
  ASSERT_TRUE(sw);
  const uint32_t id = sw->id;
  sw->parse_error = "refused";
  BootKernels kernels(range_, &formats_, nullptr, {});
  BootFormats got = kernels.For(0, 1, BootFormats{&other, {}, false, nullptr});
  ASSERT_NE(got.formats, nullptr);
  EXPECT_NE(got.formats, &other);  // A copy without the id.
  for (const CachedEventFormat& ev : got.formats->events) EXPECT_NE(ev.id, id);
  EXPECT_EQ(got.source["verified"], false);
  EXPECT_NE(got.source.value("note", std::string()).find("left undecoded"), std::string::npos);
  EXPECT_EQ(got.source["check"]["passed"], false);
  EXPECT_NE(got.source["identified"]["result"].get<std::string>().find("no banner"),
            std::string::npos);
  // The guest's own formats pass and are used as they are.
  BootFormats same = kernels.For(0, 1, BootFormats{&formats_, {}, false, nullptr});
  EXPECT_EQ(same.formats, &formats_);
  EXPECT_EQ(same.source["check"]["passed"], true);
  // The manifest's boots get what each boot was decoded with.
  nlohmann::json boots = nlohmann::json::array({{{"boot", 0}}});
  kernels.AnnotateBoots(boots);
  EXPECT_EQ(boots[0]["decoded_with"]["check"]["passed"], true) << boots.dump(2);
  // A banner with no cache (no service): said so.
  BootKernels with_banner(range_, &formats_, nullptr, {"Linux version 6.12.95"});
  BootFormats b = with_banner.For(0, 1, BootFormats{&formats_, {}, false, nullptr});
  EXPECT_NE(b.source["identified"]["result"].get<std::string>().find("no formats cache entry"),
            std::string::npos)
      << b.source.dump(2);
  EXPECT_EQ(b.source["identified"]["banner"], "Linux version 6.12.95");
}

TEST_F(BootKernelsTest, IdTableSaysKeptMovedChangedVanishedNew) {
  KernelFormats other = formats_;
  CachedEventFormat* sw = Find(other, "sched_switch");
  CachedEventFormat* wk = Find(other, "irq_handler_entry");
  CachedEventFormat* pr = Find(other, "print");
  ASSERT_TRUE(sw && wk && pr);
  const uint32_t sw_id = sw->id;
  sw->id = 4000;  // Moved: same layout, another id.
  // Changed: one more field at the end.
  const size_t blank = wk->text.find("\nprint fmt");
  ASSERT_NE(blank, std::string::npos);
  wk->text.insert(blank, "\tfield:int extra;\toffset:40;\tsize:4;\tsigned:1;\n");
  CachedEventFormat added = *sw;
  added.name = "my_new_event";
  added.text.replace(added.text.find("sched_switch"), 12, "my_new_event");
  added.id = 4001;
  const std::string pr_name = pr->system + "/" + pr->name;
  std::erase_if(other.events, [&](const CachedEventFormat& e) { return e.name == "print"; });
  other.events.push_back(added);

  const KernelFormats* boots[] = {&formats_, &other, &other};
  nlohmann::json table = EventsAcrossBoots(boots);
  ASSERT_EQ(table["boots"].size(), 2u) << table.dump();
  const nlohmann::json& b1 = table["boots"][0];
  EXPECT_EQ(b1["counts"]["moved"], 1) << b1.dump(2);
  EXPECT_EQ(b1["moved"][0]["event"], "sched/sched_switch");
  EXPECT_EQ(b1["moved"][0]["from"], sw_id);
  EXPECT_EQ(b1["moved"][0]["to"], 4000);
  EXPECT_EQ(b1["counts"]["changed"], 1);
  EXPECT_EQ(b1["changed"][0]["event"], "irq/irq_handler_entry");
  EXPECT_EQ(b1["counts"]["vanished"], 1);
  EXPECT_EQ(b1["vanished"][0]["event"], pr_name);
  EXPECT_EQ(b1["counts"]["new"], 1);
  EXPECT_EQ(b1["new"][0]["event"], "sched/my_new_event");
  EXPECT_GT(b1["counts"]["kept"].get<int>(), 3);
  EXPECT_FALSE(b1.contains("kept_list"));
  EXPECT_EQ(table["boots"][1]["same_formats"], true);
  std::printf("[boot kernels] id table: %s\n", b1.dump().c_str());
}

// A formats cache with two "kernels": A is the fixture guest's formats, B the
// same with sched_switch's and irq_handler_entry's ids swapped (another
// build); each has its own /proc/version.
class BootKernelsCacheTest : public BootKernelsTest {
 protected:
  void SetUp() override {
    BootKernelsTest::SetUp();
    HarvestBundle a = test_support::BootMapFixtureBundle();
    a.proc_version = kA;
    for (HarvestedEvent& e : a.events) {  // The fixture bundle leaves ids to the reader.
      auto parsed = ParseEventFormat(e.system, e.text);
      ASSERT_TRUE(parsed.ok()) << e.name;
      e.id = parsed->id;
    }
    HarvestBundle b = a;
    b.proc_version = kB;
    for (HarvestedEvent& e : b.events) {
      if (e.name == "sched_switch" || e.name == "irq_handler_entry") {
        const uint32_t id = e.name == "sched_switch" ? 157 : 310;  // Each other's.
        const size_t at = e.text.find("ID: ");
        e.text.replace(at, e.text.find('\n', at) - at, "ID: " + std::to_string(id));
        e.id = id;
      }
    }
    ASSERT_TRUE(FormatCache(cache_.path()).Store(std::string(64, 'a'), a, {}).ok());
    ASSERT_TRUE(FormatCache(cache_.path()).Store(std::string(64, 'b'), b, {}).ok());
    service_ = std::make_shared<FormatsService>(cache_.path(), pool_.get_executor(),
                                                [](LogLevel, const std::string&) {});
  }
  void TearDown() override { pool_.join(); }
  static constexpr const char* kA = "Linux version 6.12.95+deb12-amd64 (a) #1 SMP";
  static constexpr const char* kB = "Linux version 6.12.117+deb12-amd64 (b) #1 SMP";
  test_support::TempDir cache_;
  boost::asio::thread_pool pool_{1};
  std::shared_ptr<FormatsService> service_;
};

TEST_F(BootKernelsCacheTest, TheBannerPicksTheEntryAndTheRecordsConfirmIt) {
  const uint32_t sw_id = Find(formats_, "sched_switch")->id;
  ASSERT_EQ(sw_id, 310u);  // The swap above assumes the fixture's ids.
  BootKernels kernels(range_, nullptr, service_.get(), {kA});
  BootFormats got = kernels.For(0, 1, BootFormats{});
  ASSERT_NE(got.formats, nullptr);
  EXPECT_EQ(got.formats->key, std::string(64, 'a'));
  EXPECT_EQ(got.source["from"], "formats cache, identified by console banner") << got.source;
  EXPECT_EQ(got.source["identified"]["check"]["passed"], true);
  EXPECT_EQ(got.source["identified"]["check"]["records"], records_.size());
  EXPECT_EQ(kernels.NewestIdentified(), got.formats);
  // The agent's metadata for this very boot wins (it is proven by its
  // fingerprints); the channel's nearest-boot stand-in does not.
  KernelFormats agent = formats_;
  BootFormats own = kernels.For(0, 1, BootFormats{&agent, {}, true, {{"from", "meta channel"}}});
  EXPECT_EQ(own.formats, &agent);
  EXPECT_EQ(own.source["identified"]["result"],
            "identified and checked; the agent's own metadata is used");
  BootFormats nearest =
      kernels.For(0, 1, BootFormats{&agent, {}, true, {{"from", "meta channel (nearest boot)"}}});
  EXPECT_EQ(nearest.formats, got.formats);
  EXPECT_FALSE(nearest.own_symbols);
}

TEST_F(BootKernelsCacheTest, ResetRangeTakesTheLastBannerAndAMisfitFallsBack) {
  // The range holds one boot (the newest, which reset it at the kexec); the
  // console has two banners. Boot 0 pairs with B, whose ids do not fit the
  // records: B is refused, the caller's formats (A) are checked and used,
  // marked unverified.
  BootKernels kernels(range_, nullptr, service_.get(), {kA, kB});
  const KernelFormats* a = nullptr;
  {
    auto loaded = service_->Get(std::string(64, 'a'));
    ASSERT_TRUE(loaded.ok() && *loaded);
    a = loaded->get();
  }
  BootFormats got = kernels.For(0, 1, BootFormats{a, {}, false, nullptr});
  EXPECT_EQ(got.formats, a);
  EXPECT_EQ(got.source["identified"]["banner"], kB);
  EXPECT_EQ(got.source["identified"]["result"], "identified but its formats do not fit the records")
      << got.source.dump(2);
  EXPECT_EQ(got.source["identified"]["check"]["passed"], false);
  EXPECT_EQ(got.source["check"]["passed"], true);
  EXPECT_EQ(got.source["verified"], false);
  // With B as the only choice, its misfit ids are dropped: their records
  // stay raw instead of decoding with the wrong layout.
  auto b = service_->Get(std::string(64, 'b'));
  ASSERT_TRUE(b.ok() && *b);
  BootKernels only_b(range_, nullptr, service_.get(), {kB});
  BootFormats raw = only_b.For(0, 1, BootFormats{b->get(), {}, false, nullptr});
  ASSERT_NE(raw.formats, nullptr);
  EXPECT_NE(raw.formats, b->get());
  for (const CachedEventFormat& ev : raw.formats->events) {
    EXPECT_NE(ev.name, "sched_switch");
    EXPECT_NE(ev.name, "irq_handler_entry");
  }
  EXPECT_NE(raw.source.value("note", std::string()).find("2 event ids do not fit"),
            std::string::npos)
      << raw.source.dump(2);
  // Fewer banners than boots: the older boots have none, said so.
  BootFormats none = BootKernels(range_, nullptr, service_.get(), {kA})
                         .For(0, 2, BootFormats{a, {}, false, nullptr});
  EXPECT_NE(none.source["identified"]["result"].get<std::string>().find("no banner for this boot"),
            std::string::npos)
      << none.source.dump(2);
}

}  // namespace
}  // namespace hvtrace::hostd
