// DecodeBootRange with the VM's console banners and a formats cache: the
// kexec fixture's two boots are each identified by their banner, checked
// against their records and decoded; the id table says they used the same
// formats. A banner naming another build whose ids do not fit is refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "boot_range_decode.h"
#include "capture_service.h"
#include "formats_cache.h"
#include "formats_service.h"
#include "hostd/decode/capture_pipeline_fixture.h"
#include "hvtrace/format.h"

namespace hvtrace::hostd {
namespace {

constexpr const char* kA = "Linux version 6.12.95+deb12-amd64 (a) #1 SMP PREEMPT_DYNAMIC";
constexpr const char* kB = "Linux version 6.12.117+deb12-amd64 (b) #1 SMP PREEMPT_DYNAMIC";

// The kexec fixture's formats as a harvest of a kernel whose /proc/version
// is |proc_version|; with |swap| sched_switch and irq_handler_entry trade
// ids (another build).
HarvestBundle KexecBundle(const std::string& proc_version, bool swap) {
  HarvestBundle b;
  b.release = proc_version.substr(14, proc_version.find(' ', 14) - 14);
  b.proc_version = proc_version;
  b.header_page = ReadText(kDir + "kexec/header_page");
  b.header_event = ReadText(kDir + "kexec/header_event");
  b.kallsyms = ReadText(kDir + "kexec/kallsyms");
  std::map<std::string, uint32_t> ids;
  for (const auto& e : fs::recursive_directory_iterator(kDir + "kexec/formats")) {
    if (e.path().filename() != "format") continue;
    HarvestedEvent ev;
    ev.name = e.path().parent_path().filename().string();
    ev.system = e.path().parent_path().parent_path().filename().string();
    ev.text = ReadText(e.path());
    auto parsed = ParseEventFormat(ev.system, ev.text);
    EXPECT_TRUE(parsed.ok()) << ev.name;
    if (parsed.ok()) ev.id = parsed->id;
    ids[ev.name] = ev.id;
    b.events.push_back(ev);
  }
  if (swap) {
    for (HarvestedEvent& ev : b.events) {
      if (ev.name != "sched_switch" && ev.name != "irq_handler_entry") continue;
      const uint32_t id = ids[ev.name == "sched_switch" ? "irq_handler_entry" : "sched_switch"];
      const size_t at = ev.text.find("ID: ");
      ev.text.replace(at, ev.text.find('\n', at) - at, "ID: " + std::to_string(id));
      ev.id = id;
    }
  }
  std::sort(b.events.begin(), b.events.end(), [](const auto& x, const auto& y) {
    return std::tie(x.system, x.name) < std::tie(y.system, y.name);
  });
  return b;
}

class BootRangeIdentifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvtrace-identify-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    region_ = Unzstd(kDir + "kexec/region.bin.zst");
    ASSERT_EQ(region_.size(), 16u << 20);
    ASSERT_TRUE(
        FormatCache(root_ / "cache").Store(std::string(64, 'a'), KexecBundle(kA, false), {}).ok());
    ASSERT_TRUE(
        FormatCache(root_ / "cache").Store(std::string(64, 'b'), KexecBundle(kB, true), {}).ok());
    service_ = std::make_shared<FormatsService>(root_ / "cache", pool_.get_executor(),
                                                [](LogLevel, const std::string&) {});
  }
  void TearDown() override {
    pool_.join();
    fs::remove_all(root_);
  }
  // The VM's console: a first boot's banner, a kexec, the second's.
  void Console(const std::string& vm, const std::vector<std::string>& banners) {
    fs::create_directories(root_ / "vms" / vm);
    std::ofstream out(root_ / "vms" / vm / "console.log", std::ios::binary);
    for (const std::string& b : banners) {
      out << "[    0.000000] " << b << "\r\n[    0.000000] Command line: console=ttyS0\r\n"
          << "[    5.123456] kexec_core: Starting new kernel\r\n";
    }
  }
  json Decode(const std::string& vm) {
    CaptureStore store(root_ / "vms" / vm / "captures");
    auto pending = store.Begin("panic", HostTime::Now());
    EXPECT_TRUE(pending.ok());
    if (!pending.ok()) return {};
    CaptureManifest manifest;
    manifest.vm = vm;
    manifest.trigger = "panic";
    DecodeBootRange(region_, {.cache = service_.get(), .meta_dir = MetaDirOfStore(store)},
                    (*pending)->dir(), manifest);
    return manifest.extra;
  }
  fs::path root_;
  std::vector<std::byte> region_;
  boost::asio::thread_pool pool_{1};
  std::shared_ptr<FormatsService> service_;
};

