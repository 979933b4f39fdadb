#include "vmcore_step.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "host_time.h"
#include "hvtrace/printk_ring.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

// |from| (QEMU's file, perhaps on another file system: the daemon's run
// directory) into the capture as |name|: renamed when it can be, else
// copied (the kernel copies: copy_file_range/sendfile). Written under a
// "*.tmp.*" name first, so a half copy is never listed (capture_store.h);
// Commit fsyncs the finished file.
Status MoveInto(const fs::path& from, const fs::path& dir, const std::string& name) {
  const fs::path tmp = dir / (name + ".tmp.0");
  std::error_code ec;
  fs::rename(from, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing, ec);
    std::error_code ignored;
    fs::remove(from, ignored);
    if (ec) return Error{"copying " + from.string() + " to " + tmp.string() + ": " + ec.message()};
  }
  fs::rename(tmp, dir / name, ec);
  if (ec) return Error{"renaming " + tmp.string() + ": " + ec.message()};
  return {};
}

// QEMU before 8.2 writes kdump formats "flattened" (makedumpfile's stream
// form, for pipes): a 4096-byte header {char signature[16] = "makedumpfile";
// int64 type = 1; int64 version = 1}, then records {int64 offset; int64
// size; bytes[size]} ending with offset = size = -1, all big-endian.
// makedumpfile and crash read only the reassembled file, which is what
// `makedumpfile -R` makes and what this does: each record written at its
// offset. QEMU wrote it, but it is bounded all the same.
constexpr size_t kFlatHeaderBytes = 4096;
constexpr int64_t kMaxFlatRecord = int64_t{1} << 30;
constexpr int64_t kMaxFlatOffset = int64_t{1} << 42;

bool IsFlattened(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char sig[16] = {};
  in.read(sig, sizeof sig);
  return in && std::memcmp(sig, "makedumpfile\0", 13) == 0;
}

int64_t BigEndian64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

Status Reassemble(const fs::path& flat, const fs::path& out) {
  std::ifstream in(flat, std::ios::binary);
  std::ofstream dst(out, std::ios::binary | std::ios::trunc);
  if (!in || !dst) return Error{"reassembling " + flat.string() + ": cannot open"};
  in.seekg(kFlatHeaderBytes);
  std::vector<char> buffer(1 << 20);
  for (;;) {
    unsigned char header[16];
    if (!in.read(reinterpret_cast<char*>(header), sizeof header)) {
      return Error{"reassembling " + flat.string() + ": no end record"};
    }
    const int64_t offset = BigEndian64(header), size = BigEndian64(header + 8);
    if (offset == -1) break;
    if (offset < 0 || size < 0 || size > kMaxFlatRecord || offset > kMaxFlatOffset) {
      return Error{"reassembling " + flat.string() + ": bad record at " +
                   std::to_string(static_cast<int64_t>(in.tellg()) - 16)};
    }
    dst.seekp(offset);
    for (int64_t left = size; left > 0;) {
      const auto n = static_cast<std::streamsize>(
          std::min<int64_t>(left, static_cast<int64_t>(buffer.size())));
      if (!in.read(buffer.data(), n)) return Error{"reassembling " + flat.string() + ": truncated"};
      dst.write(buffer.data(), n);
      left -= n;
    }
  }
  dst.flush();
  if (!dst) return Error{"reassembling into " + out.string() + ": write failed"};
  return {};
}

// QEMU 7.2 reads the guest's NUMBER(phys_base) as hexadecimal; the kernel
// writes it in decimal (VMCOREINFO_NUMBER). The kdump sub-header's phys_base
// (what makedumpfile and crash translate kernel addresses with) is then
// wrong whenever the kernel was relocated. The dump's own VMCOREINFO (in the
// file, located by the sub-header) says the right value: written back when
// it differs. Layout (makedumpfile's diskdump_mod.h): disk_dump_header
// {char signature[8] "KDUMP   "; int header_version; new_utsname (390);
// timeval; int status; int block_size @428 ...}, kdump_sub_header at
// block_size {u64 phys_base; int dump_level; int split; u64 start_pfn,
// end_pfn; u64 offset_vmcoreinfo @32; u64 size_vmcoreinfo @40 ...}.
// A dump whose sub-header names no VMCOREINFO (QEMU had no note from the
// guest: no vmcoreinfo device, or the guest never handed it over) gets
// |vmcoreinfo| (what the kernel log step read from guest memory) appended,
// and the sub-header pointing at it.
bool AddVmcoreinfo(std::fstream& f, uint32_t block_size, const std::string& vmcoreinfo) {
  f.clear();
  f.seekp(0, std::ios::end);
  const uint64_t offset = static_cast<uint64_t>(f.tellp()), size = vmcoreinfo.size();
  f.write(vmcoreinfo.data(), static_cast<std::streamsize>(size));
  f.seekp(block_size + 32);
  f.write(reinterpret_cast<const char*>(&offset), 8);
  f.write(reinterpret_cast<const char*>(&size), 8);
  f.flush();
  return static_cast<bool>(f);
}

