#include "capture_service.h"

#include <fcntl.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "hostd/decode/region_capture_fixture.h"
#include "unique_fd.h"

// Counts allocations of at least |g_large| bytes in this test binary: a
// capture that copies into the pool allocates nothing that large. (GCC
// takes the malloc/free pair below for a mismatch once inlined.) The binary
// holds other files' tests too: the nothrow forms are replaced as well, so
// that every operator delete frees what a malloc-backed new returned (under
// ASan, the runtime's own nothrow new with this free is a mismatch).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
std::atomic<size_t> g_large{SIZE_MAX};
std::atomic<int> g_large_allocs{0};

void* operator new(std::size_t n) {
  if (n >= g_large.load()) g_large_allocs.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (n >= g_large.load()) g_large_allocs.fetch_add(1);
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace hvtrace::hostd {
namespace {

// |bytes| as a region file (what the agent's region looks like on disk).
fs::path WriteRegionFile(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return path;
}

// run's recovery, as a boot range's is, with the same trace.dat files.
// This file's own suite name: the unit tests of hostd/ share one
// executable, and GoogleTest refuses one suite name for fixtures of
// different translation units.
using CaptureServiceTest = RegionCaptureTest;

TEST_F(CaptureServiceTest, AttachCaptureThatDiesAfterItsCopyIsRecovered) {
  const fs::path dir = TempDir();
  const fs::path region_file = WriteRegionFile(dir / "region", mem_);
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureStore store(dir / "captures");
  // "Dies": the hook stops the capture with an exception once its copy is
  // durable; the hidden directory survives the unwinding, as it would
  // survive SIGKILL.
  CaptureFaults faults;
  faults.after_copies_durable = [] { throw std::runtime_error("killed"); };
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  request.inputs.vcpus_stopped = true;
  request.inputs.transport = {{"kind", "libvirt"}, {"domain", "vm1"}};
  CaptureService dying(nullptr, 1, faults);
  EXPECT_THROW((void)dying.Take(store, request), std::runtime_error);
  auto left = store.ListIncomplete();
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_TRUE(fs::exists((*left)[0] / "attach-region.bin"));
  EXPECT_TRUE(fs::exists((*left)[0] / std::string(kRecoveryRecordName)));

  auto report = CaptureService(nullptr, 1).Recover(store);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_EQ(report->recovered.size(), 1u) << (report->removed.empty() ? "" : report->removed[0]);
  const fs::path done = report->recovered[0].dir;
  EXPECT_TRUE(fs::exists(done / "attach-region.bin"));
  EXPECT_TRUE(fs::exists(done / "region-gen-1.trace.dat"));
  std::ifstream in(done / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_TRUE(m["recovered"].is_object()) << m.dump(2);
  EXPECT_EQ(m["region"]["kind"], "attach");
  EXPECT_EQ(m["extra"]["transport"]["kind"], "libvirt");
  EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], true);
  EXPECT_EQ(m["kernel"]["release"], "6.12.9-test");

  // The same capture taken without dying gives the same files.
  auto whole = CaptureService(nullptr, 1).Take(CaptureStore(dir / "whole"), request);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  EXPECT_EQ(test_support::ReadText(done / "region-gen-1.trace.dat").size(),
            test_support::ReadText(dir / "whole" / whole->id / "region-gen-1.trace.dat").size());
}

// A daemon that restarts and finds an attach-only guest still in the panic
// it captured names that capture instead of taking a second one; once the
// guest wrote anything, it is a new panic.
TEST_F(CaptureServiceTest, AnAttachOnlyGuestStillInTheSamePanicIsNotCapturedTwice) {
  const fs::path dir = TempDir();
  const fs::path region_file = WriteRegionFile(dir / "region", mem_);
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureStore store(dir / "captures");
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  CaptureService service(nullptr, 1);
  auto first = service.Take(store, request);
  ASSERT_TRUE(first.ok()) << first.error().message;

  request.trigger = "panic-while-away";
  request.dedupe_same_panic = true;
  auto again = service.Take(store, request);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(store.List()->size(), 1u);

  {  // The guest ran again and wrote one byte of a page.
    std::fstream io(region_file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(mem_.size() - 1));
    io.put('\x5a');
  }
  auto second = service.Take(store, request);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_FALSE(second->deduplicated);
  EXPECT_EQ(store.List()->size(), 2u);
}

// The copy buffers are one set per worker, sized by the largest regions:
// registering many VMs with the same ranges adds nothing, and a capture of a
// region file and an attach region copies into the set without allocating.
TEST_F(CaptureServiceTest, CapturesCopyIntoThePoolWhateverTheNumberOfVms) {
  const fs::path dir = TempDir();
  const fs::path region_file = WriteRegionFile(dir / "region", mem_);
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  const uint64_t size = mem_.size();
  CaptureService service(nullptr, 2);
  for (int vm = 0; vm < 100; ++vm) service.Reserve({.region_file = size, .attach = size});
  CopyPoolStats pool = service.copy_pool();
  EXPECT_EQ(pool.sets, 2u);
  EXPECT_EQ(pool.bytes, 2 * 2 * size);

  UniqueFd fd(::open(region_file.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(fd.get(), 0);
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "panic";
  request.triggered = HostTime::Now();
  // A raw shmem region: copied, kept as region.bin, not decoded.
  RegionFileSource source;
  source.file = RegionFile::Adopt(::dup(fd.get()), 0, size);
  source.path = region_file;
  source.size = size;
  source.boot_range = false;
  request.inputs.region_file = source;
  request.inputs.attach = *live;
  request.inputs.vcpus_stopped = true;
  CaptureStore store(dir / "captures");
  g_large = size;
  g_large_allocs = 0;
  for (int i = 0; i < 3; ++i) {
    auto taken = service.Take(store, request);
    ASSERT_TRUE(taken.ok()) << taken.error().message;
    EXPECT_TRUE(taken->incomplete.empty()) << taken->incomplete;
  }
  g_large = SIZE_MAX;
  EXPECT_EQ(g_large_allocs.load(), 0);  // Neither copy allocated.
  pool = service.copy_pool();
  EXPECT_EQ(pool.grown_at_capture, 0u);
  EXPECT_EQ(pool.bytes, 2 * 2 * size);  // Every set came back whole.
  EXPECT_EQ(store.List()->size(), 3u);
}

// A region nobody reserved for (a capture before its VM registered) is
// copied all the same: the copy allocates once, is counted, and the grown
// buffer stays in the pool for the next capture.
TEST_F(CaptureServiceTest, AnUnreservedAttachCopyAllocatesOnceAndIsCounted) {
  const fs::path dir = TempDir();
  const fs::path region_file = WriteRegionFile(dir / "region", mem_);
  auto live = LiveRegion::OpenExisting(region_file);
  ASSERT_TRUE(live.ok()) << live.error().message;
  CaptureService service(nullptr, 1);
  EXPECT_EQ(service.copy_pool().bytes, 0u);
  CaptureRequest request;
  request.vm = "vm1";
  request.trigger = "manual";
  request.triggered = HostTime::Now();
  request.inputs.attach = *live;
  CaptureStore store(dir / "captures");
  g_large = mem_.size();
  g_large_allocs = 0;
  ASSERT_TRUE(service.Take(store, request).ok());
  EXPECT_EQ(service.copy_pool().grown_at_capture, 1u);
  EXPECT_GE(service.copy_pool().bytes, mem_.size());
  ASSERT_TRUE(service.Take(store, request).ok());
  g_large = SIZE_MAX;
  EXPECT_EQ(service.copy_pool().grown_at_capture, 1u);
  EXPECT_EQ(g_large_allocs.load(), 1);  // The first copy only.
}

}  // namespace
}  // namespace hvtrace::hostd
