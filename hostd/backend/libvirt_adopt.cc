// Finding a libvirt domain's regions and making its backend: the boot range
// from the domain's NUMA cell and QEMU's command line (never <cmdline>: a
// disk-booted guest sets its parameters in its own boot loader), hvtrace's
// <shmem> device.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "boot_request.h"
#include "hvtrace/boot_map.h"
#include "libvirt_backend.h"
#include "region_file_open.h"

namespace hvtrace::hostd {

using json = nlohmann::json;

LibvirtRegionSpec BootRangeSpec(const DomainBootCell& cell) {
  LibvirtRegionSpec spec;
  spec.kind = "boot-range";
  spec.offset = cell.layout.file_offset;
  spec.size = cell.layout.range_bytes;
  spec.gpa = cell.layout.range_gpa;
  return spec;
}

Result<LibvirtRegionSpec> LocateBootRangeFile(const std::string& domain, LibvirtRegionSpec range,
                                              const Result<DomainQemu>& qemu) {
  const std::string ctx = "domain '" + domain + "' boot range: ";
  // libvirt names the node-1 file itself (memory_backing_dir/…/<id>-<name>/
  // ram-node1); the command line of the QEMU libvirt recorded says where.
  if (!qemu.ok()) {
    return Error{ctx + "no running QEMU for it (is the domain running on this host?): " +
                 qemu.error().message};
  }
  const std::string pid = std::to_string(qemu->pid);
  const std::vector<std::string>& args = qemu->args;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != "-object" || args[i + 1].empty() || args[i + 1][0] != '{') continue;
    json obj = json::parse(args[i + 1], nullptr, false);
    if (!obj.is_object() || obj.value("id", "") != "ram-node1" ||
        obj.value("qom-type", "") != "memory-backend-file") {
      continue;
    }
    range.path = obj.value("mem-path", "");
    const uint64_t node1 = obj.value("size", uint64_t{0});
    range.owner_uid = qemu->uid;
    range.qemu_pid = qemu->pid;
    if (range.path.empty() || range.offset + range.size > node1 || !obj.value("share", false)) {
      return Error{ctx + "QEMU pid " + pid + "'s ram-node1 (" + range.path.string() + ", " +
                   std::to_string(node1) + " bytes, share=" +
                   (obj.value("share", false) ? "on" : "off") + ") cannot hold the range"};
    }
    return range;
  }
  return Error{ctx + "QEMU pid " + pid + " has no file-backed ram-node1"};
}

Result<LibvirtRegionSpec> FindBootRangeRegion(const DomainXmlInfo& info,
                                              const Result<DomainQemu>& qemu) {
  Result<DomainBootCell> cell = FindDomainBootCell(info, "boot_map", "");
  if (!cell.ok()) return cell.error();
  return LocateBootRangeFile(info.name, BootRangeSpec(*cell), qemu);
}

