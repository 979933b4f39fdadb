#include "config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "units.h"

namespace hvtrace::hostd {
namespace {

std::string_view Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

Result<int> ParseInt(std::string_view value, int min, int max) {
  int out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    return Error{"'" + std::string(value) + "' is not an integer"};
  }
  if (out < min || out > max) {
    return Error{std::to_string(out) + " is outside " + std::to_string(min) + ".." +
                 std::to_string(max)};
  }
  return out;
}

Result<std::filesystem::path> ParsePath(std::string_view value) {
  if (value.empty() || value.front() != '/') {
    return Error{"'" + std::string(value) + "' is not an absolute path"};
  }
  return std::filesystem::path(value);
}

}  // namespace

std::string_view PanicPolicyName(PanicPolicy policy) {
  switch (policy) {
    case PanicPolicy::kPause:
      return "pause";
    case PanicPolicy::kResume:
      return "resume";
    case PanicPolicy::kQuit:
      return "quit";
  }
  return "?";
}

std::string_view VmOnShutdownName(VmOnShutdown value) {
  return value == VmOnShutdown::kKeep ? "keep" : "stop";
}

std::string LogWatchName(const Config& config) {
  if (config.log_watch_oops && config.log_watch_warn) return "oops,warn";
  if (config.log_watch_oops) return "oops";
  return config.log_watch_warn ? "warn" : "off";
}

std::filesystem::path Config::EffectiveSocketPath() const {
  return socket_path.empty() ? run_dir / "hvtraced.sock" : socket_path;
}

