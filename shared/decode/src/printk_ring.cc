#include "hvtrace/printk_ring.h"

#include <charconv>
#include <cstring>
#include <span>
#include <utility>

namespace hvtrace {
namespace {

// state_var: the state in the top two bits of an unsigned long, the id below
// (printk_ringbuffer.h DESC_SV_BITS, DESC_FLAGS_SHIFT, DESC_ID_MASK).
constexpr unsigned kStateShift = 62;
constexpr uint64_t kIdMask = ~(uint64_t{3} << kStateShift);
constexpr uint64_t kCommitted = 1, kFinalized = 2;
// A data-less record's positions have bit 0 set: NO_LPOS (0x3) both for an
// empty text, anything else a failed allocation (FAILED_LPOS 0x1).
constexpr uint64_t kNoLpos = 0x3;
constexpr size_t kBlockIdBytes = 8;  // `unsigned long id` before the text.

uint64_t LoadLe(std::span<const std::byte> bytes, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

// A field read at |offset| of |width| bytes, checked against |bytes|.
std::optional<uint64_t> Field(std::span<const std::byte> bytes, uint64_t offset, size_t width) {
  if (offset > bytes.size() || bytes.size() - offset < width) return std::nullopt;
  return LoadLe(bytes, offset, width);
}

std::optional<uint64_t> ParseNumber(std::string_view s, int base) {
  uint64_t v = 0;
  if (s.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The offsets and sizes the walk needs, every one checked to lie inside its
// struct (so a field read never leaves the copy it is read from).
struct Layout {
  uint64_t prb = 0;  // SYMBOL(prb): address of the pointer.
  uint64_t rb_size = 0;
  uint64_t desc_ring = 0, text_ring = 0;
  uint64_t count_bits = 0, descs = 0, infos = 0, head_id = 0, tail_id = 0;
  uint64_t size_bits = 0, data = 0;
  uint64_t counter = 0;
  uint64_t desc_size = 0, state_var = 0, lpos_begin = 0, lpos_next = 0;
  uint64_t info_size = 0, seq = 0, ts_nsec = 0, text_len = 0, caller_id = 0;
};

Result<Layout> LayoutOf(const Vmcoreinfo& vi) {
  Layout l;
  std::string missing;
  auto need = [&](std::optional<uint64_t> v, const char* what) {
    if (!v) missing += std::string(missing.empty() ? "" : ", ") + what;
    return v.value_or(0);
  };
  l.prb = need(vi.Symbol("prb"), "SYMBOL(prb)");
  l.rb_size = need(vi.Size("printk_ringbuffer"), "SIZE(printk_ringbuffer)");
  l.desc_ring = need(vi.Offset("printk_ringbuffer.desc_ring"), "desc_ring");
  l.text_ring = need(vi.Offset("printk_ringbuffer.text_data_ring"), "text_data_ring");
  l.count_bits = need(vi.Offset("prb_desc_ring.count_bits"), "count_bits");
  l.descs = need(vi.Offset("prb_desc_ring.descs"), "descs");
  l.infos = need(vi.Offset("prb_desc_ring.infos"), "infos");
  l.head_id = need(vi.Offset("prb_desc_ring.head_id"), "head_id");
  l.tail_id = need(vi.Offset("prb_desc_ring.tail_id"), "tail_id");
  l.size_bits = need(vi.Offset("prb_data_ring.size_bits"), "size_bits");
  l.data = need(vi.Offset("prb_data_ring.data"), "data");
  l.counter = need(vi.Offset("atomic_long_t.counter"), "atomic_long_t.counter");
  l.desc_size = need(vi.Size("prb_desc"), "SIZE(prb_desc)");
  l.state_var = need(vi.Offset("prb_desc.state_var"), "state_var");
  const uint64_t blk = need(vi.Offset("prb_desc.text_blk_lpos"), "text_blk_lpos");
  l.lpos_begin = blk + need(vi.Offset("prb_data_blk_lpos.begin"), "prb_data_blk_lpos.begin");
  l.lpos_next = blk + need(vi.Offset("prb_data_blk_lpos.next"), "prb_data_blk_lpos.next");
  l.info_size = need(vi.Size("printk_info"), "SIZE(printk_info)");
  l.seq = need(vi.Offset("printk_info.seq"), "seq");
  l.ts_nsec = need(vi.Offset("printk_info.ts_nsec"), "ts_nsec");
  l.text_len = need(vi.Offset("printk_info.text_len"), "text_len");
  l.caller_id = need(vi.Offset("printk_info.caller_id"), "caller_id");
  if (!missing.empty()) return Error{"VMCOREINFO lacks " + missing};
  // Each field must fit its struct; the struct sizes are bounded first so
  // the sums below cannot wrap.
  for (uint64_t size : {l.rb_size, l.desc_size, l.info_size}) {
    if (size == 0 || size > kMaxPrintkStructSize)
      return Error{"VMCOREINFO: struct size out of bounds"};
  }
  auto fits = [](uint64_t off, uint64_t width, uint64_t size) {
    return off <= size && size - off >= width;
  };
  const bool ok =
      l.counter <= 64 && fits(l.desc_ring, 0, l.rb_size) && fits(l.text_ring, 0, l.rb_size) &&
      fits(l.desc_ring + l.count_bits, 4, l.rb_size) && fits(l.desc_ring + l.descs, 8, l.rb_size) &&
      fits(l.desc_ring + l.infos, 8, l.rb_size) &&
      fits(l.desc_ring + l.head_id + l.counter, 8, l.rb_size) &&
      fits(l.desc_ring + l.tail_id + l.counter, 8, l.rb_size) &&
      fits(l.text_ring + l.size_bits, 4, l.rb_size) && fits(l.text_ring + l.data, 8, l.rb_size) &&
      fits(l.state_var + l.counter, 8, l.desc_size) && fits(l.lpos_begin, 8, l.desc_size) &&
      fits(l.lpos_next, 8, l.desc_size) && fits(l.seq, 8, l.info_size) &&
      fits(l.ts_nsec, 8, l.info_size) && fits(l.text_len, 2, l.info_size) &&
      fits(l.caller_id, 4, l.info_size);
  if (!ok) return Error{"VMCOREINFO: a printk field lies outside its struct"};
  return l;
}

// |read| with its answer checked to be exactly |size| bytes, and counted.
Result<std::vector<std::byte>> ReadExactly(const GuestMemoryRead& read, uint64_t addr, size_t size,
                                           const char* what, PrintkRingInfo& found) {
  Result<std::vector<std::byte>> bytes = read(addr, size);
  if (!bytes.ok()) return Error{std::string("reading ") + what + ": " + bytes.error().message};
  if (bytes->size() != size) return Error{std::string("reading ") + what + ": short read"};
  found.bytes_read += size;
  ++found.reads;
  return bytes;
}

// The copies the walk reads from; never guest memory itself.
struct Ring {
  std::vector<std::byte> descs, infos, data;
  uint64_t count = 0;  // Descriptors, a power of two.
  uint64_t data_size = 0;
};

// The text of record |id| whose block spans [begin, next), or nullopt when
// the positions or the block are not what the kernel writes.
std::optional<std::string_view> BlockText(const Ring& ring, uint64_t id, uint64_t begin,
                                          uint64_t next, uint64_t text_len, unsigned size_bits) {
  if ((begin & 1) || (next & 1)) {  // Data-less.
    if (begin == kNoLpos && next == kNoLpos && text_len == 0) return std::string_view();
    return std::nullopt;
  }
  const uint64_t mask = ring.data_size - 1;
  uint64_t at = 0, size = 0;
  // Wraps are compared at |next| - 1, the block's last byte: a block that
  // ends exactly at the ring's end is regular (Linux 6.16+ writes it so;
  // older kernels moved it to the start, which reads as wrapped here too).
  if (begin < next && (begin >> size_bits) == ((next - 1) >> size_bits)) {
    at = begin & mask;
    size = next - begin;
  } else if (next != 0 && ((begin + ring.data_size) >> size_bits) == ((next - 1) >> size_bits)) {
    at = 0;  // The block wrapped: it starts again at the ring's start.
    size = next & mask;
  } else {
    return std::nullopt;
  }
  if (size > ring.data_size || at > ring.data_size - size || size < kBlockIdBytes) {
    return std::nullopt;
  }
  // The block names its own record: a stale or foreign block does not.
  if (LoadLe(ring.data, at, kBlockIdBytes) != id) return std::nullopt;
  size -= kBlockIdBytes;
  if (text_len > size) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(ring.data.data()) + at + kBlockIdBytes,
                          text_len);
}

// Appends |text| as one record per line to |log|, each cut at
// kMaxKernelLogLine.
void AppendLines(const KernelLogRecord& proto, std::string_view text, KernelLog& log) {
  do {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    KernelLogRecord r = proto;
    if (line.size() > kMaxKernelLogLine) {
      line = line.substr(0, kMaxKernelLogLine);
      ++log.truncated;
    }
    r.text.assign(line);
    log.records.push_back(std::move(r));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  } while (!text.empty());
}

// Walks the descriptors from |tail| to |head| (ids), reading each record
// from the copies in |ring|.
void Walk(const Layout& l, const Ring& ring, uint64_t tail, uint64_t head, unsigned size_bits,
          KernelLog& log) {
  // More ids between tail and head than descriptors: the older ones are
  // overwritten; start where the ring can still hold them.
  uint64_t span = (head - tail) & kIdMask;
  if (span >= ring.count) {
    ++log.malformed;
    tail = (head - (ring.count - 1)) & kIdMask;
    span = ring.count - 1;
  }
  std::optional<uint64_t> last_seq;
  for (uint64_t n = 0; n <= span; ++n) {
    const uint64_t id = (tail + n) & kIdMask;
    const uint64_t index = id & (ring.count - 1);
    const std::span<const std::byte> desc =
        std::span(ring.descs).subspan(index * l.desc_size, l.desc_size);
    const std::span<const std::byte> info =
        std::span(ring.infos).subspan(index * l.info_size, l.info_size);
    const uint64_t sv = LoadLe(desc, l.state_var + l.counter, 8);
    const uint64_t state = sv >> kStateShift;
    // Reserved (being written at the panic), reusable or already a newer
    // record's: not this record, nothing to read.
    if ((sv & kIdMask) != id || (state != kCommitted && state != kFinalized)) continue;
    const uint64_t seq = LoadLe(info, l.seq, 8);
    const uint64_t text_len = LoadLe(info, l.text_len, 2);
    std::optional<std::string_view> text = BlockText(
        ring, id, LoadLe(desc, l.lpos_begin, 8), LoadLe(desc, l.lpos_next, 8), text_len, size_bits);
    if (!text || (last_seq && seq <= *last_seq)) {
      ++log.malformed;
      continue;
    }
    if (!last_seq) log.lost = seq;
    last_seq = seq;
    KernelLogRecord r;
    r.seq = seq;
    r.ts_ns = LoadLe(info, l.ts_nsec, 8);
    // caller_id: bit 31 set for a CPU (printk from interrupt context), else a pid.
    const uint32_t caller = static_cast<uint32_t>(LoadLe(info, l.caller_id, 4));
    if (caller & 0x80000000u) {
      r.cpu = static_cast<int32_t>(caller & 0x7fffffffu);
    } else {
      r.pid = static_cast<int32_t>(caller);
    }
    AppendLines(r, *text, log);
  }
}

}  // namespace

Vmcoreinfo Vmcoreinfo::Parse(std::string_view text) {
  text = text.substr(0, std::min(text.size(), kMaxVmcoreinfoBytes));
  text = text.substr(0, text.find('\0'));
  Vmcoreinfo out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out.values_.emplace(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  return out;
}

std::optional<std::string_view> Vmcoreinfo::Value(std::string_view key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return std::string_view(it->second);
}

std::optional<uint64_t> Vmcoreinfo::Symbol(std::string_view name) const {
  auto v = Value("SYMBOL(" + std::string(name) + ")");
  return v ? ParseNumber(*v, 16) : std::nullopt;
}

std::optional<uint64_t> Vmcoreinfo::Offset(std::string_view member) const {
  auto v = Value("OFFSET(" + std::string(member) + ")");
  return v ? ParseNumber(*v, 10) : std::nullopt;
}

std::optional<uint64_t> Vmcoreinfo::Size(std::string_view type) const {
  auto v = Value("SIZE(" + std::string(type) + ")");
  return v ? ParseNumber(*v, 10) : std::nullopt;
}

std::optional<int64_t> Vmcoreinfo::Number(std::string_view name) const {
  auto v = Value("NUMBER(" + std::string(name) + ")");
  if (!v || v->empty()) return std::nullopt;
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (ec != std::errc() || end != v->data() + v->size()) return std::nullopt;
  return n;
}

Result<KernelLog> ReadPrintkRing(const Vmcoreinfo& info, const GuestMemoryRead& read,
                                 PrintkRingInfo* found_out) {
  PrintkRingInfo found;
  Result<Layout> layout = LayoutOf(info);
  if (!layout.ok()) return layout.error();
  const Layout& l = *layout;
  Result<std::vector<std::byte>> prb = ReadExactly(read, l.prb, 8, "prb", found);
  if (!prb.ok()) return prb.error();
  found.ring = LoadLe(*prb, 0, 8);
  Result<std::vector<std::byte>> rb =
      ReadExactly(read, found.ring, l.rb_size, "the printk_ringbuffer", found);
  if (!rb.ok()) return rb.error();
  // Every field below was checked to fit |rb| (LayoutOf): read once, into locals.
  found.count_bits = static_cast<uint32_t>(*Field(*rb, l.desc_ring + l.count_bits, 4));
  found.size_bits = static_cast<uint32_t>(*Field(*rb, l.text_ring + l.size_bits, 4));
  const uint64_t descs = *Field(*rb, l.desc_ring + l.descs, 8);
  const uint64_t infos = *Field(*rb, l.desc_ring + l.infos, 8);
  found.head_id = *Field(*rb, l.desc_ring + l.head_id + l.counter, 8) & kIdMask;
  found.tail_id = *Field(*rb, l.desc_ring + l.tail_id + l.counter, 8) & kIdMask;
  const uint64_t data = *Field(*rb, l.text_ring + l.data, 8);
  if (found.count_bits == 0 || found.count_bits > kMaxPrintkCountBits || found.size_bits < 4 ||
      found.size_bits > kMaxPrintkSizeBits) {
    return Error{"printk ring sizes out of bounds: count_bits " + std::to_string(found.count_bits) +
                 ", size_bits " + std::to_string(found.size_bits)};
  }
  Ring ring;
  ring.count = uint64_t{1} << found.count_bits;
  ring.data_size = uint64_t{1} << found.size_bits;
  auto descs_bytes =
      ReadExactly(read, descs, ring.count * l.desc_size, "the printk descriptors", found);
  if (!descs_bytes.ok()) return descs_bytes.error();
  auto infos_bytes = ReadExactly(read, infos, ring.count * l.info_size, "the printk infos", found);
  if (!infos_bytes.ok()) return infos_bytes.error();
  auto data_bytes = ReadExactly(read, data, ring.data_size, "the printk text ring", found);
  if (!data_bytes.ok()) return data_bytes.error();
  ring.descs = std::move(*descs_bytes);
  ring.infos = std::move(*infos_bytes);
  ring.data = std::move(*data_bytes);
  KernelLog log;
  log.source = "printk-ring";
  Walk(l, ring, found.tail_id, found.head_id, found.size_bits, log);
  if (found_out) *found_out = found;
  return log;
}

}  // namespace hvtrace