json ProbeGuestBootMeta(int fd, const LibvirtRegionSpec& region) {
  // Bounded: the probe copies the whole range (the reader needs it).
  constexpr uint64_t kMaxProbeBytes = 256ull << 20;
  if (region.size < 4096 || region.size > kMaxProbeBytes) {
    return {{"state", "unreadable"},
            {"message", "range of " + std::to_string(region.size) +
                            " bytes is outside what the adopt-time probe reads (4 KiB..256 MiB)"}};
  }
  // Copied, then checked: the guest may write while we look.
  std::vector<std::byte> copy(region.size);
  size_t got = 0;
  while (got < copy.size()) {
    const ssize_t n =
        pread(fd, copy.data() + got, copy.size() - got, static_cast<off_t>(region.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return {{"state", "unreadable"},
              {"message", "reading " + region.path.string() + " at " +
                              std::to_string(region.offset + got) + ": " +
                              (n < 0 ? std::strerror(errno) : "end of file")}};
    }
    got += static_cast<size_t>(n);
  }
  Result<BootMap> map = ReadBootMap(copy, BootMapOptions{});
  if (!map.ok()) {
    // The magic at the start, but no layout fits: the guest's range is not
    // the cell's (or it is another kernel's). Else zeroes (a fresh file) or
    // whatever the guest kept there: nothing of its buffer yet.
    uint32_t magic = 0;
    std::memcpy(&magic, copy.data(), sizeof magic);
    if (magic == kBootMapMagic) {
      return {{"state", "mismatch"},
              {"message", "a meta is at the start of the range but does not fit a range of " +
                              std::to_string(region.size) + " bytes (is the guest's " +
                              "trace_instance= size the cell's?): " + map.error().message}};
    }
    return {{"state", "absent"}, {"message", map.error().message}};
  }
  size_t metas = 0, valid = 0;
  for (const BootMapCpu& cpu : map->cpu) {
    metas += cpu.meta_found;
    valid += cpu.meta_valid;
  }
  json j = {{"layout", map->layout},
            {"cpus", map->cpus},
            {"metas_found", metas},
            {"metas_valid", valid},
            {"events", map->total_records()}};
  // The CPU count is derived from metas whose nr_subbufs fits this range
  // size; when none does, the guest sized its range differently.
  for (const BootMapIssue& issue : map->issues) {
    if (issue.check == BootMapCheck::kNrSubbufs && !j.contains("first_issue")) {
      j["first_issue"] = issue.message;
    }
  }
  // A range larger than the guest's decodes from meta 0 (boot_map.h), but it
  // is not the guest's trace_instance= size either.
  const bool fits = valid > 0 && map->geometry_from != "meta";
  j["state"] = fits ? "present" : "mismatch";
  j["message"] = fits ? "the guest's persistent ring buffer meta is in the range"
                      : "metas are in the range but none is valid for a range of " +
                            std::to_string(region.size) +
                            " bytes: is the guest's trace_instance= size the cell's?";
  return j;
}

LibvirtRegionSpec ShmemRegion(const std::filesystem::path& path, uint64_t size) {
  LibvirtRegionSpec spec;
  spec.kind = "shmem";
  spec.path = path;
  spec.size = size;
  return spec;
}

json BootRangeFacts(const DomainBootCell& cell, const LibvirtRegionSpec& region, int fd,
                    bool running) {
  char gpa[32];
  std::snprintf(gpa, sizeof gpa, "0x%llx", static_cast<unsigned long long>(region.gpa));
  json facts = {{"gpa", gpa},
                {"size", region.size},
                {"source", "numa-cell"},
                {"kernel_params", cell.kernel_params}};
  if (!cell.cmdline_note.empty()) facts["cmdline_note"] = cell.cmdline_note;
  json meta;
  if (!running) {
    meta = {{"state", "not-running"},
            {"message", "the domain is not running; its range file is opened when it starts"}};
  } else if (fd < 0) {
    meta = {{"state", "unreadable"}, {"message", "the range file is not open"}};
  } else {
    meta = ProbeGuestBootMeta(fd, region);
  }
  const std::string state = meta.value("state", "");
  if (state != "present") {
    facts["note"] = "cell present, guest has not written a persistent-buffer meta yet (" + state +
                    ") — captures will contain it once the guest boots with " + cell.kernel_params;
  }
  facts["guest_meta"] = std::move(meta);
  return facts;
}

Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtBackendOptions options,
    bool allow_no_region) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  const bool running = virDomainIsActive(dom->get()) == 1;
  Result<std::string> xml = LibvirtDomainXml(dom->get());
  if (!xml.ok()) return xml.error();
  Result<DomainXmlInfo> info = ParseDomainXml(*xml);
  if (!info.ok()) return Error{"libvirt: domain '" + domain + "': " + info.error().message};
  // The boot range from the NUMA cell alone; the guest's own kernel command
  // line (its boot loader) is invisible here and not needed.
  Result<DomainBootCell> cell = FindDomainBootCell(*info, "boot_map", kDefaultBootEvents);
  if (!running) {
    if (!cell.ok()) {
      return Error{"libvirt: domain '" + domain +
                   "' is not running; start it first (only a domain with a boot-range NUMA "
                   "cell is adopted before it starts: " +
                   cell.error().message + ")"};
    }
    Result<std::unique_ptr<LibvirtDomainBackend>> backend = LibvirtDomainBackend::Create(
        std::move(client), domain, BootRangeSpec(*cell), std::move(options));
    if (backend.ok()) (*backend)->SetBootRangeCell(*cell, /*running=*/false);
    return backend;
  }
  const Result<DomainQemu> qemu = FindDomainQemu(client->uri(), info->name);
  // hvtrace's shmem device: with a region header it is an attach-mode region.
  std::optional<LibvirtRegionSpec> raw_shmem;
  std::shared_ptr<LiveRegion> live;
  std::string live_shm;
  for (const DomainShmem& s : info->shmems) {
    if (s.alias.rfind("ua-hvtrace-", 0) != 0 || s.model != "ivshmem-plain" || s.size_bytes == 0 ||
        !ValidateShmName(s.name).ok()) {
      continue;
    }
    const std::filesystem::path path = "/dev/shm/" + s.name;
    if (Result<std::shared_ptr<LiveRegion>> region = LiveRegion::OpenExisting(path); region.ok()) {
      live = *region;
      live_shm = s.name;
    } else {
      raw_shmem = ShmemRegion(path, s.size_bytes);
      if (qemu.ok()) raw_shmem->owner_uid = qemu->uid;
    }
    break;
  }
  Result<LibvirtRegionSpec> boot = cell.ok()
                                       ? LocateBootRangeFile(info->name, BootRangeSpec(*cell), qemu)
                                       : Result<LibvirtRegionSpec>(cell.error());
  LibvirtRegionSpec region;
  if (boot.ok()) {
    region = std::move(*boot);
  } else if (raw_shmem) {
    region = std::move(*raw_shmem);
  } else if (live || allow_no_region) {
    region.kind = "none";
  } else {
    return Error{"libvirt: domain '" + domain + "' has no hvtrace shmem device (`hvtrace attach " +
                 domain + "`) and no boot range: " + boot.error().message};
  }
  Result<std::unique_ptr<LibvirtDomainBackend>> backend = LibvirtDomainBackend::Create(
      std::move(client), domain, std::move(region), std::move(options));
  if (!backend.ok()) return backend;
  if (live) (*backend)->AdoptAttachedRegion(std::move(live), live_shm);
  if (boot.ok()) (*backend)->SetBootRangeCell(*cell, /*running=*/true);
  return backend;
}

