#include "kernel_log_step.h"

#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "capture_pipeline.h"
#include "host_time.h"
#include "hvtrace/kallsyms_table.h"
#include "hvtrace/memory_record.h"
#include "hvtrace/printk_ring.h"
#include "kernel_memory_direct.h"
#include "kernel_symbols.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// The KASLR step (CONFIG_PHYSICAL_ALIGN's minimum): where in the image area
// (kernel_symbols.h kImageStart..kImageEnd) `_text` can be.
constexpr uint64_t kKaslrStep = 0x200000;
// The scan stops here: a guest whose banner is nowhere is not searched for
// longer while its vCPUs wait.
constexpr auto kScanBudget = std::chrono::seconds(3);

KernelLogSymbols FindSymbols(const KernelFormats& formats) {
  KernelLogSymbols out;
  std::shared_ptr<const KernelSymbols> symbols = SymbolsOf(formats);
  if (!symbols) return out;
  const ImageSymbols& ix = symbols->image();
  out = ix.log;
  if (!out.end && ix.image_last != 0) out.end = ix.image_last + 1;
  return out;
}

// The guest reader, recording every successful read into |record|.
GuestMemoryRead Recording(const GuestMemoryRead& read, MemoryRecord& record) {
  return [&read, &record](uint64_t addr, size_t size) -> Result<std::vector<std::byte>> {
    Result<std::vector<std::byte>> bytes = read(addr, size);
    if (bytes.ok() && bytes->size() == size) record.Add(addr, *bytes);
    return bytes;
  };
}

// The KASLR offsets to try, the likeliest first: the decode's verdict for
// the newest boot, 0, then every step of the image area.
std::vector<int64_t> Candidates(std::optional<int64_t> hint, std::optional<uint64_t> text) {
  std::vector<int64_t> out;
  if (hint) out.push_back(*hint);
  out.push_back(0);
  if (text && *text >= kImageStart) {
    for (uint64_t at = kImageStart; at < kImageEnd; at += kKaslrStep) {
      out.push_back(static_cast<int64_t>(at - *text));
    }
  }
  return out;
}

// The offset at which the guest's linux_banner reads as |proc_version|.
std::optional<int64_t> FindDelta(const GuestMemoryRead& read,
                                 const std::vector<int64_t>& candidates, uint64_t banner,
                                 std::string_view proc_version, json& why) {
  const auto deadline = std::chrono::steady_clock::now() + kScanBudget;
  std::vector<int64_t> tried;
  for (int64_t delta : candidates) {
    if (std::find(tried.begin(), tried.end(), delta) != tried.end()) continue;
    tried.push_back(delta);
    if (std::chrono::steady_clock::now() > deadline) break;
    Result<std::vector<std::byte>> got =
        read(banner + static_cast<uint64_t>(delta), proc_version.size());
    if (!got.ok() || got->size() != proc_version.size()) continue;
    if (std::memcmp(got->data(), proc_version.data(), proc_version.size()) == 0) {
      why["kaslr_delta"] = delta;
      why["kaslr_tries"] = tried.size();
      return delta;
    }
  }
  why["kaslr_tries"] = tried.size();
  return std::nullopt;
}

// VMCOREINFO, as the guest's `vmcoreinfo_data`/`vmcoreinfo_size` say, bounded.
Result<std::string> ReadVmcoreinfo(const GuestMemoryRead& read, uint64_t data_sym,
                                   uint64_t size_sym) {
  Result<std::vector<std::byte>> ptr = read(data_sym, 8);
  Result<std::vector<std::byte>> size = read(size_sym, 8);
  if (!ptr.ok() || !size.ok() || ptr->size() != 8 || size->size() != 8) {
    return Error{"cannot read vmcoreinfo_data / vmcoreinfo_size"};
  }
  uint64_t addr = 0, bytes = 0;
  std::memcpy(&addr, ptr->data(), 8);
  std::memcpy(&bytes, size->data(), 8);
  if (addr == 0 || bytes == 0 || bytes > kMaxVmcoreinfoBytes) {
    return Error{"vmcoreinfo out of bounds: " + std::to_string(bytes) + " bytes at " +
                 std::to_string(addr)};
  }
  Result<std::vector<std::byte>> text = read(addr, bytes);
  if (!text.ok() || text->size() != bytes) return Error{"cannot read the VMCOREINFO text"};
  return std::string(reinterpret_cast<const char*>(text->data()), text->size());
}

