#include "agent_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace hvtrace::agent {
namespace {

using ::testing::HasSubstr;

// Runs ParseAgentArgs on "hvtrace-agent |args|..." and keeps what it printed.
class AgentArgsTest : public ::testing::Test {
 protected:
  std::optional<int> Parse(std::vector<std::string> args) {
    static char program[] = "hvtrace-agent";
    std::vector<char*> argv = {program};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::FILE* out = std::tmpfile();
    std::FILE* err = std::tmpfile();
    std::optional<int> status =
        ParseAgentArgs(static_cast<int>(argv.size() - 1), argv.data(), &options_, out, err);
    out_ = Read(out);
    err_ = Read(err);
    return status;
  }

  static std::string Read(std::FILE* f) {
    std::string text;
    std::rewind(f);
    for (int c; (c = std::fgetc(f)) != EOF;) text.push_back(static_cast<char>(c));
    std::fclose(f);
    return text;
  }

  AgentOptions options_;
  std::string out_, err_;
};

TEST_F(AgentArgsTest, NoArgumentsKeepTheDefaults) {
  EXPECT_EQ(Parse({}), std::nullopt);
  const AgentOptions defaults;
  EXPECT_EQ(options_.region_path, defaults.region_path);
  EXPECT_EQ(options_.tracefs, defaults.tracefs);
  EXPECT_EQ(options_.instance, "hvtrace");
  EXPECT_EQ(options_.sysfs_pci_devices, defaults.sysfs_pci_devices);
  EXPECT_TRUE(options_.set_mono_clock);
  EXPECT_EQ(options_.run_for_ms, 0u);
  EXPECT_FALSE(options_.verbose);
  EXPECT_TRUE(options_.meta.enabled);
  EXPECT_EQ(options_.meta.port, "");  // Found: sysfs name or the udev link.
}

TEST_F(AgentArgsTest, MetaPortAndNoMeta) {
  EXPECT_EQ(Parse({"--meta-port", "/dev/vport1p1"}), std::nullopt);
  EXPECT_EQ(options_.meta.port, "/dev/vport1p1");
  EXPECT_TRUE(options_.meta.enabled);
  EXPECT_EQ(Parse({"--no-meta"}), std::nullopt);
  EXPECT_FALSE(options_.meta.enabled);
  EXPECT_EQ(Parse({"--meta-port"}), 2);
  EXPECT_THAT(err_, HasSubstr("missing value for --meta-port"));
}

TEST_F(AgentArgsTest, LeaveWaitIsBoundedAndZeroTurnsItOff) {
  EXPECT_EQ(Parse({}), std::nullopt);
  EXPECT_EQ(options_.meta.leave_wait_ms, 2000u);
  EXPECT_EQ(Parse({"--leave-wait", "0"}), std::nullopt);
  EXPECT_EQ(options_.meta.leave_wait_ms, 0u);
  EXPECT_EQ(Parse({"--leave-wait", "60000"}), std::nullopt);
  EXPECT_EQ(options_.meta.leave_wait_ms, 60000u);
  // A guest admin cannot make the host believe the agent waits for ever.
  EXPECT_EQ(Parse({"--leave-wait", "60001"}), 2);
  EXPECT_THAT(err_, HasSubstr("--leave-wait takes milliseconds up to 60000"));
}

TEST_F(AgentArgsTest, EveryOptionAsTheTestsAndScriptsSpellIt) {
  EXPECT_EQ(Parse({"--region", "/tmp/r", "--tracefs", "/t", "--instance", "mine", "--sysfs", "/s",
                   "--keep-clock", "--run-for", "250", "-v"}),
            std::nullopt);
  EXPECT_EQ(options_.region_path, "/tmp/r");
  EXPECT_EQ(options_.tracefs, "/t");
  EXPECT_EQ(options_.instance, "mine");
  EXPECT_EQ(options_.sysfs_pci_devices, "/s");
  EXPECT_FALSE(options_.set_mono_clock);
  EXPECT_EQ(options_.run_for_ms, 250u);
  EXPECT_TRUE(options_.verbose);
  EXPECT_EQ(err_, "");
}

TEST_F(AgentArgsTest, LongOptionsTakeEqualsAndVerboseHasALongName) {
  EXPECT_EQ(Parse({"--region=/tmp/x", "--verbose"}), std::nullopt);
  EXPECT_EQ(options_.region_path, "/tmp/x");
  EXPECT_TRUE(options_.verbose);
}

TEST_F(AgentArgsTest, HelpAndVersionPrintAndExitZero) {
  EXPECT_EQ(Parse({"--help"}), 0);
  EXPECT_THAT(out_, HasSubstr("usage: hvtrace-agent"));
  EXPECT_EQ(Parse({"-h"}), 0);
  EXPECT_THAT(out_, HasSubstr("--run-for MS"));
  EXPECT_EQ(Parse({"--version"}), 0);
  EXPECT_THAT(out_, ::testing::MatchesRegex("hvtrace-agent [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

TEST_F(AgentArgsTest, UsageErrorsExitTwoAndSayWhat) {
  EXPECT_EQ(Parse({"--bogus"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown option --bogus"));
  EXPECT_THAT(err_, HasSubstr("usage: hvtrace-agent"));
  EXPECT_EQ(Parse({"-vx"}), 2);
  EXPECT_THAT(err_, HasSubstr("unknown option -x"));
  EXPECT_EQ(Parse({"--region"}), 2);
  EXPECT_THAT(err_, HasSubstr("missing value for --region"));
  EXPECT_EQ(Parse({"--run-for", "10s"}), 2);
  EXPECT_THAT(err_, HasSubstr("--run-for takes milliseconds"));
  EXPECT_EQ(Parse({"--run-for", "-1"}), 2);
  // The test tools are not the agent's any more (tests/guest/).
  EXPECT_EQ(Parse({"scribble", "all"}), 2);
  EXPECT_THAT(err_, HasSubstr("unexpected argument scribble"));
}

}  // namespace
}  // namespace hvtrace::agent
