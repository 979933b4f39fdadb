#include "kvm_probe.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "capped_file.h"
#include "child_process.h"

namespace hvtrace::hostd {
namespace {

using Clock = std::chrono::steady_clock;

// A real-mode boot sector (16-bit code, assembled by hand with `as --32` +
// `objcopy -O binary`): print the banner on COM1, then halt. SeaBIOS loads it
// at 0x7c00, so the probe also exercises the firmware path a real guest takes.
//   cli; xor ax,ax; mov ds,ax; mov si,msg; mov dx,0x3f8
//   1: lodsb; test al,al; jz 2f; out dx,al; jmp 1b
//   2: hlt; jmp 2b
//   msg: "HVTRACE-KVM-PROBE-OK\n\0"
std::vector<unsigned char> BootSector() {
  static constexpr unsigned char kCode[] = {0xfa, 0x31, 0xc0, 0x8e, 0xd8, 0xbe, 0x16, 0x7c,
                                            0xba, 0xf8, 0x03, 0xac, 0x84, 0xc0, 0x74, 0x03,
                                            0xee, 0xeb, 0xf8, 0xf4, 0xeb, 0xfd};
  static constexpr char kMessage[] = "HVTRACE-KVM-PROBE-OK\n";  // At 0x7c16, NUL-terminated.
  std::vector<unsigned char> sector(512, 0);
  std::memcpy(sector.data(), kCode, sizeof kCode);
  std::memcpy(sector.data() + sizeof kCode, kMessage, sizeof kMessage);
  sector[510] = 0x55;  // Boot signature.
  sector[511] = 0xaa;
  return sector;
}

bool WriteWhole(const std::string& path, const std::vector<unsigned char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  return ok;
}

// QEMU's own words when KVM fails it; the first line that matters.
std::string KvmErrorIn(const std::string& stderr_text) {
  for (std::string_view needle : {"KVM internal error", "emulation failure", "kvm run failed",
                                  "failed to initialize kvm", "Could not access KVM"}) {
    const size_t pos = stderr_text.find(needle);
    if (pos == std::string::npos) continue;
    const size_t start = stderr_text.rfind('\n', pos);
    const size_t end = stderr_text.find('\n', pos);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    return stderr_text.substr(from, end == std::string::npos ? std::string::npos : end - from);
  }
  return "";
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.size() > 400 ? s.substr(0, 400) + "..." : s;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/hvtrace-kvm-probe-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One probe guest: its QEMU arguments (without the serial port) and the
// serial output that counts as success.
struct ProbeGuest {
  std::string what;  // "probe guest", "kernel K": for the reasons.
  std::vector<std::string> args;
  std::vector<std::string_view> success;  // Any of these on the serial port.
  std::string success_name;               // What the reasons call it.
  std::chrono::milliseconds deadline;
};

std::string FoundIn(const std::string& out, const std::vector<std::string_view>& needles) {
  for (std::string_view n : needles) {
    if (out.find(n) != std::string::npos) return std::string(n);
  }
  return "";
}

KvmProbeResult RunProbeGuest(const ProbeGuest& guest, const std::string& dir) {
  const std::string serial = dir + "/serial.txt", err_path = dir + "/qemu.log";
  std::filesystem::remove(serial);
  std::vector<std::string> args = guest.args;
  args.insert(args.end(), {"-serial", "file:" + serial});
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (err_fd < 0 || null_fd < 0) {
    if (err_fd >= 0) ::close(err_fd);
    if (null_fd >= 0) ::close(null_fd);
    return {false, std::string("cannot set up the probe's stdio: ") + std::strerror(errno)};
  }
  const auto start = Clock::now();
  const pid_t pid = SpawnChild(args, null_fd, null_fd, err_fd);
  ::close(err_fd);
  ::close(null_fd);
  if (pid < 0) return {false, std::string("cannot fork the probe QEMU: ") + std::strerror(errno)};

  KvmProbeResult result;
  bool exited = false;
  int status = 0;
  for (;;) {
    // Reap before reading, so output written just before QEMU exits (a
    // kernel that panics with -no-reboot) is seen.
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    const std::string out = ReadFileTail(serial, 8192);
    const std::string err = ReadFileTail(err_path, 4096);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    if (std::string kvm_error = KvmErrorIn(err); !kvm_error.empty()) {
      result = {false, "QEMU reported a KVM failure running the " + guest.what + ": " +
                           OneLine(kvm_error)};
      break;
    }
    if (std::string found = FoundIn(out, guest.success); !found.empty()) {
      result = {true, guest.what + " wrote '" + found + "' under KVM after " + std::to_string(ms) +
                          " ms"};
      break;
    }
    if (exited) {
      const std::string why = WIFEXITED(status)
                                  ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                  : "was killed by signal " + std::to_string(WTERMSIG(status));
      result = {false, "QEMU running the " + guest.what + " " + why + " before " +
                           guest.success_name + ": " + OneLine(err)};
      break;
    }
    if (Clock::now() - start >= guest.deadline) {
      const std::string tail = out.size() > 300 ? out.substr(out.size() - 300) : out;
      result = {false,
                "the " + guest.what + " under KVM wrote nothing to its serial port matching " +
                    guest.success_name + " within " + std::to_string(guest.deadline.count()) +
                    " ms" + (tail.empty() ? "" : "; it wrote '" + OneLine(tail) + "'") +
                    (err.empty() ? "" : "; QEMU said: " + OneLine(err))};
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return result;
}

std::vector<std::string> QemuBase(const KvmProbeOptions& options, const char* memory) {
  return {options.qemu_binary,
          "-nodefaults",
          "-no-user-config",
          "-display",
          "none",
          "-machine",
          "pc",
          "-accel",
          "kvm",
          "-m",
          memory,
          "-no-reboot"};
}

}  // namespace

KvmProbeResult ProbeKvm(const KvmProbeOptions& options) {
  if (::access(options.device.c_str(), R_OK | W_OK) != 0) {
    return {false, options.device + " cannot be opened read-write: " + std::strerror(errno)};
  }
  TempDir dir;
  if (dir.path().empty())
    return {false, std::string("cannot create a probe directory: ") + std::strerror(errno)};
  const std::string disk = dir.path() + "/boot.img";
  if (!WriteWhole(disk, BootSector()))
    return {false, "cannot write the probe boot sector in " + dir.path()};

  ProbeGuest sector{
      "probe guest", QemuBase(options, "16"), {kKvmProbeBanner}, "its banner", options.deadline};
  sector.args.insert(sector.args.end(),
                     {"-drive", "file=" + disk + ",format=raw,if=floppy,readonly=on"});
  KvmProbeResult first = RunProbeGuest(sector, dir.path());
  if (!first.usable || options.kernel.empty()) return first;

  // No initrd and an init that does not exist: a kernel that ran every
  // initcall under KVM then asks for its root fs (or init) and panics.
  ProbeGuest kernel{"kernel " + options.kernel,
                    QemuBase(options, "256"),
                    {"Unable to mount root fs", "No working init found", "Run /"},
                    "the end of its boot",
                    options.kernel_deadline};
  kernel.args.insert(kernel.args.end(),
                     {"-kernel", options.kernel, "-append",
                      "console=ttyS0 panic=-1 rdinit=/hvtrace-kvm-probe-no-init"});
  KvmProbeResult second = RunProbeGuest(kernel, dir.path());
  if (!second.usable) return second;
  return {true, first.reason + "; " + second.reason};
}

KvmProbeResult KvmVerdict(const std::string& kernel) {
  const char* env = std::getenv("HVTRACE_ACCEL");
  const std::string_view accel = env != nullptr ? env : "";
  if (accel == "tcg") return KvmProbeResult{false, "HVTRACE_ACCEL=tcg rules KVM out (not probed)"};
  if (accel == "kvm") return KvmProbeResult{true, "HVTRACE_ACCEL=kvm insists on KVM (not probed)"};
  static std::mutex mu;
  static std::map<std::string, KvmProbeResult> verdicts;
  // One probe at a time: two boots of one kernel wait for one answer.
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = verdicts.find(kernel); it != verdicts.end()) return it->second;
  KvmProbeOptions options;
  options.kernel = kernel;
  if (const char* qemu = std::getenv("HVTRACE_QEMU"); qemu != nullptr && *qemu != '\0') {
    options.qemu_binary = qemu;
  }
  return verdicts.emplace(kernel, ProbeKvm(options)).first->second;
}

}  // namespace hvtrace::hostd
