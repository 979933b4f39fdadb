#include "libvirt_attach.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "domain_xml.h"
#include "host_time.h"
#include "libvirt_event_loop.h"

namespace hvtrace::hostd {
namespace {

std::string Comm(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

// The domain, its live XML parsed, and the checks every attach/detach needs.
struct DomainContext {
  LibvirtDomainPtr domain;
  DomainXmlInfo info;
};

Result<DomainContext> LoadDomain(const std::shared_ptr<LibvirtClient>& client,
                                 const std::string& name_or_uuid) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(name_or_uuid);
  if (!dom.ok()) return dom.error();
  Result<std::string> xml = LibvirtDomainXml(dom->get());
  if (!xml.ok()) return xml.error();
  Result<DomainXmlInfo> info = ParseDomainXml(*xml);
  if (!info.ok()) return Error{"libvirt: domain '" + name_or_uuid + "': " + info.error().message};
  return DomainContext{std::move(*dom), std::move(*info)};
}

}  // namespace

std::string ShmemAlias(const std::string& shm_name) {
  std::string alias = "ua-hvtrace-";
  for (char c : shm_name) alias += c == '.' ? '_' : c;  // Aliases take no '.'.
  return alias;
}

std::optional<std::string> FindMapper(const std::filesystem::path& path) {
  std::error_code ec;
  const std::string target = path.string();
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream maps(entry.path() / "maps");
    std::string line;
    while (std::getline(maps, line)) {
      // "addr perms offset dev inode   path" — the path is the last field and
      // may carry " (deleted)".
      size_t at = line.find(target);
      if (at == std::string::npos || at == 0 || line[at - 1] != ' ') continue;
      std::string rest = line.substr(at + target.size());
      if (rest.empty() || rest == " (deleted)") return "pid " + pid + " (" + Comm(pid) + ")";
    }
  }
  return std::nullopt;
}

