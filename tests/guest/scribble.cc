#include "scribble.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/region_writer.h"

namespace hvtrace::guest_test {
namespace {

struct Slot {
  region::SlotDesc* desc;
  std::byte* page;
  uint64_t offset;  // Of the descriptor, from the region start.
};

class Scribbler {
 public:
  explicit Scribbler(GuestRegion region) : r_(region), g_(region.geometry()) {
    generation_ = static_cast<uint32_t>(r_.ReadIdentity().boot_generation);
  }

  void Run(const std::set<std::string>& modes) {
    if (modes.count("lengths")) Lengths();
    if (modes.count("torn")) Torn();
    // Once: repeated, the counters would run back faster than the agent
    // pushes and every page would sit past its ring's count.
    if (modes.count("backwards") && !backwards_done_) Backwards();
    if (modes.count("pages")) Pages();
    if (modes.count("formats") && !formats_done_) Formats();
    if (modes.count("identity")) Identity();
    if (modes.count("texts")) Texts();
    if (modes.count("header")) Header();
  }

 private:
  void Say(const std::string& what, uint64_t offset) {
    if (said_.insert(what).second) {
      std::printf("scribble: %s at offset %llu\n", what.c_str(),
                  static_cast<unsigned long long>(offset));
    }
  }

  // Published slots of a ring, oldest first.
  std::vector<Slot> Written(uint32_t ring, bool dw) {
    const uint32_t slots = dw ? g_.dw_slots : g_.slots_per_cpu;
    std::vector<std::pair<uint64_t, Slot>> found;
    for (uint32_t s = 0; s < slots; ++s) {
      const uint64_t at = dw ? g_.DwDescOffset(ring, s) : g_.CpuDescOffset(ring, s);
      auto* d = reinterpret_cast<region::SlotDesc*>(r_.base() + at);
      if (d->seq == 0) continue;
      std::byte* page = r_.base() + (dw ? g_.DwPageOffset(ring, s) : g_.CpuPageOffset(ring, s));
      found.push_back({d->sequence, Slot{d, page, at}});
    }
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Slot> out;
    for (auto& f : found) out.push_back(f.second);
    return out;
  }

  std::vector<uint32_t> UsedDwRings() {
    std::vector<uint32_t> rings;
    for (uint32_t i = 0; i < g_.dw_rings; ++i) {
      if (r_.dw_ring(i)->published > 0) rings.push_back(i);
    }
    return rings;
  }

  void Lengths() {
    for (uint32_t cpu = 0; cpu < g_.max_cpus; ++cpu) {
      std::vector<Slot> w = Written(cpu, false);
      if (w.size() < 4) continue;
      w[0].desc->length = g_.slot_size + 4096;
      Say("cpu " + std::to_string(cpu) + ": slot length past the slot", w[0].offset);
      w[1].desc->length = 3;
      Say("cpu " + std::to_string(cpu) + ": slot length below the page header", w[1].offset);
      // The page's own commit runs past what the slot says is valid.
      const uint64_t commit = w[2].desc->length + 512;
      std::memcpy(w[2].page + 8, &commit, sizeof(commit));
      w[2].desc->length = std::min<uint32_t>(w[2].desc->length, g_.slot_size - 1024);
      Say("cpu " + std::to_string(cpu) + ": page commit past the slot length", w[2].offset);
    }
    for (uint32_t ring : UsedDwRings()) {
      std::vector<Slot> w = Written(ring, true);
      if (w.size() < 2) continue;
      w[0].desc->length = 0xfffffff0u;
      Say("dw ring " + std::to_string(ring) + ": slot length 0xfffffff0", w[0].offset);
    }
  }

  void Torn() {
    for (uint32_t cpu = 0; cpu < g_.max_cpus; ++cpu) {
      std::vector<Slot> w = Written(cpu, false);
      if (w.size() < 5) continue;
      w[3].desc->seq |= 1;
      Say("cpu " + std::to_string(cpu) + ": slot left mid-write (odd seq)", w[3].offset);
      // Moves on every repetition: a copy taken across it is torn.
      w[4].desc->seq += 2;
      Say("cpu " + std::to_string(cpu) + ": slot seq moving under the reader", w[4].offset);
    }
  }

