#include "hvtrace/task_names.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "hvtrace/page.h"

namespace hvtrace {
namespace {

using Bytes = std::vector<std::byte>;

// The 6.12 guest's formats (Debian 6.12.95, from its tracefs), fields only.
constexpr const char* kCommon =
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";

std::string Format(const char* name, int id, const char* fields) {
  return std::string("name: ") + name + "\nID: " + std::to_string(id) + "\n" + kCommon + fields +
         "\nprint fmt: \"x\"\n";
}

constexpr int kSwitch = 310, kWakeup = 312, kFork = 304, kExec = 303, kRename = 136, kNewTask = 137,
              kOther = 500;

std::vector<FormatText> Formats() {
  return {
      {"sched", Format("sched_switch", kSwitch,
                       "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
                       "\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
                       "\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;\n"
                       "\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n"
                       "\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n"
                       "\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n"
                       "\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;\n")},
      {"sched", Format("sched_wakeup", kWakeup,
                       "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
                       "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n"
                       "\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;\n"
                       "\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;\n")},
      {"sched", Format("sched_process_fork", kFork,
                       "\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
                       "\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
                       "\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;\n"
                       "\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n")},
      {"sched", Format("sched_process_exec", kExec,
                       "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n"
                       "\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n"
                       "\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;\n")},
      {"task", Format("task_rename", kRename,
                      "\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n"
                      "\tfield:char oldcomm[16];\toffset:12;\tsize:16;\tsigned:0;\n"
                      "\tfield:char newcomm[16];\toffset:28;\tsize:16;\tsigned:0;\n"
                      "\tfield:short oom_score_adj;\toffset:44;\tsize:2;\tsigned:1;\n")},
      {"task", Format("task_newtask", kNewTask,
                      "\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n"
                      "\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n"
                      "\tfield:unsigned long clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n"
                      "\tfield:short oom_score_adj;\toffset:40;\tsize:2;\tsigned:1;\n")},
      {"probe", Format("other", kOther, "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n")},
  };
}

void Put(Bytes& b, size_t off, const void* src, size_t n) {
  if (b.size() < off + n) b.resize(off + n);
  std::memcpy(b.data() + off, src, n);
}
void Put32(Bytes& b, size_t off, int32_t v) { Put(b, off, &v, 4); }
// A comm array: |name| padded with NULs to 16 bytes (or exactly 16 bytes).
void PutComm(Bytes& b, size_t off, const std::string& name) {
  char buf[16] = {};
  std::memcpy(buf, name.data(), std::min<size_t>(name.size(), 16));
  Put(b, off, buf, 16);
}

Bytes Header(int id, int pid, size_t size) {
  Bytes b(size);
  const uint16_t type = static_cast<uint16_t>(id);
  Put(b, 0, &type, 2);
  Put32(b, 4, pid);
  return b;
}

Bytes Switch(const std::string& prev, int prev_pid, const std::string& next, int next_pid) {
  Bytes b = Header(kSwitch, prev_pid, 64);
  PutComm(b, 8, prev);
  Put32(b, 24, prev_pid);
  PutComm(b, 40, next);
  Put32(b, 56, next_pid);
  return b;
}
Bytes Wakeup(int waker, const std::string& comm, int pid) {
  Bytes b = Header(kWakeup, waker, 36);
  PutComm(b, 8, comm);
  Put32(b, 24, pid);
  return b;
}
Bytes Fork(const std::string& parent, int parent_pid, int child_pid) {
  Bytes b = Header(kFork, parent_pid, 48);
  PutComm(b, 8, parent);
  Put32(b, 24, parent_pid);
  PutComm(b, 28, parent);
  Put32(b, 44, child_pid);
  return b;
}
Bytes Exec(int pid, const std::string& filename) {
  Bytes b = Header(kExec, pid, 20);
  const uint32_t loc = static_cast<uint32_t>((filename.size() + 1) << 16 | 20);
  Put(b, 8, &loc, 4);
  Put32(b, 12, pid);
  Put32(b, 16, pid);
  Put(b, 20, filename.c_str(), filename.size() + 1);
  return b;
}
Bytes Rename(int pid, const std::string& from, const std::string& to) {
  Bytes b = Header(kRename, pid, 48);
  Put32(b, 8, pid);
  PutComm(b, 12, from);
  PutComm(b, 28, to);
  return b;
}
Bytes NewTask(int parent, int pid, const std::string& comm) {
  Bytes b = Header(kNewTask, parent, 48);
  Put32(b, 8, pid);
  PutComm(b, 12, comm);
  return b;
}
Bytes Other(int pid) { return Header(kOther, pid, 12); }

// Runs both passes over |records| and returns each record's name ("" for
// nullptr); |inferred|: how many were named by inference.
std::vector<std::string> NamesOnce(const std::vector<FormatText>& formats,
                                   const std::vector<Bytes>& records, bool keep,
                                   uint64_t* inferred) {
  TaskNameTimeline t(formats, keep);
  EXPECT_TRUE(t.usable());
  for (const Bytes& r : records) t.Scan(r);
  t.StartNaming();
  std::vector<std::string> out;
  for (const Bytes& r : records) {
    const char* name = t.Next(r);
    out.push_back(name ? name : "");
  }
  if (inferred != nullptr) *inferred = t.inferred();
  return out;
}

// Both ways: pass 2 reading the records again, and taking what pass 1 kept
// (MostUsedNames' way); they must agree on every record.
std::vector<std::string> Names(const std::vector<Bytes>& records, uint64_t* inferred = nullptr,
                               const std::vector<FormatText>& formats = Formats()) {
  uint64_t inferred_kept = 0;
  const std::vector<std::string> kept = NamesOnce(formats, records, true, &inferred_kept);
  std::vector<std::string> read = NamesOnce(formats, records, false, inferred);
  EXPECT_EQ(kept, read);
  if (inferred != nullptr) {
    EXPECT_EQ(inferred_kept, *inferred);
  }
  return read;
}

TEST(TaskNameTimelineTest, FormatsAreFoundByTheNameTheParserReads) {
  // The constructor parses only formats whose first line names a naming
  // event; blanks around the name (as the parser trims them) or a first line
  // that is not "name:" must not hide one.
  std::vector<FormatText> formats = Formats();
  formats[0].text =
      " \tname:\t sched_switch \r" + formats[0].text.substr(formats[0].text.find('\n'));
  formats[1].text = "\n" + formats[1].text;
  auto names = Names({Other(5), Switch("a", 5, "b", 6), Other(6), Wakeup(5, "c", 7), Other(7)},
                     nullptr, formats);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "a", "b", "a", "c"}));
}

