// Task names as they were at the time, end to end: a real 6.12 guest under
// TCG, booted by hvtraced with a boot range and the default boot events
// (sched_switch, sched_wakeup, sched_process_fork/exec/exit, task_rename),
// runs a busybox workload of short-lived processes (the shell forks, the
// children exec cp, ls, cat, tar, sleep; a `sh -c` renames itself through
// /proc/self/comm), then panics. From `hvtrace show --json` of the panic
// capture: every event of a task (pid != 0) is compared with the name the
// kernel recorded for the task next on that CPU: the oldcomm of a
// task_rename by the task itself (exec renames too) when one comes before
// the task is switched out, else the next sched_switch's prev_comm. show must
// agree for >= 99% of them. Printed, not asserted: the same figure for
// `trace-cmd report` on the capture's trace.dat (one name per pid: the name
// covering most of its events) and for the old first-name-wins table
// (libtraceevent's sched plugin, as before), and all three against the next
// switch's prev_comm alone. The capture's region.bin, padded with zeros past
// the range (as a whole backing file or a padded copy would be), decodes
// with `hvtrace show --region` to the same events.
// A second case boots without task:task_rename: then nothing records the
// renames of busybox's forked applets (prctl(PR_SET_NAME)) or the /proc
// write, and show names a task's events between two statements that
// disagree by the later one (an exec splits). The reference is the next
// switch's prev_comm, except that events before the task's own exec in the
// same run take the name the task was switched in under (the kernel's comm
// up to the exec), and the exec event itself the name the exec gave. Both
// cases print show's agreement and the events the capture's manifest says
// were named by inference; both run on the 6.12 and the 7.3 guest.
// One guest boot per case.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "boot_request.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "task_name_agreement.h"
#include "test_support.h"
#include "trace_text.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

// What trace-cmd printed before this change: libtraceevent's sched plugin
// registers prev/next comm (sched_switch) and comm (sched_wakeup) after the
// event's own prefix is printed, and keeps the first name of each pid.
std::vector<std::string> FirstNameWins(const std::vector<Event>& events) {
  std::map<int, std::string> table;
  std::vector<std::string> out;
  for (const Event& e : events) {
    auto it = table.find(e.pid);
    out.push_back(it == table.end() ? "<...>" : it->second);
    auto reg = [&](const char* comm, const char* pid) {
      if (e.fields.contains(comm) && e.fields.contains(pid))
        table.try_emplace(e.fields[pid].get<int>(), e.fields[comm].get<std::string>());
    };
    if (e.name == "sched_switch") {
      reg("prev_comm", "prev_pid");
      reg("next_comm", "next_pid");
    } else if (e.name == "sched_wakeup") {
      reg("comm", "pid");
    }
  }
  return out;
}

// Events named by inference, summed over the capture's boots (the manifest's
// extra.boots[n].decoded_with.task_names.inferred); -1 when it says nothing.
int64_t InferredInManifest(const json& manifest) {
  int64_t sum = -1;
  for (const json& boot : manifest["extra"].value("boots", json::array())) {
    const json* names = nullptr;
    if (boot.contains("decoded_with") && boot["decoded_with"].contains("task_names"))
      names = &boot["decoded_with"]["task_names"];
    if (names == nullptr || !(*names)["inferred"].is_number_unsigned()) continue;
    sum = std::max<int64_t>(sum, 0) + (*names)["inferred"].get<int64_t>();
  }
  return sum;
}

// The default boot events, without task:task_rename unless |task_rename|.
std::string BootEvents(bool task_rename) {
  std::string events = hostd::kDefaultBootEvents;
  const std::string rename = ",task:task_rename";
  if (const size_t at = events.find(rename); !task_rename && at != std::string::npos) {
    events.erase(at, rename.size());
  }
  return events;
}

// What the workload did, by the events: execs, renames, forks, and pids
// switched out under more than one name (so one name per pid cannot be
// right for all their events).
struct WorkloadCounts {
  size_t execs = 0, renames = 0, forks = 0, renamed_pids = 0;
};
WorkloadCounts CountWorkload(const std::vector<Event>& events) {
  WorkloadCounts c;
  std::map<int, std::set<std::string>> names_of;
  for (const Event& e : events) {
    if (e.name == "sched_switch")
      names_of[e.fields["prev_pid"].get<int>()].insert(e.fields["prev_comm"].get<std::string>());
    c.execs += e.name == "sched_process_exec";
    c.renames += e.name == "task_rename";
    c.forks += e.name == "sched_process_fork";
  }
  for (const auto& [pid, names] : names_of) c.renamed_pids += pid != 0 && names.size() > 1;
  return c;
}

