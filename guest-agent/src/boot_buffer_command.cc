// `hvtrace-agent boot-buffer ...`: finds node 1, computes the parameters and
// edits the guest's boot loader (boot_buffer.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <fstream>

#include "boot_buffer.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxSratBytes = 1u << 20;
constexpr size_t kMaxConfigBytes = 1u << 20;
constexpr uint32_t kSharedNode = 1;

Status WriteReplacing(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".hvtrace-tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    o << text;
    o.flush();
    if (!o) return Error{"cannot write " + tmp.string() + ": " + std::strerror(errno)};
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) ::chmod(tmp.c_str(), st.st_mode & 07777);
  if (int fd = ::open(tmp.c_str(), O_RDONLY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Error{"cannot replace " + path.string() + ": " + std::strerror(errno)};
  }
  return {};
}

struct Loader {
  bool grub = false;
  fs::path config;  // syslinux/extlinux config, or GRUB's drop-in.
};

Result<Loader> FindLoader(const BootBufferPaths& paths) {
  for (const char* rel : {"boot/syslinux/syslinux.cfg", "boot/extlinux/extlinux.conf"}) {
    if (fs::exists(paths.root / rel)) return Loader{false, paths.root / rel};
  }
  if (fs::exists(paths.root / "etc/default/grub")) {
    return Loader{true, paths.root / "etc/default/grub.d/hvtrace.cfg"};
  }
  return Error{"no boot loader configuration found (" + (paths.root / "boot/syslinux").string() +
               "/syslinux.cfg, boot/extlinux/extlinux.conf, etc/default/grub)"};
}

// Node 1 from the SRAT when it is readable, else from sysfs.
Result<NodeRange> SharedNode(const BootBufferPaths& paths, std::string* note) {
  const fs::path srat = paths.sys / "firmware/acpi/tables/SRAT";
  Result<std::string> table = ReadSmallFile(srat, kMaxSratBytes);
  if (table.ok()) {
    Result<NodeRange> r = NodeRangeFromSrat(
        std::as_bytes(std::span<const char>(table->data(), table->size())), kSharedNode);
    if (r.ok()) return r;
    *note = srat.string() + ": " + r.error().message + "; ";
  } else {
    *note = table.error().message + "; ";
  }
  Result<NodeRange> r = NodeRangeFromSysfs(paths.sys, kSharedNode);
  if (!r.ok()) {
    return Error{
        "no NUMA node 1 (has the domain been set up with `hvtrace setup` and cold "
        "booted since?): " +
        *note + r.error().message};
  }
  return r;
}