TEST(TaskNameTimelineTest, ExecRenamesFromTheExecEventOn) {
  auto names = Names({Switch("swapper/0", 0, "sh", 100), Other(100), Exec(100, "/bin/cp"),
                      Other(100), Switch("cp", 100, "swapper/0", 0)});
  // The first switch runs under the idle task (pid 0: the caller's <idle>).
  EXPECT_EQ(names, (std::vector<std::string>{"", "sh", "cp", "cp", "cp"}));
}

TEST(TaskNameTimelineTest, ExecTakesTheBasenameCutTo15Bytes) {
  auto names = Names({Exec(7, "/usr/local/bin/a-very-long-program-name"), Other(7),
                      Exec(7, "relative"), Other(7), Exec(7, "/trailing/"), Other(7)});
  EXPECT_EQ(names[1], "a-very-long-pro");
  EXPECT_EQ(names[3], "relative");
  EXPECT_EQ(names[5], "");  // kbasename("/trailing/") is "", and so is the comm.
}

TEST(TaskNameTimelineTest, ForkChildStartsWithTheParentsName) {
  auto names = Names({Switch("swapper/0", 0, "init", 1), Fork("init", 1, 50), Other(50),
                      NewTask(50, 51, "init"), Other(51), Exec(50, "/bin/ls"), Other(50)});
  EXPECT_EQ(names[2], "init");
  EXPECT_EQ(names[4], "init");
  EXPECT_EQ(names[6], "ls");
}