// trace-cmd's names on the capture's trace.dat files, line for line with
// show's events.
void TraceCmdNames(const fs::path& dir, const std::vector<std::string>& boot_files,
                   const std::vector<Event>& events, std::vector<std::string>* tc_names) {
  size_t misaligned = 0;
  static const std::regex kPrefix(R"(^\s*(.*)-(\d+)\s+\[(\d+)\]\s)");
  for (const std::string& file : boot_files) {
    test_support::CommandResult report =
        test_support::RunCommandStatus("trace-cmd report -i '" + (dir / file).string() + "'");
    ASSERT_EQ(report.status, 0) << file;
    for (const std::string& line : TextLines(report.out)) {
      std::smatch m;
      if (!std::regex_search(line, m, kPrefix)) continue;
      const size_t i = tc_names->size();
      if (i >= events.size() || std::stoi(m[2]) != events[i].pid ||
          std::stoi(m[3]) != events[i].cpu) {
        ++misaligned;
      }
      tc_names->push_back(m[1]);
    }
  }
  EXPECT_EQ(tc_names->size(), events.size());
  EXPECT_EQ(misaligned, 0u);
}

// Offline geometry: the capture's region padded past the range decodes with
// `hvtrace show --region` to the same |events| events.
void CheckPaddedRegion(const HvtracedProcess& daemon, const fs::path& dir,
                       const std::string& formats_key, size_t events) {
  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  const fs::path padded = fs::path(daemon.dir()) / "padded-region.bin";
  {
    std::string region = test_support::ReadText(dir / "region.bin");
    ASSERT_EQ(region.size(), 16u << 20);
    region.append((3u << 20) + 12345, '\0');
    std::ofstream out(padded, std::ios::binary);
    out.write(region.data(), static_cast<std::streamsize>(region.size()));
    ASSERT_TRUE(out.good());
  }
  const fs::path err = fs::path(daemon.dir()) / "region-show.err";
  test_support::CommandResult offline =
      test_support::RunCommandStatus(hvtrace + " show --json --region '" + padded.string() +
                                     "' --formats " + formats_key + " 2> '" + err.string() + "'");
  const std::string offline_err = test_support::ReadText(err);
  ASSERT_EQ(offline.status, 0) << offline_err;
  size_t offline_events = 0;
  for (const std::string& line : TextLines(offline.out)) {
    offline_events += line.find("\"event\":") != std::string::npos;
  }
  std::printf("[names e2e] show --region on the region + %u zero bytes: %zu events; stderr:\n%s",
              (3u << 20) + 12345, offline_events, offline_err.c_str());
  EXPECT_EQ(offline_events, events);
  EXPECT_EQ(offline_err.find("never written"), std::string::npos) << offline_err;
  EXPECT_EQ(offline_err.find(" magic: "), std::string::npos) << offline_err;
}

