// The hvtrace CLI's command table. Each command lives in its own file and
// registers here; main.cc only dispatches. To add a command (boot, attach,
// capture, show ...), write `int RunFoo(int argc, char** argv)` in foo.cc,
// declare it below and add a row to kCommands in main.cc.
#ifndef HVTRACE_HOSTD_CLI_COMMANDS_H_
#define HVTRACE_HOSTD_CLI_COMMANDS_H_

namespace hvtrace::cli {

struct Command {
  const char* name;
  const char* summary;  // One line for `hvtrace help`.
  // argv[0] is the command name. Returns the process exit status.
  int (*run)(int argc, char** argv);
};

int RunReport(int argc, char** argv);
// show_command.cc: a capture's (or a raw boot-range file's) events.
int RunShow(int argc, char** argv);
int RunFormats(int argc, char** argv);
// libvirt_commands.cc: libvirt domains (boot-range XML, shmem hot-plug).
int RunDomainXml(int argc, char** argv);
int RunLibvirtAttach(int argc, char** argv);
int RunLibvirtDetach(int argc, char** argv);
// `hvtrace adopt DOMAIN` (no --qmp): hvtraced serves a running libvirt domain.
int RunAdoptDomain(int argc, char** argv);
// daemon_commands.cc: talk to hvtraced over its control socket.
int RunPing(int argc, char** argv);
int RunList(int argc, char** argv);
int RunStatus(int argc, char** argv);
int RunCaptures(int argc, char** argv);
int RunDaemonShutdown(int argc, char** argv);
// vm_commands.cc: QEMU guests hvtraced boots or adopts.
int RunBoot(int argc, char** argv);
int RunQemuArgs(int argc, char** argv);
int RunAdopt(int argc, char** argv);
int RunCapture(int argc, char** argv);
int RunStop(int argc, char** argv);
// attach_commands.cc: attach mode (ivshmem region + guest agent).
int RunAttach(int argc, char** argv);
int RunDetach(int argc, char** argv);
int RunStream(int argc, char** argv);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_COMMANDS_H_
