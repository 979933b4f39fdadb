// The agent's boot archive (guest-agent/src/boot_archive.h, ustar.h): what it
// writes must read back through the host's own parsers (hostd's ReadTar and
// ParseHarvestArchive), and the ELF note parser must survive hostile notes.
#include "boot_archive.h"

#include <gtest/gtest.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "formats_bundle.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "ustar.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// One ELF note: namesz, descsz, type, name and desc each padded to 4.
std::string Note(uint32_t type, std::string name, const std::string& desc) {
  std::string out(12, '\0');
  const uint32_t h[3] = {static_cast<uint32_t>(name.size()), static_cast<uint32_t>(desc.size()),
                         type};
  std::memcpy(out.data(), h, sizeof h);
  out += name + std::string((4 - name.size() % 4) % 4, '\0');
  out += desc + std::string((4 - desc.size() % 4) % 4, '\0');
  return out;
}

const std::string kBuildId(
    "\x12\x34\xab\xcd\x00\xff\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a"
    "\x0b\x0c\x0d\x0e",
    20);

TEST(UstarTest, RoundTripsThroughTheHostsReader) {
  std::vector<TarFile> files = {{"empty", ""},
                                {"one-block", std::string(512, 'x')},
                                {"odd", "hello\n"},
                                {"big", std::string(70000, '\x01')},
                                {"identity.json", "{\"a\": 1}\n"}};
  const std::string tar = WriteUstar(files);
  EXPECT_EQ(tar.size() % 512, 0u);
  auto members = hostd::ReadTar(Bytes(tar));
  ASSERT_TRUE(members.ok()) << members.error().message;
  ASSERT_EQ(members->size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ((*members)[i].name, files[i].name);
    EXPECT_EQ((*members)[i].data, files[i].data) << files[i].name;
  }
  // Deterministic: the same files give the same bytes (no mtime, no owner).
  EXPECT_EQ(WriteUstar(files), tar);
  // Cut anywhere before its end blocks, the host refuses it.
  EXPECT_FALSE(hostd::ReadTar(Bytes(tar.substr(0, tar.size() - 1024))).ok());
  EXPECT_FALSE(hostd::ReadTar(Bytes(tar.substr(0, 700))).ok());
}

TEST(GnuBuildIdTest, FindsTheGnuNoteAmongOthers) {
  const std::string notes = Note(6, std::string("Linux\0", 6), "abc") +
                            Note(1, std::string("Xen\0", 4), std::string(8, '\x07')) +
                            Note(3, std::string("GNU\0", 4), kBuildId);
  auto id = GnuBuildId(notes);
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(*id, "1234abcd00ff0102030405060708090a0b0c0d0e");
}

TEST(GnuBuildIdTest, HostileNotesGiveNoId) {
  const std::string good = Note(3, std::string("GNU\0", 4), kBuildId);
  EXPECT_FALSE(GnuBuildId("").has_value());
  EXPECT_FALSE(GnuBuildId(std::string(11, '\0')).has_value());
  // Truncated anywhere inside the note.
  for (size_t n = 1; n < good.size(); ++n)
    EXPECT_FALSE(GnuBuildId(good.substr(0, n)).has_value()) << "cut at " << n;
  // Sizes that overrun the list (and would wrap a 32-bit sum).
  for (uint32_t namesz : {0xffffffffu, 0xfffffffdu, 1000u}) {
    std::string bad = good;
    std::memcpy(bad.data(), &namesz, 4);
    EXPECT_FALSE(GnuBuildId(bad).has_value()) << namesz;
  }
  for (uint32_t descsz : {0xffffffffu, 0xfffffffdu, 21u + 4}) {
    std::string bad = good;
    std::memcpy(bad.data() + 4, &descsz, 4);
    EXPECT_FALSE(GnuBuildId(bad).has_value()) << descsz;
  }
  // Right type, wrong owner; right owner, wrong type; an empty or huge id.
  EXPECT_FALSE(GnuBuildId(Note(3, std::string("GNX\0", 4), kBuildId)).has_value());
  EXPECT_FALSE(GnuBuildId(Note(4, std::string("GNU\0", 4), kBuildId)).has_value());
  EXPECT_FALSE(GnuBuildId(Note(3, std::string("GNU\0", 4), "")).has_value());
  EXPECT_FALSE(GnuBuildId(Note(3, std::string("GNU\0", 4), std::string(65, 'a'))).has_value());
  // Odd name size (no NUL, 3 bytes): padded, then the real note follows.
  EXPECT_TRUE(GnuBuildId(Note(3, "GNU", "zz") + good).has_value());
}

