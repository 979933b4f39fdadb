// The metadata channel's boot bundles on the host: every lie refused with a
// reason that names it, and the per-VM, per-boot store.
#include "meta_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "host_time.h"
#include "hostd/meta/meta_fixture.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::MetaBootMembers;
using test_support::TestBootId;
using test_support::UstarArchive;
using ::testing::HasSubstr;

std::string Refusal(const meta::BootId& frame_id, const std::map<std::string, std::string>& m) {
  Result<MetaBoot> r = ValidateMetaBoot(frame_id, UstarArchive(m));
  return r.ok() ? std::string("accepted") : r.error().message;
}

class MetaStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hvtrace-meta-store-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST(MetaValidateTest, AcceptsTheFixtureKernelsBundle) {
  const meta::BootId id = TestBootId(1);
  Result<MetaBoot> r =
      ValidateMetaBoot(id, UstarArchive(MetaBootMembers(test_support::kMetaFixtures, id)));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->boot_id, meta::BootIdString(id));
  EXPECT_EQ(r->release, "6.12.95+deb12-amd64");
  EXPECT_EQ(r->build_id, test_support::kFixtureBuildId);
  EXPECT_EQ(r->fingerprints_checked, r->bundle.events.size());
  EXPECT_GE(r->fingerprints_checked, 3u);
  EXPECT_EQ(r->key.size(), 64u);
}

// The fixture bundle's members with sched_switch's prev_prio field line
// (after "field:int prev_prio;\t") replaced by |rest|; empty when the
// fixture has no such line.
std::map<std::string, std::string> WithPrevPrio(const meta::BootId& id, const std::string& rest) {
  auto m = MetaBootMembers(test_support::kMetaFixtures, id);
  const std::string field = "sched/sched_switch/format:\tfield:int prev_prio;\t";
  const std::string tail = "offset:28;\tsize:4;\tsigned:1;";
  const size_t at = m["formats"].find(field + tail);
  if (at == std::string::npos) return {};
  m["formats"].replace(at + field.size(), tail.size(), rest);
  return m;
}

TEST(MetaValidateTest, Malicious_FingerprintThatDoesNotMatchItsFormat) {
  const meta::BootId id = TestBootId(1);
  // The agent's fingerprint line is honest; the format it sends is not (a
  // field changed): the recomputed fingerprint differs.
  const auto m = WithPrevPrio(id, "offset:28;\tsize:4;\tsigned:0;");
  ASSERT_FALSE(m.empty());
  EXPECT_THAT(Refusal(id, m),
              HasSubstr("fingerprint of sched/sched_switch does not match its format"));
}

// A fingerprinted format this daemon cannot parse (an agent newer than the
// daemon) cannot be checked: set aside as unparsed, not a refusal.
TEST(MetaValidateTest, AFormatTheDaemonCannotParseIsSetAsideNotRefused) {
  const meta::BootId id = TestBootId(1);
  const auto m = WithPrevPrio(id, "offset:28;\tsize:x;");
  ASSERT_FALSE(m.empty());
  Result<MetaBoot> r = ValidateMetaBoot(id, UstarArchive(m));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->fingerprints_checked + 1, r->bundle.events.size());
  for (const HarvestedEvent& ev : r->bundle.events) {
    EXPECT_EQ(ev.parse_error.empty(), !(ev.system == "sched" && ev.name == "sched_switch"))
        << ev.system << "/" << ev.name << ": " << ev.parse_error;
  }
}

TEST(MetaValidateTest, Malicious_IdMismatchMissingAndUnknownLines) {
  const meta::BootId id = TestBootId(1);
  auto m = MetaBootMembers(test_support::kMetaFixtures, id);
  std::string& fp = m["fingerprints"];
  const size_t line = fp.find("sched/sched_switch ");
  ASSERT_NE(line, std::string::npos);
  const size_t id_at = line + std::string("sched/sched_switch ").size();
  const size_t id_end = fp.find(' ', id_at);
  auto lying = m;
  lying["fingerprints"].replace(id_at, id_end - id_at, "4242");
  EXPECT_THAT(Refusal(id, lying), HasSubstr("sched/sched_switch gives id 4242"));

  // No line: an agent older than the daemon could not parse the format.
  // That format is set aside, unverified; the boot's others still count.
  auto missing = m;
  missing["fingerprints"].erase(line, fp.find('\n', line) + 1 - line);
  Result<MetaBoot> partial = ValidateMetaBoot(id, UstarArchive(missing));
  ASSERT_TRUE(partial.ok()) << partial.error().message;
  EXPECT_EQ(partial->fingerprints_checked + 1, partial->bundle.events.size());
  for (const HarvestedEvent& ev : partial->bundle.events) {
    if (ev.system == "sched" && ev.name == "sched_switch") {
      EXPECT_THAT(ev.parse_error, HasSubstr("no fingerprint"));
    } else {
      EXPECT_EQ(ev.parse_error, "") << ev.system << "/" << ev.name;
    }
  }

  auto unknown = m;
  unknown["fingerprints"] += "evil/event 7 0123456789abcdef\n";
  EXPECT_THAT(Refusal(id, unknown), HasSubstr("'evil/event', which has no format"));

  auto twice = m;
  twice["fingerprints"] += fp.substr(line, fp.find('\n', line) + 1 - line);
  EXPECT_THAT(Refusal(id, twice), HasSubstr("list sched/sched_switch twice"));

  auto garbage = m;
  garbage["fingerprints"] += "sched/sched_switch x y\n";
  EXPECT_THAT(Refusal(id, garbage), HasSubstr("malformed id or fingerprint"));
}

