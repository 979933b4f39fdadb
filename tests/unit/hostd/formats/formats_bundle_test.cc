// The harvest's host-side parsers: SHA-256, the strict tar reader, the format
// listing splitter and the whole-archive check, with hostile archives.
#include "formats_bundle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "sha256.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::span<const std::byte> AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string ReadText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Builds ustar archives byte by byte, so tests can make them wrong on purpose.
class TarBuilder {
 public:
  struct Options {
    char type = '0';
    std::string size_field;       // Overrides the octal size when not empty.
    std::string prefix;           // POSIX prefix field.
    int checksum_delta = 0;       // Added to the correct checksum.
    const char* magic = "ustar";  // Followed by NUL and "00".
  };

  TarBuilder& Add(const std::string& name, const std::string& data, Options o) {
    std::string h(512, '\0');
    h.replace(0, std::min<size_t>(name.size(), 100), name.substr(0, 100));
    Put(&h, 100, "0000644");
    Put(&h, 108, "0000000");
    Put(&h, 116, "0000000");
    char size[16];
    std::snprintf(size, sizeof(size), "%011llo", static_cast<unsigned long long>(data.size()));
    Put(&h, 124, o.size_field.empty() ? std::string(size) : o.size_field);
    Put(&h, 136, "00000000000");
    h[156] = o.type;
    std::memcpy(&h[257], o.magic, std::strlen(o.magic));
    if (std::strcmp(o.magic, "ustar") == 0) Put(&h, 263, "00");
    h.replace(345, std::min<size_t>(o.prefix.size(), 155), o.prefix.substr(0, 155));
    std::memset(&h[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    char chk[8];
    std::snprintf(chk, sizeof(chk), "%06o",
                  static_cast<unsigned>(static_cast<int>(sum) + o.checksum_delta));
    std::memcpy(&h[148], chk, 7);
    out_ += h;
    out_ += data;
    out_.append((512 - data.size() % 512) % 512, '\0');
    return *this;
  }
  TarBuilder& Add(const std::string& name, const std::string& data) { return Add(name, data, {}); }
  std::string Finish() const { return out_ + std::string(1024, '\0'); }
  std::string Unfinished() const { return out_; }

 private:
  static void Put(std::string* h, size_t off, const std::string& v) {
    h->replace(off, v.size(), v);
  }
  std::string out_;
};

// ---- SHA-256 ----

TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(Sha256Hex(AsBytes("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex(AsBytes("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(AsBytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, MillionAInOddChunks) {
  Sha256 h;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, left % 3 == 0 ? size_t{1} : chunk.size());
    h.Update(AsBytes(std::string_view(chunk).substr(0, n)));
    left -= n;
  }
  EXPECT_EQ(Sha256::Hex(h.Finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, FileMatchesBytesAndNamesMissingFile) {
  const std::string path =
      (fs::temp_directory_path() / ("hvtrace-sha-" + std::to_string(getpid()))).string();
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + (i >> 9));
  std::ofstream(path, std::ios::binary) << data;
  Result<std::string> file = Sha256File(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(*file, Sha256Hex(AsBytes(data)));
  fs::remove(path);
  Result<std::string> missing = Sha256File(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr(path));
}

// ---- tar ----

TEST(ReadTarTest, ReadsFilesSkipsDirectoriesStripsDotSlash) {
  TarBuilder t;
  TarBuilder::Options dir;
  dir.type = '5';
  t.Add("./", "", dir).Add("./a", "hello").Add("sub/", "", dir).Add("sub/b", std::string(700, 'x'));
  Result<std::vector<TarMember>> m = ReadTar(AsBytes(t.Finish()));
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].name, "a");
  EXPECT_EQ((*m)[0].data, "hello");
  EXPECT_EQ((*m)[1].name, "sub/b");
  EXPECT_EQ((*m)[1].data, std::string(700, 'x'));
}

TEST(ReadTarTest, PosixPrefixJoinsTheName) {
  TarBuilder t;
  TarBuilder::Options o;
  o.prefix = "deep/dir";
  t.Add("file", "x", o);
  Result<std::vector<TarMember>> m = ReadTar(AsBytes(t.Finish()));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)[0].name, "deep/dir/file");
}

// The guest packs with busybox tar; the same tool on the host is the oracle.
TEST(ReadTarTest, ReadsArchivesFromBusyboxAndGnuTar) {
  const fs::path dir = fs::temp_directory_path() / ("hvtrace-tar-" + std::to_string(getpid()));
  fs::create_directories(dir / "src");
  std::ofstream(dir / "src" / "formats") << "sched/sched_switch/format:name: sched_switch\n";
  std::ofstream(dir / "src" / "kallsyms") << std::string(100000, 'k');
  std::ofstream(dir / "src" / "empty");
  int tools = 0;
  for (const std::string tool : {"busybox tar", "tar --format=ustar", "tar --format=gnu"}) {
    const std::string bin = tool.substr(0, tool.find(' '));
    if (std::system(("command -v " + bin + " >/dev/null 2>&1").c_str()) != 0) continue;
    if (bin == "busybox" && std::system("busybox tar --help >/dev/null 2>&1") != 0) continue;
    ++tools;
    const fs::path out = dir / "a.tar";
    const std::string cmd = "cd " + (dir / "src").string() + " && " + tool + " -cf " +
                            out.string() + " formats kallsyms empty";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::string archive = ReadText(out);
    Result<std::vector<TarMember>> m = ReadTar(AsBytes(archive));
    ASSERT_TRUE(m.ok()) << tool << ": " << m.error().message;
    ASSERT_EQ(m->size(), 3u) << tool;
    EXPECT_EQ((*m)[0].name, "formats");
    EXPECT_EQ((*m)[0].data, "sched/sched_switch/format:name: sched_switch\n");
    EXPECT_EQ((*m)[1].data, std::string(100000, 'k'));
    EXPECT_EQ((*m)[2].data, "");
    fs::remove(out);
  }
  fs::remove_all(dir);
  if (tools == 0) GTEST_SKIP() << "neither busybox nor GNU tar is installed";
}

void ExpectTarError(const std::string& archive, const std::string& needle,
                    const TarLimits& limits = {}) {
  Result<std::vector<TarMember>> m = ReadTar(AsBytes(archive), limits);
  ASSERT_FALSE(m.ok()) << "accepted an archive that should fail with '" << needle << "'";
  EXPECT_THAT(m.error().message, HasSubstr(needle));
}

TEST(ReadTarTest, Malicious_PathTraversal) {
  for (const std::string name : {"../etc/passwd", "a/../../b", "/etc/passwd", "a//b", "a/./b", "..",
                                 "a/..", "x y", "a\\b", "new\nline", "a/"}) {
    SCOPED_TRACE(name);
    ExpectTarError(TarBuilder().Add(name, "x").Finish(), "tar member name");
  }
}

TEST(ReadTarTest, Malicious_PrefixTraversal) {
  TarBuilder::Options o;
  o.prefix = "..";
  ExpectTarError(TarBuilder().Add("passwd", "x", o).Finish(), "'../passwd'");
}

TEST(ReadTarTest, Malicious_LinksDevicesAndExtensionHeaders) {
  for (char type : {'1', '2', '3', '4', '6', '7', 'L', 'K', 'x', 'g', 'S'}) {
    SCOPED_TRACE(std::string(1, type));
    TarBuilder::Options o;
    o.type = type;
    ExpectTarError(TarBuilder().Add("link", "", o).Finish(), "only regular files and directories");
  }
}

TEST(ReadTarTest, Malicious_BadChecksum) {
  TarBuilder::Options o;
  o.checksum_delta = 1;
  ExpectTarError(TarBuilder().Add("a", "x", o).Finish(), "checksum");
}

TEST(ReadTarTest, Malicious_NotUstar) {
  TarBuilder::Options o;
  o.magic = "xstar";
  ExpectTarError(TarBuilder().Add("a", "x", o).Finish(), "ustar magic");
}

TEST(ReadTarTest, Malicious_SizePastTheEnd) {
  TarBuilder::Options o;
  o.size_field = "00000010000";  // 4096 bytes claimed, 1 present.
  ExpectTarError(TarBuilder().Add("a", "x", o).Unfinished(), "claims 4096 bytes");
}

TEST(ReadTarTest, Malicious_HugeAndNonOctalSizes) {
  TarBuilder::Options huge;
  huge.size_field = "77777777777";
  ExpectTarError(TarBuilder().Add("a", "x", huge).Finish(), "limit");
  TarBuilder::Options base256;
  base256.size_field = std::string("\x80\0\0\0\0\0\0\0\0\0\0\x01", 12);
  ExpectTarError(TarBuilder().Add("a", "x", base256).Finish(), "unreadable size");
  TarBuilder::Options digits;
  digits.size_field = "0000000009";
  ExpectTarError(TarBuilder().Add("a", "x", digits).Finish(), "unreadable size");
}

TEST(ReadTarTest, Malicious_DirectoryWithData) {
  TarBuilder::Options o;
  o.type = '5';
  o.size_field = "00000000001";
  ExpectTarError(TarBuilder().Add("d/", "x", o).Finish(), "claims 1 bytes");
}

TEST(ReadTarTest, Malicious_DuplicateMember) {
  ExpectTarError(TarBuilder().Add("a", "x").Add("./a", "y").Finish(), "appears twice");
}

TEST(ReadTarTest, Malicious_LimitsOnCountAndTotal) {
  TarBuilder t;
  for (int i = 0; i < 5; ++i) t.Add("m" + std::to_string(i), std::string(100, 'a'));
  TarLimits few;
  few.max_members = 4;
  ExpectTarError(t.Finish(), "more than 4 members", few);
  TarLimits small_total;
  small_total.max_total_bytes = 450;
  ExpectTarError(t.Finish(), "in total", small_total);
  TarLimits small_member;
  small_member.max_member_bytes = 99;
  ExpectTarError(t.Finish(), "limit is 99", small_member);
}

TEST(ReadTarTest, Malicious_TruncatedTransfer) {
  const std::string whole = TarBuilder().Add("a", std::string(2000, 'z')).Add("b", "x").Finish();
  // Cut anywhere before the end-of-archive block: always an error, never a
  // silently shorter member.
  for (size_t cut : {size_t{0}, size_t{100}, size_t{512}, size_t{1500}, size_t{2560}, size_t{3072},
                     size_t{3100}}) {
    SCOPED_TRACE(cut);
    Result<std::vector<TarMember>> m = ReadTar(AsBytes(std::string_view(whole).substr(0, cut)));
    EXPECT_FALSE(m.ok());
  }
  EXPECT_TRUE(ReadTar(AsBytes(whole)).ok());
}

// ---- format listing ----

TEST(SplitFormatListingTest, GroupsLinesPerEvent) {
  const std::string listing =
      "sched/sched_switch/format:name: sched_switch\n"
      "sched/sched_switch/format:ID: 7\n"
      "sched/sched_switch/format:\n"
      "irq/irq_handler_entry/format:name: irq_handler_entry\n"
      "irq/irq_handler_entry/format:print fmt: \"a:b\"\n";
  Result<std::vector<HarvestedEvent>> ev = SplitFormatListing(listing);
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  ASSERT_EQ(ev->size(), 2u);
  EXPECT_EQ((*ev)[0].system, "sched");
  EXPECT_EQ((*ev)[0].name, "sched_switch");
  EXPECT_EQ((*ev)[0].text, "name: sched_switch\nID: 7\n\n");
  EXPECT_EQ((*ev)[1].text, "name: irq_handler_entry\nprint fmt: \"a:b\"\n");
}

TEST(SplitFormatListingTest, Malicious_BadLines) {
  const std::pair<std::string, std::string> cases[] = {
      {"no prefix here\n", "no '<system>/' prefix"},
      {"sched:name\n", "no '<system>/' prefix"},
      {"sched/x:name\n", "no '<event>/' prefix"},
      {"sched/x/fmt:name\n", "expected '<system>/<event>/format:'"},
      {"../x/format:name\n", "unsafe"},
      {".hidden/x/format:name\n", "unsafe"},
      {"a b/x/format:name\n", "unsafe"},
      {"a/x/format:1\nb/y/format:2\na/x/format:3\n", "not contiguous"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    Result<std::vector<HarvestedEvent>> ev = SplitFormatListing(text);
    ASSERT_FALSE(ev.ok());
    EXPECT_THAT(ev.error().message, HasSubstr(needle));
  }
}

TEST(SplitFormatListingTest, Malicious_OversizedFormat) {
  std::string listing;
  const std::string line = "s/e/format:" + std::string(1000, 'x') + "\n";
  while (listing.size() < (1u << 20) + (64u << 10)) listing += line;
  Result<std::vector<HarvestedEvent>> ev = SplitFormatListing(listing);
  ASSERT_FALSE(ev.ok());
  EXPECT_THAT(ev.error().message, HasSubstr("exceeds"));
}

// ---- kallsyms ----

TEST(FindKallsymTest, FindsKernelAndModuleSymbols) {
  const std::string k =
      "ffffffff81000000 T _stext\n"
      "ffffffff81000010 t startup_64\n"
      "ffffffffc0001000 t pvpanic_probe\t[pvpanic]\n";
  Result<uint64_t> a = FindKallsym(k, "_stext");
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(*a, 0xffffffff81000000ull);
  Result<uint64_t> b = FindKallsym(k, "pvpanic_probe");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(*b, 0xffffffffc0001000ull);
  EXPECT_FALSE(FindKallsym(k, "_stex").ok());
  EXPECT_FALSE(FindKallsym("zzzz T _stext\n", "_stext").ok());
  EXPECT_FALSE(FindKallsym("11112222333344445 T _stext\n", "_stext").ok());
}

// ---- the whole archive ----

const fs::path kFixtures = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";

// A listing as `grep -H '' */*/format` prints it, from the real 6.12 formats
// in the fixtures.
std::string FixtureListing(std::vector<std::pair<std::string, std::string>>* events = nullptr) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(kFixtures / "formats")) {
    if (e.path().filename() != "format") continue;
    const fs::path rel = fs::relative(e.path(), kFixtures / "formats");
    files[rel.string()] = ReadText(e.path());
  }
  std::string listing;
  for (const auto& [rel, text] : files) {
    if (events != nullptr) {
      events->push_back({rel.substr(0, rel.find('/')),
                         rel.substr(rel.find('/') + 1, rel.rfind('/') - rel.find('/') - 1)});
    }
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) listing += rel + ":" + line + "\n";
  }
  return listing;
}

