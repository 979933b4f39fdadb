// hvtraced's command line: flags, config file, then the Daemon.
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "daemon.h"
#include "daemon_log.h"

namespace hvtrace::hostd {

namespace {

int Usage(FILE* out) {
  std::fprintf(out,
               "usage: hvtraced [--config FILE] [--state-dir DIR] [--run-dir DIR] "
               "[--socket PATH] [--verbose] [--check-config]\n"
               "  --config FILE   config file (default %s; absent = defaults)\n"
               "  --state-dir DIR captures and per-VM state (overrides state_dir)\n"
               "  --run-dir DIR   socket and lock directory (overrides run_dir)\n"
               "  --socket PATH   control socket (overrides socket)\n"
               "  --verbose       log at debug level (overrides log_level)\n"
               "  --check-config  print the effective configuration as JSON and exit\n"
               "SIGHUP re-reads FILE; keys that need a restart keep their value.\n",
               std::string(kDefaultConfigPath).c_str());
  return out == stdout ? 0 : 2;
}

}  // namespace

int DaemonMain(int argc, char** argv, CaptureFaults faults) {
  std::string config_path(kDefaultConfigPath);
  bool config_given = false;
  bool check_only = false;
  bool verbose = false;
  std::optional<std::filesystem::path> state_dir, run_dir, socket;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hvtraced: %.*s needs a value\n", static_cast<int>(flag.size()),
                     flag.data());
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (arg == "--help" || arg == "-h") return Usage(stdout);
    if (arg == "--version") {
      std::printf("hvtraced %s\n", std::string(HvtraceVersion()).c_str());
      return 0;
    }
    if (arg == "--check-config") {
      check_only = true;
    } else if (arg == "--verbose" || arg == "-v") {
      verbose = true;
    } else if (arg == "--config") {
      if (!(v = value(arg))) return 2;
      config_path = v;
      config_given = true;
    } else if (arg == "--state-dir") {
      if (!(v = value(arg))) return 2;
      state_dir = std::filesystem::absolute(v);
    } else if (arg == "--run-dir") {
      if (!(v = value(arg))) return 2;
      run_dir = std::filesystem::absolute(v);
    } else if (arg == "--socket") {
      if (!(v = value(arg))) return 2;
      socket = std::filesystem::absolute(v);
    } else {
      std::fprintf(stderr, "hvtraced: unknown argument '%s'\n", argv[i]);
      return Usage(stderr);
    }
  }
  // The file over systemd's directories over the built-in defaults, then
  // the flags; a reload (SIGHUP) reads it again the same way.
  auto load = [=]() -> Result<Config> {
    auto config = LoadConfigFile(config_path, config_given, ServiceDefaults(std::getenv));
    if (!config.ok()) return config;
    if (state_dir) config->state_dir = *state_dir;
    if (run_dir) config->run_dir = *run_dir;
    if (socket) config->socket_path = *socket;
    if (verbose) config->log_level = LogLevel::kDebug;
    return config;
  };
  auto config = load();
  if (!config.ok()) {
    std::fprintf(stderr, "hvtraced: %s\n", config.error().message.c_str());
    return 1;
  }
  if (check_only) {
    std::printf("%s\n", ConfigJson(*config).dump(2).c_str());
    return 0;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // The modes hvtraced asks for (dirs 0750, captures 0640, private files
  // 0600) are what it gets, whatever umask the shell that started it had: a
  // 077 would hide captures from the observer group, a 0 would let QEMU make
  // world-readable files. Nothing it makes is for "other".
  ::umask(027);
  // Block the termination signals before the pool's threads exist, so only
  // the I/O thread (through signal_set) ever handles them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  SetLogLevel(config->log_level);
  Daemon daemon(std::move(*config), load);
  if (faults.after_copies_durable || faults.before_upload_queued)
    daemon.SetCaptureFaults(std::move(faults));
  // Unblocked once Start added them to its signal_sets: a SIGHUP that came
  // earlier waits (pending) instead of killing the daemon.
  if (Status s = daemon.Start(); !s.ok()) {
    LogErr(s.error().message);
    return 1;
  }
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  daemon.Run();
  return 0;
}

}  // namespace hvtrace::hostd
