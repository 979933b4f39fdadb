// The guest agent keeps to its own tracefs instance (instances/hvtrace) on a
// real guest (6.12, TCG), so a user's trace-cmd or perf in the guest keeps
// the top-level buffer to itself. The top level is set up as trace-cmd
// record would (trace_clock `local`, an event enabled, its own
// trace_marker line) before the attach and again while the agent streams;
// the agent's instance gets its own markers. Afterwards the top level still
// holds its lines and its clock, and `hvtrace stream` shows the instance's
// markers (task names, the guest's symbol) and none of the top level's.
// Then the agent is stopped and started again (as the initramfs agent
// hands over to the systemd unit): a marker written while no agent ran
// reaches the same region, and the top level is still untouched.
//
// trace-cmd itself is not in the busybox guest image; the shell writes the
// same files trace-cmd record writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

using test_support::MarkerLine;

constexpr const char* kTop = "/sys/kernel/tracing";
constexpr const char* kInstance = "/sys/kernel/tracing/instances/hvtrace";

// Runs |command| in the guest; its output, or "" and a failure.
std::string GuestOutput(TestGuest& guest, const std::string& command) {
  auto r = guest.Run(command);
  EXPECT_TRUE(r.ok() && r->status == 0) << command << ": " << (r.ok() ? r->output : "");
  return r.ok() ? r->output : "";
}

bool GuestLogHas(TestGuest& guest, const std::string& path, const std::string& needle) {
  return WaitUntil(
      [&] {
        auto r = guest.Run("grep -q '" + needle + "' " + path);
        return r.ok() && r->status == 0;
      },
      std::chrono::seconds(30));
}

// What trace-cmd record does to the top level (a clock write empties the
// buffer, so |set_clock| only the first time), plus a line of its own.
void UseTopLevelAsTraceCmd(TestGuest& guest, const std::string& mark, bool set_clock) {
  GuestOutput(guest, (set_clock ? std::string("echo local > ") + kTop + "/trace_clock && " : "") +
                         "echo 1 > " + kTop + "/events/sched/sched_process_exec/enable && echo " +
                         mark + " > " + kTop + "/trace_marker");
}