TEST(TaskNameTimelineTest, RenameEventRunsUnderTheOldName) {
  auto names = Names({Other(9), Rename(9, "sh", "worker"), Other(9)});
  EXPECT_EQ(names, (std::vector<std::string>{"sh", "sh", "worker"}));
}

TEST(TaskNameTimelineTest, RenameOfAnotherTaskKeepsTheCallersName) {
  // kthread_create names the new thread from its creator (kthreadd).
  auto names =
      Names({Switch("kthreadd", 2, "x", 30), Rename(30, "kthreadd", "kworker/0:1"), Other(30)});
  EXPECT_EQ(names[2], "kworker/0:1");
  Bytes by_other = Rename(30, "kthreadd", "kworker/0:2");
  Put32(by_other, 4, 2);  // common_pid: kthreadd renames pid 30.
  auto names2 = Names({Switch("kthreadd", 2, "x", 30), by_other, Other(30), Other(2)});
  EXPECT_EQ(names2[1], "kthreadd");
  EXPECT_EQ(names2[2], "kworker/0:2");
  EXPECT_EQ(names2[3], "kthreadd");
}

TEST(TaskNameTimelineTest, BackwardFillFromTheFirstStatement) {
  // Events of pid 40 before anything names it take the name its first
  // switch gives it; the later exec does not rename the earlier events.
  auto names = Names(
      {Other(40), Other(40), Switch("cat", 40, "swapper/1", 0), Exec(40, "/bin/ls"), Other(40)});
  EXPECT_EQ(names, (std::vector<std::string>{"cat", "cat", "cat", "ls", "ls"}));
  // A wakeup names the wakee at its time: it fills backwards too.
  auto woken = Names({Other(41), Wakeup(1, "sleep", 41), Other(41)});
  EXPECT_EQ(woken, (std::vector<std::string>{"sleep", "", "sleep"}));  // The waker is unnamed.
}

TEST(TaskNameTimelineTest, ExecFirstDoesNotSayTheOldName) {
  auto names = Names({Other(60), Exec(60, "/bin/tar"), Other(60)});
  EXPECT_EQ(names, (std::vector<std::string>{"", "tar", "tar"}));
}

TEST(TaskNameTimelineTest, ReusedPidGetsTheNewTasksName) {
  auto names = Names({Switch("old", 70, "swapper/0", 0), Other(70), Fork("sh", 5, 70), Other(70),
                      Exec(70, "/bin/sleep"), Other(70)});
  EXPECT_EQ(names, (std::vector<std::string>{"old", "old", "sh", "sh", "sleep", "sleep"}));
}

TEST(TaskNameTimelineTest, BusyboxAppletRenamedWithoutAnEventTakesTheNextName) {
  // A real busybox guest without task:task_rename: init forks 1840, which is
  // switched in as init, renames itself to ls (prctl(PR_SET_NAME): no
  // event), works, and is switched out as ls.
  uint64_t inferred = 0;
  auto names =
      Names({Fork("init", 1, 1840), Switch("swapper/0", 0, "init", 1840), Other(1840), Other(1840),
             Other(1840), Switch("ls", 1840, "swapper/0", 0), Other(1840), Other(1)},
            &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"init", "", "ls", "ls", "ls", "ls", "ls", "init"}));
  EXPECT_EQ(inferred, 3u);
}

TEST(TaskNameTimelineTest, InferenceStopsAtTheStatementsAroundTheInterval) {
  // Two runs of pid 5 with an unrecorded rename in each: only the records
  // between the disagreeing statements change; a wakeup by another task is
  // a statement about pid 5 too.
  uint64_t inferred = 0;
  auto names = Names({Switch("swapper/0", 0, "a", 5), Other(5), Wakeup(7, "b", 5), Other(5),
                      Switch("c", 5, "swapper/0", 0), Other(7)},
                     &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"", "b", "", "c", "c", ""}));
  EXPECT_EQ(inferred, 2u);
}

