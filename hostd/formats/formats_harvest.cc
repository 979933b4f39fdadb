#include "formats_harvest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <system_error>
#include <thread>
#include <vector>

#include "formats_bundle.h"
#include "formats_cache.h"
#include "sha256.h"
#include "vm_config.h"
#include "vm_console.h"
#include "vm_process.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kPortName = "org.hvtrace.harvest";
constexpr const char* kGuestDir = "/tmp/hvtrace-harvest";
constexpr const char* kGuestTar = "/tmp/hvtrace-harvest.tar";

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The VM's scratch directory; removed with everything in it unless kept.
class WorkDir {
 public:
  static Result<WorkDir> Create() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/hvtrace-harvest-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Error{"cannot create a work directory from " + tmpl + ": " + std::strerror(errno)};
    }
    return WorkDir(tmpl);
  }
  WorkDir(WorkDir&& other) noexcept : path_(std::move(other.path_)), keep_(other.keep_) {
    other.path_.clear();
  }
  WorkDir& operator=(WorkDir&&) = delete;
  ~WorkDir() {
    if (path_.empty() || keep_) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  explicit WorkDir(fs::path path) : path_(std::move(path)) {}
  fs::path path_;
  bool keep_ = false;
};

// Reads at most |cap| bytes of |path|.
Result<std::vector<std::byte>> ReadPrefix(const fs::path& path, size_t want) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  std::vector<std::byte> data(want);
  size_t done = 0;
  while (done < want) {
    const ssize_t n = ::read(fd, data.data() + done, want - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Error{"reading " + path.string() + " at offset " + std::to_string(done) + ": " +
                   std::strerror(err)};
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

uint64_t FileSize(const fs::path& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The last line of |output| that is only digits, as a number.
bool LastNumberLine(const std::string& output, uint64_t* value) {
  static const std::regex kNumber("^\\s*([0-9]{1,12})\\s*$");
  bool found = false;
  size_t pos = 0;
  while (pos < output.size()) {
    size_t end = output.find('\n', pos);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(pos, end - pos);
    pos = end + 1;
    std::smatch m;
    if (std::regex_match(line, m, kNumber)) {
      *value = std::stoull(m[1].str());
      found = true;
    }
  }
  return found;
}

// The guest side of one harvest, on a booted guest.
class GuestSession {
 public:
  GuestSession(GuestConsole& console, const HarvestOptions& options)
      : console_(console), options_(options) {}

  // Runs |command|; fails unless it exits with status 0.
  Result<std::string> Must(const std::string& what, const std::string& command) {
    Result<GuestConsole::CommandResult> r = console_.Run(command, options_.command_timeout);
    if (!r.ok()) return Error{what + ": " + r.error().message};
    if (r->status != 0) {
      return Error{what + ": the guest command exited with status " + std::to_string(r->status) +
                   "; output:\n" + r->output.substr(0, 2000)};
    }
    return std::move(r->output);
  }

 private:
  GuestConsole& console_;
  const HarvestOptions& options_;
};

void Progress(const HarvestOptions& options, const std::string& line) {
  if (options.progress) options.progress(line);
}

// The guest's write returning means the data is queued in the virtqueue;
// QEMU writes it to the file from its main loop, so wait for all of it.
Status AwaitArchive(const fs::path& archive_path, uint64_t archive_bytes) {
  const Clock::time_point deadline = Clock::now() + 30s;
  while (FileSize(archive_path) < archive_bytes && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  const uint64_t received = FileSize(archive_path);
  if (received < archive_bytes) {
    return Error{"only " + std::to_string(received) + " of " + std::to_string(archive_bytes) +
                 " archive bytes arrived within 30 s"};
  }
  return {};
}

// Stores a checked harvest in the cache and reads the entry back.
Result<HarvestResult> StoreHarvest(FormatCache& cache, const std::string& key,
                                   const HarvestBundle& bundle, json manifest,
                                   Clock::time_point start) {
  Result<fs::path> stored = cache.Store(key, bundle, std::move(manifest));
  if (!stored.ok()) return stored.error();
  Result<std::optional<json>> written = cache.Lookup(key);
  if (!written.ok()) return written.error();
  if (!written->has_value()) return Error{"format cache entry " + stored->string() + " vanished"};
  HarvestResult result;
  result.key = key;
  result.entry_dir = *stored;
  result.manifest = std::move(**written);
  result.seconds = SecondsSince(start);
  return result;
}

// The throwaway VM a harvest boots: TCG, one vCPU, its console and QMP in
// |dir|, and a virtio-serial port whose host end is |archive_path|.
VmConfig HarvestVmConfig(const HarvestOptions& options, const fs::path& dir,
                         const fs::path& archive_path) {
  std::error_code ec;
  VmConfig config;
  config.name = "hvtrace-harvest";
  config.qemu_binary = options.qemu_binary;
  // TCG always: /dev/kvm on the machines this was built on opens but fails
  // early in the guest's boot (see qemu-scripts/README.md), and a harvest is
  // one short boot.
  config.accel = Accel::kTcg;
  config.vcpus = 1;  // Formats do not depend on the CPU count.
  config.memory_bytes = 512 * kMiB;
  config.kernel = fs::absolute(options.kernel, ec).string();
  config.initrd = fs::absolute(options.initrd, ec).string();
  // quiet: less console output for the emulated UART to carry. panic=-1 with
  // -no-reboot: a guest that panics makes QEMU exit, so we fail fast.
  config.cmdline = "console=ttyS0 quiet panic=-1";
  config.no_reboot = true;
  config.panic_device = PanicDevice::kNone;
  config.pause_on_panic = false;
  config.qmp_socket = (dir / "qmp.sock").string();
  config.console_socket = (dir / "console.sock").string();
  config.console_log = (dir / "console.log").string();
  config.qemu_log = (dir / "qemu.log").string();
  config.extra_args = {
      "-device",
      "virtio-serial-pci,id=hvt_vser",
      "-chardev",
      "file,id=hvt_harvest,path=" + OptValue(archive_path.string()),
      "-device",
      "virtserialport,bus=hvt_vser.0,chardev=hvt_harvest,name=" + std::string(kPortName)};
  return config;
}

// The guest's name for the virtio-serial port the archive goes out through.
Result<std::string> FindHarvestPort(GuestSession& guest) {
  Result<std::string> ports = guest.Must(
      "finding the virtio-serial port",
      std::string("for p in /sys/class/virtio-ports/*; do [ \"$(cat $p/name 2>/dev/null)\" = ") +
          kPortName + " ] && echo PORT=${p##*/}; done; true");
  if (!ports.ok()) return ports.error();
  std::smatch port_match;
  static const std::regex kPort("PORT=(vport[0-9]{1,4}p[0-9]{1,4})");
  if (!std::regex_search(*ports, port_match, kPort)) {
    return Error{std::string("the guest has no virtio-serial port named ") + kPortName +
                 ": its kernel needs virtio_pci and virtio_console (built in on Debian 6.12; "
                 "for kernels where they are modules, build the initrd with "
                 "HVTRACE_GUEST_EXTRA_MODULES=\"virtio_pci virtio_console\")"};
  }
  return port_match[1].str();
}

// Copies the kernel's formats, kallsyms and identity into one tar in the
// guest's tmpfs; returns its size as the guest reports it (checked).
Result<uint64_t> PackFormatsInGuest(GuestSession& guest) {
  const std::string H = kGuestDir;
  // tracefs files stat as size 0, so they are copied with cat/grep into the
  // initramfs (tmpfs) first; `grep -H ''` copies all ~2000 formats in one
  // process, prefixing every line with its file's path.
  Result<std::string> collected =
      guest.Must("copying tracefs formats",
                 "rm -rf " + H + " && mkdir -p " + H +
                     " && cd /sys/kernel/tracing/events && grep -H '' */*/format > " + H +
                     "/formats && cat header_page > " + H + "/header_page && cat header_event > " +
                     H + "/header_event && cat ../printk_formats > " + H +
                     "/printk_formats; S=$?; cd /; [ $S = 0 ]");
  if (!collected.ok()) return collected.error();
  Result<std::string> identity =
      guest.Must("copying kallsyms and the kernel identity",
                 "echo 0 > /proc/sys/kernel/kptr_restrict && cat /proc/kallsyms > " + H +
                     "/kallsyms && cat /proc/version > " + H + "/version && uname -r > " + H +
                     "/release && cat /proc/modules > " + H + "/modules");
  if (!identity.ok()) return identity.error();
  Result<std::string> packed = guest.Must(
      "packing the archive",
      "cd " + H + " && tar -cf " + kGuestTar +
          " formats header_page header_event printk_formats kallsyms version release modules; "
          "S=$?; cd /; [ $S = 0 ] && wc -c < " +
          kGuestTar);
  if (!packed.ok()) return packed.error();
  uint64_t archive_bytes = 0;
  if (!LastNumberLine(*packed, &archive_bytes) || archive_bytes == 0) {
    return Error{"the guest did not report the archive size; output:\n" + packed->substr(0, 500)};
  }
  if (archive_bytes > kMaxHarvestArchiveBytes) {
    return Error{"the guest reports a " + std::to_string(archive_bytes) +
                 "-byte archive; the limit is " + std::to_string(kMaxHarvestArchiveBytes)};
  }
  return archive_bytes;
}

}  // namespace

std::filesystem::path ResolveHarvestInitrd(const std::filesystem::path& configured) {
  if (!configured.empty()) return configured;
  std::error_code ec;
  // A build tree's binaries use the build tree's guest; the installed ones
  // (/usr/sbin, /usr/bin) find no guest/ there and take the package's image.
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = exe.parent_path().parent_path() / "guest" / "6.12" / "initrd.img";
    if (fs::is_regular_file(beside, ec)) return beside;
  }
  const fs::path packaged(kPackagedHarvestInitrd);
  return fs::is_regular_file(packaged, ec) ? packaged : fs::path();
}

Result<HarvestResult> HarvestFormats(const HarvestOptions& options) {
  const Clock::time_point start = Clock::now();
  const std::string& label = options.kernel_label.empty() ? options.kernel : options.kernel_label;
  struct stat st;
  if (options.kernel.empty() || ::stat(options.kernel.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error{"kernel image '" + label + "' is not a readable file"};
  }
  const uint64_t kernel_bytes = static_cast<uint64_t>(st.st_size);
  if (options.initrd.empty() || ::stat(options.initrd.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error{"initrd '" + options.initrd + "' is not a readable file"};
  }
  Result<std::string> key = KernelKeyOfFile(options.kernel);
  if (!key.ok()) return key.error();
  const double key_seconds = SecondsSince(start);

  FormatCache cache(options.cache_root);
  Result<std::optional<json>> existing = cache.Lookup(*key);
  if (!existing.ok()) return existing.error();
  if (existing->has_value()) {
    HarvestResult hit;
    hit.key = *key;
    hit.entry_dir = cache.EntryDir(*key);
    hit.cache_hit = true;
    hit.manifest = std::move(**existing);
    hit.seconds = SecondsSince(start);
    return hit;
  }

  Result<WorkDir> work = WorkDir::Create();
  if (!work.ok()) return work.error();
  if (options.keep_work_dir) work->Keep();
  const fs::path dir = work->path();
  const fs::path archive_path = dir / "harvest.tar";

  const VmConfig config = HarvestVmConfig(options, dir, archive_path);

  Progress(options, "kernel " + *key + ": not cached, booting it under TCG to harvest formats");
  const Clock::time_point boot_start = Clock::now();
  Result<std::unique_ptr<Vm>> vm = Vm::Start(config, /*kvm_usable=*/false);
  if (!vm.ok()) return Error{"harvest VM: " + vm.error().message};
  auto fail = [&](const std::string& message, GuestConsole* console) -> Result<HarvestResult> {
    std::string text = "harvest of " + label + ": " + message;
    if (console != nullptr) text += "\n--- guest console (tail) ---\n" + console->Tail(30);
    const std::string qemu_tail = (*vm)->QemuLogTail(1024);
    if (!qemu_tail.empty()) text += "\n--- QEMU ---\n" + qemu_tail;
    (void)(*vm)->Stop(nullptr, 2s);
    return Error{text};
  };
  Result<std::unique_ptr<GuestConsole>> console = GuestConsole::Connect(config.console_socket, 15s);
  if (!console.ok()) return fail(console.error().message, nullptr);
  GuestConsole& con = **console;
  Result<std::string> ready = con.WaitForLine("HVTRACE-GUEST-READY", options.boot_timeout);
  if (!ready.ok()) {
    return fail("the guest did not print HVTRACE-GUEST-READY: " + ready.error().message, &con);
  }
  const double boot_seconds = SecondsSince(boot_start);
  Progress(options, "guest ready after " + std::to_string(static_cast<int>(boot_seconds)) +
                        " s; collecting formats");

  GuestSession guest(con, options);
  const Clock::time_point collect_start = Clock::now();
  // Find the port first: without it nothing else is worth doing.
  Result<std::string> port = FindHarvestPort(guest);
  if (!port.ok()) return fail(port.error().message, &con);

  Result<uint64_t> archive_bytes = PackFormatsInGuest(guest);
  if (!archive_bytes.ok()) return fail(archive_bytes.error().message, &con);
  const double collect_seconds = SecondsSince(collect_start);

  const Clock::time_point transfer_start = Clock::now();
  Result<std::string> sent =
      guest.Must("sending the archive", std::string("cat ") + kGuestTar + " > /dev/" + *port);
  if (!sent.ok()) return fail(sent.error().message, &con);
  if (Status s = AwaitArchive(archive_path, *archive_bytes); !s.ok())
    return fail(s.error().message, &con);
  const double transfer_seconds = SecondsSince(transfer_start);
  // The guest is of no further use; stop it before checking its output.
  if (Status s = (*vm)->Stop(nullptr, 2s); !s.ok()) {
    Progress(options, "warning: stopping the harvest VM: " + s.error().message);
  }
  const double vm_seconds = SecondsSince(boot_start);

  Result<std::vector<std::byte>> archive = ReadPrefix(archive_path, *archive_bytes);
  if (!archive.ok()) return archive.error();
  Result<HarvestBundle> bundle = ParseHarvestArchive(*archive);
  if (!bundle.ok()) return Error{"harvest of " + label + ": " + bundle.error().message};
  const std::string ready_release = ready->substr(ready->find("HVTRACE-GUEST-READY") + 19);
  if (ready_release.find(bundle->release) == std::string::npos) {
    return Error{"harvest of " + label + ": uname -r says '" + bundle->release +
                 "' but the guest announced '" + ready_release + "'"};
  }

  Result<std::string> initrd_hash = Sha256File(options.initrd);
  json manifest = {
      {"kernel_path", options.kernel_label.empty() ? config.kernel : label},
      {"kernel_bytes", kernel_bytes},
      {"initrd_path", config.initrd},
      {"initrd_sha256", initrd_hash.ok() ? *initrd_hash : std::string()},
      {"harvest",
       {{"accel", "tcg"},
        {"channel", "virtio-serial port " + std::string(kPortName)},
        {"archive_bytes", *archive_bytes},
        {"key_seconds", key_seconds},
        {"boot_seconds", boot_seconds},
        {"collect_seconds", collect_seconds},
        {"transfer_seconds", transfer_seconds},
        {"vm_seconds", vm_seconds}}},
#ifdef HVTRACE_VERSION
      {"hvtrace_version", HVTRACE_VERSION},
#endif
  };
  return StoreHarvest(cache, *key, *bundle, std::move(manifest), start);
}

}  // namespace hvtrace::hostd