Status RunUpdateGrub(const std::string& command, std::FILE* out) {
  if (command.empty()) return {};
  std::fprintf(out, "running %s\n", command.c_str());
  std::fflush(out);
  const pid_t pid = ::fork();
  if (pid < 0) return Error{std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    ::execlp(command.c_str(), command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error{command + " failed (status " + std::to_string(status) +
                 "): the GRUB drop-in is changed but grub.cfg is not; run " + command +
                 " again once it works"};
  }
  return {};
}

int Enable(const BootBufferOptions& o, std::FILE* out, std::FILE* err) {
  std::string note;
  Result<NodeRange> node = SharedNode(o.paths, &note);
  if (!node.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", node.error().message.c_str());
    return 1;
  }
  Result<BootBufferParams> p = BootBufferKernelParams(*node, kBootBufferInstance, o.events);
  if (!p.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", p.error().message.c_str());
    return 1;
  }
  // Printed before the boot loader is looked for: a user without one of
  // ours can still put them where their boot loader wants them.
  std::fprintf(out, "node 1: %llu bytes at 0x%llx (%s)\nkernel parameters: %s\n",
               static_cast<unsigned long long>(node->bytes),
               static_cast<unsigned long long>(node->start), node->source.c_str(),
               p->loader_params.c_str());
  Result<Loader> loader = FindLoader(o.paths);
  if (!loader.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", loader.error().message.c_str());
    return 1;
  }
  std::string text;
  if (loader->grub) {
    text = GrubDropIn(p->loader_params);
  } else {
    Result<std::string> config = ReadSmallFile(loader->config, kMaxConfigBytes);
    if (!config.ok()) {
      std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", config.error().message.c_str());
      return 1;
    }
    text = SyslinuxEnable(*config, p->loader_params);
  }
  if (o.dry_run) {
    std::fprintf(out, "dry run: would write %s:\n%s", loader->config.c_str(), text.c_str());
    return 0;
  }
  std::error_code ec;
  if (loader->grub) fs::create_directories(loader->config.parent_path(), ec);
  Status s = WriteReplacing(loader->config, text);
  if (s.ok() && loader->grub) s = RunUpdateGrub(o.paths.update_grub, out);
  if (!s.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", s.error().message.c_str());
    return 1;
  }
  std::fprintf(out, "wrote %s; the boot range is recorded from the next boot on\n",
               loader->config.c_str());
  return 0;
}

int Disable(const BootBufferOptions& o, std::FILE* out, std::FILE* err) {
  Result<Loader> loader = FindLoader(o.paths);
  if (!loader.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", loader.error().message.c_str());
    return 1;
  }
  if (loader->grub) {
    if (!fs::exists(loader->config)) {
      std::fprintf(out, "not enabled (%s does not exist)\n", loader->config.c_str());
      return 0;
    }
    if (o.dry_run) {
      std::fprintf(out, "dry run: would remove %s\n", loader->config.c_str());
      return 0;
    }
    std::error_code ec;
    fs::remove(loader->config, ec);
    Status s = ec ? Status(Error{"cannot remove " + loader->config.string() + ": " + ec.message()})
                  : RunUpdateGrub(o.paths.update_grub, out);
    if (!s.ok()) {
      std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", s.error().message.c_str());
      return 1;
    }
    std::fprintf(out, "removed %s\n", loader->config.c_str());
    return 0;
  }
  Result<std::string> config = ReadSmallFile(loader->config, kMaxConfigBytes);
  if (!config.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", config.error().message.c_str());
    return 1;
  }
  Result<std::string> clean = SyslinuxDisable(*config);
  if (!clean.ok()) {
    std::fprintf(out, "not enabled in %s (%s)\n", loader->config.c_str(),
                 clean.error().message.c_str());
    return 0;
  }
  if (o.dry_run) {
    std::fprintf(out, "dry run: would write %s:\n%s", loader->config.c_str(), clean->c_str());
    return 0;
  }
  if (Status s = WriteReplacing(loader->config, *clean); !s.ok()) {
    std::fprintf(err, "hvtrace-agent boot-buffer: %s\n", s.error().message.c_str());
    return 1;
  }
  std::fprintf(out, "removed the boot-buffer parameters from %s\n", loader->config.c_str());
  return 0;
}

int PrintStatus(const BootBufferOptions& o, std::FILE* out) {
  std::string note;
  Result<NodeRange> node = SharedNode(o.paths, &note);
  std::string params;
  if (node.ok()) {
    Result<BootBufferParams> p = BootBufferKernelParams(*node, kBootBufferInstance, o.events);
    if (p.ok()) params = p->kernel_params;
    std::fprintf(out, "node 1: %llu bytes at 0x%llx (%s)\n",
                 static_cast<unsigned long long>(node->bytes),
                 static_cast<unsigned long long>(node->start), node->source.c_str());
  } else {
    std::fprintf(out, "node 1: %s\n", node.error().message.c_str());
  }
  Result<Loader> loader = FindLoader(o.paths);
  bool configured = false;
  if (loader.ok()) {
    Result<std::string> config = ReadSmallFile(loader->config, kMaxConfigBytes);
    configured = config.ok() && (loader->grub || SyslinuxDisable(*config).ok());
    std::fprintf(out, "boot loader: %s (%s)\n", loader->config.c_str(),
                 configured ? "boot buffer enabled" : "boot buffer not enabled");
  } else {
    std::fprintf(out, "boot loader: %s\n", loader.error().message.c_str());
  }
  Result<std::string> cmdline = ReadSmallFile(o.paths.proc_cmdline, 64 * 1024);
  const std::string memmap = params.substr(0, params.find(' '));
  const bool in_cmdline =
      cmdline.ok() && !memmap.empty() && cmdline->find(memmap) != std::string::npos;
  const bool instance = fs::exists(o.paths.tracefs / "instances" / kBootBufferInstance);
  std::fprintf(out, "running kernel: %s on the command line; instance %s %s\n",
               in_cmdline ? "range" : "no range", kBootBufferInstance,
               instance ? "present" : "absent");
  return 0;
}

void Usage(std::FILE* f) {
  std::fprintf(f,
               "usage: hvtrace-agent boot-buffer enable [--dry-run] [--events LIST]\n"
               "       hvtrace-agent boot-buffer disable [--dry-run]\n"
               "       hvtrace-agent boot-buffer status\n"
               "Puts the host-backed boot range of NUMA node 1 (`hvtrace setup` on the host)\n"
               "on this guest's kernel command line, through its boot loader.\n");
}

}  // namespace

int RunBootBufferCommand(const std::vector<std::string>& args, const BootBufferPaths& paths,
                         std::FILE* out, std::FILE* err) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    Usage(args.empty() ? err : out);
    return args.empty() ? 2 : 0;
  }
  BootBufferOptions o;
  o.paths = paths;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--dry-run" && args[0] != "status") {
      o.dry_run = true;
    } else if (args[i] == "--events" && args[0] == "enable" && i + 1 < args.size()) {
      o.events = args[++i];
    } else {
      std::fprintf(err, "hvtrace-agent boot-buffer %s: unexpected '%s'\n", args[0].c_str(),
                   args[i].c_str());
      Usage(err);
      return 2;
    }
  }
  for (char c : o.events) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || std::strchr(":,_*^-", c) != nullptr)) {
      std::fprintf(err, "hvtrace-agent boot-buffer: events may only hold names, ':', ','\n");
      return 2;
    }
  }
  if (args[0] == "enable") return Enable(o, out, err);
  if (args[0] == "disable") return Disable(o, out, err);
  if (args[0] == "status") return PrintStatus(o, out);
  std::fprintf(err, "hvtrace-agent boot-buffer: unknown subcommand '%s'\n", args[0].c_str());
  Usage(err);
  return 2;
}

}  // namespace hvtrace::agent
