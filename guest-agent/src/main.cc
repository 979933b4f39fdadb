// hvtrace-agent: see agent.h; command line in agent_args.h. `hvtrace-agent
// boot-buffer ...` is a one-shot command for the guest's admin (boot_buffer.h).
#include <cstring>

#include "agent.h"
#include "agent_args.h"
#include "boot_buffer.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "boot-buffer") == 0) {
    return hvtrace::agent::RunBootBufferCommand(std::vector<std::string>(argv + 2, argv + argc), {},
                                                stdout, stderr);
  }
  hvtrace::agent::AgentOptions options;
  if (std::optional<int> status = hvtrace::agent::ParseAgentArgs(argc, argv, &options))
    return *status;
  hvtrace::agent::Agent agent(options);
  return agent.Run();
}
