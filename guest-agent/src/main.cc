// hvtrace-agent: see agent.h; command line in agent_args.h.
#include "agent.h"
#include "agent_args.h"

int main(int argc, char** argv) {
  hvtrace::agent::AgentOptions options;
  if (std::optional<int> status = hvtrace::agent::ParseAgentArgs(argc, argv, &options))
    return *status;
  hvtrace::agent::Agent agent(options);
  return agent.Run();
}