namespace {

// The fleet upload's keys (docs/fleet.md); false for any other key.
Result<bool> ApplyUploadKey(Config& config, std::string_view key, std::string_view value) {
  if (key == "upload_endpoint") {
    // Checked in full when the uploader starts (s3_client.h); a scheme here.
    if (!value.empty() && !value.starts_with("http://") && !value.starts_with("https://")) {
      return Error{"'" + std::string(value) + "' must start with http:// or https://"};
    }
    config.upload_endpoint = std::string(value);
  } else if (key == "upload_bucket" || key == "upload_region" || key == "upload_prefix") {
    if (value.find_first_of(" \t") != std::string_view::npos) {
      return Error{"'" + std::string(value) + "' holds a space"};
    }
    (key == "upload_bucket"   ? config.upload_bucket
     : key == "upload_region" ? config.upload_region
                              : config.upload_prefix) = std::string(value);
  } else if (key == "upload_credentials") {
    auto path = ParsePath(value);
    if (!path.ok()) return path.error();
    config.upload_credentials = *path;
  } else if (key == "upload_retry_max") {
    auto d = ParseDuration(value);
    if (!d.ok()) return d.error();
    if (*d < std::chrono::seconds(1) || *d > std::chrono::hours(1)) {
      return Error{"must be between 1s and 1h"};
    }
    config.upload_retry_max = *d;
  } else {
    return false;
  }
  return true;
}

// The kernel log watch's keys (log_watch.h); false for any other key.
Result<bool> ApplyLogWatchKey(Config& config, std::string_view key, std::string_view value) {
  if (key == "log_watch") {
    bool oops = false, warn = false;
    for (size_t start = 0; value != "off" && start <= value.size();) {
      const size_t comma = std::min(value.find(',', start), value.size());
      const std::string_view item = value.substr(start, comma - start);
      if (item != "oops" && item != "warn") {
        return Error{"'" + std::string(item) + "' is not one of oops, warn (or the value off)"};
      }
      (item == "oops" ? oops : warn) = true;
      start = comma + 1;
    }
    config.log_watch_oops = oops;
    config.log_watch_warn = warn;
  } else if (key == "log_watch_interval") {
    auto d = ParseDuration(value);
    if (!d.ok()) return d.error();
    if (*d < std::chrono::milliseconds(100) || *d > std::chrono::hours(1)) {
      return Error{"must be between 100ms and 1h"};
    }
    config.log_watch_interval = *d;
  } else {
    return false;
  }
  return true;
}

// Sets |key| in |config| from |value|: false for a key that does not exist,
// an error (without the key) for a value it cannot take.
Result<bool> ApplyKey(Config& config, std::string_view key, std::string_view value) {
  if (key.starts_with("upload_")) return ApplyUploadKey(config, key, value);
  if (key.starts_with("log_watch")) return ApplyLogWatchKey(config, key, value);
  if (key == "harvest_initrd") {
    auto path = ParsePath(value);
    if (!path.ok()) return path.error();
    config.harvest_initrd = *path;
  } else if (key == "state_dir" || key == "run_dir" || key == "socket" || key == "cache_dir") {
    auto path = ParsePath(value);
    if (!path.ok()) return path.error();
    (key == "state_dir"   ? config.state_dir
     : key == "run_dir"   ? config.run_dir
     : key == "cache_dir" ? config.cache_dir
                          : config.socket_path) = *path;
  } else if (key == "socket_group") {
    config.socket_group = std::string(value);
  } else if (key == "admin_group") {
    config.admin_group = std::string(value);
  } else if (key == "capture_retention") {
    auto n = ParseInt(value, 0, 1000000);
    if (!n.ok()) return n.error();
    config.capture_retention = *n;
  } else if (key == "capture_bytes_per_vm" || key == "capture_bytes_total" ||
             key == "capture_free_reserve" || key == "console_log_size") {
    auto n = ParseSize(value);
    if (!n.ok()) return n.error();
    if (key == "console_log_size" && *n < 4096) return Error{"must be at least 4096"};
    (key == "capture_bytes_per_vm"  ? config.capture_bytes_per_vm
     : key == "capture_bytes_total" ? config.capture_bytes_total
     : key == "console_log_size"    ? config.console_log_size
                                    : config.capture_free_reserve) = *n;
  } else if (key == "console_log_files") {
    auto n = ParseInt(value, 1, 100);
    if (!n.ok()) return n.error();
    config.console_log_files = *n;
  } else if (key == "guest_capture_interval") {
    auto d = ParseDuration(value);
    if (!d.ok()) return d.error();
    if (*d > std::chrono::hours(24)) return Error{"must be at most 24h"};
    config.guest_capture_interval = *d;
  } else if (key == "panic_policy") {
    if (value == "pause") {
      config.panic_policy = PanicPolicy::kPause;
    } else if (value == "resume") {
      config.panic_policy = PanicPolicy::kResume;
    } else if (value == "quit") {
      config.panic_policy = PanicPolicy::kQuit;
    } else {
      return Error{"'" + std::string(value) + "' is not one of pause, resume, quit"};
    }
  } else if (key == "vmcore") {
    if (value != "off" && value != "on-panic") {
      return Error{"'" + std::string(value) + "' is not one of off, on-panic"};
    }
    config.vmcore_on_panic = value == "on-panic";
  } else if (key == "accel") {
    if (value != "auto" && value != "tcg" && value != "kvm") {
      return Error{"'" + std::string(value) + "' is not one of auto, tcg, kvm"};
    }
    config.accel = std::string(value);
  } else if (key == "vm_on_shutdown") {
    if (value == "keep") {
      config.vm_on_shutdown = VmOnShutdown::kKeep;
    } else if (value == "stop") {
      config.vm_on_shutdown = VmOnShutdown::kStop;
    } else {
      return Error{"'" + std::string(value) + "' is not one of keep, stop"};
    }
  } else if (key == "worker_threads") {
    auto n = ParseInt(value, 1, 64);
    if (!n.ok()) return n.error();
    config.worker_threads = *n;
  } else if (key == "max_connections") {
    auto n = ParseInt(value, 1, 4096);
    if (!n.ok()) return n.error();
    config.max_connections = *n;
  } else if (key == "max_requests_per_connection") {
    auto n = ParseInt(value, 1, 1024);
    if (!n.ok()) return n.error();
    config.max_requests_per_connection = *n;
  } else if (key == "log_level") {
    auto level = ParseLogLevel(value);
    if (!level.ok()) return level.error();
    config.log_level = *level;
  } else if (key == "qemu_sandbox") {
    if (value != "on" && value != "off") {
      return Error{"'" + std::string(value) + "' is not one of on, off"};
    }
    config.qemu_sandbox = value == "on";
  } else if (key == "qemu_user") {
    // A user name QEMU (-run-with user= or -runas) resolves when the VM
    // boots (checked then, so a user created later needs no restart); empty:
    // the default user (qemu_user.h); "root": none.
    if (value.find_first_of(" \t,=/:") != std::string_view::npos) {
      return Error{"'" + std::string(value) + "' is not a user name"};
    }
    config.qemu_user = std::string(value);
  } else if (key == "qemu_binary") {
    // Probed when a VM boots (qemu_caps.h), so a QEMU installed later needs
    // no restart.
    if (value.empty() || value.find_first_of(" \t") != std::string_view::npos) {
      return Error{"'" + std::string(value) + "' is not a program name or path"};
    }
    config.qemu_binary = std::string(value);
  } else if (key == "libvirt_uri") {
    // Any URI libvirt accepts; it is checked when the daemon connects, and
    // a libvirtd that is down then is retried, not fatal.
    config.libvirt_uri = std::string(value);
  } else if (key == "libvirt_qemu_log_dir") {
    Result<std::filesystem::path> p = ParsePath(value);
    if (!p.ok()) return p.error();
    config.libvirt_qemu_log_dir = *p;
  } else {
    return false;
  }
  return true;
}

}  // namespace

