#include "libvirtd_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace hvtrace::e2e {
std::string ReadWhole(const std::string& path);

namespace {

const std::string kScript =
    std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/libvirt/private-libvirtd.sh";

// TCG domains run under qemu-scripts/libvirt/qemu-tcg-single-thread (the
// script says why: multi-threaded TCG breaks the guest kernel's live text
// patching about once in 25 boots). Domains that name an emulator keep it.
std::string WithSingleThreadTcg(std::string xml) {
  if (xml.find("<domain type='qemu'") == std::string::npos ||
      xml.find("<emulator>") != std::string::npos) {
    return xml;
  }
  const size_t devices = xml.find("<devices>");
  if (devices == std::string::npos) return xml;
  xml.insert(devices + std::strlen("<devices>"),
             "\n    <emulator>" + std::string(HVTRACE_SOURCE_DIR) +
                 "/qemu-scripts/libvirt/qemu-tcg-single-thread</emulator>");
  return xml;
}

std::string Tail(const std::string& path, size_t max_bytes) {
  std::string all = ReadWhole(path);
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

}  // namespace

std::string ReadWhole(const std::string& path) {
  std::string all;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return all;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  close(fd);
  return all;
}

RunResult RunArgvStatus(const std::vector<std::string>& argv) {
  RunResult r;
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    r.output = "pipe failed";
    return r;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    r.output = "fork failed";
    return r;
  }
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result<std::string> RunArgv(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return Error{"pipe failed"};
  pid_t pid = fork();
  if (pid < 0) return Error{"fork failed"};
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Error{"'" + cmd + "' failed (status " + std::to_string(status) + "): " + out};
  }
  return out;
}

std::string LibvirtdUnavailableReason() {
  if (geteuid() != 0) return "a private system-mode libvirtd needs root";
  for (const char* bin : {"/usr/sbin/libvirtd", "/usr/sbin/virtlogd", "/usr/bin/virsh"}) {
    if (access(bin, X_OK) != 0) {
      return std::string(bin) + " missing; install libvirt-daemon-system libvirt-clients";
    }
  }
  return QemuUnavailableReason();
}

Result<std::unique_ptr<PrivateLibvirtd>> PrivateLibvirtd::Start(const std::string& tag) {
  // libvirt writes to its socket; a write to a libvirtd being restarted would
  // kill the test with SIGPIPE (libvirt asks applications to ignore it).
  signal(SIGPIPE, SIG_IGN);
  static std::atomic<int> counter{0};
  // Short: the socket path must fit in sun_path (108 bytes).
  std::string dir =
      "/tmp/hvt-lv-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::unique_ptr<PrivateLibvirtd> d(new PrivateLibvirtd(dir));
  Result<std::string> out = RunArgv({kScript, "start", dir});
  if (!out.ok()) return Error{out.error().message + "\nlibvirtd log:\n" + d->LogTail()};
  return d;
}

PrivateLibvirtd::PrivateLibvirtd(std::string dir)
    : dir_(std::move(dir)), uri_("qemu:///system?socket=" + dir_ + "/sock/libvirt-sock") {}

