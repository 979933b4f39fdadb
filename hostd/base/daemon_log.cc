#include "daemon_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace hvtrace::hostd {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

// Decided once: stderr does not change under a running daemon.
LogStyle Style() {
  static const LogStyle style = StderrIsJournal() ? LogStyle::kJournal : LogStyle::kTerminal;
  return style;
}

void AppendEscaped(std::string& out, std::string_view message) {
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kErr:
      return "err";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kNotice:
      return "notice";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

Result<LogLevel> ParseLogLevel(std::string_view text) {
  if (text == "err" || text == "error") return LogLevel::kErr;
  if (text == "warning") return LogLevel::kWarning;
  if (text == "notice") return LogLevel::kNotice;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  return Error{"'" + std::string(text) + "' is not one of err, warning, notice, info, debug"};
}

std::string FormatLogLine(LogStyle style, LogLevel level, std::string_view message, long pid) {
  std::string line;
  line.reserve(message.size() + 32);
  if (style == LogStyle::kJournal) {
    line += '<';
    line += std::to_string(static_cast<int>(level));
    line += '>';
  } else {
    line += "hvtraced[" + std::to_string(pid) + "]: ";
    line += LogLevelName(level);
    line += ": ";
  }
  AppendEscaped(line, message);
  line += '\n';
  return line;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(g_level.load()); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

bool StderrIsJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  if (env == nullptr || *env == '\0') return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(env, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev &&
         static_cast<unsigned long long>(st.st_ino) == ino;
}

void Log(LogLevel level, std::string_view message) {
  if (!LogEnabled(level)) return;
  const std::string line = FormatLogLine(Style(), level, message, static_cast<long>(::getpid()));
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace hvtrace::hostd