Result<int> OpenRegionFile(const std::string& domain, const LibvirtRegionSpec& region) {
  return OpenRegionFileChecked({.owner_label = "domain '" + domain + "'",
                                .path = region.path,
                                .offset = region.offset,
                                .size = region.size,
                                .owner_uid = region.owner_uid,
                                .mapped_by = region.qemu_pid});
}

Result<std::unique_ptr<LibvirtDomainBackend>> LibvirtDomainBackend::Create(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtRegionSpec region,
    LibvirtBackendOptions options) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  char uuid[VIR_UUID_STRING_BUFLEN] = {};
  virDomainGetUUIDString(dom->get(), uuid);
  const char* name = virDomainGetName(dom->get());
  LibvirtDomainFacts facts;
  if (Result<std::string> xml = LibvirtDomainXml(dom->get()); xml.ok()) {
    if (Result<DomainXmlInfo> info = ParseDomainXml(*xml); info.ok()) {
      facts = {info->on_crash,          info->kernel,       info->initrd,
               info->meta_channel_path, info->meta_channel, !info->qemu_trace_events.empty()};
    }
  }
  int fd = -1;
  // A boot range without a path: the domain is not running yet; its file is
  // opened when it starts (OpenBootRangeOfThisRun).
  if (region.kind != "none" && !region.path.empty()) {
    Result<int> opened = OpenRegionFile(domain, region);
    if (!opened.ok()) return opened.error();
    fd = *opened;
  }
  return std::make_unique<LibvirtDomainBackend>(
      OpenLibvirtDomain(std::move(client), name ? name : domain, uuid), std::move(region), fd,
      std::move(facts), std::move(options));
}

}  // namespace hvtrace::hostd
