// Disk budgets of the captures (capture_budget.h): retention by class, byte
// budgets per VM and in total, the free-space reserve on a real small tmpfs,
// and what a full disk does to a capture whose raw copy is durable.
#include "capture_budget.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "capture_service.h"
#include "capture_store.h"
#include "region_file.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(seed + i * 7 + 1));
  return v;
}

// A committed capture of |trigger| holding |bytes| of region.bin, |n|
// milliseconds into a fixed day (so names and order are known).
std::string AddCapture(const CaptureStore& store, const std::string& vm, const std::string& trigger,
                       int n, size_t bytes) {
  const HostTime t{1718187330000000000LL + int64_t{n} * 1000000, n};
  auto pending = store.Begin(trigger, t);
  EXPECT_TRUE(pending.ok()) << pending.error().message;
  if (!pending.ok()) return "";
  EXPECT_TRUE((*pending)->WriteFile("region.bin", Bytes(bytes, static_cast<uint8_t>(n))).ok());
  CaptureManifest m;
  m.vm = vm;
  m.trigger = trigger;
  m.triggered = t;
  auto entry = (*pending)->Commit(m);
  EXPECT_TRUE(entry.ok()) << entry.error().message;
  return entry.ok() ? entry->id : "";
}

std::vector<std::string> Triggers(const CaptureStore& store) {
  std::vector<std::string> out;
  auto list = store.List();
  EXPECT_TRUE(list.ok());
  if (!list.ok()) return out;
  for (const auto& e : *list) out.push_back(e.summary.value("trigger", std::string("?")));
  return out;
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A tmpfs of |size| at |dir|; unmounted (lazily) when destroyed.
class SmallTmpfs {
 public:
  SmallTmpfs(const fs::path& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// Fills the filesystem of |dir| until a write fails (ENOSPC), leaving
// |leave| bytes free (rounded to pages) by deleting a last piece.
void FillTo(const fs::path& dir, uint64_t leave) {
  const fs::path filler = dir / "filler";
  int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> chunk(64 * 1024, 'x');
  while (::write(fd, chunk.data(), chunk.size()) > 0) {
  }
  ASSERT_EQ(errno, ENOSPC);
  if (leave > 0) {
    const off_t size = ::lseek(fd, 0, SEEK_END);
    ASSERT_EQ(::ftruncate(fd, size - static_cast<off_t>(leave)), 0);
  }
  ::close(fd);
}

TEST(CaptureBudgetTest, CheapTriggersNeverEvictPanicCaptures) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "vms/vm1/captures");
  CaptureBudget budget(DiskLimits{}, tmp.path() / "vms");
  AddCapture(store, "vm1", "panic", 1, 4096);
  AddCapture(store, "vm1", "panic-while-away", 2, 4096);
  // A flood of crash-loaded captures, pruned to 3 after each as the service does.
  for (int i = 0; i < 10; ++i) {
    const std::string id = AddCapture(store, "vm1", "crashloaded", 10 + i, 4096);
    auto removed = budget.Prune(store, "vm1", "crashloaded", id, 3);
    ASSERT_TRUE(removed.ok()) << removed.error().message;
  }
  EXPECT_EQ(Triggers(store),
            (std::vector<std::string>{"panic", "panic-while-away", "crashloaded"}));
  // A cheap capture never evicts a panic capture, even when only panics are left.
  AddCapture(store, "vm1", "panic", 30, 4096);
  AddCapture(store, "vm1", "panic", 31, 4096);
  const std::string reset = AddCapture(store, "vm1", "reset", 32, 4096);
  auto removed = budget.Prune(store, "vm1", "reset", reset, 3);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(Triggers(store),
            (std::vector<std::string>{"panic", "panic-while-away", "panic", "panic", "reset"}));
  // A panic evicts the cheap ones first, then the oldest panics.
  const std::string panic = AddCapture(store, "vm1", "panic", 33, 4096);
  removed = budget.Prune(store, "vm1", "panic", panic, 3);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 3u);
  EXPECT_EQ(Triggers(store), (std::vector<std::string>{"panic", "panic", "panic"}));
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->back().id, panic);
}

