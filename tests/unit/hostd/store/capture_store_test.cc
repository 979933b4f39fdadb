#include "capture_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "state_dir.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::TempDir;

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  return v;
}

std::vector<std::string> DirNames(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

CaptureManifest SampleManifest() {
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  m.triggered = HostTime{1718187330123000000LL, 5000};
  m.kernel = {{"release", "6.12.9+bpo-amd64"}};
  m.region = {{"file", "/dev/shm/x"}, {"offset", 0}, {"size", 4096}};
  m.cpus.push_back({0, 10, 2, 1, {{"bad_magic", 1}}});
  m.cpus.push_back({1, 5, 1, 0, {}});
  m.qmp_events.push_back({"GUEST_PANICKED", {1718187330123000000LL, 4000}, {{"action", "pause"}}});
  return m;
}

TEST(CaptureStoreTest, CommitMakesCompleteCaptureVisible) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "vms/vm1/captures");
  auto pending = store.Begin("panic", HostTime{1718187330123000000LL, 1});
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  auto region = Bytes(8192, 3);
  ASSERT_TRUE((*pending)->WriteFile("region.bin", region).ok());
  // Nothing is visible before Commit.
  auto before = store.List();
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(before->empty());

  auto entry = (*pending)->Commit(SampleManifest());
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_EQ(entry->id, "20240612T101530.123Z-panic");
  EXPECT_EQ(DirNames(store.dir()), std::vector<std::string>{entry->id});
  EXPECT_EQ(DirNames(entry->dir), (std::vector<std::string>{"manifest.json", "region.bin"}));
  EXPECT_EQ(fs::file_size(entry->dir / "region.bin"), region.size());

  json m = ReadJson(entry->dir / "manifest.json");
  EXPECT_EQ(m["format"], "hvtrace-capture");
  EXPECT_EQ(m["id"], entry->id);
  EXPECT_EQ(m["vm"], "vm1");
  EXPECT_EQ(m["trigger"], "panic");
  EXPECT_EQ(m["host_time"]["triggered"]["realtime_ns"], 1718187330123000000LL);
  EXPECT_GT(m["host_time"]["completed"]["monotonic_ns"].get<int64_t>(), 0);
  EXPECT_EQ(m["kernel"]["release"], "6.12.9+bpo-amd64");
  EXPECT_EQ(m["totals"]["events"], 15);
  EXPECT_EQ(m["totals"]["bad_pages"], 1);
  EXPECT_EQ(m["cpus"][0]["bad_pages"]["bad_magic"], 1);
  EXPECT_EQ(m["qmp_events"][0]["event"], "GUEST_PANICKED");
  EXPECT_EQ(m["files"], json::parse(R"([{"name":"region.bin","bytes":8192}])"));

  auto list = store.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].summary["trigger"], "panic");
  EXPECT_EQ((*list)[0].summary["totals"]["events"], 15);
  EXPECT_FALSE((*list)[0].summary.contains("error"));
}

TEST(CaptureStoreTest, AbandonedCaptureLeavesNothing) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  {
    auto pending = store.Begin("manual", HostTime::Now());
    ASSERT_TRUE(pending.ok());
    ASSERT_TRUE((*pending)->WriteFile("region.bin", Bytes(100, 1)).ok());
  }
  EXPECT_TRUE(DirNames(store.dir()).empty());
}

TEST(CaptureStoreTest, SameMillisecondGetsSuffix) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  HostTime t{1718187330123000000LL, 1};
  std::vector<std::unique_ptr<PendingCapture>> pending;
  for (int i = 0; i < 3; ++i) {
    auto p = store.Begin("reset", t);
    ASSERT_TRUE(p.ok());
    pending.push_back(std::move(*p));
  }
  std::vector<std::string> ids;
  for (auto& p : pending) {
    auto e = p->Commit(SampleManifest());
    ASSERT_TRUE(e.ok()) << e.error().message;
    ids.push_back(e->id);
  }
  EXPECT_EQ(ids,
            (std::vector<std::string>{"20240612T101530.123Z-reset", "20240612T101530.123Z-reset-2",
                                      "20240612T101530.123Z-reset-3"}));
}

