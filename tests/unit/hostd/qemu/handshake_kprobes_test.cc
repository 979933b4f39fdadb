// kHandshakeKprobeParam (the kernel command line's kprobe events) and
// qemu-scripts/guest/hvtrace-boot-probes (the initramfs's) define the same
// events the same way: the initramfs recognises the command line's events by
// their exact text in kprobe_events, and a harvest of the initramfs gives
// them the ids a VM booted with the parameter has.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "boot_request.h"

namespace hvtrace::hostd {
namespace {

std::string ScriptText() {
  std::ifstream in(std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/guest/hvtrace-boot-probes");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The script's definitions with BTF names, as it writes them to kprobe_events.
std::vector<std::string> ScriptDefinitions(const std::string& script) {
  std::smatch m;
  const std::regex idx_re("\nidx=' (index=[^']+)'");
  EXPECT_TRUE(std::regex_search(script, m, idx_re));
  const std::string idx = " " + m[1].str();
  std::string lidx = idx;
  lidx.replace(lidx.find("mdev->"), 6, "ldev->");
  const std::regex status_re("\nstatus_def='([^']+)'");
  EXPECT_TRUE(std::regex_search(script, m, status_re));
  const std::string status_def = m[1].str();
  // The here-document between "<<EOF" and "EOF".
  const size_t begin = script.find("<<EOF\n");
  const size_t end = script.find("\nEOF\n", begin);
  EXPECT_NE(begin, std::string::npos);
  EXPECT_NE(end, std::string::npos);
  std::vector<std::string> out;
  std::istringstream lines(script.substr(begin + 6, end - begin - 6));
  for (std::string line; std::getline(lines, line);) {
    for (auto [from, to] : {std::pair<std::string, std::string>{"$status_def", status_def},
                            {"$lidx", lidx},
                            {"$idx", idx},
                            {"\\$", "$"}}) {
      for (size_t at; (at = line.find(from)) != std::string::npos;)
        line.replace(at, from.size(), to);
    }
    out.push_back(line);
  }
  return out;
}

TEST(HandshakeKprobesTest, KernelParameterDefinesWhatTheInitramfsDefines) {
  const std::string script = ScriptText();
  ASSERT_FALSE(script.empty()) << "cannot read qemu-scripts/guest/hvtrace-boot-probes";
  const std::vector<std::string> from_script = ScriptDefinitions(script);
  ASSERT_EQ(from_script.size(), 5u);

  std::string param = kHandshakeKprobeParam;
  const std::string prefix = "kprobe_event=";
  ASSERT_EQ(param.rfind(prefix, 0), 0u);
  param = param.substr(prefix.size());
  EXPECT_EQ(param.find(' '), std::string::npos) << "one kernel parameter has no spaces";
  std::vector<std::string> from_param;
  std::istringstream defs(param);
  for (std::string def; std::getline(defs, def, ';');) {
    for (char& c : def) c = c == ',' ? ' ' : c;
    from_param.push_back(def);
  }
  EXPECT_EQ(from_param, from_script);
  // Within the kernel's command line buffer with room for the rest.
  EXPECT_LT(std::string(kHandshakeKprobeParam).size(), 1024u);
}

TEST(HandshakeKprobesTest, ProbesAreAtFunctionEntryOfUniqueSymbols) {
  // vp_set_status is static in both virtio_pci_modern.c and
  // virtio_pci_legacy.c: a kprobe on it is refused as ambiguous, and resets
  // bypass it. The exported transport functions see every write.
  const std::string param = kHandshakeKprobeParam;
  EXPECT_EQ(param.find(",vp_set_status,"), std::string::npos);
  for (const char* fn :
       {",vp_modern_set_status,", ",vp_legacy_set_status,", ",vp_modern_set_features,",
        ",vp_legacy_set_features,", ",vp_modern_set_queue_enable,"}) {
    EXPECT_NE(param.find(fn), std::string::npos) << fn;
  }
  EXPECT_EQ(param.find('+', param.find("vp_modern_set_status")),
            param.find("+0(mdev", param.find("vp_modern_set_status")))
      << "no offset into the function: the probe fires at its entry";
}

}  // namespace
}  // namespace hvtrace::hostd