struct Members {
  std::map<std::string, std::string> m;
  Members() {
    m["formats"] = FixtureListing();
    m["header_page"] = ReadText(kFixtures / "header_page");
    m["header_event"] = ReadText(kFixtures / "header_event");
    m["printk_formats"] = "0xffffffff82a0c1e0 : \"hello\\n\"\n";
    m["kallsyms"] = "ffffffff81000000 T _stext\n0000000000000000 A fixed_percpu_data\n";
    m["version"] = "Linux version 6.12.95+deb12-amd64 (debian-kernel@lists.debian.org) #1 SMP\n";
    m["release"] = "6.12.95+deb12-amd64\n";
    m["modules"] = "pvpanic 12288 2 pvpanic_pci,pvpanic_mmio, Live 0x0000000000000000\n";
  }
  std::string Tar() const {
    TarBuilder t;
    for (const auto& [name, data] : m) t.Add(name, data);
    return t.Finish();
  }
};

TEST(ParseHarvestArchiveTest, RealFormatsParse) {
  std::vector<std::pair<std::string, std::string>> names;
  FixtureListing(&names);
  ASSERT_GE(names.size(), 3u) << "fixtures missing in " << kFixtures;
  Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(Members().Tar()));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->release, "6.12.95+deb12-amd64");
  EXPECT_THAT(b->proc_version, HasSubstr("Linux version 6.12.95"));
  EXPECT_EQ(b->events.size(), names.size());
  EXPECT_EQ(b->unparsed, 0u);
  EXPECT_TRUE(b->rejected.empty());
  EXPECT_EQ(b->kallsyms_symbols, 2u);
  EXPECT_EQ(b->kallsyms_nonzero_addresses, 1u);
  bool have_switch = false;
  for (const HarvestedEvent& e : b->events) {
    EXPECT_TRUE(e.parse_error.empty()) << e.system << "/" << e.name << ": " << e.parse_error;
    if (e.system == "sched" && e.name == "sched_switch") {
      have_switch = true;
      EXPECT_NE(e.id, 0u);
      EXPECT_EQ(e.text, ReadText(kFixtures / "formats/sched/sched_switch/format"));
    }
  }
  EXPECT_TRUE(have_switch);
}