PrivateLibvirtd::~PrivateLibvirtd() {
  Result<std::string> out = RunArgv({kScript, "stop", dir_});
  if (!out.ok()) std::fprintf(stderr, "libvirtd fixture: stop: %s\n", out.error().message.c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

Status PrivateLibvirtd::RestartLibvirtd() {
  Result<std::string> out = RunArgv({kScript, "restart-libvirtd", dir_});
  if (!out.ok()) return Error{out.error().message + "\nlibvirtd log:\n" + LogTail()};
  return {};
}

Status PrivateLibvirtd::StopLibvirtd() {
  Result<std::string> out = RunArgv({kScript, "stop-libvirtd", dir_});
  if (!out.ok()) return out.error();
  return {};
}

Status PrivateLibvirtd::StartLibvirtd() {
  Result<std::string> out = RunArgv({kScript, "start-libvirtd", dir_});
  if (!out.ok()) return Error{out.error().message + "\nlibvirtd log:\n" + LogTail()};
  return {};
}

PrivateHvtraced::PrivateHvtraced(const std::string& tag, const std::string& libvirt_uri) {
  static std::atomic<int> counter{0};
  dir_ = "/tmp/hvt-d-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(dir_);
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/hvtraced.conf")
      << "socket_group =\naccel = tcg\nlibvirt_uri = " << libvirt_uri << "\n";
}

PrivateHvtraced::~PrivateHvtraced() {
  Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PrivateHvtraced::Log() const { return Tail(dir_ + "/hvtraced.log", 6000); }

Status PrivateHvtraced::Start(uid_t uid) {
  if (pid_ > 0) return Error{"hvtraced already started"};
  std::string bin = std::string(HVTRACE_BIN_DIR) + "/hvtraced";
  if (uid != 0) {
    for (const char* sub : {"", "/state", "/run"}) {
      std::filesystem::create_directories(dir_ + sub);
      if (chown((dir_ + sub).c_str(), uid, uid) != 0) return Error{"chown " + dir_ + sub};
    }
    // The build tree may sit below a directory |uid| cannot enter (a clone
    // in /root or in a 0700 mktemp dir): run a copy from the test's own
    // directory, which it can.
    const std::string copy = dir_ + "/hvtraced";
    std::error_code ec;
    std::filesystem::copy_file(bin, copy, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec)
      return Error{"cannot copy " + bin + " to " + copy + " for uid " + std::to_string(uid) + ": " +
                   ec.message()};
    if (chmod(dir_.c_str(), 0755) != 0 || chmod(copy.c_str(), 0755) != 0) {
      return Error{"cannot make " + copy + " reachable for uid " + std::to_string(uid)};
    }
    for (std::filesystem::path p = dir_; p.has_relative_path(); p = p.parent_path()) {
      struct stat st {};
      if (stat(p.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
        return Error{"uid " + std::to_string(uid) + " cannot enter " + p.string() + " (mode " +
                     std::to_string(st.st_mode & 07777) + "), where this test keeps its daemon"};
      }
    }
    bin = copy;
  }
  pid_ = fork();
  if (pid_ < 0) return Error{"fork failed"};
  if (pid_ == 0) {
    std::string log = dir_ + "/hvtraced.log";
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd >= 0) dup2(fd, 2);
    if (uid != 0 && (setgid(uid) != 0 || setuid(uid) != 0)) _exit(126);
    // A test that dies must not leave its daemon behind (set after setuid,
    // which clears it).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    std::string conf = dir_ + "/hvtraced.conf", state = state_dir(), run = dir_ + "/run";
    execl(bin.c_str(), bin.c_str(), "--config", conf.c_str(), "--state-dir", state.c_str(),
          "--run-dir", run.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Hvtrace({"ping"}).status == 0) return {};
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return Error{"hvtraced exited at start:\n" + Log()};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Error{"hvtraced did not answer ping within 20 s:\n" + Log()};
}

double PrivateHvtraced::Stop() {
  if (pid_ <= 0) return 0;
  const auto start = std::chrono::steady_clock::now();
  kill(pid_, SIGTERM);
  bool exited = false;
  for (int i = 0; i < 2000 && !exited; ++i) {
    exited = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!exited) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
  return exited ? ms : -1;
}

RunResult PrivateHvtraced::Hvtrace(std::vector<std::string> args) const {
  std::vector<std::string> argv = {std::string(HVTRACE_BIN_DIR) + "/hvtrace"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--socket");
  argv.push_back(socket());
  return RunArgvStatus(argv);
}

Result<nlohmann::json> PrivateHvtraced::HvtraceJson(std::vector<std::string> args) const {
  args.push_back("--json");
  std::string cmd;
  for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
  RunResult r = Hvtrace(args);
  if (r.status != 0) {
    return Error{"`hvtrace " + cmd + "` exited " + std::to_string(r.status) + ": " + r.output};
  }
  nlohmann::json j = nlohmann::json::parse(r.output, nullptr, false);
  if (j.is_discarded()) return Error{"`hvtrace " + cmd + "` printed no JSON: " + r.output};
  return j;
}

Result<nlohmann::json> PrivateHvtraced::WaitForCaptures(const std::string& name, size_t count,
                                                        std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<nlohmann::json> j = HvtraceJson({"captures", name});
    if (j.ok() && (*j)["captures"].is_array() && (*j)["captures"].size() >= count) return j;
    last = j.ok() ? j->dump() : j.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Error{"no " + std::to_string(count) + " capture(s) of " + name + " within " +
               std::to_string(timeout.count()) + " ms; last: " + last + "\nhvtraced log:\n" +
               Log()};
}

Result<nlohmann::json> PrivateHvtraced::WaitForLibvirt(
    const std::function<bool(const nlohmann::json&)>& pred,
    std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<nlohmann::json> j = HvtraceJson({"ping"});
    if (j.ok() && (*j).contains("libvirt") && pred((*j)["libvirt"])) return (*j)["libvirt"];
    last = j.ok() ? j->dump() : j.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Error{"libvirt state not reached within " + std::to_string(timeout.count()) +
               " ms; last ping: " + last + "\nhvtraced log:\n" + Log()};
}

std::string PrivateLibvirtd::LogTail() const { return Tail(dir_ + "/log/libvirtd.log", 3000); }

TestDomain::TestDomain(PrivateLibvirtd& daemon, const std::string& tag)
    : daemon_(daemon), name_("hvt-" + tag + "-" + std::to_string(getpid())) {}

TestDomain::~TestDomain() {
  console_.reset();
  if (conn_) {
    if (virDomainPtr dom = virDomainLookupByName(conn_.get(), name_.c_str())) {
      if (virDomainIsActive(dom) == 1) virDomainDestroy(dom);
      if (defined_) virDomainUndefine(dom);
      virDomainFree(dom);
    }
  }
}

std::string TestDomain::MakeXml(const GuestImage& image, const TestDomainOptions& o) const {
  return "<domain type='qemu'>\n"
         "  <name>" +
         name_ +
         "</name>\n"
         "  <memory unit='MiB'>512</memory>\n"
         "  <vcpu>2</vcpu>\n"
         "  <os>\n"
         "    <type arch='x86_64' machine='" +
         o.machine +
         "'>hvm</type>\n"
         "    <kernel>" +
         image.kernel +
         "</kernel>\n"
         "    <initrd>" +
         image.initrd +
         "</initrd>\n"
         "    <cmdline>console=ttyS0</cmdline>\n"
         "  </os>\n"
         "  <features><acpi/></features>\n"
         "  <on_poweroff>destroy</on_poweroff>\n"
         "  <on_reboot>restart</on_reboot>\n"
         "  <on_crash>" +
         o.on_crash +
         "</on_crash>\n"
         "  <devices>\n"
         "    <serial type='unix'>\n"
         "      <source mode='bind' path='" +
         console_socket() +
         "'/>\n"
         "      <log file='" +
         console_log() +
         "' append='off'/>\n"
         "      <target port='0'/>\n"
         "    </serial>\n"
         "    <panic model='isa'/>\n"
         "    <memballoon model='none'/>\n" +
         o.extra_devices +
         "  </devices>\n"
         "</domain>\n";
}

Status TestDomain::Create(const GuestImage& image, const TestDomainOptions& options) {
  if (!conn_) {
    Result<hostd::LibvirtConnectPtr> conn = hostd::OpenLibvirtConnection(daemon_.uri());
    if (!conn.ok()) return conn.error();
    conn_ = std::move(*conn);
  }
  const std::string xml =
      WithSingleThreadTcg(options.raw_xml.empty() ? MakeXml(image, options) : options.raw_xml);
  if (options.via_virsh) {
    const std::string file = daemon_.dir() + "/" + name_ + ".xml";
    std::ofstream(file) << xml;
    Result<std::string> defined = RunArgv({"virsh", "-q", "-c", daemon_.uri(), "define", file});
    if (!defined.ok()) return defined.error();
    defined_ = true;
    if (!options.start) return {};
    Result<std::string> started = RunArgv({"virsh", "-q", "-c", daemon_.uri(), "start", name_});
    if (!started.ok()) return Error{started.error().message + "\n" + daemon_.LogTail()};
  } else {
    virDomainPtr dom = virDomainDefineXML(conn_.get(), xml.c_str());
    if (dom == nullptr) return Error{"define " + name_ + ": " + hostd::LibvirtLastError()};
    hostd::LibvirtDomainPtr hold(dom);
    defined_ = true;
    if (!options.start) return {};
    if (virDomainCreate(dom) != 0) {
      return Error{"start " + name_ + ": " + hostd::LibvirtLastError() + "\n" + daemon_.LogTail()};
    }
  }
  Result<std::unique_ptr<hostd::GuestConsole>> console =
      hostd::GuestConsole::Connect(console_socket(), std::chrono::seconds(20));
  if (!console.ok()) return Error{"console of " + name_ + ": " + console.error().message};
  console_ = std::move(*console);
  // The console may have connected after the ready line: the log has it all.
  auto deadline = std::chrono::steady_clock::now() + kBootTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Tail(console_log(), 1 << 20).find("HVTRACE-GUEST-READY") != std::string::npos) {
      // Make sure the shell answers on our socket before tests type into it.
      Result<hostd::GuestConsole::CommandResult> r = console_->Run("true", kCommandTimeout);
      if (!r.ok()) return Error{"guest shell of " + name_ + ": " + r.error().message};
      return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Error{"guest " + name_ + " did not print HVTRACE-GUEST-READY within " +
               std::to_string(kBootTimeout.count()) + " ms\n" + Diagnostics()};
}

std::string TestDomain::Diagnostics() const {
  return "console log tail:\n" + Tail(console_log(), 2000) + "\nlibvirtd log tail:\n" +
         daemon_.LogTail();
}

}  // namespace hvtrace::e2e