TEST(CaptureStoreTest, ListIsChronologicalAndPruneKeepsNewest) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  for (int i = 0; i < 5; ++i) {
    auto p = store.Begin("manual", HostTime{1700000000000000000LL + i * 1000000000LL, 0});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Commit(SampleManifest()).ok());
  }
  auto pruned = store.Prune(2);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(*pruned, 3u);
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id, "20231114T221323.000Z-manual");
  EXPECT_EQ((*list)[1].id, "20231114T221324.000Z-manual");
  EXPECT_EQ(*store.Prune(0), 0u);
}

TEST(CaptureStoreTest, Malicious_DamagedManifestIsListedWithError) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  auto p = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(p.ok());
  auto e = (*p)->Commit(SampleManifest());
  ASSERT_TRUE(e.ok());
  std::ofstream(e->dir / "manifest.json", std::ios::trunc) << "{\"vm\": [unterminated";
  fs::create_directory(store.dir() / "20990101T000000.000Z-manual");  // No manifest at all.
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_NE((*list)[0].summary["error"].get<std::string>().find("not a JSON object"),
            std::string::npos);
  EXPECT_NE((*list)[1].summary["error"].get<std::string>().find("manifest.json"),
            std::string::npos);
}

TEST(CaptureStoreTest, Malicious_BadNamesRejected) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  EXPECT_FALSE(store.Begin("../x", HostTime::Now()).ok());
  EXPECT_FALSE(store.Begin("", HostTime::Now()).ok());
  EXPECT_FALSE(store.Begin("PANIC", HostTime::Now()).ok());
  auto p = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(p.ok());
  std::vector<std::byte> one(1);
  EXPECT_FALSE((*p)->WriteFile("../escape", one).ok());
  EXPECT_FALSE((*p)->WriteFile(".hidden", one).ok());
  EXPECT_FALSE((*p)->WriteFile("", one).ok());
  EXPECT_TRUE((*p)->WriteFile("trace.dat", one).ok());
  EXPECT_FALSE((*p)->WriteFile("trace.dat", one).ok()) << "must not overwrite";
  EXPECT_FALSE(fs::exists(tmp.path() / "escape"));
}

// WriteFiles: a set written, synced and published together; a set with a
// bad or taken name publishes none of it and leaves no part file.
TEST(CaptureStoreTest, WriteFilesPublishesTheWholeSetOrNone) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  auto p = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(p.ok());
  const std::vector<std::byte> a(3, std::byte{'a'}), b(70000, std::byte{'b'});
  const PendingCapture::NamedBytes set[] = {{"a.txt", a}, {"b.zst", b}};
  ASSERT_TRUE((*p)->WriteFiles(set).ok());
  EXPECT_EQ(fs::file_size((*p)->dir() / "a.txt"), 3u);
  EXPECT_EQ(fs::file_size((*p)->dir() / "b.zst"), 70000u);
  const PendingCapture::NamedBytes taken[] = {{"c.txt", a}, {"a.txt", a}};
  EXPECT_FALSE((*p)->WriteFiles(taken).ok()) << "must not overwrite";
  const PendingCapture::NamedBytes bad[] = {{"d.txt", a}, {"../escape", a}};
  EXPECT_FALSE((*p)->WriteFiles(bad).ok());
  size_t files = 0;
  for (const auto& e : fs::directory_iterator((*p)->dir())) {
    ++files;
    EXPECT_NE(e.path().filename().string().front(), '.') << e.path();
  }
  EXPECT_EQ(files, 2u) << "c.txt and d.txt are not published, nor left as parts";
  EXPECT_FALSE(fs::exists(tmp.path() / "escape"));
}

TEST(CaptureStoreTest, IncompleteCapturesAreListedAndCanBeTakenOver) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  auto p = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->WriteFile("region.bin", Bytes(10, 0)).ok());
  // Simulate a daemon that died mid-capture: the temp dir stays behind.
  const fs::path leftover = (*p)->dir();
  fs::copy(leftover, store.dir() / ".tmp-crashed", fs::copy_options::recursive);
  auto listed = store.ListIncomplete();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<fs::path>{leftover, store.dir() / ".tmp-crashed"}));
  auto odd = store.Resume(store.dir() / ".tmp-crashed");
  EXPECT_FALSE(odd.ok());
  EXPECT_FALSE(store.Resume(tmp.path() / ".tmp-x-abcdef").ok()) << "not in this store";
  p->reset();  // The original owner is gone; a new one takes the same directory over.
  fs::copy(store.dir() / ".tmp-crashed", leftover, fs::copy_options::recursive);
  auto resumed = store.Resume(leftover);
  ASSERT_TRUE(resumed.ok()) << resumed.error().message;
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  auto entry = (*resumed)->Commit(m);
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_EQ(entry->id,
            leftover.filename().string().substr(5, leftover.filename().string().size() - 12));
  EXPECT_TRUE(fs::exists(entry->dir / "region.bin"));
}