  void Backwards() {
    backwards_done_ = true;
    for (uint32_t cpu = 0; cpu < g_.max_cpus; ++cpu) {
      region::CpuRingHeader* h = r_.cpu_ring(cpu);
      if (h->published < 3) continue;
      h->published -= 2;
      Say("cpu " + std::to_string(cpu) + ": publish counter run backwards", g_.CpuRingOffset(cpu));
      std::vector<Slot> w = Written(cpu, false);
      if (w.size() < 6) continue;
      w[5].desc->sequence += uint64_t{g_.slots_per_cpu} * 1000;
      Say("cpu " + std::to_string(cpu) + ": slot claims a page never published", w[5].offset);
    }
    for (uint32_t ring : UsedDwRings()) {
      std::vector<Slot> w = Written(ring, true);
      if (w.size() < 2) continue;
      // A page the ring never published, in the slot it would have.
      w[0].desc->sequence += uint64_t{g_.dw_slots} * 1000;
      Say("dw ring " + std::to_string(ring) + ": slot claims a page never published", w[0].offset);
    }
    region::GuestStatus* st = r_.status();
    st->heartbeat = st->heartbeat > 10 ? st->heartbeat / 2 : 0;
    st->pages_pushed = 0;
    Say("status: heartbeat and pages pushed run backwards", region::kGuestStatusOffset);
  }

  void Pages() {
    for (uint32_t ring : UsedDwRings()) {
      std::vector<Slot> w = Written(ring, true);
      if (w.empty()) continue;
      Slot& s = w.size() >= 3 ? w[1] : w.back();
      // First record: type_len 0 says "length in the next word"; that
      // length runs far past the page.
      const uint32_t type_len_delta = 0;
      const uint32_t huge = 0x00ffffff;
      std::memcpy(s.page + 16, &type_len_delta, 4);
      std::memcpy(s.page + 20, &huge, 4);
      Say("dw ring " + std::to_string(ring) + ": record length past the page", s.offset);
    }
  }

  // A valid format text for "scribble:NAME" with event id |id| and one
  // field of |size| bytes.
  static std::string Text(const std::string& name, uint32_t id, uint32_t size) {
    return "name: " + name + "\nID: " + std::to_string(id) +
           "\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
           "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
           "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
           "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
           "\tfield:unsigned int x;\toffset:8;\tsize:" +
           std::to_string(size) + ";\tsigned:0;\n\nprint fmt: \"x=%u\", REC->x\n";
  }
  static uint64_t Fingerprint(const std::string& text) {
    auto parsed = ParseEventFormat("scribble", text);
    return parsed.ok() ? EventFingerprint(*parsed) : 0;
  }

  void Publish(region::FormatKind kind, uint32_t id, const std::string& text, uint64_t fp,
               const std::string& what) {
    auto index = r_.PublishFormat(kind, generation_, id, "scribble", text, fp);
    if (index.ok())
      Say("format: " + what, g_.FormatEntryOffset(*index));
    else
      std::printf("scribble: format: %s: %s\n", what.c_str(), index.error().message.c_str());
  }

  void Formats() {
    formats_done_ = true;
    const std::string t1 = Text("id_liar", 1000, 4);
    Publish(region::kFormatKernelEvent, 4242, t1, Fingerprint(t1), "entry id 4242, text ID 1000");
    const std::string t2 = Text("fp_liar", 1001, 4);
    Publish(region::kFormatKernelEvent, 1001, t2, Fingerprint(t2) ^ 1,
            "fingerprint its text does not have");
    Publish(static_cast<region::FormatKind>(77), 1002, Text("kind77", 1002, 4), 0,
            "unknown kind 77");
    Publish(region::kFormatKernelEvent, 1003, "this is not a format file\n", 0, "unparsable text");
    const std::string t4 = Text("conflict", 1004, 4), t5 = Text("conflict", 1004, 2);
    Publish(region::kFormatKernelEvent, 1004, t4, Fingerprint(t4), "id 1004 (first)");
    Publish(region::kFormatKernelEvent, 1004, t5, Fingerprint(t5), "id 1004 again, another format");
    // Sizes that lie: an entry whose text reaches past the text area.
    const std::string t6 = Text("size_liar", 1005, 4);
    auto index = r_.PublishFormat(region::kFormatKernelEvent, generation_, 1005, "scribble", t6,
                                  Fingerprint(t6));
    if (index.ok()) {
      auto* e = reinterpret_cast<region::FormatEntry*>(r_.base() + g_.FormatEntryOffset(*index));
      e->text_len = g_.format_text_size + 100;
      Say("format: text length past the text area", g_.FormatEntryOffset(*index));
    }
  }