TEST(ParseHarvestArchiveTest, UnparsableFormatIsKeptWithItsError) {
  Members m;
  m.m["formats"] += "x/broken/format:name: broken\nx/broken/format:ID: nope\n";
  Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b->unparsed, 1u);
  auto it = std::find_if(b->events.begin(), b->events.end(),
                         [](const HarvestedEvent& e) { return e.name == "broken"; });
  ASSERT_NE(it, b->events.end());
  EXPECT_THAT(it->parse_error, HasSubstr("ID"));
}

TEST(ParseHarvestArchiveTest, Malicious_DuplicateIdAndMisnamedFormatAreDropped) {
  Members m;
  const std::string sw = ReadText(kFixtures / "formats/sched/sched_switch/format");
  std::string listing;
  std::istringstream in(sw);
  std::string line;
  while (std::getline(in, line)) listing += "zz/sched_switch/format:" + line + "\n";  // Same id.
  in.clear();
  in.str(sw);
  while (std::getline(in, line)) listing += "zz/other/format:" + line + "\n";  // Name mismatch.
  m.m["formats"] += listing;
  Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_EQ(b->rejected.size(), 2u);
  EXPECT_THAT(b->rejected[0], HasSubstr("is also"));
  EXPECT_THAT(b->rejected[1], HasSubstr("names the event 'sched_switch'"));
  for (const HarvestedEvent& e : b->events) EXPECT_NE(e.system, "zz");
}

