// hvtraced's command line: flags, config file, then the Daemon.
#include <signal.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <variant>

#include "daemon.h"
#include "daemon_log.h"

namespace hvtrace::hostd {

namespace {

// hvtraced's flags; each overrides its key of the config file.
struct DaemonArgs {
  std::string config_path{kDefaultConfigPath};
  bool config_given = false;
  bool check_only = false;
  bool verbose = false;
  std::optional<std::filesystem::path> state_dir, run_dir, socket;
};

// The flags, or the exit status when there is nothing to run: 0 after
// --help or --version (printed on stdout), 2 on bad usage (said on stderr).
std::variant<DaemonArgs, int> ParseArgs(int argc, char** argv) {
  DaemonArgs args;
  CLI::App app{
      "hvtraced: the hvtrace host daemon. SIGHUP re-reads the config file; keys that "
      "need a restart keep their value.",
      "hvtraced"};
  app.set_version_flag("--version", "hvtraced " + std::string(HvtraceVersion()));
  app.add_option("--config", args.config_path,
                 "config file (default " + args.config_path + "; absent = defaults)")
      ->type_name("FILE");
  std::string state_dir, run_dir, socket;
  app.add_option("--state-dir", state_dir, "captures and per-VM state (overrides state_dir)")
      ->type_name("DIR");
  app.add_option("--run-dir", run_dir, "socket and lock directory (overrides run_dir)")
      ->type_name("DIR");
  app.add_option("--socket", socket, "control socket (overrides socket)")->type_name("PATH");
  app.add_flag("-v,--verbose", args.verbose, "log at debug level (overrides log_level)");
  app.add_flag("--check-config", args.check_only,
               "print the effective configuration as JSON and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version.
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "hvtraced: %s\nRun `hvtraced --help` for usage.\n", e.what());
    return 2;
  }
  args.config_given = app.count("--config") > 0;
  const auto absolute = [](const std::string& v) -> std::optional<std::filesystem::path> {
    if (v.empty()) return std::nullopt;
    return std::filesystem::absolute(v);
  };
  args.state_dir = absolute(state_dir);
  args.run_dir = absolute(run_dir);
  args.socket = absolute(socket);
  return args;
}

}  // namespace

int DaemonMain(int argc, char** argv, CaptureFaults faults) {
  auto parsed = ParseArgs(argc, argv);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  const DaemonArgs args = std::get<DaemonArgs>(std::move(parsed));
  // The file over systemd's directories over the built-in defaults, then
  // the flags; a reload (SIGHUP) reads it again the same way.
  auto load = [args]() -> Result<Config> {
    auto config = LoadConfigFile(args.config_path, args.config_given, ServiceDefaults(std::getenv));
    if (!config.ok()) return config;
    if (args.state_dir) config->state_dir = *args.state_dir;
    if (args.run_dir) config->run_dir = *args.run_dir;
    if (args.socket) config->socket_path = *args.socket;
    if (args.verbose) config->log_level = LogLevel::kDebug;
    return config;
  };
  auto config = load();
  if (!config.ok()) {
    std::fprintf(stderr, "hvtraced: %s\n", config.error().message.c_str());
    return 1;
  }
  if (args.check_only) {
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