TEST(TaskNameTimelineTest, ExecSplitsTheInterval) {
  uint64_t inferred = 0;
  // Switched in as sh, switched out as cp: the exec says where the name
  // changed, so the records before it keep sh.
  auto names = Names({Switch("swapper/0", 0, "sh", 100), Other(100), Other(100),
                      Exec(100, "/bin/cp"), Other(100), Switch("cp", 100, "swapper/0", 0)},
                     &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"", "sh", "sh", "cp", "cp", "cp"}));
  EXPECT_EQ(inferred, 0u);
  // Without the exec event the whole run takes the later name.
  names = Names({Switch("swapper/0", 0, "sh", 100), Other(100), Other(100), Other(100),
                 Switch("cp", 100, "swapper/0", 0)},
                &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"", "cp", "cp", "cp", "cp"}));
  EXPECT_EQ(inferred, 3u);
  // An unrecorded rename after the exec: the records after the exec take
  // the later name, the exec its own, those before it still the earlier one.
  names = Names({Switch("swapper/0", 0, "sh", 100), Other(100), Exec(100, "/bin/busybox"),
                 Other(100), Other(100), Switch("cp", 100, "swapper/0", 0)},
                &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"", "sh", "busybox", "cp", "cp", "cp"}));
  EXPECT_EQ(inferred, 2u);
}

TEST(TaskNameTimelineTest, RecordedRenameStaysExact) {
  uint64_t inferred = 0;
  auto names = Names(
      {Fork("init", 1, 1840), Switch("swapper/0", 0, "init", 1840), Other(1840),
       Rename(1840, "init", "ls"), Other(1840), Other(1840), Switch("ls", 1840, "swapper/0", 0)},
      &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"init", "", "init", "init", "ls", "ls", "ls"}));
  EXPECT_EQ(inferred, 0u);
}

TEST(TaskNameTimelineTest, UnchangedNameIsNotInferred) {
  uint64_t inferred = 0;
  auto names = Names({Other(30), Switch("swapper/0", 0, "sleep", 30), Other(30), Other(30),
                      Switch("sleep", 30, "swapper/0", 0), Wakeup(1, "sleep", 30), Other(30),
                      Switch("sleep", 30, "swapper/0", 0)},
                     &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"sleep", "", "sleep", "sleep", "sleep", "", "sleep",
                                             "sleep"}));
  EXPECT_EQ(inferred, 0u);
}

TEST(TaskNameTimelineTest, Malicious_InferenceReadsOnlyWholeStatements) {
  uint64_t inferred = 0;
  // A switch-out cut short says nothing: the run keeps the switch-in name.
  Bytes cut = Switch("ls", 20, "swapper/0", 0);
  cut.resize(20);  // prev_comm cut.
  Bytes tiny = Header(kOther, 20, 8);
  tiny.resize(6);  // Not even a trace_entry: no task.
  auto names =
      Names({Switch("swapper/0", 0, "init", 20), Other(20), tiny, cut, Other(20)}, &inferred);
  EXPECT_EQ(names, (std::vector<std::string>{"", "init", "", "init", "init"}));
  EXPECT_EQ(inferred, 0u);
  // A later name with no NUL is cut to 15 bytes like any other.
  names = Names({Switch("swapper/0", 0, "init", 21), Other(21),
                 Switch("0123456789abcdefXYZ", 21, "swapper/0", 0)},
                &inferred);
  EXPECT_EQ(names[1], "0123456789abcde");
  EXPECT_EQ(inferred, 1u);
  // Many unrecorded renames: each interval is named by its own next
  // statement, and every record in one is counted once.
  std::vector<Bytes> many;
  std::vector<std::string> want;
  for (int i = 0; i < 1000; ++i) {
    const std::string in = "in" + std::to_string(i), out = "out" + std::to_string(i);
    many.push_back(Wakeup(1, in, 22));
    many.push_back(Other(22));
    many.push_back(Other(22));
    many.push_back(Switch(out, 22, "swapper/0", 0));
    want.insert(want.end(), {"", out, out, out});
  }
  EXPECT_EQ(Names(many, &inferred), want);
  EXPECT_EQ(inferred, 2000u);
}

TEST(TaskNameTimelineTest, IdleAndUnnamedPidsAreLeftToTheCaller) {
  auto names = Names({Switch("swapper/0", 0, "a", 3), Other(0), Other(12345)});
  EXPECT_EQ(names[1], "");
  EXPECT_EQ(names[2], "");
}