Result<Config> ParseConfig(std::string_view text, std::string_view origin, Config base) {
  Config config = std::move(base);
  std::set<std::string, std::less<>> seen;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    std::string where = std::string(origin) + ":" + std::to_string(line_no) + ": ";
    std::string_view line = Trim(raw);
    if (line.empty() || line.front() == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) return Error{where + "expected 'key = value'"};
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (key.empty()) return Error{where + "missing key before '='"};
    if (!seen.insert(std::string(key)).second) {
      return Error{where + "'" + std::string(key) + "' is set twice"};
    }
    Result<bool> known = ApplyKey(config, key, value);
    if (!known.ok()) return Error{where + std::string(key) + ": " + known.error().message};
    if (!*known) return Error{where + "unknown key '" + std::string(key) + "'"};
  }
  return config;
}

Result<Config> LoadConfigFile(const std::filesystem::path& path, bool must_exist, Config base) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    if (err == ENOENT && !must_exist) return base;
    return Error{"cannot open config " + path.string() + ": " + std::strerror(err)};
  }
  // Bounded like every file hvtraced reads (a config is a few hundred
  // bytes), but not through ReadCappedFile: root's config may be a symlink
  // (configuration management), which that refuses.
  constexpr size_t kMaxConfigBytes = 1u << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return Error{"cannot read config " + path.string()};
  if (static_cast<size_t>(in.gcount()) > kMaxConfigBytes) {
    return Error{"config " + path.string() + " is larger than 1 MiB"};
  }
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseConfig(text, path.string(), std::move(base));
}

Config ServiceDefaults(const std::function<const char*(const char*)>& getenv) {
  Config config;
  auto first = [&](const char* name) -> std::filesystem::path {
    const char* v = getenv(name);
    if (v == nullptr) return {};
    std::string_view s(v);
    s = s.substr(0, s.find(':'));
    if (s.empty() || s.front() != '/') return {};
    return std::filesystem::path(s);
  };
  if (auto p = first("STATE_DIRECTORY"); !p.empty()) config.state_dir = p;
  if (auto p = first("RUNTIME_DIRECTORY"); !p.empty()) config.run_dir = p;
  if (auto p = first("CACHE_DIRECTORY"); !p.empty()) config.cache_dir = p;
  return config;
}

std::filesystem::path ResolveClientSocket(std::string_view flag) {
  if (!flag.empty()) return std::filesystem::path(flag);
  if (const char* env = std::getenv(std::string(kSocketEnvVar).c_str()); env && *env) {
    return env;
  }
  auto config = LoadConfigFile(std::string(kDefaultConfigPath), false);
  if (config.ok()) return config->EffectiveSocketPath();
  return Config{}.EffectiveSocketPath();
}

}  // namespace hvtrace::hostd
