// The printk ring reader over rings built here the way the kernel lays them
// out (printk_ringbuffer.c), including the hostile cases; the real 6.12 and
// 7.3 guests' rings are in printk_ring_real_test.cc.
#include "hvtrace/printk_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "hvtrace/memory_record.h"

namespace hvtrace {
namespace {

constexpr uint64_t kPrbSym = 0xffffffff82000000ull;
constexpr uint64_t kRb = 0xffffffff82001000ull;
constexpr uint64_t kDescs = 0xffff888000100000ull;
constexpr uint64_t kInfos = 0xffff888000200000ull;
constexpr uint64_t kData = 0xffff888000300000ull;
constexpr uint64_t kCommitted = 1, kFinalized = 2, kReserved = 0;

// A ring with the x86_64 layout of Linux 6.12 (the offsets VMCOREINFO
// states for it), 2^count_bits descriptors, 2^size_bits text bytes.
class FakeRing {
 public:
  FakeRing(unsigned count_bits, unsigned size_bits)
      : count_bits_(count_bits), size_bits_(size_bits) {
    descs_.resize((size_t{1} << count_bits) * 24);
    infos_.resize((size_t{1} << count_bits) * 88);
    data_.resize(size_t{1} << size_bits);
  }

  // Appends record |id| (its seq = id) as the kernel does: the block at the
  // data head, starting again at 0 when it would cross the end.
  void Add(uint64_t id, const std::string& text, uint64_t state = kFinalized, uint32_t caller = 7,
           uint64_t ts = 0) {
    const uint64_t size = (8 + text.size() + 7) / 8 * 8;
    const uint64_t ring = data_.size();
    const uint64_t begin = data_head_;
    uint64_t next = begin + size;
    uint64_t at = begin & (ring - 1);
    if ((begin / ring) != ((next - 1) / ring)) {
      // get_next_lpos(): a block that would cross the end is stored at the
      // ring's start; its begin stays where the head was.
      next = (begin + size) / ring * ring + size;
      at = 0;
    }
    Put(data_, at, id, 8);
    std::memcpy(data_.data() + at + 8, text.data(), text.size());
    data_head_ = next;
    SetDesc(id, state, begin, next);
    const size_t i = (id & ((uint64_t{1} << count_bits_) - 1)) * 88;
    Put(infos_, i + 0, id + seq_base_, 8);
    Put(infos_, i + 8, ts ? ts : id * 1000, 8);
    Put(infos_, i + 16, text.size(), 2);
    Put(infos_, i + 20, caller, 4);
    if (!any_) tail_ = id;
    any_ = true;
    head_ = id;
  }
  void SetDesc(uint64_t id, uint64_t state, uint64_t begin, uint64_t next) {
    const size_t d = (id & ((uint64_t{1} << count_bits_) - 1)) * 24;
    Put(descs_, d, (state << 62) | id, 8);
    Put(descs_, d + 8, begin, 8);
    Put(descs_, d + 16, next, 8);
  }
  // A record with no text (NO_LPOS): nothing in the data ring.
  void AddEmpty(uint64_t id) {
    SetDesc(id, kFinalized, 3, 3);
    const size_t i = (id & ((uint64_t{1} << count_bits_) - 1)) * 88;
    Put(infos_, i, id + seq_base_, 8);
    Put(infos_, i + 16, 0, 2);
    head_ = id;
  }
  void SetTail(uint64_t id) { tail_ = id; }
  void SetSeqBase(uint64_t base) { seq_base_ = base; }

  std::string Vmcoreinfo(const std::map<std::string, std::string>& override = {}) const {
    std::map<std::string, std::string> v = {
        {"OSRELEASE", "6.12.95+deb12-amd64"},
        {"SYMBOL(prb)", "ffffffff82000000"},
        {"SIZE(printk_ringbuffer)", "88"},
        {"OFFSET(printk_ringbuffer.desc_ring)", "0"},
        {"OFFSET(printk_ringbuffer.text_data_ring)", "48"},
        {"OFFSET(prb_desc_ring.count_bits)", "0"},
        {"OFFSET(prb_desc_ring.descs)", "8"},
        {"OFFSET(prb_desc_ring.infos)", "16"},
        {"OFFSET(prb_desc_ring.head_id)", "24"},
        {"OFFSET(prb_desc_ring.tail_id)", "32"},
        {"SIZE(prb_desc)", "24"},
        {"OFFSET(prb_desc.state_var)", "0"},
        {"OFFSET(prb_desc.text_blk_lpos)", "8"},
        {"OFFSET(prb_data_blk_lpos.begin)", "0"},
        {"OFFSET(prb_data_blk_lpos.next)", "8"},
        {"SIZE(printk_info)", "88"},
        {"OFFSET(printk_info.seq)", "0"},
        {"OFFSET(printk_info.ts_nsec)", "8"},
        {"OFFSET(printk_info.text_len)", "16"},
        {"OFFSET(printk_info.caller_id)", "20"},
        {"OFFSET(prb_data_ring.size_bits)", "0"},
        {"OFFSET(prb_data_ring.data)", "8"},
        {"OFFSET(atomic_long_t.counter)", "0"},
    };
    for (const auto& [k, val] : override) {
      if (val.empty()) {
        v.erase(k);
      } else {
        v[k] = val;
      }
    }
    std::string out;
    for (const auto& [k, val] : v) out += k + "=" + val + "\n";
    return out;
  }

