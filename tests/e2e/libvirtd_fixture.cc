#include "libvirtd_fixture.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace hvtrace::e2e {

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

}  // namespace

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

std::string PrivateLibvirtd::LogTail() const { return FileTail(dir_ + "/log/libvirtd.log", 3000); }

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

// The serial console both kinds of domain have: a socket the tests type
// into and a log libvirt keeps.
std::string TestDomain::SerialXml() const {
  return "    <serial type='unix'>\n"
         "      <source mode='bind' path='" +
         console_socket() +
         "'/>\n"
         "      <log file='" +
         console_log() +
         "' append='off'/>\n"
         "      <target port='0'/>\n"
         "    </serial>\n";
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
         "  <devices>\n" +
         SerialXml() +
         "    <panic model='isa'/>\n"
         "    <memballoon model='none'/>\n" +
         o.extra_devices +
         "  </devices>\n"
         "</domain>\n";
}

Result<std::string> TestDomain::MakeDiskXml(const DiskImage& image,
                                            const TestDomainOptions& o) const {
  const std::string overlay = daemon_.dir() + "/" + name_ + ".qcow2";
  Result<std::string> made = RunArgv(
      {"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", image.disk, overlay});
  if (!made.ok()) return made.error();
  return "<domain type='qemu'>\n"
         "  <name>" +
         name_ +
         "</name>\n"
         "  <memory unit='MiB'>1024</memory>\n"
         "  <vcpu>2</vcpu>\n"
         "  <os>\n"
         "    <type arch='x86_64' machine='" +
         o.machine +
         "'>hvm</type>\n"
         "    <boot dev='hd'/>\n"
         "  </os>\n"
         "  <features><acpi/></features>\n"
         "  <on_poweroff>destroy</on_poweroff>\n"
         "  <on_reboot>restart</on_reboot>\n"
         "  <on_crash>" +
         o.on_crash +
         "</on_crash>\n"
         "  <devices>\n"
         "    <disk type='file' device='disk'>\n"
         "      <driver name='qemu' type='qcow2'/>\n"
         "      <source file='" +
         overlay +
         "'/>\n"
         "      <target dev='vda' bus='virtio'/>\n"
         "    </disk>\n" +
         SerialXml() + "    <memballoon model='none'/>\n" + o.extra_devices +
         "  </devices>\n"
         "</domain>\n";
}

Status TestDomain::Create(const GuestImage& image, const TestDomainOptions& options) {
  ready_timeout_ = options.ready_timeout;
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
    return Start();
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
  return WaitReady();
}

Status TestDomain::Start() {
  Result<std::string> started = RunArgv({"virsh", "-q", "-c", daemon_.uri(), "start", name_});
  if (!started.ok()) return Error{started.error().message + "\n" + daemon_.LogTail()};
  return WaitReady();
}

Status TestDomain::WaitReady() {
  Result<std::unique_ptr<hostd::GuestConsole>> console =
      hostd::GuestConsole::Connect(console_socket(), std::chrono::seconds(20));
  if (!console.ok()) return Error{"console of " + name_ + ": " + console.error().message};
  console_ = std::move(*console);
  // The console may have connected after the ready line: the log has it all.
  auto deadline = std::chrono::steady_clock::now() + ready_timeout_;
  while (std::chrono::steady_clock::now() < deadline) {
    if (FileTail(console_log(), 1 << 20).find("HVTRACE-GUEST-READY") != std::string::npos) {
      // Make sure the shell answers on our socket before tests type into it.
      Result<hostd::GuestConsole::CommandResult> r = console_->Run("true", kCommandTimeout);
      if (!r.ok()) return Error{"guest shell of " + name_ + ": " + r.error().message};
      return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return Error{"guest " + name_ + " did not print HVTRACE-GUEST-READY within " +
               std::to_string(ready_timeout_.count()) + " ms\n" + Diagnostics()};
}

std::string TestDomain::Diagnostics() const {
  return "console log tail:\n" + FileTail(console_log(), 2000) + "\nlibvirtd log tail:\n" +
         daemon_.LogTail();
}

}  // namespace hvtrace::e2e
