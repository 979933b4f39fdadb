#include "guest_harness.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "formats_cache.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool Readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

std::string QemuBinary() {
  const char* env = std::getenv("HVTRACE_QEMU");
  return env != nullptr && *env != '\0' ? env : "qemu-system-x86_64";
}

hostd::Accel AccelFromEnv() {
  const char* env = std::getenv("HVTRACE_ACCEL");
  if (env == nullptr) return hostd::Accel::kAuto;
  const std::string v = env;
  if (v == "tcg") return hostd::Accel::kTcg;
  if (v == "kvm") return hostd::Accel::kKvm;
  return hostd::Accel::kAuto;
}

// Runs a shell command, returning its exit status and combined output.
int RunCommand(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  return pclose(p);
}

}  // namespace

std::string QemuUnavailableReason() {
  std::string out;
  const int status = RunCommand(QemuBinary() + " -version", &out);
  if (status != 0) return QemuBinary() + " cannot run (" + out + "); install qemu-system-x86";
  return "";
}

std::string KernelParamName(const std::string& version) {
  std::string name = "Linux" + version;
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

Result<GuestImage> FindGuestImage(const std::string& version) {
  const std::string dir = std::string(HVTRACE_SOURCE_DIR) + "/build/guest/" + version;
  auto complete = [&] { return Readable(dir + "/vmlinuz") && Readable(dir + "/initrd.img"); };
  if (!complete()) {
    // One build at a time per process; the script serializes across
    // processes itself (flock), and is a fast no-op once cached.
    static std::mutex build_mutex;
    std::lock_guard lock(build_mutex);
    if (!complete()) {
      std::string out;
      const std::string cmd =
          std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/build-guest.sh --kernel " + version;
      const int status = RunCommand(cmd, &out);
      if (status != 0 || !complete()) {
        return Error{"guest image " + version + " missing in " + dir + " and `" + cmd +
                     "` failed (status " + std::to_string(status) + "):\n" + out};
      }
    }
  }
  GuestImage image{dir + "/vmlinuz", dir + "/initrd.img", ReadFirstLine(dir + "/kernel-release")};
  return image;
}

Result<GuestImage> GuestImageWithTestModules(const std::string& version) {
  const std::string bin = HVTRACE_BIN_DIR;
  const std::string dir = bin + "/../guest-modules";
  const std::string cmd = std::string(HVTRACE_SOURCE_DIR) +
                          "/qemu-scripts/build-guest.sh --kernel " + version + " --out " + dir +
                          " --agent " + bin +
                          "/hvtrace-agent --with-test-modules --with-kexec-kernel 2>&1";
  // One build at a time per process, as FindGuestImage.
  static std::mutex build_mutex;
  std::lock_guard lock(build_mutex);
  std::string out;
  const int status = RunCommand(cmd, &out);
  const std::string image_dir = dir + "/" + version;
  GuestImage image{image_dir + "/vmlinuz", image_dir + "/initrd-kexec.img",
                   ReadFirstLine(image_dir + "/kernel-release")};
  if (status != 0 || !Readable(image.kernel) || !Readable(image.initrd)) {
    return Error{"`" + cmd + "` failed:\n" + out};
  }
  return image;
}

Result<std::string> FindKexecInitrd(const GuestImage& image) {
  const std::string initrd = (fs::path(image.initrd).parent_path() / "initrd-kexec.img").string();
  if (!Readable(initrd)) {
    std::string out;
    const std::string cmd = std::string(HVTRACE_SOURCE_DIR) +
                            "/qemu-scripts/build-guest.sh --kernel 6.12 --with-kexec-kernel";
    if (RunCommand(cmd, &out) != 0 || !Readable(initrd)) {
      return Error{"no " + initrd + ": `" + cmd + "` did not make it:\n" + out};
    }
  }
  return initrd;
}

std::string AddDaemonMonitor(hostd::VmConfig& config, const std::string& tag) {
  const std::string path = "/tmp/hvt-" + tag + "-" + std::to_string(getpid()) + ".qmp";
  config.extra_args.insert(config.extra_args.end(),
                           {"-qmp", "unix:" + path + ",server=on,wait=off"});
  return path;
}

TestGuest::TestGuest(const std::string& tag) {
  static std::atomic<int> counter{0};
  const std::string unique =
      "hvt-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  // Unix socket paths are limited to 107 bytes: keep the directory short.
  dir_ = "/tmp/" + unique;
  fs::create_directories(dir_);
  shm_prefix_ = "/dev/shm/" + unique;
}

TestGuest::~TestGuest() {
  if (vm_) {
    (void)vm_->Stop(qmp_.get(), 3s);
    qmp_.reset();
    console_.reset();
    vm_.reset();  // Removes sockets and the backing files it created.
  }
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

hostd::VmConfig TestGuest::MakeConfig(const GuestImage& image) const {
  hostd::VmConfig c;
  c.name = fs::path(dir_).filename().string();
  c.qemu_binary = QemuBinary();
  c.accel = AccelFromEnv();
  c.vcpus = 2;
  c.memory_bytes = 1088 * hostd::kMiB;
  c.kernel = image.kernel;
  c.initrd = image.initrd;
  c.cmdline = "console=ttyS0";
  c.qmp_socket = dir_ + "/qmp.sock";
  c.console_socket = dir_ + "/console.sock";
  c.console_log = dir_ + "/console.log";
  c.qemu_log = dir_ + "/qemu.log";
  return c;
}

std::string TestGuest::ShmPath(const std::string& suffix) const {
  return shm_prefix_ + "-" + suffix;
}

Status TestGuest::Boot(const hostd::VmConfig& config) {
  const auto started = std::chrono::steady_clock::now();
  auto vm = hostd::Vm::Start(config, hostd::KvmUsable(config.kernel));
  if (!vm.ok()) return vm.error();
  vm_ = std::move(vm.value());
  // Console first: QEMU drops what the guest writes while nobody is
  // connected (the log file still has it).
  auto console = hostd::GuestConsole::Connect(config.console_socket, 10s);
  if (!console.ok()) return Error{console.error().message + "\n" + Diagnostics()};
  console_ = std::move(console.value());
  auto qmp = hostd::QmpSyncClient::Connect(config.qmp_socket, 10s);
  if (!qmp.ok()) return Error{qmp.error().message + "\n" + Diagnostics()};
  qmp_ = std::move(qmp.value());
  auto ready = console_->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout);
  if (!ready.ok()) {
    return Error{"guest did not boot (" + std::string(vm_->kvm() ? "KVM" : "TCG") +
                 "): " + ready.error().message + "\nQEMU " + vm_->DescribeExit() + ", stderr:\n" +
                 vm_->QemuLogTail()};
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("[harness] %s: %s guest %s ready after %.1f s\n", config.name.c_str(),
              vm_->kvm() ? "KVM" : "TCG", ready->c_str() + ready->find("HVTRACE-GUEST-READY"),
              seconds);
  return {};
}

Result<hostd::GuestConsole::CommandResult> TestGuest::Run(const std::string& command) {
  if (!console_) return Error{"guest not booted"};
  return console_->Run(command, kCommandTimeout);
}

std::string TestGuest::Diagnostics() const {
  std::ostringstream out;
  if (console_) {
    out << "console tail:\n" << console_->Tail();
  } else if (vm_) {
    std::ifstream log(vm_->config().console_log);
    // rdbuf() rather than istreambuf_iterator: GCC 12 warns falsely
    // (-Wnull-dereference) on the iterator form, and CI builds with -Werror.
    std::ostringstream content;
    content << log.rdbuf();
    const std::string all = content.str();
    out << "console log tail:\n"
        << (all.size() > 3000 ? all.substr(all.size() - 3000) : all) << "\n";
  }
  if (vm_) out << "QEMU (" << vm_->DescribeExit() << ") stderr:\n" << vm_->QemuLogTail();
  return out.str();
}

Result<hostd::HarvestResult> HarvestImage(const GuestImage& image,
                                          const std::filesystem::path& cache_root) {
  hostd::HarvestOptions harvest;
  harvest.kernel = image.kernel;
  harvest.initrd = image.initrd;
  harvest.cache_root = cache_root;
  return hostd::HarvestFormats(harvest);
}

Result<std::filesystem::path> CacheWithFormatsOf(const GuestImage& image) {
  Result<std::filesystem::path> root = hostd::DefaultCacheRoot();
  if (!root.ok()) return root.error();
  Result<hostd::HarvestResult> harvested = HarvestImage(image, *root);
  if (!harvested.ok()) return harvested.error();
  return *root;
}

}  // namespace hvtrace::e2e