TEST(ParseHarvestArchiveTest, Malicious_MissingUnexpectedOrBadMembers) {
  {
    Members m;
    m.m.erase("header_page");
    Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.error().message, HasSubstr("'header_page' is missing"));
  }
  {
    Members m;
    m.m["etc_passwd"] = "root:x:0:0";
    Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.error().message, HasSubstr("unexpected member 'etc_passwd'"));
  }
  {
    Members m;
    m.m["release"] = "6.12; rm -rf /\n";
    Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.error().message, HasSubstr("not a kernel release"));
  }
  {
    Members m;
    m.m["version"] = "Linux\x1b[2J\n";
    EXPECT_FALSE(ParseHarvestArchive(AsBytes(m.Tar())).ok());
  }
  {
    Members m;
    m.m["header_page"] = "garbage\n";
    Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.error().message, HasSubstr("header_page"));
  }
  {
    Members m;
    m.m["release"] = std::string(300, '6');
    Result<HarvestBundle> b = ParseHarvestArchive(AsBytes(m.Tar()));
    ASSERT_FALSE(b.ok());
    EXPECT_THAT(b.error().message, HasSubstr("limit"));
  }
  {
    Members m;
    m.m["formats"] = "";
    EXPECT_FALSE(ParseHarvestArchive(AsBytes(m.Tar())).ok());
  }
}

}  // namespace
}  // namespace hvtrace::hostd