std::optional<uint64_t> FixPhysBase(const fs::path& file, const std::string& read_vmcoreinfo,
                                    nlohmann::json& info) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  char head[432] = {};
  if (!f.read(head, sizeof head) || std::memcmp(head, "KDUMP   ", 8) != 0) {
    info["phys_base_unchecked"] = "no kdump header";
    return std::nullopt;
  }
  uint32_t block_size = 0;
  std::memcpy(&block_size, head + 428, 4);
  if (block_size < 512 || block_size > (1u << 20)) {
    info["phys_base_unchecked"] = "block size " + std::to_string(block_size);
    return std::nullopt;
  }
  char sub[48] = {};
  f.seekg(block_size);
  if (!f.read(sub, sizeof sub)) {
    info["phys_base_unchecked"] = "no kdump sub-header";
    return std::nullopt;
  }
  uint64_t phys_base = 0, offset = 0, size = 0;
  std::memcpy(&phys_base, sub, 8);
  std::memcpy(&offset, sub + 32, 8);
  std::memcpy(&size, sub + 40, 8);
  if (size == 0 && !read_vmcoreinfo.empty() && read_vmcoreinfo.size() <= kMaxVmcoreinfoBytes &&
      AddVmcoreinfo(f, block_size, read_vmcoreinfo)) {
    info["vmcoreinfo_added"] = true;
    offset = 0;
    f.seekg(block_size + 32);
    if (!f.read(reinterpret_cast<char*>(&offset), 8)) return std::nullopt;
    size = read_vmcoreinfo.size();
  }
  if (size == 0 || size > kMaxVmcoreinfoBytes) {
    info["phys_base_unchecked"] = "no VMCOREINFO in the dump (" + std::to_string(size) + " bytes)";
    return std::nullopt;
  }
  std::string text(size, '\0');
  f.seekg(static_cast<std::streamoff>(offset));
  if (!f.read(text.data(), static_cast<std::streamsize>(size))) return std::nullopt;
  const Vmcoreinfo vmcoreinfo = Vmcoreinfo::Parse(text);
  const auto number = vmcoreinfo.Value("NUMBER(phys_base)");
  if (!number) {
    info["phys_base_unchecked"] = "VMCOREINFO without NUMBER(phys_base)";
    return std::nullopt;
  }
  // Signed: the kernel prints phys_base with %ld, and a kernel loaded below
  // its link-time physical address has a negative one (Debian's 7.3 under
  // KASLR: -140509184); the sub-header holds it as the u64 it wraps to.
  const std::optional<int64_t> signed_want = vmcoreinfo.Number("phys_base");
  if (!signed_want) {
    info["phys_base_unchecked"] = "NUMBER(phys_base)=" + std::string(*number) + " is no number";
    return std::nullopt;
  }
  const uint64_t want = static_cast<uint64_t>(*signed_want);
  info["vmcoreinfo"] = true;
  if (want == phys_base) return phys_base;
  f.seekp(block_size);
  f.write(reinterpret_cast<const char*>(&want), 8);
  f.flush();
  info["phys_base_fixed"] = {{"qemu", phys_base}, {"kernel", want}};
  return want;
}

// |from| reassembled into the capture as |name| (see above).
Status ReassembleInto(const fs::path& from, const fs::path& dir, const std::string& name) {
  const fs::path tmp = dir / (name + ".tmp.0");
  Status s = Reassemble(from, tmp);
  std::error_code ec;
  fs::remove(from, ec);
  if (!s.ok()) {
    fs::remove(tmp, ec);
    return s;
  }
  fs::rename(tmp, dir / name, ec);
  if (ec) return Error{"renaming " + tmp.string() + ": " + ec.message()};
  return {};
}

}  // namespace

void VmcoreStep(const CaptureInputs& in, PendingCapture& pending, CaptureManifest& manifest) {
  nlohmann::json& info = manifest.extra["vmcore"];
  info = nlohmann::json::object();
  if (!in.dump_guest_memory) {
    info["error"] = "vmcore = on-panic, but this VM's backend cannot dump guest memory";
    return;
  }
  const HostTime start = HostTime::Now();
  Result<fs::path> dumped = in.dump_guest_memory(pending.dir());
  const double dump_ms = MsSince(start);
  info["dump_ms"] = dump_ms;
  if (!dumped.ok()) {
    info["error"] = dumped.error().message;
    return;
  }
  const HostTime moving = HostTime::Now();
  const bool flattened = IsFlattened(*dumped);
  info["reassembled"] = flattened;
  if (Status s = flattened ? ReassembleInto(*dumped, pending.dir(), kVmcoreFileName)
                           : MoveInto(*dumped, pending.dir(), kVmcoreFileName);
      !s.ok()) {
    info["error"] = s.error().message;
    return;
  }
  // The kernel log step's copy of VMCOREINFO (kernel_log_step.h), if any.
  std::string read_vmcoreinfo;
  if (std::ifstream v(pending.dir() / "vmcoreinfo.txt", std::ios::binary); v) {
    read_vmcoreinfo.assign(std::istreambuf_iterator<char>(v), {});
  }
  FixPhysBase(pending.dir() / kVmcoreFileName, read_vmcoreinfo, info);
  std::error_code ec;
  info["file"] = kVmcoreFileName;
  info["format"] = "kdump-zlib";
  info["bytes"] = fs::file_size(pending.dir() / kVmcoreFileName, ec);
  info["move_ms"] = MsSince(moving);
  manifest.extra["timing_ms"]["vmcore"] = MsSince(start);
}

}  // namespace hvtrace::hostd
