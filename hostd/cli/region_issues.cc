// RegionIssueLines and CpuList (region_issues.h).
#include "region_issues.h"

#include <algorithm>

namespace hvtrace::cli {

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::string> RegionIssueLines(const nlohmann::json& issues) {
  std::vector<std::string> lines;
  std::vector<int> empty;
  if (!issues.is_array()) return lines;
  for (const nlohmann::json& i : issues) {
    if (!i.is_object()) continue;
    const auto text = [&](const char* key) {
      return i.contains(key) && i[key].is_string() ? i[key].get<std::string>() : std::string("?");
    };
    const int cpu = i.contains("cpu") && i["cpu"].is_number_integer() ? i["cpu"].get<int>() : -1;
    const std::string check = text("check");
    if (check == "empty" && cpu >= 0) {
      empty.push_back(cpu);
      continue;
    }
    lines.push_back("cpu " + std::to_string(cpu) + " " + check + ": " + text("message"));
  }
  if (!empty.empty()) {
    std::sort(empty.begin(), empty.end());
    empty.erase(std::unique(empty.begin(), empty.end()), empty.end());
    lines.push_back((empty.size() == 1 ? "cpu " : "cpus ") + CpuList(empty) +
                    ": never written (possible CPUs not online)");
  }
  return lines;
}

}  // namespace hvtrace::cli