  MemoryRecord Memory(uint32_t count_bits_field = 0, uint32_t size_bits_field = 0) const {
    std::vector<std::byte> rb(88);
    Put(rb, 0, count_bits_field ? count_bits_field : count_bits_, 4);
    Put(rb, 8, kDescs, 8);
    Put(rb, 16, kInfos, 8);
    Put(rb, 24, head_, 8);
    Put(rb, 32, tail_, 8);
    Put(rb, 48, size_bits_field ? size_bits_field : size_bits_, 4);
    Put(rb, 56, kData, 8);
    std::vector<std::byte> prb(8);
    Put(prb, 0, kRb, 8);
    MemoryRecord m;
    m.Add(kPrbSym, prb);
    m.Add(kRb, rb);
    m.Add(kDescs, descs_);
    m.Add(kInfos, infos_);
    m.Add(kData, data_);
    return m;
  }

  static void Put(std::vector<std::byte>& v, size_t at, uint64_t value, size_t width) {
    for (size_t i = 0; i < width; ++i) v[at + i] = static_cast<std::byte>(value >> (8 * i));
  }

  std::vector<std::byte> data_;

 private:
  unsigned count_bits_, size_bits_;
  std::vector<std::byte> descs_, infos_;
  uint64_t data_head_ = 0, head_ = 0, tail_ = 0, seq_base_ = 0;
  bool any_ = false;
};

Result<KernelLog> Read(const FakeRing& ring, const MemoryRecord& memory,
                       const std::map<std::string, std::string>& override = {}) {
  return ReadPrintkRing(Vmcoreinfo::Parse(ring.Vmcoreinfo(override)),
                        [&memory](uint64_t a, size_t n) { return memory.Read(a, n); });
}

std::vector<std::string> Texts(const KernelLog& log) {
  std::vector<std::string> out;
  for (const KernelLogRecord& r : log.records) out.push_back(r.text);
  return out;
}

TEST(VmcoreinfoTest, ParsesKeysSymbolsOffsetsSizes) {
  const Vmcoreinfo v = Vmcoreinfo::Parse(
      "OSRELEASE=6.12\nSYMBOL(prb)=ffffffff8a2b3c40\nOFFSET(printk_info.seq)=0\n"
      "SIZE(prb_desc)=24\nnot a line\n=empty\nSIZE(bad)=12x\n"
      "NUMBER(phys_base)=-140509184\nNUMBER(bad)=1-\n");
  EXPECT_EQ(v.Value("OSRELEASE"), "6.12");
  EXPECT_EQ(v.Symbol("prb"), 0xffffffff8a2b3c40ull);
  EXPECT_EQ(v.Offset("printk_info.seq"), 0u);
  EXPECT_EQ(v.Size("prb_desc"), 24u);
  EXPECT_FALSE(v.Size("bad"));
  EXPECT_FALSE(v.Symbol("missing"));
  EXPECT_EQ(v.Number("phys_base"), -140509184);
  EXPECT_FALSE(v.Number("bad"));
  EXPECT_FALSE(v.Number("missing"));
}

TEST(VmcoreinfoTest, StopsAtNulAndAtTheBound) {
  std::string text = "A=1\n";
  text += '\0';
  text += "B=2\n";
  EXPECT_FALSE(Vmcoreinfo::Parse(text).Value("B"));
  std::string big(kMaxVmcoreinfoBytes, 'x');
  big += "\nC=3\n";
  EXPECT_FALSE(Vmcoreinfo::Parse(big).Value("C"));
}

TEST(PrintkRingTest, ReadsRecordsInOrderWithTimeAndCaller) {
  FakeRing ring(4, 10);
  ring.Add(0, "Linux version 6.12", kFinalized, 0, 5);
  ring.Add(1, "from an interrupt", kFinalized, 0x80000001u);
  ring.Add(2, "Kernel panic - not syncing: sysrq triggered crash", kCommitted, 1234);
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok()) << log.error().message;
  EXPECT_EQ(log->source, "printk-ring");
  EXPECT_EQ(Texts(*log),
            (std::vector<std::string>{"Linux version 6.12", "from an interrupt",
                                      "Kernel panic - not syncing: sysrq triggered crash"}));
  EXPECT_EQ(log->records[0].ts_ns, 5u);
  EXPECT_EQ(log->records[0].pid, 0);
  EXPECT_EQ(log->records[1].cpu, 1);
  EXPECT_EQ(log->records[1].pid, -1);
  EXPECT_EQ(log->records[2].pid, 1234);
  EXPECT_EQ(log->records[2].seq, 2u);
  EXPECT_EQ(log->lost, 0u);
  EXPECT_EQ(log->malformed, 0u);
}

TEST(PrintkRingTest, SplitsLinesAndKeepsEmptyDatalessRecords) {
  FakeRing ring(4, 10);
  ring.Add(0, "one\ntwo");
  ring.AddEmpty(1);
  ring.Add(2, "three");
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(Texts(*log), (std::vector<std::string>{"one", "two", "", "three"}));
  EXPECT_EQ(log->records[0].seq, log->records[1].seq);
}

TEST(PrintkRingTest, WrappedRingSaysWhatWasLostAndReadsWrappedBlocks) {
  FakeRing ring(3, 8);  // 8 descriptors, 256 text bytes.
  for (uint64_t id = 0; id < 30; ++id) ring.Add(id, "message number " + std::to_string(id));
  // The kernel keeps the tail within the descriptors still valid.
  ring.SetTail(30 - 6);
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok()) << log.error().message;
  ASSERT_FALSE(log->records.empty());
  EXPECT_EQ(log->records.back().text, "message number 29");
  EXPECT_EQ(log->lost, log->records.front().seq);
  EXPECT_GT(log->lost, 0u);
  for (size_t i = 1; i < log->records.size(); ++i) {
    EXPECT_EQ(log->records[i].seq, log->records[i - 1].seq + 1);
    EXPECT_EQ(log->records[i].text, "message number " + std::to_string(log->records[i].seq));
  }
}