Result<KernelLog> ReadLog(const CaptureInputs& in, FormatsService* formats,
                          const KaslrHintSource& kaslr_hint, MemoryRecord& record,
                          std::string& vmcoreinfo_text, json& info) {
  if (!in.read_guest_memory && !in.guest_ram)
    return Error{"the VM's backend cannot read guest memory"};
  if (!formats || !in.region_file || in.region_file->kernel_key.empty()) {
    return Error{"no kallsyms for the guest's kernel (unknown kernel)"};
  }
  Result<std::shared_ptr<const KernelFormats>> kf = formats->Get(in.region_file->kernel_key);
  if (!kf.ok()) return Error{"no kallsyms for the guest's kernel: " + kf.error().message};
  // Null: a kernel the service knows of but has no formats for (its harvest
  // failed or was not asked for; the boots decoded with the meta channel's).
  if (*kf == nullptr) return Error{"no kallsyms for the guest's kernel (its formats are missing)"};
  const KernelLogSymbols sym = FindSymbols(**kf);
  if (!sym.vmcoreinfo_data || !sym.vmcoreinfo_size || !sym.linux_banner ||
      (*kf)->proc_version.empty()) {
    return Error{"the kernel's kallsyms lack vmcoreinfo_data, vmcoreinfo_size or linux_banner"};
  }
  GuestMemoryRead reader = in.read_guest_memory;
  std::optional<int64_t> delta;
  if (in.guest_ram) {
    const HostTime mapping = HostTime::Now();
    Result<DirectKernelMemory> direct =
        MapKernelMemory(in.guest_ram, sym, (*kf)->proc_version, in.read_guest_memory);
    info["guest_ram_map_ms"] = MsSince(mapping);
    if (direct.ok()) {
      reader = std::move(direct->read);
      delta = direct->kaslr_delta;
      info["kaslr_delta"] = *delta;
      info["guest_ram"] = std::move(direct->info);
    } else {
      info["guest_ram"] = {{"error", direct.error().message}};
    }
  }
  // "backend": QMP memsave, or libvirt's memory peek.
  info["reader"] = delta ? "guest-ram" : "backend";
  if (!delta) {
    if (!in.read_guest_memory) return Error{"the VM's backend cannot read guest memory"};
    delta = FindDelta(in.read_guest_memory, Candidates(kaslr_hint(), sym.text), *sym.linux_banner,
                      (*kf)->proc_version, info);
  }
  if (!delta) return Error{"the guest's linux_banner was found at no KASLR offset"};
  const GuestMemoryRead read = Recording(reader, record);
  const auto moved = [&](uint64_t a) { return a + static_cast<uint64_t>(*delta); };
  Result<std::string> text =
      ReadVmcoreinfo(read, moved(*sym.vmcoreinfo_data), moved(*sym.vmcoreinfo_size));
  if (!text.ok()) return text.error();
  vmcoreinfo_text = std::move(*text);
  const Vmcoreinfo vmcoreinfo = Vmcoreinfo::Parse(vmcoreinfo_text);
  if (auto release = vmcoreinfo.Value("OSRELEASE")) info["osrelease"] = PrintableLogText(*release);
  PrintkRingInfo ring;
  Result<KernelLog> log = ReadPrintkRing(vmcoreinfo, read, &ring);
  info["ring"] = {{"count_bits", ring.count_bits}, {"size_bits", ring.size_bits},
                  {"head_id", ring.head_id},       {"tail_id", ring.tail_id},
                  {"bytes_read", ring.bytes_read}, {"reads", ring.reads}};
  return log;
}

}  // namespace

std::string KernelLogText(const KernelLog& log) {
  std::string out;
  char num[24];
  for (const KernelLogRecord& r : log.records) {
    const char kind = r.cpu >= 0 ? 'C' : 'T';
    const int32_t who = r.cpu >= 0 ? r.cpu : r.pid;
    // "SEQ\t[STAMP]\tC|T WHO\t" (snprintf was ~1 M instructions a panic).
    out.append(num, std::to_chars(num, num + sizeof num, r.seq).ptr);
    out += '\t';
    AppendDmesgStamp(r.ts_ns, &out);
    out += '\t';
    out += kind;
    out.append(num, std::to_chars(num, num + sizeof num, who).ptr);
    out += '\t';
    out += PrintableLogText(r.text);
    out += '\n';
  }
  return out;
}