// One boot of guest |kernel| (FindGuestImage) with the busybox workload and
// the default boot events, or those without task:task_rename, then the
// panic capture's names.
void RunBusyboxWorkload(const std::string& kernel, bool task_rename) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage(kernel);
  ASSERT_TRUE(image.ok()) << image.error().message;
  auto cache_root = hostd::DefaultCacheRoot();
  ASSERT_TRUE(cache_root.ok()) << cache_root.error().message;
  auto harvested = HarvestImage(*image, *cache_root);
  ASSERT_TRUE(harvested.ok()) << harvested.error().message;

  HvtracedProcess daemon(
      {.tag = "names",
       .config = "vm_on_shutdown = stop\ncache_dir = " + cache_root->string() + "\n"});
  Status started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;
  const std::string name = "names-e2e-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(daemon, name, image->kernel, image->initrd,
                               {{"events", BootEvents(task_rename)}});
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // Short-lived processes: each forked by the shell with its name, then
  // renamed by exec; a `sh -c` renames itself and keeps running as that.
  const std::string workload =
      "cd /tmp && echo data > f && for i in $(seq 1 60); do cp f g; ls / > /dev/null; "
      "cat g > /dev/null; tar cf t.tar f g 2>/dev/null; sleep 0; "
      "sh -c 'echo -n hvt-renamed > /proc/self/comm; ls /proc > /dev/null; j=0; "
      "while [ $j -lt 30 ]; do j=$((j+1)); done'; done; echo workload-done";
  auto ran = console.Run(workload, 240s);
  ASSERT_TRUE(ran.ok() && ran->status == 0) << tail();
  ASSERT_TRUE(console.Send("echo c > /proc/sysrq-trigger\n").ok());
  auto panic = daemon.WaitForCapture(name, "panic", 90s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir = fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();

  const std::string hvtrace = std::string(HVTRACE_BIN_DIR) + "/hvtrace";
  test_support::CommandResult shown =
      test_support::RunCommandStatus(hvtrace + " show --json '" + dir.string() + "'");
  ASSERT_EQ(shown.status, 0) << shown.out.substr(0, 2000);
  std::vector<Event> events;
  std::vector<std::string> boot_files;
  ASSERT_NO_FATAL_FAILURE(ParseShown(shown.out, &events, &boot_files));
  ASSERT_GT(events.size(), 1000u);

  const std::vector<std::string> ref = KernelNames(events, /*at_switch_only=*/false);
  const std::vector<std::string> at_switch = KernelNames(events, /*at_switch_only=*/true);
  const std::vector<std::string> show_names = ShownNames(events);
  const Agreement show = Compare(ref, show_names);

  const WorkloadCounts did = CountWorkload(events);
  std::vector<std::string> tc_names;
  ASSERT_NO_FATAL_FAILURE(TraceCmdNames(dir, boot_files, events, &tc_names));
  const Agreement trace_cmd = Compare(ref, tc_names);
  const std::vector<std::string> first_names = FirstNameWins(events);
  const Agreement first_wins = Compare(ref, first_names);
  // The same against the next switch's prev_comm alone: events that precede
  // an exec or rename in the same run of the task count as wrong there,
  // although the task had the old name when they happened.
  const Agreement show_sw = Compare(at_switch, show_names);
  const Agreement trace_cmd_sw = Compare(at_switch, tc_names);
  const Agreement first_wins_sw = Compare(at_switch, first_names);

  const json manifest = json::parse(test_support::ReadText(dir / "manifest.json"));
  const int64_t inferred = InferredInManifest(manifest);
  std::printf(
      "[names e2e] %s, %s task_rename: %zu events (%zu exec, %zu task_rename, %zu fork), %zu "
      "pids switched out under more than one name, %lld named by inference (manifest)\n",
      image->release.c_str(), task_rename ? "with" : "without", events.size(), did.execs,
      did.renames, did.forks, did.renamed_pids, static_cast<long long>(inferred));
  const auto print_figures = [](const char* what, const Agreement& a, const Agreement& b,
                                const Agreement& c) {
    std::printf(
        "[names e2e] %s: hvtrace show %zu/%zu (%.2f%%), trace-cmd report on trace.dat "
        "%zu/%zu (%.2f%%), first name wins (before) %zu/%zu (%.2f%%)\n",
        what, a.agree, a.compared, a.percent(), b.agree, b.compared, b.percent(), c.agree,
        c.compared, c.percent());
  };
  print_figures("named as the kernel recorded next (rename oldcomm, else next switch)", show,
                trace_cmd, first_wins);
  print_figures("named as the next switch's prev_comm", show_sw, trace_cmd_sw, first_wins_sw);
  EXPECT_GT(did.execs, 100u);
  if (task_rename) {
    EXPECT_GT(did.renames, 100u);
  } else {
    EXPECT_EQ(did.renames, 0u);
    // The applets' and the shell's renames went unrecorded: show inferred.
    EXPECT_GT(inferred, 0);
  }
  EXPECT_GE(inferred, 0) << "no task_names.inferred in the manifest";
  EXPECT_GT(did.forks, 100u);
  // How many pids are switched out both before and after their exec depends
  // on the guest's scheduling under TCG: 86-102 in three runs alone, 45 in a
  // clean-clone run beside the other e2e tests (2026-11-25, when this asked
  // for more than 50). A precondition, so with room.
  EXPECT_GT(did.renamed_pids, 20u);
  EXPECT_GT(show.compared, 1000u);
  EXPECT_GE(show.percent(), 99.0);
  EXPECT_EQ(manifest["validation"]["cpus"], 2) << manifest["validation"].dump(2);
  CheckPaddedRegion(daemon, dir, harvested->key, events.size());

  // The first disagreements, to make a failure readable.
  PrintDisagreements("names e2e", events, ref, show_names, 10);
}

TEST(TaskNamesE2e, BusyboxShortLivedProcessesNamedAsTheKernelRecorded) {
  RunBusyboxWorkload("6.12", /*task_rename=*/true);
}

TEST(TaskNamesE2e, BusyboxNamedWithoutTaskRenameEvents) {
  RunBusyboxWorkload("6.12", /*task_rename=*/false);
}

TEST(TaskNamesE2e, Linux73BusyboxNamedAsTheKernelRecorded) {
  RunBusyboxWorkload("7.3", /*task_rename=*/true);
}

TEST(TaskNamesE2e, Linux73BusyboxNamedWithoutTaskRenameEvents) {
  RunBusyboxWorkload("7.3", /*task_rename=*/false);
}

}  // namespace
}  // namespace hvtrace::e2e