TEST_F(BootRangeIdentifyTest, EachBootIsIdentifiedByItsBannerAndChecked) {
  Console("vm", {"Linux version 5.10 (an older run of the VM)", kA, kA});
  const json extra = Decode("vm");
  ASSERT_EQ(extra["formats"]["decoded"], true) << extra.dump(2);
  EXPECT_EQ(extra["formats"]["unknown_id_events"], 0);
  ASSERT_EQ(extra["boots"].size(), 2u) << extra["boots"].dump(2);
  for (const json& b : extra["boots"]) {
    const json& with = b["decoded_with"];
    EXPECT_EQ(with["from"], "formats cache, identified by console banner") << with.dump(2);
    EXPECT_EQ(with["key"], std::string(64, 'a'));
    EXPECT_EQ(with["identified"]["banner"], kA);
    EXPECT_EQ(with["identified"]["check"]["passed"], true);
    EXPECT_EQ(with["identified"]["check"]["records"], b["events"]);
  }
  EXPECT_EQ(extra["formats"]["events_across_boots"]["boots"][0]["same_formats"], true)
      << extra["formats"].dump(2);
  EXPECT_EQ(extra["formats"]["identify"]["console_banners"], 3);
  EXPECT_EQ(extra["formats"]["identify"]["newest_banners"].back(), kA);
}

TEST_F(BootRangeIdentifyTest, ABannerWhoseFormatsDoNotFitIsRefusedAndNothingDecodesWrongly) {
  // The console says the second boot ran build B, whose sched_switch and
  // irq_handler_entry ids are each other's: its records refute B. Boot 0 is
  // A's; boot 1 falls back to the capture's default formats, marked
  // unverified.
  Console("vm", {kA, kB});
  const json extra = Decode("vm");
  ASSERT_EQ(extra["boots"].size(), 2u) << extra.dump(2);
  const json& b0 = extra["boots"][0]["decoded_with"];
  const json& b1 = extra["boots"][1]["decoded_with"];
  EXPECT_EQ(b0["key"], std::string(64, 'a')) << b0.dump(2);
  EXPECT_EQ(b1["identified"]["banner"], kB) << b1.dump(2);
  EXPECT_EQ(b1["identified"]["result"], "identified but its formats do not fit the records");
  EXPECT_EQ(b1["identified"]["check"]["passed"], false);
  EXPECT_EQ(b1["verified"], false);
  // What decoded boot 1 is what the layout came from (B, the newest
  // banner's): its misfitting ids were dropped, so their records are
  // counted unknown and never printed with the other event's layout.
  EXPECT_EQ(b1["check"]["passed"], false) << b1.dump(2);
  EXPECT_NE(b1.value("note", "").find("left undecoded"), std::string::npos) << b1.dump(2);
  EXPECT_EQ(extra["formats"]["unknown_id_events"], b1["check"]["misfit_id_records"])
      << extra["formats"].dump(2);
  const json& table = extra["formats"]["events_across_boots"]["boots"][0];
  std::printf("[identify] refused banner: boot 1 %s; table %s\n",
              b1["identified"]["check"].dump().c_str(), table.dump().c_str());
}

}  // namespace
}  // namespace hvtrace::hostd
