// hvtrace-agent's command line:
//
//   hvtrace-agent [--region PATH] [--tracefs DIR] [--instance NAME] [--sysfs DIR]
//                 [--keep-clock] [--run-for MS] [--meta-port PATH | --no-meta]
//                 [-v|--verbose] [-h|--help] [--version]
//
// Parsed with getopt_long (the agent is a static binary with no CLI library).
#ifndef HVTRACE_AGENT_AGENT_ARGS_H_
#define HVTRACE_AGENT_AGENT_ARGS_H_

#include <cstdio>
#include <optional>

#include "agent.h"

namespace hvtrace::agent {

// Fills |options| from |argv|. Returns the exit status when the agent is not
// to run: 0 after --help or --version (printed to |out|), 2 after a usage
// error (the usage printed to |err|).
std::optional<int> ParseAgentArgs(int argc, char** argv, AgentOptions* options,
                                  std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_AGENT_ARGS_H_