Result<ShmemAttachment> AttachShmem(const std::shared_ptr<LibvirtClient>& client,
                                    const ShmemAttachRequest& req) {
  const std::string what = "attach shmem '" + req.shm_name + "' to domain '" + req.domain + "'";
  if (LibvirtEventLoop::OnLoopThread()) {
    return Error{what + ": called on the libvirt event loop's thread (it waits for DEVICE_ADDED)"};
  }
  const std::string alias = ShmemAlias(req.shm_name);
  Result<std::string> device_xml = ShmemDeviceXml(req.shm_name, req.size_bytes, alias);
  if (!device_xml.ok()) return Error{what + ": " + device_xml.error().message};

  Result<DomainContext> ctx = LoadDomain(client, req.domain);
  if (!ctx.ok()) return Error{what + ": " + ctx.error().message};
  const DomainXmlInfo& info = ctx->info;
  if (!info.hotplug_ok) {
    return Error{what + ": domain has no hot-pluggable PCI bus: " + info.hotplug_reason};
  }
  int active = virDomainIsActive(ctx->domain.get());
  if (active != 1) {
    return Error{what + ": the domain is not running" +
                 (active < 0 ? " (" + LibvirtLastError() + ")" : std::string())};
  }
  for (const DomainShmem& s : info.shmems) {
    if (s.name == req.shm_name) {
      return Error{what + ": the domain already has a shmem device with this name (alias '" +
                   s.alias + "'); detach it first"};
    }
  }

  ShmemAttachment out;
  out.domain_name = info.name;
  out.domain_uuid = info.uuid;
  out.shm_name = req.shm_name;
  out.alias = alias;
  out.path = req.shm_dir / req.shm_name;

  // A file already there: another VM's live region, or a leftover.
  struct stat st {};
  if (req.prepared_file) {
    if (lstat(out.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) != req.size_bytes) {
      return Error{what + ": the prepared region " + out.path.string() + " is missing, not a " +
                   "regular file or not " + std::to_string(req.size_bytes) + " bytes"};
    }
  } else if (lstat(out.path.c_str(), &st) == 0) {
    if (std::optional<std::string> user = FindMapper(out.path)) {
      return Error{what + ": " + out.path.string() + " is in use by " + *user +
                   "; pick another name"};
    }
    std::string desc = out.path.string() + " (" + std::to_string(st.st_size) +
                       " bytes, owner uid " + std::to_string(st.st_uid) + ")";
    if (!S_ISREG(st.st_mode)) {
      return Error{what + ": " + desc + " is not a regular file; refusing to touch it"};
    }
    if (!req.replace_stale) {
      return Error{
          what + ": stale " + desc +
          " left by an earlier run (libvirt never deletes shmem files; a file owned by "
          "another user can also stop QEMU from starting): remove it or ask to replace it"};
    }
    if (unlink(out.path.c_str()) != 0) {
      return Error{what + ": cannot remove stale " + desc + ": " + std::strerror(errno)};
    }
    out.stale_note = "removed stale " + desc;
  }

  LibvirtEventWaiter waiter(client, info.uuid);
  auto t0 = std::chrono::steady_clock::now();
  if (virDomainAttachDeviceFlags(ctx->domain.get(), device_xml->c_str(), VIR_DOMAIN_AFFECT_LIVE) !=
      0) {
    return Error{what + ": libvirt refused the device: " + LibvirtLastError()};
  }
  Result<LibvirtDomainEvent> added = waiter.Wait(
      [&](const LibvirtDomainEvent& e) {
        return e.kind == LibvirtDomainEvent::Kind::kDeviceAdded && e.device_alias == alias;
      },
      req.timeout, "DEVICE_ADDED for '" + alias + "'");
  if (!added.ok()) return Error{what + ": " + added.error().message};
  out.attach_ms = MsBetween(t0, added->received);

  if (stat(out.path.c_str(), &st) != 0) {
    return Error{what + ": DEVICE_ADDED arrived but " + out.path.string() +
                 " is missing (does QEMU see another /dev/shm, e.g. a private mount namespace?): " +
                 std::strerror(errno)};
  }
  if (static_cast<uint64_t>(st.st_size) != req.size_bytes) {
    return Error{what + ": " + out.path.string() + " has " + std::to_string(st.st_size) +
                 " bytes, expected " + std::to_string(req.size_bytes)};
  }
  out.size_bytes = req.size_bytes;
  out.owner_uid = st.st_uid;
  out.owner_gid = st.st_gid;
  if (access(out.path.c_str(), R_OK | W_OK) != 0) {
    return Error{what + ": " + out.path.string() + " is owned by uid " + std::to_string(st.st_uid) +
                 " gid " + std::to_string(st.st_gid) + " mode " +
                 std::to_string(st.st_mode & 0777) + " (octal " +
                 [&] {
                   char b[8];
                   std::snprintf(b, sizeof b, "%o", st.st_mode & 0777);
                   return std::string(b);
                 }() +
                 ") and hvtrace (uid " + std::to_string(geteuid()) +
                 ") cannot read and write it; run hvtraced as root or in QEMU's group"};
  }
  return out;
}

Status DetachShmem(const std::shared_ptr<LibvirtClient>& client, const std::string& domain,
                   const std::string& shm_name, std::chrono::milliseconds timeout) {
  const std::string what = "detach shmem '" + shm_name + "' from domain '" + domain + "'";
  if (LibvirtEventLoop::OnLoopThread()) {
    return Error{what +
                 ": called on the libvirt event loop's thread (it waits for DEVICE_REMOVED)"};
  }
  Result<DomainContext> ctx = LoadDomain(client, domain);
  if (!ctx.ok()) return Error{what + ": " + ctx.error().message};
  const std::string alias = ShmemAlias(shm_name);
  bool present = false;
  for (const DomainShmem& s : ctx->info.shmems) present |= s.alias == alias;
  if (!present) return Error{what + ": the domain has no device with alias '" + alias + "'"};

  LibvirtEventWaiter waiter(client, ctx->info.uuid);
  if (virDomainDetachDeviceAlias(ctx->domain.get(), alias.c_str(), VIR_DOMAIN_AFFECT_LIVE) != 0) {
    return Error{what + ": libvirt refused: " + LibvirtLastError()};
  }
  Result<LibvirtDomainEvent> removed = waiter.Wait(
      [&](const LibvirtDomainEvent& e) {
        return e.kind == LibvirtDomainEvent::Kind::kDeviceRemoved && e.device_alias == alias;
      },
      timeout, "DEVICE_REMOVED for '" + alias + "'");
  if (!removed.ok()) {
    return Error{what +
                 ": the guest did not release the device (no PCI hotplug driver, or it "
                 "is still in use); libvirt's own success is not proof: " +
                 removed.error().message};
  }
  return {};
}

}  // namespace hvtrace::hostd