// The recovery record staged beside the copy (StageRecoveryRecord) makes
// nothing durable: a capture that fails before PublishRecoveryRecord, or is
// dropped, leaves nothing; once published it is kept for the next start.
TEST(CaptureStoreTest, AStagedRecoveryRecordCountsOnlyOncePublished) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  m.triggered = HostTime::Now();
  {
    auto p = store.Begin("panic", m.triggered);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->StageRecoveryRecord(m).ok());
    ASSERT_TRUE((*p)->WriteFile("region.bin", Bytes(10, 0)).ok());
    EXPECT_FALSE((*p)->durable());
  }
  auto left = store.ListIncomplete();
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << left->front();
  auto p = store.Begin("panic", m.triggered);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->StageRecoveryRecord(m).ok());
  ASSERT_TRUE((*p)->WriteFile("region.bin", Bytes(10, 0)).ok());
  ASSERT_TRUE((*p)->PublishRecoveryRecord().ok());
  EXPECT_TRUE((*p)->durable());
  const fs::path dir = (*p)->dir();
  EXPECT_EQ(DirNames(dir), (std::vector<std::string>{"recovery.json", "region.bin"}));
  p->reset();
  EXPECT_TRUE(fs::exists(dir / "recovery.json")) << "kept for the next start";
}

TEST(CaptureStoreTest, VmNamesAreValidated) {
  EXPECT_TRUE(ValidateVmName("vm-1.test_A").ok());
  EXPECT_FALSE(ValidateVmName("").ok());
  EXPECT_FALSE(ValidateVmName("..").ok());
  EXPECT_FALSE(ValidateVmName("a/b").ok());
  EXPECT_FALSE(ValidateVmName("-rf").ok());
  EXPECT_FALSE(ValidateVmName(std::string(65, 'a')).ok());
  EXPECT_FALSE(ValidateVmName(std::string("a\0b", 3)).ok());
}

// A real full filesystem: a 256 KiB tmpfs. Needs CAP_SYS_ADMIN; without it the
// RLIMIT_FSIZE test below covers the same error path.
TEST(CaptureStoreTest, FullDiskIsReportedWithPathAndLeavesNothing) {
  TempDir tmp;
  fs::path mnt = tmp.path() / "small";
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here: " << std::strerror(errno);
  }
  {
    CaptureStore store(mnt / "vms/vm1/captures");
    auto p = store.Begin("panic", HostTime::Now());
    ASSERT_TRUE(p.ok()) << p.error().message;
    Status s = (*p)->WriteFile("region.bin", Bytes(1 << 20, 9));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find((*p)->dir().string() + "/region.bin"), std::string::npos)
        << s.error().message;
    EXPECT_NE(s.error().message.find("No space left on device"), std::string::npos)
        << s.error().message;
    p->reset();
    EXPECT_TRUE(DirNames(store.dir()).empty());
    auto list = store.List();
    ASSERT_TRUE(list.ok());
    EXPECT_TRUE(list->empty());
  }
  ASSERT_EQ(::umount2(mnt.c_str(), MNT_DETACH), 0);
}

TEST(CaptureStoreTest, FileSizeLimitIsReportedAndLeavesNothing) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {65536, 65536};
    setrlimit(RLIMIT_FSIZE, &lim);
    auto p = store.Begin("panic", HostTime::Now());
    if (!p.ok()) _exit(2);
    Status s = (*p)->WriteFile("region.bin", Bytes(1 << 20, 9));
    if (s.ok()) _exit(3);
    if (s.error().message.find("region.bin at offset 65536") == std::string::npos) _exit(4);
    p->reset();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(DirNames(store.dir()).empty());
}

TEST(CopyRegionFileTest, CopiesRangeAndRefusesShortFiles) {
  TempDir tmp;
  fs::path f = tmp.path() / "region";
  auto data = Bytes(10000, 5);
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
  auto copy = CopyRegionFile(f, 1000, 4096);
  ASSERT_TRUE(copy.ok()) << copy.error().message;
  EXPECT_TRUE(std::equal(copy->begin(), copy->end(), data.begin() + 1000));
  auto too_long = CopyRegionFile(f, 8000, 4096);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find(f.string()), std::string::npos);
  EXPECT_FALSE(CopyRegionFile(f, UINT64_MAX, 2).ok());
  EXPECT_FALSE(CopyRegionFile(tmp.path() / "missing", 0, 1).ok());
}