TEST(TaskNameTimelineTest, NoNameEventsMeansUnusable) {
  TaskNameTimeline t(
      {{"probe", Format("other", kOther, "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n")}});
  EXPECT_FALSE(t.usable());
}

TEST(TaskNameTimelineTest, Malicious_NamesAreBoundedAndRecordsChecked) {
  Bytes no_nul = Switch("0123456789abcdefXYZ", 80, "swapper/0", 0);  // 16 bytes, no NUL.
  Bytes short_switch = Switch("evil", 81, "x", 82);
  short_switch.resize(30);  // Cuts next_comm and next_pid.
  Bytes bad_loc = Exec(83, "/bin/true");
  const uint32_t loc = 0xffffu << 16 | 0xfff0;  // Past the record.
  Put(bad_loc, 8, &loc, 4);
  Bytes tiny = Header(kSwitch, 84, 4);  // Not even a trace_entry.
  auto names = Names({no_nul, Other(80), short_switch, Other(82), bad_loc, Other(83), tiny});
  EXPECT_EQ(names[1], "0123456789abcde");
  EXPECT_EQ(names[3], "");  // The cut record says nothing about pid 82.
  EXPECT_EQ(names[5], "");  // The out-of-bounds filename is not read.
  EXPECT_EQ(names[6], "");
  // A format whose comm is not a char array is not used.
  TaskNameTimeline t({{"sched", Format("sched_wakeup", kWakeup,
                                       "\tfield:int comm;\toffset:8;\tsize:4;\tsigned:1;\n"
                                       "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n")}});
  EXPECT_FALSE(t.usable());
}

Bytes PageOf(const std::vector<std::pair<uint64_t, Bytes>>& records) {
  Bytes page(4096);
  PageWriter w(page, PageLayout::Default(), records.empty() ? 0 : records[0].first);
  for (const auto& [ts, payload] : records) EXPECT_TRUE(w.Append(ts, payload));
  w.Finish();
  return page;
}

TEST(MostUsedNamesTest, PicksTheNameCoveringMostEventsAcrossCpus) {
  // pid 10 is "sh" for one event, then "cp" for three (on two CPUs).
  Bytes cpu0 = PageOf({{100, Switch("swapper/0", 0, "sh", 10)},
                       {150, Other(10)},
                       {200, Exec(10, "/bin/cp")},
                       {400, Other(10)}});
  Bytes cpu1 = PageOf({{300, Other(10)}, {500, Other(20)}});
  std::vector<std::vector<std::span<const std::byte>>> cpus = {{cpu0}, {cpu1}};
  TaskNameStats stats;
  std::string text = MostUsedNames(Formats(), PageLayout::Default(), cpus,
                                   "10 agent-name\n20 from-agent\nbad line\n", &stats);
  EXPECT_EQ(text, "10 cp\n20 from-agent\n");
  EXPECT_EQ(stats.events, 6u);
  EXPECT_EQ(stats.named, 4u);  // One event as sh; the exec and two others as cp.
  EXPECT_EQ(stats.pids, 1u);
  EXPECT_EQ(stats.renamed_pids, 1u);
  EXPECT_EQ(stats.not_most_used, 1u);
}

TEST(MostUsedNamesTest, CountsTheEventsNamedByInference) {
  // pid 10 switched in as init, out as ls (no task_rename): its three events
  // in between are ls, inferred.
  Bytes cpu0 = PageOf({{100, Switch("swapper/0", 0, "init", 10)},
                       {150, Other(10)},
                       {200, Other(10)},
                       {400, Switch("ls", 10, "swapper/0", 0)}});
  Bytes cpu1 = PageOf({{300, Other(10)}});
  std::vector<std::vector<std::span<const std::byte>>> cpus = {{cpu0}, {cpu1}};
  TaskNameStats stats;
  EXPECT_EQ(MostUsedNames(Formats(), PageLayout::Default(), cpus, "", &stats), "10 ls\n");
  EXPECT_EQ(stats.named, 4u);
  EXPECT_EQ(stats.inferred, 3u);
  EXPECT_EQ(stats.renamed_pids, 0u);
}

}  // namespace
}  // namespace hvtrace
