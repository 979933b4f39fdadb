// hvtraced's log: one line on stderr per message, with a priority, which
// systemd's journal (or the test harness, or a terminal) collects.
//
// Priorities are syslog's (err 3 … debug 7). When stderr is the journal
// ($JOURNAL_STREAM names stderr's device:inode, as systemd sets it for
// StandardError=journal) a line is "<N>message", the sd-daemon(3) prefix the
// journal turns into the entry's PRIORITY= (`journalctl -p warning`); run by
// hand it is "hvtraced[PID]: LEVEL: message" as syslog would show it.
// Messages below the current level (SetLogLevel; config log_level, --verbose)
// are dropped. Control characters in a message (a guest's text among them)
// are escaped, so one call is always exactly one line.
#ifndef HVTRACE_HOSTD_DAEMON_LOG_H_
#define HVTRACE_HOSTD_DAEMON_LOG_H_

#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

enum class LogLevel : int { kErr = 3, kWarning = 4, kNotice = 5, kInfo = 6, kDebug = 7 };

std::string_view LogLevelName(LogLevel level);
// "err" (or "error"), "warning", "notice", "info", "debug".
Result<LogLevel> ParseLogLevel(std::string_view text);

enum class LogStyle { kJournal, kTerminal };

// The line Log writes, with its final '\n'.
std::string FormatLogLine(LogStyle style, LogLevel level, std::string_view message, long pid);

// Thread-safe. The default is kInfo.
void SetLogLevel(LogLevel level);
LogLevel CurrentLogLevel();
bool LogEnabled(LogLevel level);

// True when $JOURNAL_STREAM names the file stderr is (sd-daemon(3)).
bool StderrIsJournal();

// Writes the line with a single write(2), so lines from concurrent callers
// never interleave. Never fails (a closed stderr drops it).
void Log(LogLevel level, std::string_view message);

inline void LogErr(std::string_view m) { Log(LogLevel::kErr, m); }
inline void LogWarning(std::string_view m) { Log(LogLevel::kWarning, m); }
inline void LogNotice(std::string_view m) { Log(LogLevel::kNotice, m); }
inline void LogInfo(std::string_view m) { Log(LogLevel::kInfo, m); }
inline void LogDebug(std::string_view m) { Log(LogLevel::kDebug, m); }

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DAEMON_LOG_H_