// A tracefs and /proc as the guest shows them, from the fixtures.
class BootArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("hvtrace-boot-archive-" + std::to_string(getpid()));
    fs::remove_all(root_);
    const fs::path fx = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
    fs::create_directories(root_ / "tracing");
    fs::copy(fx / "formats", root_ / "tracing/events", fs::copy_options::recursive);
    Put(root_ / "tracing/events/header_page", Slurp(fx / "header_page"));
    Put(root_ / "tracing/events/header_event", Slurp(fx / "header_event"));
    Put(root_ / "tracing/events/enable", "0\n");  // Files beside the systems are no events.
    Put(root_ / "tracing/events/bad/broken/format", "name: broken\nID: x\n");
    Put(root_ / "tracing/printk_formats", "0xffffffff81000000 : \"hello %d\\n\"\n");
    Put(root_ / "proc/kallsyms", Slurp(fx / "kallsyms"));
    Put(root_ / "proc/version", "Linux version 6.12.0-test (gcc \"x\") #1 SMP\n");
    Put(root_ / "proc/modules", "virtio_console 45056 0 - Live 0x0000000000000000\n");
    Put(root_ / "proc/sys/kernel/random/boot_id", "0b1e5a1d-2c3d-4e5f-8a9b-0c1d2e3f4a5b\n");
    Put(root_ / "notes", Note(3, std::string("GNU\0", 4), kBuildId));
    paths_.tracefs = root_ / "tracing";
    paths_.proc = root_ / "proc";
    paths_.kallsyms = root_ / "proc/kallsyms";
    paths_.notes = root_ / "notes";
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
  BootArchivePaths paths_;
};

TEST_F(BootArchiveTest, ListingMatchesTheFormatFilesAndTheirFingerprints) {
  const FormatListing listing = ListFormats(paths_.tracefs + "/events");
  auto split = hostd::SplitFormatListing(listing.formats);
  ASSERT_TRUE(split.ok()) << split.error().message;
  EXPECT_EQ(split->size(), listing.events);
  EXPECT_EQ(listing.unparsed, 1u);  // bad/broken
  for (const hostd::HarvestedEvent& ev : *split) {
    EXPECT_EQ(ev.text, Slurp(root_ / "tracing/events" / ev.system / ev.name / "format"))
        << ev.system << "/" << ev.name;
  }
  // One fingerprint line per parsed event, recomputed here from the file.
  std::istringstream lines(listing.fingerprints);
  std::string name;
  uint32_t id = 0;
  std::string fp;
  size_t n = 0;
  while (lines >> name >> id >> fp) {
    ++n;
    const std::string sys = name.substr(0, name.find('/'));
    auto parsed = ParseEventFormat(sys, Slurp(root_ / "tracing/events" / name / "format"));
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(id, parsed->id) << name;
    char want[17];
    std::snprintf(want, sizeof want, "%016llx",
                  static_cast<unsigned long long>(EventFingerprint(*parsed)));
    EXPECT_EQ(fp, want) << name;
  }
  EXPECT_EQ(n, listing.events - 1);
  EXPECT_GT(n, 3u);
}