TEST(AgentInstanceE2e, TheTopLevelBufferStaysTheUsersWhileTheAgentStreamsAndRestarts) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK) != 0) {
    GTEST_SKIP() << "hvtrace-agent not built";
  }
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  const std::string tag = "agent-inst";
  TestGuest guest(tag);
  hostd::VmConfig config = guest.MakeConfig(*image);
  const std::string daemon_qmp = AddDaemonMonitor(config, tag);
  auto booted = guest.Boot(config);
  ASSERT_TRUE(booted.ok()) << booted.error().message << guest.Diagnostics();

  // The user's tracing is set up before the agent even starts.
  UseTopLevelAsTraceCmd(guest, "TOPLEVEL-MARK-1", true);
  const std::string cmdlines_size =
      GuestOutput(guest, std::string("cat ") + kTop + "/saved_cmdlines_size");
  ASSERT_EQ(guest.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)")->status, 0);

  HvtracedProcess hvt({.tag = tag});
  Status started = hvt.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = tag + "-" + std::to_string(::getpid());
  struct Cleanup {
    std::string path;
    ~Cleanup() { std::filesystem::remove(path); }
  } cleanup{hvt.dir() + "/run/mem/hvtrace-" + name + "-attach"};
  auto diag = [&] {
    auto a1 = guest.Run("cat /tmp/agent.log"), a2 = guest.Run("cat /tmp/agent2.log 2>/dev/null");
    return guest.Diagnostics() + "\n--- agent ---\n" + (a1.ok() ? a1->output : "?") +
           (a2.ok() ? a2->output : "") + "\n--- hvtraced ---\n" + hvt.LogTail();
  };
  auto attached =
      hvt.HvtraceJson({"attach", name, "--qmp", daemon_qmp, "--size", "16M", "--pump-ms", "50",
                       "--events", "sched:sched_switch", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << diag();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << diag();
  EXPECT_EQ((*attached)["guest"]["trace_clock"], "mono") << attached->dump(2);
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "symbols: ")) << "no symbols\n" << diag();

  StreamReader stream(hvt, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", std::chrono::seconds(10))) << stream.output();
  // While the agent streams: the user touches the top level again, then
  // a guest service writes into the agent's instance.
  UseTopLevelAsTraceCmd(guest, "TOPLEVEL-MARK-2", false);
  GuestOutput(guest, std::string("echo AGENT-MARK > ") + kInstance + "/trace_marker && echo " +
                         "TOPLEVEL-MARK-3 > " + kTop + "/trace_marker && echo AGENT-MARK-END > " +
                         kInstance + "/trace_marker");
  ASSERT_TRUE(stream.WaitForText("AGENT-MARK-END", std::chrono::seconds(60)))
      << "the instance's marker never reached the host\n"
      << stream.output() << diag();
  const std::string text = stream.text();
  const std::string agent_line = MarkerLine(text, "AGENT-MARK");
  std::printf("[agent-inst] stream: %s\n", agent_line.c_str());
  EXPECT_NE(agent_line.find("tracing_mark_write: AGENT-MARK"), std::string::npos) << agent_line;
  EXPECT_EQ(agent_line.find("<...>"), std::string::npos) << "the marker's task is unnamed";
  EXPECT_NE(agent_line.find("sh-"), std::string::npos) << "written by the guest's shell";
  EXPECT_NE(text.find("sched_switch:"), std::string::npos) << "the instance's kernel events";
  EXPECT_EQ(text.find("TOPLEVEL-MARK"), std::string::npos) << "a top-level line reached the host:\n"
                                                           << MarkerLine(text, "TOPLEVEL-MARK");
  EXPECT_EQ(text.find("sched_process_exec:"), std::string::npos)
      << "the top level's event reached the host";

  // The top level is as the user left it: its clock, its event, every line.
  const std::string top = GuestOutput(guest, std::string("cat ") + kTop + "/trace");
  for (const char* mark : {"TOPLEVEL-MARK-1", "TOPLEVEL-MARK-2", "TOPLEVEL-MARK-3"})
    EXPECT_NE(top.find(mark), std::string::npos) << mark << " gone from the top level:\n" << top;
  EXPECT_EQ(top.find("AGENT-MARK"), std::string::npos) << "an instance line in the top level";
  EXPECT_NE(GuestOutput(guest, std::string("cat ") + kTop + "/trace_clock").find("[local]"),
            std::string::npos);
  EXPECT_EQ(GuestOutput(guest, std::string("cat ") + kTop + "/events/sched/sched_switch/enable"),
            "0\n")
      << "the agent enabled its event at the top level";
  EXPECT_EQ(
      GuestOutput(guest, std::string("cat ") + kTop + "/events/sched/sched_process_exec/enable"),
      "1\n");
  EXPECT_NE(GuestOutput(guest, std::string("cat ") + kInstance + "/trace_clock").find("[mono]"),
            std::string::npos);
  // Global, and a resize would drop the names trace-cmd needs: left alone.
  EXPECT_EQ(GuestOutput(guest, std::string("cat ") + kTop + "/saved_cmdlines_size"), cmdlines_size);
  std::printf("[agent-inst] saved_cmdlines_size %s", cmdlines_size.c_str());
  std::printf("[agent-inst] top-level trace after the attach:\n%s",
              GuestOutput(guest, std::string("grep TOPLEVEL ") + kTop + "/trace").c_str());

  // The agent stops (SIGTERM, as systemd stops it), a line is written while
  // none runs, a new agent starts: the line reaches the same region.
  ASSERT_EQ(guest.Run("kill -TERM $(pidof hvtrace-agent)")->status, 0);
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent.log", "agent exit")) << diag();
  std::printf("[agent-inst] first agent:\n%s",
              GuestOutput(guest, "grep -v 'bus faults' /tmp/agent.log").c_str());
  GuestOutput(guest, std::string("echo AGENT-GAP > ") + kInstance + "/trace_marker");
  EXPECT_NE(GuestOutput(guest, std::string("cat ") + kInstance + "/trace").find("AGENT-GAP"),
            std::string::npos);
  ASSERT_EQ(guest.Run("(hvtrace-agent > /tmp/agent2.log 2>&1 &)")->status, 0);
  ASSERT_TRUE(GuestLogHas(guest, "/tmp/agent2.log", "attached ")) << diag();
  GuestOutput(guest, std::string("echo AGENT-AFTER > ") + kInstance + "/trace_marker");
  StreamReader again(hvt, name, {.from_start = true});
  ASSERT_TRUE(again.WaitForText("AGENT-AFTER", std::chrono::seconds(60)))
      << again.output() << diag();
  const std::string after = again.text();
  EXPECT_NE(after.find("AGENT-GAP"), std::string::npos)
      << "the line written between the two agents was lost\n"
      << after.substr(0, 4000);
  EXPECT_EQ(after.find("TOPLEVEL-MARK"), std::string::npos);
  const std::string agent2 = GuestOutput(guest, "cat /tmp/agent2.log");
  EXPECT_NE(agent2.find("took over 1 events"), std::string::npos) << agent2;
  std::printf("[agent-inst] second agent: %s[agent-inst] after the restart: %s\n", agent2.c_str(),
              MarkerLine(after, "AGENT-GAP").c_str());
  const std::string top2 = GuestOutput(guest, std::string("cat ") + kTop + "/trace");
  for (const char* mark : {"TOPLEVEL-MARK-1", "TOPLEVEL-MARK-2", "TOPLEVEL-MARK-3"})
    EXPECT_NE(top2.find(mark), std::string::npos) << mark << " gone after the restart";
  EXPECT_NE(GuestOutput(guest, std::string("cat ") + kTop + "/trace_clock").find("[local]"),
            std::string::npos);
  (void)guest.Run("kill $(pidof hvtrace-agent)");
}

}  // namespace
}  // namespace hvtrace::e2e