// The capture's region.bin: the same bytes as the region (zero pages as
// holes), a private copy for the decoder, errors naming the source.
TEST(CopyRegionTest, WritesTheRegionSparselyAndKeepsAPrivateCopy) {
  TempDir tmp;
  const fs::path f = tmp.path() / "region";
  // 3 MiB + 1 page at offset 8192: chunks of 1 MiB and a short tail; pages
  // 0, 5, 300 and the last one non-zero.
  const uint64_t offset = 8192, size = (3u << 20) + 4096;
  std::vector<std::byte> data(offset + size + 4096, std::byte{0});
  for (uint64_t page : {uint64_t{0}, uint64_t{5}, uint64_t{300}, size / 4096 - 1}) {
    data[offset + page * 4096 + 17] = std::byte{0x5a};
  }
  data[offset + size] = std::byte{0x77};  // Past the range: must not be copied.
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
  const auto fd = RegionFile::Adopt(::open(f.c_str(), O_RDONLY | O_CLOEXEC), offset, size);
  ASSERT_NE(fd, nullptr);

  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  std::vector<std::byte> copy(size, std::byte{0xee});  // Every byte is overwritten.
  auto stats = (*pending)->CopyRegion("region.bin", *fd, f, offset, size, copy);
  ASSERT_TRUE(stats.ok()) << stats.error().message;
  EXPECT_EQ(stats->bytes_written, 4u * 4096);
  ASSERT_EQ(copy.size(), size);
  EXPECT_TRUE(std::equal(copy.begin(), copy.end(), data.begin() + static_cast<long>(offset)));
  const fs::path written = (*pending)->dir() / "region.bin";
  std::ifstream in(written, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  ASSERT_EQ(text.size(), size);
  EXPECT_TRUE(std::memcmp(text.data(), copy.data(), size) == 0);
  struct stat st;
  ASSERT_EQ(::stat(written.c_str(), &st), 0);
  std::printf("region.bin: %llu bytes, %llu allocated on disk\n",
              static_cast<unsigned long long>(st.st_size),
              static_cast<unsigned long long>(st.st_blocks) * 512);

  // The name is taken now; a short region is an error naming it.
  EXPECT_FALSE((*pending)->CopyRegion("region.bin", *fd, f, offset, size, copy).ok());
  auto short_region = (*pending)->CopyRegion("other.bin", *fd, f, offset, data.size(), copy);
  ASSERT_FALSE(short_region.ok());
  EXPECT_NE(short_region.error().message.find(f.string()), std::string::npos);
  // A buffer of another size is refused, not overrun.
  std::vector<std::byte> small(size - 1);
  EXPECT_FALSE((*pending)->CopyRegion("third.bin", *fd, f, offset, size, small).ok());
}

// The worst case for the panic-to-disk time: a full 16 MiB ring (no zero
// page to skip). Prints the figures; never asserts them.
TEST(CopyRegionTest, FullSixteenMiBRegionTimings) {
  TempDir tmp;
  const fs::path f = tmp.path() / "region";
  const uint64_t size = 16u << 20;
  std::vector<std::byte> data(size);
  for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 13 | 1);
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
  const auto fd = RegionFile::Adopt(::open(f.c_str(), O_RDONLY | O_CLOEXEC), 0, size);
  ASSERT_NE(fd, nullptr);
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  std::vector<std::byte> copy(size);
  auto stats = (*pending)->CopyRegion("region.bin", *fd, f, 0, size, copy);
  ASSERT_TRUE(stats.ok()) << stats.error().message;
  EXPECT_EQ(stats->bytes_written, size);
  EXPECT_TRUE(copy == data);
  std::printf(
      "full 16 MiB region -> region.bin in %s: copy %.1f ms, write %.1f ms, fdatasync %.1f ms, "
      "total %.1f ms\n",
      tmp.path().c_str(), stats->copy_ms, stats->write_ms, stats->sync_ms,
      stats->copy_ms + stats->write_ms + stats->sync_ms);
}

}  // namespace
}  // namespace hvtrace::hostd
