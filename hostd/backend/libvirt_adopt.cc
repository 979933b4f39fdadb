// Finding a libvirt domain's regions and making its backend: the boot range
// from the live XML and QEMU's command line, hvtrace's <shmem> device.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "libvirt_backend.h"

namespace hvtrace::hostd {

using json = nlohmann::json;

Result<LibvirtRegionSpec> FindBootRangeRegion(const DomainXmlInfo& info,
                                              const Result<DomainQemu>& qemu) {
  const std::string ctx = "domain '" + info.name + "' boot range: ";
  // memmap=SIZE$ADDR, as `hvtrace domain-xml` wrote it into <cmdline>.
  std::optional<uint64_t> size, gpa;
  std::istringstream words(info.cmdline);
  std::string word;
  while (words >> word) {
    if (word.rfind("memmap=", 0) != 0) continue;
    size_t dollar = word.find('$');
    if (dollar == std::string::npos) continue;
    Result<uint64_t> s = ParseKernelSize(word.substr(7, dollar - 7));
    Result<uint64_t> a = ParseKernelSize(word.substr(dollar + 1));
    if (!s.ok() || !a.ok()) return Error{ctx + "cannot parse '" + word + "'"};
    size = *s;
    gpa = *a;
  }
  if (!size)
    return Error{ctx +
                 "no memmap=SIZE$ADDR in the kernel command line (not made by "
                 "`hvtrace domain-xml`?)"};
  if (info.numa_cells.size() != 2 || info.numa_cells[1].mem_access != "shared") {
    return Error{ctx + "expected two NUMA cells, cell 1 with memAccess='shared'"};
  }
  const uint64_t node0 = info.numa_cells[0].memory_bytes;
  if (*gpa < node0) return Error{ctx + "the range is not in NUMA node 1"};

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
    LibvirtRegionSpec spec;
    spec.kind = "boot-range";
    spec.path = obj.value("mem-path", "");
    const uint64_t node1 = obj.value("size", uint64_t{0});
    spec.offset = *gpa - node0;
    spec.size = *size;
    spec.owner_uid = qemu->uid;
    spec.qemu_pid = qemu->pid;
    if (spec.path.empty() || spec.offset + spec.size > node1 || !obj.value("share", false)) {
      return Error{ctx + "QEMU pid " + pid + "'s ram-node1 (" + spec.path.string() + ", " +
                   std::to_string(node1) + " bytes, share=" +
                   (obj.value("share", false) ? "on" : "off") + ") cannot hold the range"};
    }
    return spec;
  }
  return Error{ctx + "QEMU pid " + pid + " has no file-backed ram-node1"};
}

LibvirtRegionSpec ShmemRegion(const std::filesystem::path& path, uint64_t size) {
  LibvirtRegionSpec spec;
  spec.kind = "shmem";
  spec.path = path;
  spec.size = size;
  return spec;
}

Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtBackendOptions options,
    bool allow_no_region) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  if (virDomainIsActive(dom->get()) != 1) {
    return Error{"libvirt: domain '" + domain + "' is not running; start it first"};
  }
  Result<std::string> xml = LibvirtDomainXml(dom->get());
  if (!xml.ok()) return xml.error();
  Result<DomainXmlInfo> info = ParseDomainXml(*xml);
  if (!info.ok()) return Error{"libvirt: domain '" + domain + "': " + info.error().message};
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
  Result<LibvirtRegionSpec> boot = FindBootRangeRegion(*info, qemu);
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
  if (backend.ok() && live) (*backend)->AdoptAttachedRegion(std::move(live), live_shm);
  return backend;
}

namespace {

// Whether |pid| maps the file |st| (device and inode) — /proc/PID/maps lines
// are "start-end perms offset MAJ:MIN inode path".
bool QemuMaps(pid_t pid, const struct stat& st) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev;
    unsigned long long inode = 0;
    if (!(fields >> range >> perms >> offset >> dev >> inode) || inode != st.st_ino) continue;
    unsigned major_id = 0, minor_id = 0;
    if (std::sscanf(dev.c_str(), "%x:%x", &major_id, &minor_id) == 2 &&
        major_id == major(st.st_dev) && minor_id == minor(st.st_dev)) {
      return true;
    }
  }
  return false;
}

}  // namespace

Result<int> OpenRegionFile(const std::string& domain, const LibvirtRegionSpec& region) {
  const std::string where = "domain '" + domain + "': region " + region.path.string();
  if (region.size == 0) return Error{"domain '" + domain + "': region size is 0"};
  // O_NONBLOCK: a FIFO would otherwise block this worker until someone writes.
  const int fd = open(region.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Error{where + ": cannot open: " + std::strerror(errno)};
  auto fail = [fd](std::string message) -> Error {
    close(fd);
    return Error{std::move(message)};
  };
  struct stat st {};
  if (fstat(fd, &st) != 0) return fail(where + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(where + " is not a regular file; refusing to read it");
  if (region.owner_uid && st.st_uid != *region.owner_uid && st.st_uid != 0) {
    return fail(where + " belongs to uid " + std::to_string(st.st_uid) + ", not to QEMU's user (" +
                std::to_string(*region.owner_uid) + ") or root");
  }
  if (static_cast<uint64_t>(st.st_size) < region.offset + region.size) {
    return fail(where + " has " + std::to_string(st.st_size) + " bytes, less than offset " +
                std::to_string(region.offset) + " + size " + std::to_string(region.size));
  }
  if (region.qemu_pid > 0 && !QemuMaps(region.qemu_pid, st)) {
    return fail(where + " is not the file QEMU pid " + std::to_string(region.qemu_pid) +
                " maps (was it replaced?)");
  }
  return fd;
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
      facts = {info->on_crash, info->kernel, info->initrd};
    }
  }
  int fd = -1;
  if (region.kind != "none") {
    Result<int> opened = OpenRegionFile(domain, region);
    if (!opened.ok()) return opened.error();
    fd = *opened;
  }
  return std::make_unique<LibvirtDomainBackend>(
      OpenLibvirtDomain(std::move(client), name ? name : domain, uuid), std::move(region), fd,
      std::move(facts), std::move(options));
}

}  // namespace hvtrace::hostd