TEST(PrintkRingTest, SkipsReservedRecordsWithoutCountingThem) {
  FakeRing ring(4, 10);
  ring.Add(0, "done");
  ring.Add(1, "being written", kReserved);
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(Texts(*log), std::vector<std::string>{"done"});
  EXPECT_EQ(log->malformed, 0u);
}

TEST(PrintkRingTest, Malicious_BadBlocksAreCountedAndSkipped) {
  FakeRing ring(4, 10);
  ring.Add(0, "good");
  ring.Add(1, "foreign block id");
  ring.Add(2, "text longer than its block");
  ring.Add(3, "good too");
  ring.Add(4, "positions out of order");
  ring.Add(5, "failed allocation");
  FakeRing::Put(ring.data_, 16, 99, 8);  // Record 1's block names record 99.
  ring.SetDesc(2, kFinalized, 40, 48);   // Only the id fits: text_len > block.
  ring.SetDesc(4, kFinalized, 4096, 64);
  ring.SetDesc(5, kFinalized, 1, 1);  // FAILED_LPOS
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(Texts(*log), (std::vector<std::string>{"good", "good too"}));
  EXPECT_EQ(log->malformed, 4u);
}

TEST(PrintkRingTest, Malicious_SeqGoingBackIsMalformed) {
  FakeRing ring(4, 10);
  ring.SetSeqBase(100);
  ring.Add(0, "a");
  ring.SetSeqBase(0);
  ring.Add(1, "b");  // seq 1 after seq 100.
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(Texts(*log), std::vector<std::string>{"a"});
  EXPECT_EQ(log->malformed, 1u);
  EXPECT_EQ(log->lost, 100u);
}

TEST(PrintkRingTest, Malicious_RingSizesOutOfBoundsAreRefused) {
  FakeRing ring(4, 10);
  ring.Add(0, "x");
  EXPECT_FALSE(Read(ring, ring.Memory(40, 0)).ok());
  EXPECT_FALSE(Read(ring, ring.Memory(0, 60)).ok());
  EXPECT_FALSE(Read(ring, ring.Memory(0, 2)).ok());
}