TEST(CaptureBudgetTest, BytesPerVmAndTotal) {
  TempDir tmp;
  const fs::path vms = tmp.path() / "vms";
  CaptureStore a(vms / "a/captures"), b(vms / "b/captures");
  // Each capture is 1 MiB of region.bin (and a manifest): 3 per VM, 4 in all.
  constexpr uint64_t kSlack = 128 * 1024;
  CaptureBudget budget(DiskLimits{3 * kMiB + kSlack / 2, 4 * kMiB + kSlack, 0}, vms);
  int n = 0;
  auto add = [&](const CaptureStore& store, const std::string& vm, const std::string& trigger) {
    const std::string id = AddCapture(store, vm, trigger, ++n, kMiB);
    auto removed = budget.Prune(store, vm, trigger, id, 0);
    EXPECT_TRUE(removed.ok()) << removed.error().message;
  };
  add(b, "b", "manual");
  add(b, "b", "panic");
  add(a, "a", "panic");
  // A reset flood on a: over the total, a's own older resets go first.
  for (int i = 0; i < 4; ++i) add(a, "a", "reset");
  EXPECT_EQ(Triggers(a), (std::vector<std::string>{"panic", "reset"}));
  EXPECT_EQ(Triggers(b), (std::vector<std::string>{"manual", "panic"}));
  // Panics on a: its reset, then b's manual capture (non-panic, the disk is
  // shared), then a's own oldest panic; never b's panic.
  add(a, "a", "panic");
  EXPECT_EQ(Triggers(a), (std::vector<std::string>{"panic", "panic"}));
  EXPECT_EQ(Triggers(b), (std::vector<std::string>{"manual", "panic"}));
  add(a, "a", "panic");
  EXPECT_EQ(Triggers(b), (std::vector<std::string>{"panic"}));
  add(a, "a", "panic");
  EXPECT_EQ(Triggers(a), (std::vector<std::string>{"panic", "panic", "panic"}));
  EXPECT_EQ(Triggers(b), (std::vector<std::string>{"panic"}));
  EXPECT_LE(CaptureDiskBytes(vms), 4 * kMiB + kSlack);

  // Admission: a 512 KiB region needs up to 2 MiB (twice the region + 1 MiB).
  EXPECT_EQ(CaptureNeed(kMiB / 2), 2 * kMiB);
  // a holds 3 MiB of panics: a cheap capture is refused, naming the budget.
  auto refused = budget.Admit(a, "a", "crashloaded", kMiB / 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("capture_bytes_per_vm"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("never evicts a panic capture"), std::string::npos);
  EXPECT_EQ(Triggers(a).size(), 3u);
  // A panic may evict the VM's own older panics, never another VM's.
  auto panic = budget.Admit(a, "a", "panic", kMiB / 2);
  ASSERT_TRUE(panic.ok()) << panic.error().message;
  EXPECT_EQ(panic->evicted.size(), 2u);
  EXPECT_EQ(Triggers(a), (std::vector<std::string>{"panic"}));
  EXPECT_EQ(Triggers(b), (std::vector<std::string>{"panic"}));
}

// A committed capture is read once (CaptureDirent: the same name and inode),
// not at every admission; a capture removed, or replaced under its name, is
// seen at the next listing.
TEST(CaptureBudgetTest, EachCommittedCaptureIsReadOnceAndTheStoresChangesAreSeen) {
  TempDir tmp;
  const fs::path vms = tmp.path() / "vms";
  CaptureStore store(vms / "vm1/captures");
  CaptureBudget budget(DiskLimits{}, vms);
  auto add = [&](const std::string& trigger, int n) {
    const std::string id = AddCapture(store, "vm1", trigger, n, 4096);
    auto removed = budget.Prune(store, "vm1", trigger, id, 2);
    EXPECT_TRUE(removed.ok()) << removed.error().message;
    return std::make_pair(id, removed.ok() ? *removed : std::vector<std::string>{});
  };
  const std::string panic = add("panic", 1).first;
  // The manifest rewritten in place (same directory): the budget still
  // knows the capture as the panic it read.
  const fs::path manifest = store.dir() / panic / "manifest.json";
  nlohmann::json doc = nlohmann::json::parse(test_support::ReadText(manifest));
  doc["trigger"] = "reset";
  std::ofstream(manifest, std::ios::trunc) << doc.dump();
  const std::string r1 = add("reset", 2).first;
  auto [r2, removed] = add("reset", 3);
  EXPECT_EQ(removed, (std::vector<std::string>{"vm1/" + r1}));
  EXPECT_TRUE(fs::exists(store.dir() / panic));
  // Replaced under its name (a new directory, so a new inode): read again,
  // now a reset, the oldest cheap capture.
  const fs::path fresh = store.dir() / ".replacement";
  fs::create_directory(fresh);
  fs::copy_file(manifest, fresh / "manifest.json");
  fs::remove_all(store.dir() / panic);
  fs::rename(fresh, store.dir() / panic);
  auto [r3, removed3] = add("reset", 4);
  EXPECT_EQ(removed3, (std::vector<std::string>{"vm1/" + panic}));
  // Removed by hand: no longer counted, so nothing is over the count.
  fs::remove_all(store.dir() / r2);
  auto [r4, removed4] = add("reset", 5);
  EXPECT_TRUE(removed4.empty()) << removed4.front();
  EXPECT_EQ(Names(store.dir()), (std::vector<std::string>{r3, r4}));
}

// Captures whose fleet upload is not confirmed (SetUploadPending) are no
// victims of retention nor of a cheap capture's admission; a panic's
// admission takes them last; once uploaded they go as before.
TEST(CaptureBudgetTest, CapturesWaitingForUploadAreKept) {
  TempDir tmp;
  const fs::path vms = tmp.path() / "vms";
  CaptureStore store(vms / "vm1/captures");
  CaptureBudget budget(DiskLimits{3 * kMiB + 64 * 1024, 0, 0}, vms);
  std::set<std::string> waiting;
  budget.SetUploadPending([&](const std::string& vm, const std::string& id) {
    return waiting.count(vm + "/" + id) != 0;
  });
  const std::string first = AddCapture(store, "vm1", "manual", 1, kMiB);
  waiting.insert("vm1/" + first);
  // Count retention of 2: the waiting capture stays, the next oldest goes.
  std::string last;
  for (int i = 0; i < 3; ++i) {
    last = AddCapture(store, "vm1", "reset", 2 + i, kMiB);
    ASSERT_TRUE(budget.Prune(store, "vm1", "reset", last, 2).ok());
  }
  auto list = store.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ(list->front().id, first);
  // A cheap capture's admission may not take them either: refused.
  waiting.insert("vm1/" + last);
  last = AddCapture(store, "vm1", "reset", 10, kMiB);
  waiting.insert("vm1/" + last);
  EXPECT_FALSE(budget.Admit(store, "vm1", "crashloaded", kMiB / 2).ok());
  EXPECT_EQ(store.List()->size(), 3u);
  // A panic's admission must: the waiting ones go, oldest first.
  auto panic = budget.Admit(store, "vm1", "panic", kMiB / 2);
  ASSERT_TRUE(panic.ok()) << panic.error().message;
  EXPECT_FALSE(panic->evicted.empty());
  EXPECT_EQ(panic->evicted.front(), "vm1/" + first);
  // Uploaded: retention applies as before.
  waiting.clear();
  const std::string again = AddCapture(store, "vm1", "reset", 20, kMiB);
  ASSERT_TRUE(budget.Prune(store, "vm1", "reset", again, 1).ok());
  EXPECT_EQ(store.List()->size(), 1u);
}

// The reserve on a real small filesystem: a cheap capture is refused with
// the directory, the free bytes and the need; a panic capture evicts older
// non-panic captures to fit.
TEST(CaptureBudgetTest, FreeSpaceReserveOnASmallTmpfs) {
  TempDir tmp;
  const fs::path mnt = tmp.path() / "state";
  SmallTmpfs tmpfs(mnt, "16m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << tmpfs.error();
  const fs::path vms = mnt / "vms";
  CaptureStore a(vms / "a/captures"), b(vms / "b/captures");
  CaptureBudget budget(DiskLimits{0, 0, 2 * kMiB}, vms);
  AddCapture(a, "a", "panic", 1, 2 * kMiB);
  AddCapture(b, "b", "crashloaded", 2, 2 * kMiB);
  AddCapture(a, "a", "crashloaded", 3, 2 * kMiB);
  AddCapture(a, "a", "reset", 4, 2 * kMiB);
  FillTo(mnt, 512 * 1024);
  auto free = FreeBytes(a.dir());
  ASSERT_TRUE(free.ok());
  std::printf("tmpfs 16 MiB: %llu bytes free before admitting\n",
              static_cast<unsigned long long>(*free));

  auto refused = budget.Admit(a, "a", "crashloaded", kMiB);
  ASSERT_FALSE(refused.ok());
  const std::string& msg = refused.error().message;
  EXPECT_NE(msg.find(a.dir().string()), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(*free) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(CaptureNeed(kMiB)) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("capture_free_reserve"), std::string::npos) << msg;
  EXPECT_EQ(Triggers(a).size(), 3u);

  auto admitted = budget.Admit(a, "a", "panic", kMiB);
  ASSERT_TRUE(admitted.ok()) << admitted.error().message;
  std::printf("panic admitted: need %llu, free %llu -> %llu, evicted %zu\n",
              static_cast<unsigned long long>(admitted->need),
              static_cast<unsigned long long>(admitted->free_before),
              static_cast<unsigned long long>(admitted->free_after), admitted->evicted.size());
  // Oldest non-panic first (this VM's, then the others'); the panic stays.
  ASSERT_FALSE(admitted->evicted.empty());
  EXPECT_EQ(admitted->evicted[0].substr(0, 2), "a/");
  EXPECT_GE(admitted->free_after, admitted->need + 2 * kMiB);
  EXPECT_EQ(Triggers(a)[0], "panic");

  // Nothing left to evict and still no room: the panic is tried anyway (the
  // reserve is there for it), the panic capture kept.
  FillTo(mnt, 0);
  auto full = budget.Admit(a, "a", "panic", kMiB);
  ASSERT_TRUE(full.ok()) << full.error().message;
  EXPECT_FALSE(full->reserve_met);
  EXPECT_EQ(Triggers(a)[0], "panic");
  EXPECT_FALSE(budget.Admit(a, "a", "reset", kMiB).ok());
}

// A full disk at the manifest keeps a durable raw copy and its recovery
// record; the next start's recovery commits it once there is room.
TEST(CaptureBudgetTest, FullDiskAtCommitKeepsTheDurableCopy) {
  TempDir tmp;
  const fs::path mnt = tmp.path() / "state";
  SmallTmpfs tmpfs(mnt, "4m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << tmpfs.error();
  CaptureStore store(mnt / "vms/vm1/captures");
  fs::path kept_dir;
  {
    auto pending = store.Begin("panic", HostTime::Now());
    ASSERT_TRUE(pending.ok());
    ASSERT_TRUE((*pending)->WriteFile("region.bin", Bytes(kMiB, 3)).ok());
    CaptureManifest m;
    m.vm = "vm1";
    m.trigger = "panic";
    m.triggered = HostTime::Now();
    m.region = {{"kind", "shmem"}, {"size", kMiB}, {"source", "/dev/shm/x"}};
    ASSERT_TRUE((*pending)->WriteRecoveryRecord(m).ok());
    FillTo(mnt, 0);
    auto entry = (*pending)->Commit(m);
    ASSERT_FALSE(entry.ok());
    const std::string& msg = entry.error().message;
    std::printf("commit on a full disk: %s\n", msg.c_str());
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kept in " + (*pending)->dir().string()), std::string::npos) << msg;
    EXPECT_TRUE((*pending)->kept());
    kept_dir = (*pending)->dir();
  }
  // Destroying it kept the copy.
  ASSERT_TRUE(fs::exists(kept_dir / "region.bin"));
  EXPECT_EQ(fs::file_size(kept_dir / "region.bin"), kMiB);
  ASSERT_TRUE(fs::exists(kept_dir / std::string(kRecoveryRecordName)));
  EXPECT_FALSE(fs::exists(kept_dir / "manifest.json"));

  // Still full: recovery keeps it again instead of removing it.
  CaptureService service(nullptr, 1);
  auto again = service.Recover(store);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->recovered.empty());
  EXPECT_TRUE(again->removed.empty());
  ASSERT_EQ(again->kept.size(), 1u);
  ASSERT_TRUE(fs::exists(kept_dir / "region.bin"));

  // Room again: recovered and committed with only finished files.
  fs::remove(mnt / "filler");
  auto report = service.Recover(store);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->recovered.size(), 1u);
  const CaptureEntry& done = report->recovered[0];
  EXPECT_EQ(Names(done.dir), (std::vector<std::string>{"manifest.json", "region.bin"}));
  ASSERT_TRUE(done.summary.contains("files"));
  EXPECT_EQ(done.summary["files"].size(), 1u);
  EXPECT_EQ(done.summary["files"][0]["name"], "region.bin");
}

// The whole capture path at a real ENOSPC: the disk has room for region.bin
// and its recovery record, not for the manifest. The panic capture fails
// with an error saying where its durable copy is kept, and the next start's
// recovery commits it once there is room.
TEST(CaptureBudgetTest, PanicCaptureOnAFullDiskKeepsRegionBin) {
  TempDir tmp;
  const fs::path region_path = tmp.path() / "region";
  {
    std::vector<std::byte> bytes = Bytes(kMiB, 5);
    std::ofstream(region_path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(kMiB));
  }
  int region_fd = ::open(region_path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(region_fd, 0);
  const fs::path mnt = tmp.path() / "state";
  SmallTmpfs tmpfs(mnt, "4m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << tmpfs.error();
  CaptureStore store(mnt / "vms/vm1/captures");
  ASSERT_TRUE(fs::create_directories(store.dir()));
  // Room for region.bin (256 pages) and the recovery record (one page).
  FillTo(mnt, kMiB + 4096);

  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  RegionFileSource source;
  source.file = RegionFile::Adopt(::dup(region_fd), 0, kMiB);
  source.path = region_path;
  source.size = kMiB;
  source.boot_range = false;  // Raw shmem: kept, not decoded.
  request.inputs.region_file = source;
  request.inputs.vcpus_stopped = true;
  CaptureService service(nullptr, 1);
  auto taken = service.Take(store, request);
  ::close(region_fd);
  ASSERT_FALSE(taken.ok()) << "committed " << taken->id;
  const std::string& msg = taken.error().message;
  std::printf("panic capture on a full disk: %s\n", msg.c_str());
  EXPECT_NE(msg.find("VM vm1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kept in"), std::string::npos) << msg;
  auto left = store.ListIncomplete();
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ(fs::file_size((*left)[0] / "region.bin"), kMiB);
  EXPECT_TRUE(fs::exists((*left)[0] / std::string(kRecoveryRecordName)));
  EXPECT_TRUE(store.List()->empty());

  fs::remove(mnt / "filler");
  auto report = service.Recover(store);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->recovered.size(), 1u);
  EXPECT_EQ(report->recovered[0].summary.value("trigger", ""), "panic");
  EXPECT_EQ(Names(report->recovered[0].dir),
            (std::vector<std::string>{"manifest.json", "region.bin"}));
}

// The region copy's writes run on a thread of their own beside the copy
// (ChunkWriter): a write that fails there (ENOSPC after the first of 4
// chunks) fails the copy with the file's name and the cause, the copy stops,
// and nothing of it is left.
TEST(CaptureBudgetTest, RegionCopyRunningOutOfDiskMidwayFailsAndLeavesNothing) {
  TempDir tmp;
  const fs::path region_path = tmp.path() / "region";
  {
    std::vector<std::byte> bytes = Bytes(4 * kMiB, 9);
    std::ofstream(region_path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(4 * kMiB));
  }
  const fs::path mnt = tmp.path() / "state";
  SmallTmpfs tmpfs(mnt, "2m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << tmpfs.error();
  const auto file =
      RegionFile::Adopt(::open(region_path.c_str(), O_RDONLY | O_CLOEXEC), 0, 4 * kMiB);
  ASSERT_NE(file, nullptr);
  CaptureStore store(mnt / "c");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok()) << pending.error().message;
  std::vector<std::byte> copy(4 * kMiB);
  auto stats = (*pending)->CopyRegion("region.bin", *file, region_path, 0, 4 * kMiB, copy);
  ASSERT_FALSE(stats.ok());
  const std::string& msg = stats.error().message;
  EXPECT_NE(msg.find((*pending)->dir().string() + "/region.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_FALSE((*pending)->durable());
  EXPECT_TRUE(Names((*pending)->dir()).empty());  // No part file left.
}

// What a writer that failed or died mid-file left (a trace.dat writer's
// temporary, a part file) is never committed into files[].
TEST(CaptureBudgetTest, OnlyFinishedFilesAreCommitted) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "c");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE((*pending)->WriteFile("region.bin", Bytes(8192, 3)).ok());
  std::ofstream((*pending)->dir() / "boot-0.trace.dat.tmp.AbC123") << "half";
  std::ofstream((*pending)->dir() / ".attach-region.bin.part") << "half";
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  m.triggered = HostTime::Now();
  auto entry = (*pending)->Commit(m);
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_EQ(Names(entry->dir), (std::vector<std::string>{"manifest.json", "region.bin"}));
  ASSERT_EQ(entry->summary["files"].size(), 1u);
  EXPECT_EQ(entry->summary["files"][0]["name"], "region.bin");
}

// A capture whose region copy fails at ENOSPC held nothing durable: it goes,
// with an error naming the file.
TEST(CaptureBudgetTest, FullDiskBeforeTheCopyIsDurableLeavesNothing) {
  TempDir tmp;
  const fs::path mnt = tmp.path() / "state";
  SmallTmpfs tmpfs(mnt, "1m");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a small tmpfs here: " << tmpfs.error();
  CaptureStore store(mnt / "c");
  auto pending = store.Begin("panic", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  Status s = (*pending)->WriteFile("region.bin", Bytes(2 * kMiB, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find((*pending)->dir().string() + "/region.bin"), std::string::npos)
      << s.error().message;
  EXPECT_FALSE((*pending)->durable());
  EXPECT_TRUE(Names((*pending)->dir()).empty());  // No part file left.
  pending->reset();
  EXPECT_TRUE(Names(store.dir()).empty());
}

}  // namespace
}  // namespace hvtrace::hostd
