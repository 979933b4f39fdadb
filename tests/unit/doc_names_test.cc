// docs/architecture.md walks the data paths through the tree by name; a
// name that no longer exists there misleads the next reader (it named
// DoCapture and LiveRegion::Snapshot long after both were gone). Every
// `quoted` path in the doc must exist, and every `quoted` C++ name
// (CamelCase, or Type::Member) must be declared or defined somewhere in
// hostd/, shared/ or guest-agent/.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = HVTRACE_SOURCE_DIR;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The `quoted` spans of |doc|, outside ``` blocks.
std::vector<std::string> QuotedNames(const std::string& doc) {
  std::vector<std::string> names;
  std::istringstream lines(doc);
  bool in_block = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    if (in_block) continue;
    static const std::regex kQuoted("`([^`]+)`");
    for (std::sregex_iterator it(line.begin(), line.end(), kQuoted), end; it != end; ++it) {
      names.push_back((*it)[1]);
    }
  }
  return names;
}

// "shared/{core,dwtrace}" -> "shared/core", "shared/dwtrace" (one brace group).
std::vector<std::string> ExpandBraces(const std::string& path) {
  const size_t open = path.find('{'), close = path.find('}');
  if (open == std::string::npos || close == std::string::npos || close < open) return {path};
  std::vector<std::string> out;
  std::istringstream alternatives(path.substr(open + 1, close - open - 1));
  for (std::string alt; std::getline(alternatives, alt, ',');) {
    out.push_back(path.substr(0, open) + alt + path.substr(close + 1));
  }
  return out;
}

// One source file of the three product folders: its text and its words.
struct Source {
  std::string text;
  std::set<std::string> words;
};

// |text| without its // comments: a name a comment mentions (a stale one
// too) is not declared by it.
std::string WithoutComments(const std::string& text) {
  std::string code;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    code += line.substr(0, line.find("//"));
    code += '\n';
  }
  return code;
}

const std::vector<Source>& ProductSources() {
  static const std::vector<Source> all = [] {
    std::vector<Source> sources;
    for (const char* dir : {"hostd", "shared", "guest-agent"}) {
      for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
        const std::string ext = e.path().extension().string();
        if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
        Source source{WithoutComments(ReadAll(e.path())), {}};
        std::string word;
        for (char c : source.text + ' ') {
          if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
            word += c;
          } else if (!word.empty()) {
            source.words.insert(std::move(word));
            word.clear();
          }
        }
        sources.push_back(std::move(source));
      }
    }
    return sources;
  }();
  return all;
}

// Whether |text| declares class or struct |type| (not one whose name only
// starts with it).
bool DeclaresType(const std::string& text, const std::string& type) {
  for (const char* kind : {"class ", "struct "}) {
    const std::string decl = kind + type;
    for (size_t at = text.find(decl); at != std::string::npos; at = text.find(decl, at + 1)) {
      const size_t end = at + decl.size();
      if (end == text.size() ||
          !(std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
        return true;
      }
    }
  }
  return false;
}

// Name: an identifier of the sources. Type::Member: defined as such
// somewhere (Type::Member in a .cc), or a member of that name in a file that
// declares the type; both words existing apart is not enough
// (LiveRegion::Snapshot passed that way long after Snapshot was gone).
bool DefinedInSources(const std::string& name) {
  const size_t colons = name.find("::");
  for (const Source& source : ProductSources()) {
    if (colons == std::string::npos) {
      if (source.words.contains(name)) return true;
    } else if (source.text.find(name) != std::string::npos ||
               (source.words.contains(name.substr(colons + 2)) &&
                DeclaresType(source.text, name.substr(0, colons)))) {
      return true;
    }
  }
  return false;
}

TEST(DocNamesTest, ArchitectureNamesExistInTheTree) {
  const std::string doc = ReadAll(kRoot / "docs/architecture.md");
  ASSERT_FALSE(doc.empty());
  static const std::regex kPath(
      "^(hostd|shared|guest-agent|tests|docs|bench|scripts|qemu-scripts|"
      "debian)/[A-Za-z0-9_./{},-]*$");
  static const std::regex kFile("^[a-z0-9_]+\\.(cc|h)$");
  static const std::regex kCxxName("^([A-Z][A-Za-z0-9]*::)?[A-Z][a-z][A-Za-z0-9]*$");
  std::set<std::string> missing;
  size_t checked = 0;
  for (const std::string& name : QuotedNames(doc)) {
    if (std::regex_match(name, kPath)) {
      for (const std::string& path : ExpandBraces(name)) {
        ++checked;
        if (!fs::exists(kRoot / path)) missing.insert(path + " (no such path)");
      }
    } else if (std::regex_match(name, kFile)) {
      ++checked;
      bool found = false;
      for (const char* dir : {"hostd", "shared", "guest-agent"}) {
        for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
          found = found || e.path().filename() == name;
        }
      }
      if (!found) missing.insert(name + " (no such file)");
    } else if (std::regex_match(name, kCxxName)) {
      ++checked;
      if (!DefinedInSources(name)) missing.insert(name + " (named nowhere in the sources)");
    }
  }
  EXPECT_GT(checked, 20u) << "the doc names fewer things than it walks through";
  for (const std::string& m : missing) ADD_FAILURE() << "docs/architecture.md: " << m;
}

}  // namespace