TEST(PrintkRingTest, Malicious_VmcoreinfoOffsetsOutsideTheirStructAreRefused) {
  FakeRing ring(4, 10);
  ring.Add(0, "x");
  const MemoryRecord m = ring.Memory();
  EXPECT_FALSE(Read(ring, m, {{"OFFSET(printk_info.caller_id)", "86"}}).ok());
  EXPECT_FALSE(Read(ring, m, {{"OFFSET(prb_desc_ring.tail_id)", "18446744073709551615"}}).ok());
  EXPECT_FALSE(Read(ring, m, {{"SIZE(printk_info)", "100000"}}).ok());
  EXPECT_FALSE(Read(ring, m, {{"SIZE(prb_desc)", "0"}}).ok());
  auto missing = Read(ring, m, {{"SYMBOL(prb)", ""}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("SYMBOL(prb)"), std::string::npos);
}

TEST(PrintkRingTest, Malicious_FailedOrShortReadsFail) {
  FakeRing ring(4, 10);
  ring.Add(0, "x");
  const Vmcoreinfo v = Vmcoreinfo::Parse(ring.Vmcoreinfo());
  EXPECT_FALSE(ReadPrintkRing(v, [](uint64_t, size_t) -> Result<std::vector<std::byte>> {
                 return Error{"no"};
               }).ok());
  const MemoryRecord m = ring.Memory();
  EXPECT_FALSE(ReadPrintkRing(v, [&m](uint64_t a, size_t n) -> Result<std::vector<std::byte>> {
                 auto r = m.Read(a, n);
                 if (r.ok() && n > 8) r->pop_back();
                 return r;
               }).ok());
}

TEST(PrintkRingTest, Malicious_HeadFarFromTailIsBoundedByTheRing) {
  FakeRing ring(3, 10);
  for (uint64_t id = 0; id < 5; ++id) ring.Add(id, "m" + std::to_string(id));
  ring.SetTail(0x3fffffff00000000ull);  // A span of ~2^62 ids.
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->malformed, 1u);
  EXPECT_EQ(log->records.size(), 5u);
}

TEST(PrintkRingTest, LongLinesAreCutAndCounted) {
  FakeRing ring(4, 12);
  ring.Add(0, std::string(kMaxKernelLogLine + 10, 'a'));
  auto log = Read(ring, ring.Memory());
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->records[0].text.size(), kMaxKernelLogLine);
  EXPECT_EQ(log->truncated, 1u);
}

TEST(MemoryRecordTest, RoundTripsAndServesSubRanges) {
  MemoryRecord m;
  std::vector<std::byte> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i);
  m.Add(0x1000, bytes);
  auto packed = m.Compress();
  ASSERT_TRUE(packed.ok());
  auto back = MemoryRecord::Decompress(*packed);
  ASSERT_TRUE(back.ok()) << back.error().message;
  auto part = back->Read(0x1010, 4);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ((*part)[0], std::byte{0x10});
  EXPECT_FALSE(back->Read(0x0fff, 4).ok());
  EXPECT_FALSE(back->Read(0x1060, 5).ok());
  EXPECT_TRUE(back->Read(0x1060, 4).ok());
}

TEST(MemoryRecordTest, CompressedIsTheSerializedRecord) {
  // Compress streams the blocks; what it packs must be Serialize's bytes:
  // several blocks, an empty one, and one larger than zstd's stream buffer.
  MemoryRecord m;
  std::vector<std::byte> big(300 * 1024);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7 % 251);
  m.Add(0x1000, big);
  m.Add(0x900000, {});
  m.Add(0x800000, std::vector<std::byte>(33, std::byte{5}));
  const MemoryRecord empty;
  for (const MemoryRecord* r : std::vector<const MemoryRecord*>{&m, &empty}) {
    const MemoryRecord& record = *r;
    auto packed = record.Compress();
    ASSERT_TRUE(packed.ok()) << packed.error().message;
    auto back = MemoryRecord::Decompress(*packed);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(back->Serialize(), record.Serialize());
  }
}

TEST(MemoryRecordTest, Malicious_TruncatedOrOversizedRecordsFail) {
  MemoryRecord m;
  m.Add(1, std::vector<std::byte>(10));
  std::vector<std::byte> raw = m.Serialize();
  EXPECT_TRUE(MemoryRecord::Parse(raw).ok());
  std::vector<std::byte> cut(raw.begin(), raw.end() - 1);
  EXPECT_FALSE(MemoryRecord::Parse(cut).ok());
  std::vector<std::byte> huge = raw;
  FakeRing::Put(huge, 24, ~uint64_t{0}, 8);  // The block's size.
  EXPECT_FALSE(MemoryRecord::Parse(huge).ok());
  std::vector<std::byte> more = raw;
  more.push_back(std::byte{0});
  EXPECT_FALSE(MemoryRecord::Parse(more).ok());
  EXPECT_FALSE(MemoryRecord::Decompress(raw).ok());
}

}  // namespace
}  // namespace hvtrace