TEST_F(BootArchiveTest, ArchiveIsAHarvestPlusIdentityAndFramesAsKBoot) {
  const BootArchive a = BuildBootArchive(paths_);
  EXPECT_EQ(a.boot_id_text, "0b1e5a1d-2c3d-4e5f-8a9b-0c1d2e3f4a5b");
  auto members = hostd::ReadTar(Bytes(a.tar));
  ASSERT_TRUE(members.ok()) << members.error().message;
  std::map<std::string, std::string> by_name;
  for (auto& m : *members) by_name[m.name] = m.data;
  for (const char* want : {"formats", "header_page", "header_event", "printk_formats", "kallsyms",
                           "version", "release", "modules", "fingerprints", "identity.json"}) {
    EXPECT_EQ(by_name.count(want), 1u) << want;
  }
  utsname u{};
  uname(&u);
  EXPECT_EQ(by_name["release"], std::string(u.release) + "\n");
  const std::string& identity = by_name["identity.json"];
  EXPECT_NE(identity.find("\"boot_id\": \"0b1e5a1d-2c3d-4e5f-8a9b-0c1d2e3f4a5b\""),
            std::string::npos)
      << identity;
  EXPECT_NE(identity.find("\"build_id\": \"1234abcd00ff0102030405060708090a0b0c0d0e\""),
            std::string::npos)
      << identity;
  // The quotes of /proc/version are escaped: the JSON stays one string.
  EXPECT_NE(identity.find("(gcc \\\"x\\\") #1 SMP\""), std::string::npos) << identity;
  EXPECT_NE(identity.find("\"page_size\": " + std::to_string(sysconf(_SC_PAGESIZE))),
            std::string::npos);

  // The harvest members alone are what the host's harvest parser reads.
  std::vector<TarFile> harvest;
  for (auto& [name, data] : by_name) {
    if (name != "identity.json" && name != "fingerprints") harvest.push_back({name, data});
  }
  const std::string harvest_tar = WriteUstar(harvest);
  auto bundle = hostd::ParseHarvestArchive(Bytes(harvest_tar));
  ASSERT_TRUE(bundle.ok()) << bundle.error().message;
  EXPECT_EQ(bundle->unparsed, 1u);
  EXPECT_GT(bundle->kallsyms_nonzero_addresses, 0u);

  // The frame decodes to the same archive, sequence 0, this boot's id.
  meta::MetaDecoder decoder;
  decoder.Feed(a.frame);
  auto frame = decoder.Next();
  ASSERT_TRUE(frame.has_value());
  ASSERT_TRUE(frame->ok()) << frame->error().message;
  EXPECT_EQ((*frame)->type, meta::MetaType::kBoot);
  EXPECT_EQ((*frame)->sequence, 0u);
  EXPECT_EQ(meta::BootIdString((*frame)->boot_id), a.boot_id_text);
  EXPECT_EQ((*frame)->payload, a.tar);
  EXPECT_LT(a.frame.size(), a.tar.size());  // Compressed.
  EXPECT_NE(a.note.find("build id 1234abcd"), std::string::npos) << a.note;
}

TEST_F(BootArchiveTest, MissingBootIdAndNotesAreSaidNotGuessed) {
  fs::remove(root_ / "proc/sys/kernel/random/boot_id");
  fs::remove(root_ / "notes");
  const BootArchive a = BuildBootArchive(paths_);
  EXPECT_EQ(a.boot_id_text, "");
  EXPECT_EQ(a.boot_id, meta::BootId{});
  EXPECT_NE(a.note.find("build id (none)"), std::string::npos) << a.note;
  EXPECT_NE(a.note.find("no boot_id"), std::string::npos) << a.note;
  auto members = hostd::ReadTar(Bytes(a.tar));
  ASSERT_TRUE(members.ok());
  for (auto& m : *members) {
    if (m.name == "identity.json") {
      EXPECT_NE(m.data.find("\"build_id\": \"\""), std::string::npos) << m.data;
    }
  }
}

}  // namespace
}  // namespace hvtrace::agent