TEST(MetaValidateTest, Malicious_HugeOrHiddenKallsyms) {
  const meta::BootId id = TestBootId(1);
  auto huge = MetaBootMembers(test_support::kMetaFixtures, id);
  std::string line = "ffffffff81000000 T padding_symbol_xxxxxxxxxxxxxxxxxxxxxxxx\n";
  while (huge["kallsyms"].size() <= kMaxMetaKallsyms) huge["kallsyms"] += line;
  EXPECT_THAT(Refusal(id, huge), HasSubstr("kallsyms is"));

  auto hidden = MetaBootMembers(test_support::kMetaFixtures, id);
  hidden["kallsyms"] = "0000000000000000 T _text\n0000000000000000 T schedule\n";
  EXPECT_THAT(Refusal(id, hidden), HasSubstr("no nonzero address"));
}

TEST(MetaValidateTest, Malicious_IdentityLies) {
  const meta::BootId id = TestBootId(1);
  // The frame says one boot, identity.json another.
  EXPECT_THAT(Refusal(TestBootId(2), MetaBootMembers(test_support::kMetaFixtures, id)),
              HasSubstr("is not the frame's"));

  auto m = MetaBootMembers(test_support::kMetaFixtures, id);
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "not a JSON object"},
           {"[1,2]", "not a JSON object"},
           {R"({"boot_id": 7})", "boot_id is not a string"},
           {R"({"release": "x", "build_id": "ab"})", "has no boot_id"},
       }) {
    auto bad = m;
    bad["identity.json"] = text;
    EXPECT_THAT(Refusal(id, bad), HasSubstr(why)) << text;
  }
  const auto with = [&](const char* key, nlohmann::json value) {
    auto bad = m;
    nlohmann::json j = nlohmann::json::parse(bad["identity.json"]);
    j[key] = std::move(value);
    bad["identity.json"] = j.dump();
    return Refusal(id, bad);
  };
  EXPECT_THAT(with("build_id", "not-hex-at-all-not-hex-at-all-not-hex-at"), HasSubstr("build_id"));
  EXPECT_THAT(with("build_id", "abcd"), HasSubstr("16..64 bytes of hex"));
  EXPECT_THAT(with("release", "6.1.0-other"), HasSubstr("is not the archive's"));
  EXPECT_THAT(with("nr_cpus", 0), HasSubstr("nr_cpus"));
  EXPECT_THAT(with("boot_id", std::string(100, 'a')), HasSubstr("too long"));

  auto big = m;
  big["identity.json"] = std::string(kMaxMetaIdentity + 1, ' ');
  EXPECT_THAT(Refusal(id, big), HasSubstr("identity.json"));
  auto none = m;
  none.erase("identity.json");
  EXPECT_THAT(Refusal(id, none), HasSubstr("'identity.json' is missing"));
  auto no_fp = m;
  no_fp.erase("fingerprints");
  EXPECT_THAT(Refusal(id, no_fp), HasSubstr("'fingerprints' is missing"));
  auto extra = m;
  extra["shadow"] = "x";
  EXPECT_THAT(Refusal(id, extra), HasSubstr("unexpected member 'shadow'"));
}

