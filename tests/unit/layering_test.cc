// The folders of hostd/, shared/ and guest-agent/ are layers: a file may
// include headers of its own folder and of the folders below it, nothing
// else. CMake enforces most of this already (a layer only sees the include
// paths of what it links); this test names the offending line, and for hostd
// reads the graph from CMake itself (hostd-layers.txt), so a link added to
// make a backwards include compile shows up as a cycle or an unknown layer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = HVTRACE_SOURCE_DIR;

// hostd's layers as hostd/CMakeLists.txt links them: "hostd/X hostd/Y ..."
// per line (hostd-layers.txt in the build tree), the one statement of that
// graph. Each layer may also include from the layers below those it links.
std::map<std::string, std::set<std::string>> HostdLayersFromCMake() {
  std::map<std::string, std::set<std::string>> direct;
  std::vector<std::string> order;  // As CMake defined them: lower ones first.
  std::ifstream in(HVTRACE_LAYER_GRAPH);
  EXPECT_TRUE(in.good()) << "cannot read " << HVTRACE_LAYER_GRAPH;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string layer, dep;
    if (!(words >> layer)) continue;
    order.push_back(layer);
    while (words >> dep) direct[layer].insert(dep);
  }
  std::map<std::string, std::set<std::string>> closed;
  for (const std::string& layer : order) {
    std::set<std::string> deps = direct[layer];
    for (const std::string& d : direct[layer]) {
      EXPECT_TRUE(closed.count(d)) << layer << " links " << d << ", defined after it";
      deps.insert(closed[d].begin(), closed[d].end());
    }
    closed[layer] = deps;
  }
  return closed;
}

// Folder → folders it may include from (besides itself). shared/ and the
// agent here; hostd from its CMake (above).
const std::map<std::string, std::set<std::string>>& AllowedIncludes() {
  static const std::map<std::string, std::set<std::string>> kAllowed = [] {
    std::map<std::string, std::set<std::string>> m;
    m["shared/core"] = {};
    m["shared/dwtrace"] = {"shared/core"};
    m["shared/decode"] = {"shared/core"};
    m["guest-agent"] = {"shared/core", "shared/dwtrace"};
    for (auto& [layer, deps] : HostdLayersFromCMake()) {
      m[layer] = deps;
      m[layer].insert({"shared/core", "shared/decode"});
    }
    return m;
  }();
  return kAllowed;
}

// The layers hostd must have: a graph file that lost some would pass
// everything above by knowing nothing.
TEST(Layering, HostdGraphComesFromCMake) {
  for (const char* layer :
       {"hostd/base", "hostd/formats", "hostd/store", "hostd/meta", "hostd/timeline", "hostd/vm",
        "hostd/decode", "hostd/capture", "hostd/backend", "hostd/daemon", "hostd/cli"}) {
    EXPECT_TRUE(AllowedIncludes().count(layer))
        << layer << " is missing from " << HVTRACE_LAYER_GRAPH;
  }
  EXPECT_TRUE(AllowedIncludes().at("hostd/capture").count("hostd/decode"));
  EXPECT_FALSE(AllowedIncludes().at("hostd/decode").count("hostd/capture"));
}

bool IsSource(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cc" || ext == ".h" || ext == ".hpp";
}

// The layer folder a file belongs to ("hostd/daemon", "shared/core", …).
std::string LayerOf(const fs::path& file) {
  const fs::path rel = fs::relative(file, kRoot);
  auto it = rel.begin();
  const std::string top = it->string();
  if (top == "guest-agent") return top;
  ++it;
  return it == rel.end() ? top : top + "/" + it->string();
}

struct Project {
  std::vector<fs::path> sources;
  std::multimap<std::string, std::string> header_layers;  // "x.h" or "hvtrace/x.h" → layer
};

Project Scan() {
  Project p;
  for (const char* top : {"hostd", "shared", "guest-agent"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / top)) {
      if (!e.is_regular_file() || !IsSource(e.path())) continue;
      p.sources.push_back(e.path());
      const std::string layer = LayerOf(e.path());
      const std::string parent = e.path().parent_path().filename().string();
      const std::string name = e.path().filename().string();
      p.header_layers.emplace(parent == "hvtrace" ? "hvtrace/" + name : name, layer);
    }
  }
  return p;
}

TEST(Layering, EveryFolderIsAKnownLayer) {
  const Project p = Scan();
  ASSERT_FALSE(p.sources.empty());
  for (const fs::path& f : p.sources) {
    EXPECT_TRUE(AllowedIncludes().count(LayerOf(f)))
        << f << " is in folder " << LayerOf(f) << ", which is not a layer this test knows";
  }
}

TEST(Layering, IncludesPointDownOnly) {
  const Project p = Scan();
  const std::regex include_re(R"(^\s*#\s*include\s*"([^"]+)\")");
  int checked = 0;
  for (const fs::path& f : p.sources) {
    const std::string layer = LayerOf(f);
    auto allowed = AllowedIncludes().find(layer);
    if (allowed == AllowedIncludes().end()) continue;
    std::ifstream in(f);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const std::string header = m[1];
      auto [lo, hi] = p.header_layers.equal_range(header);
      if (lo == hi) continue;  // A header of another project (gtest, …) or generated.
      std::set<std::string> owners;
      for (auto it = lo; it != hi; ++it) owners.insert(it->second);
      EXPECT_EQ(owners.size(), 1u) << "header name " << header << " exists in several folders; "
                                   << "includes of it are ambiguous";
      const std::string& owner = *owners.begin();
      ++checked;
      EXPECT_TRUE(owner == layer || allowed->second.count(owner))
          << fs::relative(f, kRoot).string() << ":" << n << " includes " << header << " from "
          << owner << ", which " << layer << " may not use (it would point up or sideways)";
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
