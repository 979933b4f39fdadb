// The folders of hostd/, shared/ and guest-agent/ are layers: a file may
// include headers of its own folder and of the folders listed for it below,
// nothing else. CMake enforces most of this already (a layer only sees the
// include paths of what it links); this test names the offending line when
// someone adds a link to make a backwards include compile.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = HVTRACE_SOURCE_DIR;

// Folder → folders it may include from (besides itself). Mirrors the
// target_link_libraries of hostd/CMakeLists.txt and shared/.
const std::map<std::string, std::set<std::string>>& AllowedIncludes() {
  static const std::set<std::string> kShared = {"shared/core", "shared/decode"};
  static const std::map<std::string, std::set<std::string>> kAllowed = [] {
    std::map<std::string, std::set<std::string>> m;
    m["shared/core"] = {};
    m["shared/dwtrace"] = {"shared/core"};
    m["shared/decode"] = {"shared/core"};
    m["guest-agent"] = {"shared/core", "shared/dwtrace"};
    auto hostd = [&](const std::string& layer, std::set<std::string> deps) {
      deps.insert(kShared.begin(), kShared.end());
      for (const std::string& d : std::set<std::string>(deps)) {
        if (d.rfind("hostd/", 0) == 0) {
          const auto& more = m.at(d);
          deps.insert(more.begin(), more.end());
        }
      }
      m["hostd/" + layer] = deps;
    };
    hostd("base", {});
    hostd("control", {"hostd/base"});
    hostd("fleet", {"hostd/base"});
    hostd("qemu", {"hostd/base"});
    hostd("libvirt", {"hostd/qemu"});
    hostd("formats", {"hostd/qemu"});
    hostd("capture", {"hostd/formats"});
    hostd("backend", {"hostd/capture", "hostd/libvirt"});
    hostd("daemon", {"hostd/backend", "hostd/control", "hostd/fleet"});
    hostd("cli", {"hostd/control", "hostd/capture", "hostd/libvirt", "hostd/fleet"});
    return m;
  }();
  return kAllowed;
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
