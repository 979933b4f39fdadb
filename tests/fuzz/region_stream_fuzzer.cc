// Fuzzes RegionStreamer (hostd/decode/region_stream.h) across snapshots the
// way a hostile guest drives a live `hvtrace stream`: every step the guest
// picks a boot generation (any value, up or down), publishes symbols and a
// page for it, and scribbles over the region; one streamer follows all the
// steps. It must never crash, and what it keeps must stay within its bounds
// (RegionStreamer::kDecoderGenerationsKept decoders, kTextGenerationsKept
// texts per kind, kMaxTextHeld bytes of text in the process).
//
// Input: repeated { u32le generation; u8 flags; u32le offset; u8 length;
// length bytes } — flags bit 0: publish symbols for the generation, bit 1:
// push a kernel page of the generation, bit 2: flush the stream.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hvtrace/dwtrace.hpp"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"
#include "region_stream.h"

namespace {

struct Baseline {
  hvtrace::RegionGeometry geometry;
  std::vector<std::byte> bytes;
  std::vector<std::byte> page;  // A page of events, pushed as a kernel page.
  hvtrace::EncodedText symbols;
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
  guest->WriteIdentity(id);
  auto tracer = hvtrace::dw::Tracer::FromMemory(b.bytes.data(), b.bytes.size());
  if (!tracer.ok()) __builtin_trap();
  auto ev = (*tracer)->Register("fuzz", "ev", {{"n", "int", 0, 4, true}});
  if (!ev.ok()) __builtin_trap();
  for (int32_t i = 0; i < 100; ++i) (*tracer)->Write(*ev, &i, sizeof i);
  const auto* ring = reinterpret_cast<const std::byte*>(guest->dw_page(0, 0));
  b.page.assign(ring, ring + 4096);
  // Compressible, so a large text fits the area as a guest would make it.
  std::string text;
  while (text.size() < (1u << 20)) text += "ffffffff81000000 T fuzz_symbol\n";
  b.symbols = hvtrace::EncodeText(text);
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Baseline baseline = MakeBaseline();
  std::vector<std::byte> region = baseline.bytes;
  auto guest = hvtrace::GuestRegion::Attach(region.data(), region.size());
  if (!guest.ok()) __builtin_trap();
  hvtrace::hostd::RegionStreamer streamer(baseline.geometry,
                                          {false, true, std::chrono::seconds(1)});
  auto now = std::chrono::steady_clock::time_point{};
  int steps = 0;
  while (size >= 10 && steps++ < 64) {
    uint32_t generation, offset;
    std::memcpy(&generation, data, 4);
    const uint8_t flags = data[4];
    std::memcpy(&offset, data + 5, 4);
    size_t length = std::min<size_t>(data[9], size - 10);
    const uint8_t* bytes = data + 10;
    data += 10 + length;
    size -= 10 + length;
    hvtrace::region::GuestIdentity id{};
    id.boot_generation = generation;
    id.nr_cpus = 2;
    id.page_size = 4096;
    guest->WriteIdentity(id);
    if (flags & 1)
      (void)guest->WriteTextArea(hvtrace::TextAreaKind::kSymbols, generation, baseline.symbols);
    if (flags & 2) guest->PushCpuPage(steps % 2, generation, baseline.page, 0);
    const uint64_t at = offset % region.size();
    std::memcpy(region.data() + at, bytes, std::min<uint64_t>(length, region.size() - at));

    std::vector<std::byte> copy;
    hvtrace::CopyLiveRegion(region.data(), baseline.geometry, &copy);
    auto snap = hvtrace::ReadRegion(std::move(copy), baseline.geometry);
    if (!snap.ok()) __builtin_trap();
    now += std::chrono::milliseconds(50);
    (void)streamer.Feed(&*snap, now, (flags & 4) != 0);
    if (streamer.decoders_kept() > hvtrace::hostd::RegionStreamer::kDecoderGenerationsKept ||
        streamer.texts().generations_kept(hvtrace::TextAreaKind::kSymbols) >
            hvtrace::kTextGenerationsKept ||
        streamer.texts().generations_kept(hvtrace::TextAreaKind::kComms) >
            hvtrace::kTextGenerationsKept ||
        hvtrace::RegionTextCache::process_held_bytes() > hvtrace::kMaxTextHeld) {
      __builtin_trap();
    }
  }
  return 0;
}
