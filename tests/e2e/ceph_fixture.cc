#include "ceph_fixture.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "host_command.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// curl: the fixture asks radosgw with it, and the tests make requests the
// client under test does not (SigV4 by curl's --aws-sigv4).
const std::vector<std::string> kBinaries = {"ceph-mon",   "ceph-mgr",      "ceph-osd",
                                            "radosgw",    "radosgw-admin", "ceph-authtool",
                                            "monmaptool", "ceph",          "curl"};

bool InPath(const std::string& tool) {
  for (const char* dir : {"/usr/bin", "/usr/sbin", "/bin", "/sbin"}) {
    if (::access((std::string(dir) + "/" + tool).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// A port the kernel has just handed out on 127.0.0.1 (closed again, so a
// daemon can bind it; a collision in between is very unlikely).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Where ceph-osd loads its object classes from (radosgw calls cls_version,
// cls_fifo and others at its start). Debian 13's ceph 18.2.7 defaults
// osd_class_dir to the relative "lib/x86_64-linux-gnu/rados-classes": an OSD
// whose working directory is not / finds no class, and radosgw stops with
// "failed to init services (ret=(95) Operation not supported)". Its default
// made absolute (/usr, then /); empty when there is none to give.
std::string OsdClassDir() {
  RunResult r =
      RunArgvStatus({"ceph-conf", "-c", "/dev/null", "--show-config-value", "osd_class_dir"});
  std::string dir = r.output;
  while (!dir.empty() && (dir.back() == '\n' || dir.back() == ' ')) dir.pop_back();
  dir = dir.substr(dir.rfind('\n') + 1);  // npos + 1 == 0: the only line.
  if (r.status != 0 || dir.empty()) return "";
  if (dir.front() == '/') return dir;
  for (const std::string base : {"/usr/", "/"}) {
    if (fs::is_directory(base + dir)) return base + dir;
  }
  return "";
}

std::string Uuid() {
  std::string u = ReadWhole("/proc/sys/kernel/random/uuid");
  while (!u.empty() && u.back() == '\n') u.pop_back();
  return u;
}

}  // namespace

CephCluster::~CephCluster() { Stop(); }

std::string CephCluster::UnavailableReason() {
  for (const std::string& b : kBinaries) {
    if (!InPath(b)) {
      return b +
             " is not installed (scripts/install-deps.sh installs ceph-mon ceph-mgr ceph-osd "
             "radosgw ceph-common curl)";
    }
  }
  return "";
}

Status CephCluster::Run(const std::vector<std::string>& argv, std::string* out) const {
  RunResult r = RunArgvStatus(argv);
  if (out != nullptr) *out = r.output;
  if (r.status != 0) {
    std::string cmd;
    for (const std::string& a : argv) cmd += a + " ";
    return Error{"ceph fixture: '" + cmd + "' exited " + std::to_string(r.status) + ": " +
                 r.output.substr(0, 4000)};
  }
  return {};
}

Result<pid_t> CephCluster::Spawn(const std::string& name, const std::vector<std::string>& argv) {
  const std::string out = dir_ + "/" + name + ".stdout";
  pid_t pid = ::fork();
  if (pid < 0) return Error{"fork: " + std::string(std::strerror(errno))};
  if (pid == 0) {
    // Dies with the test process, whatever ends it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  daemons_[name] = pid;
  return pid;
}

void CephCluster::Kill(const std::string& name) {
  auto it = daemons_.find(name);
  if (it == daemons_.end()) return;
  ::kill(it->second, SIGKILL);
  int status = 0;
  ::waitpid(it->second, &status, 0);
  daemons_.erase(it);
}

Status CephCluster::WaitForRgw(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    RunResult r = RunArgvStatus(
        {"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", endpoint()});
    if (r.status == 0 && r.output == "200") return {};
    auto it = daemons_.find("rgw");
    int status = 0;
    if (it != daemons_.end() && ::waitpid(it->second, &status, WNOHANG) == it->second) {
      daemons_.erase(it);
      return Error{"radosgw exited:\n" + Logs()};
    }
    std::this_thread::sleep_for(200ms);
  }
  return Error{"radosgw did not answer on " + endpoint() + " within " + std::to_string(seconds) +
               " s:\n" + Logs()};
}

Status CephCluster::Start() {
  const auto t0 = std::chrono::steady_clock::now();
  std::string tmpl = (fs::temp_directory_path() / "hvt-ceph-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Error{"mkdtemp: " + std::string(std::strerror(errno))};
  dir_ = tmpl;
  mon_port_ = FreePort();
  rgw_port_ = FreePort();
  const std::string fsid = Uuid();
  conf_ = dir_ + "/ceph.conf";
  for (const char* d : {"run", "osd", "mgr", "mon", "rgw"}) fs::create_directories(dir_ + "/" + d);
  {
    std::ofstream c(conf_);
    c << "[global]\n"
      << "fsid = " << fsid << "\n"
      << "mon host = v2:127.0.0.1:" << mon_port_ << "\n"
      << "mon initial members = a\n"
      << "auth cluster required = cephx\nauth service required = cephx\n"
      << "auth client required = cephx\n"
      // One OSD: one copy, and no health checks that want more.
      << "osd pool default size = 1\nosd pool default min size = 1\n"
      << "osd pool default pg autoscale mode = off\n"
      << "osd pool default pg num = 8\nosd pool default pgp num = 8\n"
      << "mon allow pool size one = true\nmon warn on pool no redundancy = false\n"
      << "osd crush chooseleaf type = 0\n"
      << "osd objectstore = memstore\nmemstore device bytes = 2147483648\n"
      << "osd data = " << dir_ << "/osd\n"
      << "mon data = " << dir_ << "/mon\n"
      << "mgr data = " << dir_ << "/mgr\n"
      << "keyring = " << dir_ << "/keyring\n"
      << "log file = " << dir_ << "/$name.log\n"
      << "run dir = " << dir_ << "/run\n"
      << "admin socket = " << dir_ << "/run/$name.asok\n"
      << "pid file = " << dir_ << "/run/$name.pid\n"
      << "mon data avail warn = 1\nmon data avail crit = 0\n"
      << "rgw frontends = beast endpoint=127.0.0.1:" << rgw_port_ << "\n"
      << "rgw data = " << dir_ << "/rgw\n";
    if (const std::string classes = OsdClassDir(); !classes.empty()) {
      c << "osd class dir = " << classes << "\n";
    }
  }
  const std::string keyring = dir_ + "/keyring";
  const std::string c = "-c";
  Status s = Run({"ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap",
                  "mon", "allow *"});
  if (s.ok()) {
    s = Run({"ceph-authtool", keyring, "--gen-key", "-n", "client.admin", "--cap", "mon", "allow *",
             "--cap", "osd", "allow *", "--cap", "mgr", "allow *"});
  }
  if (s.ok()) {
    s = Run({"monmaptool", "--create", "--add", "a", "v2:127.0.0.1:" + std::to_string(mon_port_),
             "--fsid", fsid, dir_ + "/monmap"});
  }
  if (s.ok()) {
    s = Run({"ceph-mon", c, conf_, "--mkfs", "-i", "a", "--monmap", dir_ + "/monmap", "--keyring",
             keyring});
  }
  if (!s.ok()) return s;
  if (auto p = Spawn("mon", {"ceph-mon", c, conf_, "-f", "-i", "a"}); !p.ok()) return p.error();
  // The first `ceph` command waits for the monitor's quorum.
  s = Run({"ceph", c, conf_, "--connect-timeout", "30", "auth", "get-or-create", "mgr.x", "mon",
           "allow profile mgr", "osd", "allow *", "-o", dir_ + "/mgr/keyring"});
  if (!s.ok()) return Error{s.error().message + "\n" + Logs()};
  if (auto p =
          Spawn("mgr", {"ceph-mgr", c, conf_, "-f", "-i", "x", "--keyring", dir_ + "/mgr/keyring"});
      !p.ok()) {
    return p.error();
  }
  const std::string osd_uuid = Uuid();
  std::string osd_id;
  s = Run({"ceph", c, conf_, "osd", "new", osd_uuid}, &osd_id);
  while (!osd_id.empty() && (osd_id.back() == '\n' || osd_id.back() == ' ')) osd_id.pop_back();
  if (s.ok()) {
    s = Run({"ceph", c, conf_, "auth", "get-or-create", "osd." + osd_id, "mon", "allow profile osd",
             "mgr", "allow profile osd", "osd", "allow *", "-o", dir_ + "/osd/keyring"});
  }
  if (s.ok()) {
    s = Run({"ceph-osd", c, conf_, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid, "--keyring",
             dir_ + "/osd/keyring"});
  }
  if (!s.ok()) return Error{s.error().message + "\n" + Logs()};
  if (auto p = Spawn(
          "osd", {"ceph-osd", c, conf_, "-f", "-i", osd_id, "--keyring", dir_ + "/osd/keyring"});
      !p.ok()) {
    return p.error();
  }
  s = Run({"ceph", c, conf_, "auth", "get-or-create", "client.rgw.a", "mon", "allow rw", "osd",
           "allow rwx", "-o", dir_ + "/rgw.keyring"});
  if (!s.ok()) return s;
  if (Status r = StartRgw(); !r.ok()) return r;
  s = Run({"radosgw-admin", c, conf_, "user", "create", "--uid=hvtrace-test",
           "--display-name=hvtrace test", "--access-key=" + access_key_,
           "--secret=" + secret_key_});
  if (!s.ok()) return Error{s.error().message + "\n" + Logs()};
  start_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {};
}

Status CephCluster::StartRgw() {
  if (daemons_.count("rgw") != 0) return {};
  auto p = Spawn("rgw", {"radosgw", "-c", conf_, "-f", "-n", "client.rgw.a", "--keyring",
                         dir_ + "/rgw.keyring"});
  if (!p.ok()) return p.error();
  // The first start creates RGW's pools; the OSD must come up for that.
  return WaitForRgw(90);
}

void CephCluster::StopRgw() { Kill("rgw"); }

void CephCluster::Stop() {
  for (const char* name : {"rgw", "osd", "mgr", "mon"}) Kill(name);
  if (!dir_.empty() && std::getenv("HVTRACE_KEEP_TMP") == nullptr) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  dir_.clear();
}

Status CephCluster::CreateBucket(const std::string& bucket) {
  RunResult r =
      RunArgvStatus({"curl", "-s", "-f", "-S", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                     "--user", access_key_ + ":" + secret_key_, "-H",
                     "x-amz-content-sha256: UNSIGNED-PAYLOAD", endpoint() + "/" + bucket});
  if (r.status != 0) return Error{"creating bucket " + bucket + ": " + r.output};
  return {};
}

Result<std::string> CephCluster::WriteCredentials(const std::string& name,
                                                  const std::string& access_key,
                                                  const std::string& secret_key) const {
  const std::string path = dir_ + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Error{"cannot create " + path + ": " + std::strerror(errno)};
  const std::string text = "access_key = " + access_key + "\nsecret_key = " + secret_key + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) return Error{"cannot write " + path};
  return path;
}

std::string CephCluster::Logs() const {
  std::string out;
  for (const char* name : {"mon.a", "mgr.x", "osd.0", "client.rgw.a"}) {
    out += "--- " + std::string(name) + ".log\n" + FileTail(dir_ + "/" + name + ".log", 1500);
  }
  for (const char* name : {"mon", "mgr", "osd", "rgw"}) {
    out += "--- " + std::string(name) + ".stdout\n" +
           FileTail(dir_ + "/" + std::string(name) + ".stdout", 1000);
  }
  return out;
}

}  // namespace hvtrace::e2e
