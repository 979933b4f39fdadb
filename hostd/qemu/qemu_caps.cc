#include "qemu_caps.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <tuple>

#include "child_process.h"

namespace hvtrace::hostd {
namespace {

// Bounds on what a (possibly hostile) binary's help text can make us keep.
constexpr size_t kMaxNameBytes = 128;
constexpr size_t kMaxEntries = 100000;
constexpr size_t kMaxProbeOutput = 4u << 20;

// Calls |fn| with each line of |text|, without its newline.
template <typename Fn>
void ForEachLine(std::string_view text, Fn fn) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    fn(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

bool IsNameChar(char c, bool allow_upper_punct) {
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') return true;
  return allow_upper_punct && ((c >= 'A' && c <= 'Z') || c == '.' || c == ',' || c == '+');
}

// The quoted value after |key| (e.g. `name "`) in |line|, or empty.
std::string_view QuotedAfter(std::string_view line, std::string_view key) {
  const size_t at = line.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = line.substr(at + key.size());
  const size_t end = rest.find('"');
  if (end == std::string_view::npos || end == 0 || end > kMaxNameBytes) return {};
  rest = rest.substr(0, end);
  const bool plain =
      std::all_of(rest.begin(), rest.end(), [](char c) { return IsNameChar(c, true); });
  return plain ? rest : std::string_view();
}

// What hvtraced uses an option or device for, for refusals.
std::string_view PurposeOf(std::string_view what) {
  static constexpr std::pair<std::string_view, std::string_view> kPurposes[] = {
      {"ivshmem-plain", "attach (the trace region it plugs into the guest)"},
      {"pvpanic", "panic capture (GUEST_PANICKED)"},
      {"pvpanic-pci", "panic capture (GUEST_PANICKED)"},
      {"virtio-serial-pci", "the agent's metadata channel"},
      {"virtserialport", "the agent's metadata channel"},
      {"virtio-blk-pci", "the boot handshake devices (--device)"},
      {"virtio-net-pci", "the boot handshake devices (--device)"},
      {"vmcoreinfo", "the guest's VMCOREINFO note"},
      {"-run-with", "qemu_user (QEMU drops root)"},
      {"-runas", "qemu_user (QEMU drops root)"},
      {"-trace", "the boot timeline (QEMU's trace events)"},
      {"-msg", "the boot timeline (QEMU's trace events)"},
      {"-D", "the boot timeline (QEMU's trace events)"},
      {"-numa", "the boot range"},
      {"-object", "guest memory backed by host files"},
      {"-action", "holding a panicked guest paused"},
      {"-sandbox", "qemu_sandbox"},
      {"-mon", "QMP"},
  };
  for (const auto& [name, purpose] : kPurposes) {
    if (name == what) return purpose;
  }
  return "this VM's command line";
}

Error Missing(const QemuCaps& caps, const std::string& vm, const std::string& what,
              std::string_view purpose_key) {
  return Error{vm + caps.Describe() + " has no " + what + "; hvtraced needs it for " +
               std::string(PurposeOf(purpose_key))};
}

// -run-with KEY=VALUE[,KEY=VALUE]: only user= matters to the caps (the other
// keys hvtraced never passes, so they are refused as unknown).
Status CheckRunWith(const QemuCaps& caps, const std::string& value, const std::string& vm) {
  std::string_view rest = value;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    if (!item.starts_with("user=")) {
      return Error{vm + "-run-with " + std::string(item) + " is not something hvtraced asks for"};
    }
    if (!caps.run_with_user) return Missing(caps, vm, "-run-with user=", "-run-with");
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return {};
}

// Checks one option and its value (|value| is null when it takes none).
Status CheckOption(const QemuCaps& caps, const std::string& option, const std::string* value,
                   const std::string& vm) {
  if (option == "-device" && value != nullptr) {
    const std::string driver = value->substr(0, value->find(','));
    if (!caps.HasDevice(driver)) return Missing(caps, vm, "-device " + driver, driver);
  } else if (option == "-trace" && value != nullptr && value->starts_with("enable=")) {
    std::string event = value->substr(7);
    event = event.substr(0, event.find(','));
    if (!caps.HasTraceEvent(event)) return Missing(caps, vm, "trace event " + event, "-trace");
  } else if (option == "-run-with" && value != nullptr) {
    return CheckRunWith(caps, *value, vm);
  }
  return {};
}

}  // namespace

std::string QemuCaps::Describe() const {
  return "QEMU " + (version.empty() ? std::string("(unknown version)") : version) + " (" + binary +
         ")";
}

std::string ParseQemuVersion(std::string_view version_text) {
  constexpr std::string_view kPrefix = "QEMU emulator version ";
  const size_t at = version_text.find(kPrefix);
  if (at == std::string_view::npos) return "";
  std::string_view rest = version_text.substr(at + kPrefix.size());
  size_t n = 0;
  while (n < rest.size() && n < 32 && ((rest[n] >= '0' && rest[n] <= '9') || rest[n] == '.')) ++n;
  std::string version(rest.substr(0, n));
  while (!version.empty() && version.back() == '.') version.pop_back();
  if (version.empty() || version.front() == '.') return "";
  return version;
}

std::map<std::string, bool, std::less<>> ParseQemuOptions(std::string_view help) {
  std::map<std::string, bool, std::less<>> options;
  ForEachLine(help, [&](std::string_view line) {
    if (options.size() >= kMaxEntries || line.size() < 2 || line[0] != '-') return;
    size_t n = 1;
    // Option names hold capitals too (-D, -L, -S).
    while (n < line.size() && n <= kMaxNameBytes &&
           (IsNameChar(line[n], false) || (line[n] >= 'A' && line[n] <= 'Z'))) {
      ++n;
    }
    if (n == 1 || n > kMaxNameBytes) return;
    const std::string name(line.substr(0, n));
    // "-opt arg   text" takes an argument; "-opt   text" and "-opt" do not.
    const bool takes_arg = n + 1 < line.size() && line[n] == ' ' && line[n + 1] != ' ';
    if (n < line.size() && line[n] != ' ' && line[n] != '\t') return;
    options[name] = options[name] || takes_arg;
  });
  return options;
}

bool ParseRunWithUser(std::string_view help) {
  bool found = false;
  ForEachLine(help, [&](std::string_view line) {
    if (line.starts_with("-run-with ") && line.find("user=") != std::string_view::npos) {
      found = true;
    }
  });
  return found;
}

std::set<std::string, std::less<>> ParseQemuDevices(std::string_view device_help) {
  std::set<std::string, std::less<>> devices;
  ForEachLine(device_help, [&](std::string_view line) {
    if (devices.size() >= kMaxEntries || !line.starts_with("name \"")) return;
    if (std::string_view name = QuotedAfter(line, "name \""); !name.empty()) {
      devices.emplace(name);
    }
    if (std::string_view alias = QuotedAfter(line, ", alias \""); !alias.empty()) {
      devices.emplace(alias);
    }
  });
  return devices;
}

std::set<std::string, std::less<>> ParseQemuTraceEvents(std::string_view trace_help) {
  std::set<std::string, std::less<>> events;
  ForEachLine(trace_help, [&](std::string_view line) {
    if (events.size() >= kMaxEntries || line.empty() || line.size() > kMaxNameBytes) return;
    const bool plain = std::all_of(line.begin(), line.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    });
    if (plain) events.emplace(line);
  });
  return events;
}

QemuCaps ParseQemuCaps(const QemuCapsText& text, const std::string& binary) {
  QemuCaps caps;
  caps.binary = binary;
  caps.version = ParseQemuVersion(text.version);
  caps.options = ParseQemuOptions(text.help);
  caps.run_with_user = caps.HasOption("-run-with") && ParseRunWithUser(text.help);
  caps.devices = ParseQemuDevices(text.device_help);
  caps.trace_events = ParseQemuTraceEvents(text.trace_help);
  return caps;
}

Result<std::vector<std::string>> RunAsArgs(const QemuCaps& caps, const std::string& user) {
  if (caps.run_with_user) return std::vector<std::string>{"-run-with", "user=" + user};
  if (caps.HasOption("-runas")) return std::vector<std::string>{"-runas", user};
  return Error{caps.Describe() +
               " has neither -run-with user= nor -runas; hvtraced needs one for qemu_user "
               "(QEMU drops root); set qemu_user = root to run QEMU as root"};
}

Status CheckQemuArgv(const QemuCaps& caps, const std::vector<std::string>& argv,
                     const std::string& vm) {
  for (std::string_view device : kAlwaysRequiredDevices) {
    if (!caps.HasDevice(device)) {
      return Missing(caps, vm, "-device " + std::string(device), device);
    }
  }
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string option = argv[i];
    if (option.starts_with("--")) option.erase(0, 1);
    if (option.size() < 2 || option[0] != '-') {
      return Error{vm + "QEMU argument '" + argv[i] + "' is not an option"};
    }
    const auto it = caps.options.find(option);
    if (it == caps.options.end()) return Missing(caps, vm, "option " + option, option);
    const std::string* value = nullptr;
    if (it->second) {
      if (i + 1 >= argv.size()) return Error{vm + "QEMU option " + option + " has no value"};
      value = &argv[++i];
    }
    if (Status s = CheckOption(caps, option, value, vm); !s.ok()) return s;
  }
  return {};
}