  // Lies in the text areas, a different one on each call (the host sees
  // each as a new header): content that is no text, sizes and CRCs that do
  // not match, a compressed size past the area, a zlib bomb, a torn write.
  void Texts() {
    const uint32_t turn = texts_turn_++;
    const std::string symbols = "ffffffff81000000 T _text\nffffffff811a2b30 t tracing_mark_write\n";
    if (g_.symbol_size != 0) {
      auto* h = reinterpret_cast<region::TextAreaHeader*>(r_.base() + g_.symbol_offset);
      std::string what;
      switch (turn % 5) {
        case 0:
          (void)r_.WriteTextArea(TextAreaKind::kSymbols, generation_,
                                 EncodeText(std::string("\x01\x02\xff bytes\n", 10)));
          what = "symbols: binary bytes, sizes and CRC right";
          break;
        case 1: {
          const EncodedText e = EncodeText(symbols);
          (void)r_.WriteTextArea(TextAreaKind::kSymbols, generation_, e);
          h->raw_size = e.raw_size + 1000;
          what = "symbols: raw size 1000 bytes more than the text";
          break;
        }
        case 2:
          (void)r_.WriteTextArea(TextAreaKind::kSymbols, generation_, EncodeText(symbols));
          h->crc32 ^= 1;
          what = "symbols: CRC that does not match";
          break;
        case 3:
          (void)r_.WriteTextArea(TextAreaKind::kSymbols, generation_, EncodeText(symbols));
          h->stored_size = g_.symbol_size;
          what = "symbols: compressed size past the area";
          break;
        default: {
          static const EncodedText bomb = EncodeText(std::string(16u << 20, '0'));
          (void)r_.WriteTextArea(TextAreaKind::kSymbols, generation_, bomb);
          h->raw_size = 4096;
          what = "symbols: zlib bomb (16 MiB) stated as 4096 bytes";
          break;
        }
      }
      h->seq += 2;  // A new header for a host that already looked.
      Say(what, g_.symbol_offset);
    }
    if (g_.comm_size != 0) {
      auto* h = reinterpret_cast<region::TextAreaHeader*>(r_.base() + g_.comm_offset);
      std::string what;
      switch (turn % 3) {
        case 0:
          (void)r_.WriteTextArea(TextAreaKind::kComms, generation_, EncodeText("not a pid\n"));
          h->seq += 2;
          what = "comms: a line without a pid";
          break;
        case 1:
          (void)r_.WriteTextArea(TextAreaKind::kComms, generation_, EncodeText("1 init\n"));
          h->crc32 ^= 0xff;
          h->seq += 2;
          what = "comms: CRC that does not match";
          break;
        default:
          h->seq |= 1;
          what = "comms: left mid-write (odd seq)";
          break;
      }
      Say(what, g_.comm_offset);
    }
  }

  void Identity() {
    region::GuestIdentity id = r_.ReadIdentity();
    id.nr_cpus = 100000;
    r_.WriteIdentity(id);
    Say("identity: 100000 CPUs", region::kGuestIdentityOffset);
  }

  void Header() {
    auto* h = reinterpret_cast<region::HostHeader*>(r_.base() + region::kHostHeaderOffset);
    h->slot_size = 123;
    h->cpu_offset = 7;
    h->region_size = 3;
    h->dw_rings = 0xffffffff;
    Say("host header: slot size, CPU offset, region size, dw rings rewritten",
        region::kHostHeaderOffset);
  }

  GuestRegion r_;
  RegionGeometry g_;
  uint32_t generation_ = 0;
  bool formats_done_ = false;
  bool backwards_done_ = false;
  uint32_t texts_turn_ = 0;
  std::set<std::string> said_;
};

uint64_t MonoMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

}  // namespace

int ScribbleMain(int argc, char** argv) {
  std::string path;
  uint64_t repeat_ms = 0;
  std::set<std::string> modes;
  const std::set<std::string> known = {"lengths", "torn",  "backwards", "formats",
                                       "pages",   "texts", "header",    "identity"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--region" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg == "--repeat-ms" && i + 1 < argc) {
      repeat_ms = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "all") {
      for (const std::string& m : known) {
        if (m != "identity") modes.insert(m);
      }
    } else if (known.count(arg)) {
      modes.insert(arg);
    } else {
      std::fprintf(stderr,
                   "scribble: unknown mode '%s' (lengths torn backwards formats pages texts header "
                   "identity all)\n",
                   arg.c_str());
      return 2;
    }
  }
  if (modes.empty()) {
    std::fprintf(stderr,
                 "usage: hvtrace-guest-test scribble [--region PATH] [--repeat-ms MS] MODE...\n");
    return 2;
  }
  if (path.empty()) {
    std::ifstream in(kRegionPointerFile);
    in >> path;
  }
  if (path.empty()) {
    std::fprintf(stderr, "scribble: no region (no --region and no %s)\n", kRegionPointerFile);
    return 1;
  }
  auto mapping = RegionMapping::Map(path);
  if (!mapping.ok()) {
    std::fprintf(stderr, "scribble: %s\n", mapping.error().message.c_str());
    return 1;
  }
  auto region = GuestRegion::Attach(mapping->data(), mapping->size());
  if (!region.ok()) {
    std::fprintf(stderr, "scribble: %s: %s\n", path.c_str(), region.error().message.c_str());
    return 1;
  }
  Scribbler scribbler(*region);
  const uint64_t end = MonoMs() + repeat_ms;
  do {
    scribbler.Run(modes);
    const timespec pause{0, 10 * 1000000};
    if (repeat_ms > 0) nanosleep(&pause, nullptr);
  } while (MonoMs() < end);
  std::printf("scribble: done\n");
  return 0;
}

}  // namespace hvtrace::guest_test