std::optional<int64_t> DecodedKaslrDelta(const CaptureManifest& manifest) {
  const json* boots = manifest.extra.contains("boots") ? &manifest.extra["boots"] : nullptr;
  if (!boots || !boots->is_array() || boots->empty()) return std::nullopt;
  return KaslrDeltaOf(boots->back().value("decoded_with", json::object()).value("kaslr", json()));
}

GuestLogRead ReadGuestLog(const CaptureInputs& in, FormatsService* formats,
                          const KaslrHintSource& kaslr_hint) {
  const HostTime start = HostTime::Now();
  GuestLogRead out;
  out.log = ReadLog(in, formats, kaslr_hint, out.record, out.vmcoreinfo, out.info);
  out.read_ms = MsSince(start);
  return out;
}

void WriteGuestLogFiles(GuestLogRead& read, PendingCapture& pending) {
  if (read.files_written) return;
  read.files_written = true;
  const HostTime start = HostTime::Now();
  auto as_bytes = [](std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); };
  // Written as one set (PendingCapture::WriteFiles): each written and
  // fsynced in turn took 0.4-4.3 ms of this thread at a panic, 5-6.6 ms
  // with the compression for the three (a journal commit each, beside the
  // trace.dat's writes).
  std::vector<PendingCapture::NamedBytes> files;
  std::string write_error;
  if (!read.vmcoreinfo.empty()) files.push_back({"vmcoreinfo.txt", as_bytes(read.vmcoreinfo)});
  Result<std::vector<std::byte>> packed = std::vector<std::byte>();
  if (read.record.bytes() > 0) {
    packed = read.record.Compress();
    if (packed.ok()) {
      files.push_back({"printk-memory.zst", *packed});
    } else {
      write_error = packed.error().message;
    }
  }
  std::string text;
  if (read.log.ok()) {
    text = KernelLogText(*read.log);
    files.push_back({kKernelLogFileName, as_bytes(text)});
  }
  if (Status s = pending.WriteFiles(files); !s.ok()) {
    // One at a time, so that what fits (a full disk) is kept; the error
    // said is the last file's that failed.
    std::string last = s.error().message;
    bool failed = false;
    for (const PendingCapture::NamedBytes& f : files) {
      std::error_code ec;
      if (std::filesystem::exists(pending.dir() / std::string(f.name), ec)) continue;
      if (Status one = pending.WriteFile(f.name, f.data); !one.ok()) {
        last = one.error().message;
        failed = true;
      }
    }
    if (failed) write_error = last;
  }
  if (!write_error.empty()) read.info["write_error"] = write_error;
  read.write_ms = MsSince(start);
}

std::optional<KernelLog> StoreGuestLog(GuestLogRead read, PendingCapture& pending,
                                       CaptureManifest& manifest) {
  WriteGuestLogFiles(read, pending);
  json& info = read.info;
  std::optional<KernelLog> out;
  if (read.log.ok()) {
    const KernelLog& log = *read.log;
    info["source"] = log.source;
    info["file"] = kKernelLogFileName;
    info["lines"] = log.records.size();
    info["lost"] = log.lost;
    info["malformed"] = log.malformed;
    info["truncated"] = log.truncated;
    if (!log.records.empty()) {
      info["first_seq"] = log.records.front().seq;
      info["last_seq"] = log.records.back().seq;
    }
    out = std::move(*read.log);
  } else {
    info["error"] = read.log.error().message;
  }
  info["read_ms"] = read.read_ms;
  // The step's own work: its reads and file writes (not any wait for the
  // decode it ran beside).
  const double ms = read.read_ms + read.write_ms;
  info["ms"] = ms;
  manifest.extra["kernel_log"] = std::move(info);
  manifest.extra["timing_ms"]["kernel_log"] = ms;
  return out;
}

std::optional<KernelLog> ReadKernelLogStep(const CaptureInputs& in, FormatsService* formats,
                                           PendingCapture& pending, CaptureManifest& manifest) {
  const std::optional<int64_t> hint = DecodedKaslrDelta(manifest);
  return StoreGuestLog(ReadGuestLog(in, formats, [hint] { return hint; }), pending, manifest);
}

}  // namespace hvtrace::hostd