Result<QemuCapsText> RunQemuCapsProbe(const std::string& binary,
                                      std::chrono::milliseconds deadline) {
  QemuCapsText text;
  const std::pair<std::vector<std::string>, std::string*> runs[] = {
      {{binary, "-version"}, &text.version},
      {{binary, "-help"}, &text.help},
      {{binary, "-device", "help"}, &text.device_help},
      {{binary, "-trace", "help"}, &text.trace_help},
  };
  for (const auto& [args, out] : runs) {
    std::string what = args[1] + (args.size() > 2 ? " " + args[2] : "");
    ChildOutput child = RunChildCapture(args, kMaxProbeOutput, deadline);
    if (!child.spawned) return Error{"cannot run " + binary + " " + what + ": " + child.error};
    if (child.timed_out) {
      return Error{binary + " " + what + " did not finish within " +
                   std::to_string(deadline.count()) + " ms"};
    }
    const int status = child.wait_status;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      const std::string why =
          WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "cannot be executed (exit status 127)"
          : WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                              : "was killed by signal " + std::to_string(WTERMSIG(status));
      return Error{binary + " " + what + " " + why};
    }
    *out = std::move(child.out);
  }
  return text;
}

namespace {

// The file exec would run for |binary|: as is when it holds a slash, else
// the first executable regular file of that name in PATH.
std::string ResolveBinary(const std::string& binary) {
  if (binary.find('/') != std::string::npos) return binary;
  const char* env = std::getenv("PATH");
  std::string_view path = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = path.find(':');
    std::string dir(path.substr(0, colon));
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + binary;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) return binary;
    path.remove_prefix(colon + 1);
  }
}

}  // namespace

Result<std::shared_ptr<const QemuCaps>> QemuCapsFor(const std::string& binary) {
  using Key = std::tuple<std::string, dev_t, ino_t, off_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const QemuCaps>> cache;
  const std::string resolved = ResolveBinary(binary);
  struct stat st {};
  if (::stat(resolved.c_str(), &st) != 0) {
    return Error{"QEMU binary " + binary + " not found (config qemu_binary)"};
  }
  char* real = ::realpath(resolved.c_str(), nullptr);
  const std::string real_path = real != nullptr ? real : resolved;
  std::free(real);
  const Key key{real_path, st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  // One probe at a time: two boots with one binary wait for one answer.
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  Result<QemuCapsText> text = RunQemuCapsProbe(resolved);
  if (!text.ok()) return text.error();
  auto caps = std::make_shared<const QemuCaps>(ParseQemuCaps(*text, binary));
  cache.emplace(key, caps);
  return std::shared_ptr<const QemuCaps>(caps);
}

}  // namespace hvtrace::hostd
