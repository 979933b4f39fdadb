// Fuzzes the host region reader (hvtrace/region_reader.h) the way a hostile
// guest attacks it: starting from a well-formed region (identity, formats, a
// kernel page, direct-write events), the input is a list of patches the
// guest scribbles over it. ReadRegion and RegionTracker must never crash,
// and every page they return must lie inside the copy with a bounded length;
// the symbol and comm areas must inflate to checked text or to nothing. The
// incremental reader (hvtrace/region_incremental.h) reads the region twice,
// after the first half of the patches and after all of them, so it meets a
// region that changed under its private copy; the same rules hold.
//
// Input: repeated { u32le offset; u16le length; length bytes }, offsets taken
// modulo the region size so every patch lands somewhere.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "hvtrace/dwtrace.hpp"
#include "hvtrace/region_incremental.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"

namespace {

struct Baseline {
  hvtrace::RegionGeometry geometry;
  std::vector<std::byte> bytes;
};

Baseline MakeBaseline() {
  Baseline b;
  hvtrace::RegionPlanOptions opt;
  opt.max_cpus = 2;
  opt.dw_rings = 2;
  opt.dw_slots = 2;
  opt.symbol_area_size = 64 << 10;
  opt.comm_area_size = 8 << 10;
  auto g = hvtrace::PlanRegion(1 << 20, opt);
  if (!g.ok()) __builtin_trap();
  b.geometry = *g;
  b.bytes.assign(g->region_size, std::byte{0});
  if (!hvtrace::InitRegionHeader(b.bytes, *g, 1).ok()) __builtin_trap();
  auto guest = hvtrace::GuestRegion::Attach(b.bytes.data(), b.bytes.size());
  if (!guest.ok()) __builtin_trap();
  hvtrace::region::GuestIdentity id{};
  id.boot_generation = 1;
  id.nr_cpus = 2;
  id.page_size = 4096;
  std::memcpy(id.kernel_release, "6.12.0-fuzz", 11);
  guest->WriteIdentity(id);
  if (!guest
           ->PublishFormat(hvtrace::region::kFormatHeaderPage, 1, 0, "ftrace",
                           "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
                           "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
                           "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n",
                           0)
           .ok()) {
    __builtin_trap();
  }
  // Text areas (symbols, comms) the host inflates and checks.
  if (!guest
           ->WriteTextArea(hvtrace::TextAreaKind::kSymbols, 1,
                           hvtrace::EncodeText("ffffffff81000000 T _text\n"
                                               "ffffffff811a2b30 t tracing_mark_write\n"
                                               "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n"))
           .ok() ||
      !guest
           ->WriteTextArea(hvtrace::TextAreaKind::kComms, 1,
                           hvtrace::EncodeText("1 init\n242 sh\n"))
           .ok()) {
    __builtin_trap();
  }
  {
    auto tracer = hvtrace::dw::Tracer::FromMemory(b.bytes.data(), b.bytes.size());
    if (!tracer.ok()) __builtin_trap();
    auto ev = (*tracer)->Register("fuzz", "ev",
                                  {{"n", "int", 0, 4, true}, {"s", "char[8]", 4, 8, false}});
    if (!ev.ok()) __builtin_trap();
    struct {
      int32_t n;
      char s[8];
    } payload = {1, "abc"};
    for (int i = 0; i < 300; ++i) {
      payload.n = i;
      (*tracer)->Write(*ev, &payload, sizeof(payload));
    }
    // A kernel page built by the same writer, pushed to CPU 0.
    const auto* ring = reinterpret_cast<const std::byte*>(guest->dw_page(0, 0));
    guest->PushCpuPage(0, 1, std::span<const std::byte>(ring, 4096), 0);
    guest->PushCpuPage(1, 1, std::span<const std::byte>(ring, 4096), 0);
  }
  return b;
}

void CheckPages(const hvtrace::RegionSnapshot& snap, const hvtrace::RegionGeometry& g,
                const std::byte* copy_begin, const std::byte* copy_end) {
  for (const auto& rings : {&snap.cpus, &snap.dw_rings}) {
    for (const hvtrace::RegionRing& ring : *rings) {
      for (const hvtrace::RegionPage& p : ring.pages) {
        if (p.length > g.slot_size || p.page.size() != g.slot_size) __builtin_trap();
        if (copy_begin != nullptr &&
            (p.page.data() < copy_begin || p.page.data() + p.page.size() > copy_end)) {
          __builtin_trap();
        }
        if (p.offset + p.page.size() > g.region_size) __builtin_trap();
      }
    }
  }
  for (const hvtrace::RegionFormat& f : snap.formats) {
    if (f.text.size() > g.format_text_size) __builtin_trap();
  }
}

// Two incremental reads with the tracker and the text cache a stream keeps.
void ReadIncrementally(const Baseline& baseline, std::vector<std::byte>* region,
                       const std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& patches) {
  auto reader = hvtrace::IncrementalRegionReader::Create(baseline.geometry);
  if (!reader.ok()) __builtin_trap();
  hvtrace::RegionTracker tracker(baseline.geometry);
  hvtrace::RegionTextCache texts;
  const size_t half = patches.size() / 2;
  for (size_t i = 0; i < patches.size(); ++i) {
    if (!patches[i].second.empty())
      std::memcpy(region->data() + patches[i].first, patches[i].second.data(),
                  patches[i].second.size());
    if (i + 1 != half) continue;
    hvtrace::RegionSnapshot* first = (*reader)->Read(region->data());
    CheckPages(*first, baseline.geometry, nullptr, nullptr);
    tracker.Update(first);
    texts.Update(first);
  }
  hvtrace::RegionSnapshot* last = (*reader)->Read(region->data());
  CheckPages(*last, baseline.geometry, nullptr, nullptr);
  tracker.Update(last);
  texts.Update(last);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Baseline baseline = MakeBaseline();
  std::vector<std::byte> region = baseline.bytes;
  const uint64_t region_size = region.size();
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> patches;
  while (size >= 6) {
    uint32_t offset;
    uint16_t length;
    std::memcpy(&offset, data, 4);
    std::memcpy(&length, data + 4, 2);
    data += 6;
    size -= 6;
    length = static_cast<uint16_t>(std::min<size_t>(length, size));
    const uint64_t at = offset % region_size;
    const uint64_t n = std::min<uint64_t>(length, region_size - at);
    std::memcpy(region.data() + at, data, n);
    patches.emplace_back(at, std::vector<uint8_t>(data, data + n));
    data += length;
    size -= length;
  }
  std::vector<std::byte> copy;
  hvtrace::CopyLiveRegion(region.data(), baseline.geometry, &copy);
  auto snap = hvtrace::ReadRegion(std::move(copy), baseline.geometry);
  if (!snap.ok()) __builtin_trap();  // Only the geometry or size can fail, and both are ours.
  hvtrace::RegionTracker tracker(baseline.geometry);
  auto delta = tracker.Update(&*snap);
  CheckPages(*snap, baseline.geometry, snap->copy.data(), snap->copy.data() + snap->copy.size());
  hvtrace::RegionTextCache texts;
  texts.Update(&*snap);
  const std::string& symbols = texts.Text(hvtrace::TextAreaKind::kSymbols, 1);
  const std::string& comms = texts.Text(hvtrace::TextAreaKind::kComms, 1);
  if (!hvtrace::CheckAreaText(hvtrace::TextAreaKind::kSymbols, symbols).ok() ||
      !hvtrace::CheckAreaText(hvtrace::TextAreaKind::kComms, comms).ok() ||
      symbols.size() > hvtrace::kMaxSymbolText || comms.size() > hvtrace::kMaxCommText) {
    __builtin_trap();
  }
  (void)delta;
  std::vector<std::byte> live = baseline.bytes;
  ReadIncrementally(baseline, &live, patches);
  return 0;
}