TEST(MetaValidateTest, FindsTheGnuBuildIdNote) {
  // Xen-style note first, then the GNU build id, as in a kernel's .notes.
  std::string notes;
  const auto note = [&](const std::string& name, uint32_t type, const std::string& desc) {
    const uint32_t h[3] = {static_cast<uint32_t>(name.size() + 1),
                           static_cast<uint32_t>(desc.size()), type};
    notes.append(reinterpret_cast<const char*>(h), 12);
    std::string n = name + '\0';
    n.resize((n.size() + 3) & ~size_t{3}, '\0');
    std::string d = desc;
    d.resize((d.size() + 3) & ~size_t{3}, '\0');
    notes += n + d;
  };
  note("Xen", 1, "abcdefgh");
  std::string id;
  for (int i = 0; i < 20; ++i) id += static_cast<char>(0xa0 + i);
  note("GNU", 3, id);
  notes.resize(4096, '\0');
  Result<std::string> r = FindGnuBuildId(std::as_bytes(std::span(notes)));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3");
  std::string junk(4096, '\xff');
  EXPECT_FALSE(FindGnuBuildId(std::as_bytes(std::span(junk))).ok());
}

TEST_F(MetaStoreTest, StoresPerBootKeepsNewestNAndLoadsBack) {
  MetaStore store(root_ / "vms" / "a" / "meta", 3);
  for (uint8_t n = 1; n <= 5; ++n) {
    const meta::BootId id = TestBootId(n);
    Result<MetaBoot> boot =
        ValidateMetaBoot(id, UstarArchive(MetaBootMembers(test_support::kMetaFixtures, id)));
    ASSERT_TRUE(boot.ok()) << boot.error().message;
    ASSERT_TRUE(store.StoreBoot(*boot, {{"build_id", "unverified"}}, n * 1'000'000'000ll).ok());
    EXPECT_TRUE(store.Has(boot->boot_id, boot->key));
    ASSERT_TRUE(store.StoreComms(boot->boot_id, "1 init\n" + std::to_string(n) + " task\n").ok());
  }
  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].boot_id, meta::BootIdString(TestBootId(3)));
  EXPECT_EQ((*list)[2].boot_id, meta::BootIdString(TestBootId(5)));
  EXPECT_EQ((*list)[2].received_ns, 5'000'000'000ll);
  EXPECT_EQ((*list)[2].received_utc, UtcStamp(5'000'000'000ll));
  EXPECT_FALSE(fs::exists(store.dir() / meta::BootIdString(TestBootId(1))));
  EXPECT_FALSE(fs::exists(store.dir() / meta::BootIdString(TestBootId(2))));
  // No temporary files are left behind.
  for (const auto& e : fs::recursive_directory_iterator(store.dir())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  Result<KernelFormats> f = store.LoadFormats((*list)[2]);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->release, "6.12.95+deb12-amd64");
  EXPECT_FALSE(f->events.empty());
  Result<std::string> comms = store.LoadComms((*list)[2]);
  ASSERT_TRUE(comms.ok());
  EXPECT_EQ(*comms, "1 init\n5 task\n");
  // Comms for a boot whose bundle was never accepted are refused.
  Status orphan = store.StoreComms(meta::BootIdString(TestBootId(9)), "1 x\n");
  ASSERT_FALSE(orphan.ok());
  EXPECT_THAT(orphan.error().message, HasSubstr("was not accepted"));
  // Another VM's store sees none of it.
  Result<std::vector<MetaBootEntry>> other = MetaStore(root_ / "vms" / "b" / "meta").List();
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->empty());
}

// |members| plus an event of a module loaded later (as the agent's newer
// archive carries it): its format lines and its fingerprints line. |n| > 0
// names another one (alpha_seq<n>, id 1496 + n).
std::map<std::string, std::string> WithModuleEvent(std::map<std::string, std::string> members,
                                                   int n = 0) {
  const std::string name = "alpha_seq" + (n > 0 ? std::to_string(n) : std::string());
  const std::string id = std::to_string(1496 + n);
  const std::string text =
      "name: " + name + "\nID: " + id +
      "\nformat:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
      "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:u32 seq;\toffset:8;\tsize:4;\tsigned:0;\n"
      "\tfield:char tag[8];\toffset:12;\tsize:8;\tsigned:0;\n\n"
      "print fmt: \"seq=%u tag=%s\", REC->seq, REC->tag\n";
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    members["formats"] += "hvt_alpha/" + name + "/format:" + text.substr(pos, nl - pos) + "\n";
    pos = nl + 1;
  }
  Result<EventFormat> parsed = ParseEventFormat("hvt_alpha", text);
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  char fp[32];
  std::snprintf(fp, sizeof fp, "%016llx",
                static_cast<unsigned long long>(EventFingerprint(*parsed)));
  members["fingerprints"] += "hvt_alpha/" + name + " " + id + " " + fp + "\n";
  return members;
}

TEST_F(MetaStoreTest, ANewerBundleOfTheSameBootReplacesItInPlace) {
  MetaStore store(root_ / "meta");
  std::vector<MetaBoot> first;
  for (uint8_t n = 1; n <= 2; ++n) {
    Result<MetaBoot> boot = ValidateMetaBoot(
        TestBootId(n), UstarArchive(MetaBootMembers(test_support::kMetaFixtures, TestBootId(n))));
    ASSERT_TRUE(boot.ok()) << boot.error().message;
    ASSERT_TRUE(store.StoreBoot(*boot, {}, n * 1'000'000'000ll).ok());
    first.push_back(std::move(*boot));
  }
  ASSERT_TRUE(store.StoreComms(first[0].boot_id, "1 init\n").ok());
  // Boot 1 loads a module with events: its agent sends a newer bundle.
  Result<MetaBoot> newer = ValidateMetaBoot(
      TestBootId(1),
      UstarArchive(WithModuleEvent(MetaBootMembers(test_support::kMetaFixtures, TestBootId(1)))));
  ASSERT_TRUE(newer.ok()) << newer.error().message;
  ASSERT_NE(newer->key, first[0].key);
  EXPECT_TRUE(store.HasBoot(newer->boot_id));
  EXPECT_FALSE(store.Has(newer->boot_id, newer->key));
  ASSERT_TRUE(store.StoreBoot(*newer, {}, 3'000'000'000ll).ok());

  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  ASSERT_EQ(list->size(), 2u);
  const MetaBootEntry& e = (*list)[0];  // Its place and first arrival are kept.
  EXPECT_EQ(e.boot_id, first[0].boot_id);
  EXPECT_EQ(e.key, newer->key);
  EXPECT_EQ(e.received_ns, 1'000'000'000ll);
  EXPECT_EQ(e.revision, 2u);
  EXPECT_EQ(e.updated_utc, UtcStamp(3'000'000'000ll));
  EXPECT_EQ(e.changes["added"], nlohmann::json::array({"hvt_alpha/alpha_seq"})) << e.changes;
  EXPECT_EQ(e.changes["removed_count"], 0);
  EXPECT_EQ((*list)[1].revision, 1u);
  EXPECT_TRUE(store.Has(newer->boot_id, newer->key));
  EXPECT_FALSE(store.Has(first[0].boot_id, first[0].key));
  // The replaced bundle stays on disk for a capture that listed the index
  // before the update; the comms stay.
  EXPECT_TRUE(fs::exists(store.dir() / e.boot_id / "formats" / first[0].key));
  Result<std::string> comms = store.LoadComms(e);
  ASSERT_TRUE(comms.ok());
  EXPECT_EQ(*comms, "1 init\n");
  Result<KernelFormats> f = store.LoadFormats(e);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const bool has_alpha = std::any_of(f->events.begin(), f->events.end(), [](const auto& ev) {
    return ev.system == "hvt_alpha" && ev.name == "alpha_seq";
  });
  EXPECT_TRUE(has_alpha);
}

TEST_F(MetaStoreTest, ABootKeepsItsNewestBundleAndTheOneItReplacedNoMore) {
  MetaStore store(root_ / "meta");
  std::vector<std::string> keys;
  for (int revision = 0; revision < 3; ++revision) {
    std::map<std::string, std::string> members =
        MetaBootMembers(test_support::kMetaFixtures, TestBootId(1));
    for (int m = 0; m < revision; ++m) members = WithModuleEvent(std::move(members), m);
    Result<MetaBoot> boot = ValidateMetaBoot(TestBootId(1), UstarArchive(members));
    ASSERT_TRUE(boot.ok()) << boot.error().message;
    ASSERT_TRUE(store.StoreBoot(*boot, {}, (revision + 1) * 1'000'000'000ll).ok());
    keys.push_back(boot->key);
  }
  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_TRUE(list.ok() && list->size() == 1u);
  EXPECT_EQ((*list)[0].revision, 3u);
  const fs::path formats = store.dir() / (*list)[0].boot_id / "formats";
  EXPECT_FALSE(fs::exists(formats / keys[0]));
  EXPECT_TRUE(fs::exists(formats / keys[1]));
  EXPECT_TRUE(fs::exists(formats / keys[2]));
}

TEST_F(MetaStoreTest, Malicious_IndexWithAPathInIt) {
  MetaStore store(root_ / "meta");
  fs::create_directories(store.dir());
  std::ofstream(store.dir() / "boots.json")
      << R"({"boots": [{"boot_id": "../../etc", "key": "00"}]})";
  Result<std::vector<MetaBootEntry>> list = store.List();
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.error().message, HasSubstr("bad entry"));
}

}  // namespace
}  // namespace hvtrace::hostd
