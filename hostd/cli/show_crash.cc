#include "show_crash.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "boot_file_name.h"
#include "hvtrace/kernel_log.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A copied capture's log file is read back line by line; nothing longer.
constexpr uint64_t kMaxLogFileBytes = 256u << 20;

const json* Crash(const json& manifest) {
  if (!manifest.is_object()) return nullptr;
  auto it = manifest.find("crash");
  return it != manifest.end() && it->is_object() ? &*it : nullptr;
}

std::string Text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? PrintableLogText(it->get<std::string>()) : "";
}

std::string Number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? std::to_string(it->get<int64_t>()) : "?";
}

bool Flag(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

void Frames(const json& crash, std::string* out) {
  auto frames = crash.find("frames");
  if (frames == crash.end() || !frames->is_array() || frames->empty()) return;
  *out += "#   call trace (? unreliable):\n";
  std::string context = "TASK";
  for (const json& f : *frames) {
    if (!f.is_object()) continue;
    const std::string ctx = Text(f, "context");
    if (!ctx.empty() && ctx != context) {
      *out += "#     <" + ctx + ">\n";
      context = ctx;
    }
    std::string line =
        "#     " + std::string(Flag(f, "unreliable") ? "? " : "") + Text(f, "function");
    if (const std::string mod = Text(f, "module"); !mod.empty()) line += " [" + mod + "]";
    if (Flag(f, "symbolized")) line += "  (named from kallsyms)";
    *out += line + "\n";
  }
  if (crash.contains("frames_dropped")) {
    *out += "#     ... " + Number(crash, "frames_dropped") + " more frames\n";
  }
}

void EventsBefore(const json& crash, std::string* out) {
  auto events = crash.find("events_before");
  if (events == crash.end() || !events->is_array() || events->empty()) return;
  *out += "#   last " + std::to_string(events->size()) + " events of CPU " + Number(crash, "cpu") +
          " before it:\n";
  for (const json& e : *events) {
    if (e.is_object()) *out += "#   " + Text(e, "line") + "\n";
  }
}

}  // namespace

std::string CrashSummaryText(const json& manifest) {
  const json* crash = Crash(manifest);
  if (crash == nullptr) return std::string();
  const json& c = *crash;
  const std::string kind = Text(c, "kind");
  std::string out = "# crash (boot " + Number(c, "boot") + ", " + kind + "): ";
  out += kind == "panic" ? Text(c, "panic_line") : Text(c, "reason");
  out += "\n";
  std::string who =
      "#   task " + Text(c, "task") + ", pid " + Number(c, "pid") + ", CPU " + Number(c, "cpu");
  if (const std::string taint = Text(c, "taint"); !taint.empty()) who += "; " + taint;
  out += who + "\n";
  for (const auto& [key, label] : {std::pair{"bug_line", ""}, std::pair{"oops_line", ""},
                                   std::pair{"warning_line", ""}, std::pair{"rip", "RIP: "}}) {
    if (const std::string v = Text(c, key); !v.empty())
      out += "#   " + std::string(label) + v + "\n";
  }
  Frames(c, &out);
  EventsBefore(c, &out);
  if (auto log = c.find("log"); log != c.end() && log->is_object()) {
    out += "#   kernel log: " + Text(*log, "source") + ", " + Number(*log, "lines") + " lines, " +
           Number(*log, "lost") + " lost, " + Number(*log, "malformed") +
           " malformed (hvtrace show --log)\n";
  }
  return out;
}

std::string CrashSummaryJsonLine(const json& manifest) {
  const json* crash = Crash(manifest);
  if (crash == nullptr) return std::string();
  return json{{"crash", *crash}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string CrashReasonColumn(const json& summary, size_t width) {
  const json* crash = Crash(summary);
  if (crash == nullptr) return "-";
  std::string text = Text(*crash, "kind") + ": " + Text(*crash, "reason");
  if (text.size() > width) text = text.substr(0, width - 3) + "...";
  // Never end inside an escape or a UTF-8 sequence: cut bytes are escaped.
  return PrintableLogText(text);
}

int ShowKernelLogs(const fs::path& dir, std::optional<uint32_t> boot, int fd) {
  std::vector<std::pair<uint32_t, fs::path>> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (auto b = hostd::BootOfFileName(name, hostd::kBootKernelLogSuffix)) {
      if (!boot || *boot == *b) files.push_back({*b, it->path()});
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr,
                 "hvtrace show: %s holds no kernel log%s (the boot range recorded no "
                 "printk:console events)\n",
                 dir.c_str(), boot ? (" for boot " + std::to_string(*boot)).c_str() : "");
    return 1;
  }
  std::string out;
  for (const auto& [b, path] : files) {
    if (files.size() > 1) out += "# boot " + std::to_string(b) + "\n";
    std::ifstream in(path, std::ios::binary);
    std::string line;
    uint64_t bytes = 0;
    while (std::getline(in, line) && bytes <= kMaxLogFileBytes) {
      bytes += line.size() + 1;
      out += PrintableLogText(line);
      out.push_back('\n');
    }
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::fprintf(stderr, "hvtrace show: writing output: %s\n", std::strerror(errno));
      return 1;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace hvtrace::cli
