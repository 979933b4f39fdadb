// What `hvtrace show --region` says about a region's validation issues: one
// line per issue, except for CPUs whose meta was never written (head_buffer
// 0), which are possible CPUs that never came online on a guest started with
// more possible than present CPUs (-smp 2,maxcpus=8): those get one quiet
// summary line, since nothing is lost. The manifest keeps every issue.
#ifndef HVTRACE_HOSTD_CLI_REGION_ISSUES_H_
#define HVTRACE_HOSTD_CLI_REGION_ISSUES_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hvtrace::cli {

// |issues|: the capture validation's "issues" array ({cpu, check, message}).
std::vector<std::string> RegionIssueLines(const nlohmann::json& issues);

// "2-7", "1,3,5-6": a sorted CPU list in short form.
std::string CpuList(const std::vector<int>& cpus);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_REGION_ISSUES_H_
