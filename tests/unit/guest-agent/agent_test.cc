#include "agent.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"
#include "hvtrace/region_writer.h"
#include "uevent.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A fake tracefs (real format files and real trace_pipe_raw pages from the
// fixtures) and a region file as hostd creates it. The agent's instance is
// tracing/instances/hvtrace; the top level is set up as a user (trace-cmd)
// left it, and the tests check that the agent never writes it.
class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("hvtrace-agent-test-" + std::to_string(getpid()));
    fs::remove_all(root_);
    const fs::path fx = HVTRACE_FIXTURES_DIR;
    const fs::path top = root_ / "tracing";
    for (const char* f : {"trace_clock", "tracing_on", "trace", "current_tracer", "events/enable",
                          "events/sched/sched_switch/enable", "saved_cmdlines_size"}) {
      Put(top / f, kTopLevel.at(f));
    }
    Put(top / "events/sched/sched_switch/format",
        Slurp(fx / "boot_map/formats/sched/sched_switch/format"));
    const fs::path t = inst();
    Put(t / "events/header_page", Slurp(fx / "boot_map/header_page"));
    Put(t / "events/header_event", Slurp(fx / "boot_map/header_event"));
    Put(t / "events/ftrace/print/format", Slurp(fx / "boot_map/formats/ftrace/print/format"));
    Put(t / "events/sched/sched_switch/format",
        Slurp(fx / "boot_map/formats/sched/sched_switch/format"));
    Put(t / "events/sched/sched_switch/enable", "0");
    Put(t / "trace_clock", "[local] global mono");
    Put(t / "tracing_on", "0");
    Put(t / "trace", "");
    const long cpus = sysconf(_SC_NPROCESSORS_CONF);
    for (long c = 0; c < cpus; ++c) {
      std::string pages;
      for (int i = 0; i < 3; ++i)
        pages +=
            Slurp(fx / ("pages/cpu" + std::to_string(c % 2) + "-" + std::to_string(i) + ".bin"));
      Put(t / ("per_cpu/cpu" + std::to_string(c) + "/trace_pipe_raw"), pages);
    }
    cpus_ = static_cast<uint32_t>(cpus);
    RegionPlanOptions opt;
    opt.max_cpus = std::max<uint32_t>(cpus_, 2);
    opt.symbol_area_size = 64 << 10;  // A 2 MiB region gets none by default.
    opt.comm_area_size = 8 << 10;
    auto g = PlanRegion(1 << 21, opt);
    ASSERT_TRUE(g.ok());
    geometry_ = *g;
    region_path_ = root_ / "region";
    std::vector<std::byte> mem(geometry_.region_size);
    ASSERT_TRUE(InitRegionHeader(mem, geometry_, 1).ok());
    Put(region_path_, std::string(reinterpret_cast<const char*>(mem.data()), mem.size()));
    auto m = RegionMapping::Map(region_path_);
    ASSERT_TRUE(m.ok());
    host_ = std::move(*m);
    SetRequests("sched:sched_switch", 0, 2);

    options_.tracefs = top;
    options_.kallsyms = root_ / "kallsyms";  // Absent unless a test writes it.
    options_.region_path = region_path_;
    options_.pointer_file = root_ / "run/region";
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path inst() const { return root_ / "tracing/instances/hvtrace"; }
  // The top level as trace-cmd left it: the agent must find it so afterwards.
  static inline const std::map<std::string, std::string> kTopLevel = {
      {"trace_clock", "global [local] mono"},
      {"tracing_on", "1"},
      {"trace", "TOPLEVEL-MARK"},
      {"current_tracer", "nop\n"},
      {"events/enable", "0\n"},
      {"events/sched/sched_switch/enable", "0"},
      {"saved_cmdlines_size", "128\n"},
  };
  // saved_cmdlines_size is global, raised when harmless (its own tests).
  void ExpectTopLevelUntouched() {
    for (const auto& [file, text] : kTopLevel) {
      if (file == "saved_cmdlines_size") continue;
      EXPECT_EQ(Slurp(root_ / "tracing" / file), text) << "top-level " << file;
    }
  }
  // A region with a new id, where the last one was (as after detach+attach).
  void NewRegion(uint64_t region_id) {
    host_.Unmap();
    fs::remove(region_path_);
    RegionPlanOptions opt;
    opt.max_cpus = geometry_.max_cpus;
    opt.region_id = region_id;
    auto g = PlanRegion(1 << 21, opt);
    ASSERT_TRUE(g.ok());
    geometry_ = *g;
    std::vector<std::byte> mem(geometry_.region_size);
    ASSERT_TRUE(InitRegionHeader(mem, geometry_, 1).ok());
    Put(region_path_, std::string(reinterpret_cast<const char*>(mem.data()), mem.size()));
    auto m = RegionMapping::Map(region_path_);
    ASSERT_TRUE(m.ok());
    host_ = std::move(*m);
    SetRequests("sched:sched_switch", 0, 2);
  }

  region::HostRequests* requests() {
    return reinterpret_cast<region::HostRequests*>(host_.data() + region::kHostRequestsOffset);
  }
  void SetRequests(const std::string& events, uint32_t flags, uint64_t seq) {
    region::HostRequests* r = requests();
    std::memset(r->events, 0, sizeof(r->events));
    std::memcpy(r->events, events.data(), events.size());
    r->events_len = static_cast<uint32_t>(events.size());
    r->flags = flags;
    r->pump_interval_ms = 50;
    __atomic_store_n(&r->request_seq, seq, __ATOMIC_RELEASE);
  }
  RegionSnapshot Read() {
    std::vector<std::byte> copy;
    CopyLiveRegion(host_.data(), geometry_, &copy);
    auto s = ReadRegion(std::move(copy), geometry_);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }

  fs::path root_;
  fs::path region_path_;
  RegionGeometry geometry_;
  RegionMapping host_;
  AgentOptions options_;
  uint32_t cpus_ = 0;
};

TEST_F(AgentTest, AnnouncesPublishesEnablesAndPumps) {
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  agent.Tick(true);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u) << (s.problems.empty()
                                         ? ""
                                         : s.problems[0].where + ": " + s.problems[0].detail);
  ASSERT_TRUE(s.guest.present);
  EXPECT_EQ(s.guest.boot_generation, 1u);
  EXPECT_EQ(s.guest.nr_cpus, std::min(cpus_, geometry_.max_cpus));
  EXPECT_EQ(s.guest.boot_id, Slurp("/proc/sys/kernel/random/boot_id").substr(0, 36));
  EXPECT_EQ(s.guest.status.state, region::kStateRunning);
  EXPECT_EQ(s.guest.status.request_ack, 2u);
  EXPECT_EQ(s.guest.status.events_enabled, 1u);
  EXPECT_NE(s.FindFormat(1, 310), nullptr);  // sched_switch
  bool have_print = false, have_header_page = false;
  for (const RegionFormat& f : s.formats) {
    have_print |= f.parsed && f.parsed->name == "print";
    have_header_page |= f.kind == region::kFormatHeaderPage;
  }
  EXPECT_TRUE(have_print);
  EXPECT_TRUE(have_header_page);
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "1");
  EXPECT_EQ(Slurp(inst() / "trace_clock"), "mono");
  EXPECT_EQ(Slurp(inst() / "tracing_on"), "1");
  ExpectTopLevelUntouched();
  // Every page of every CPU pipe, byte for byte, in order.
  for (uint32_t c = 0; c < s.guest.nr_cpus; ++c) {
    ASSERT_EQ(s.cpus[c].pages.size(), 3u) << "cpu " << c;
    for (int i = 0; i < 3; ++i) {
      const std::string want =
          Slurp(fs::path(HVTRACE_FIXTURES_DIR) /
                ("pages/cpu" + std::to_string(c % 2) + "-" + std::to_string(i) + ".bin"));
      EXPECT_EQ(std::memcmp(s.cpus[c].pages[i].page.data(), want.data(), want.size()), 0);
      EXPECT_EQ(s.cpus[c].pages[i].page_error, PageError::kOk);
    }
  }
  EXPECT_EQ(s.guest.status.pages_pushed, 3u * s.guest.nr_cpus);
  EXPECT_NE(Slurp(root_ / "run/region").find(region_path_.string()), std::string::npos);
}

// Ticks until the agent's symbol worker finished and the state is written.
uint32_t WaitForSymbols(Agent& agent, RegionMapping& host) {
  const auto* st =
      reinterpret_cast<const region::GuestStatus*>(host.data() + region::kGuestStatusOffset);
  for (int i = 0; i < 500 && st->symbols_state == region::kSymbolsPending; ++i) {
    agent.Tick(false);
    usleep(10000);
  }
  return st->symbols_state;
}

// A device the agent finds before the host finished its region (here: a BAR
// of zeroes that gets its header 300 ms later) is tried again until the
// deadline, not dropped after one failed look; a hot-plug once went
// unattached for good that way.
TEST_F(AgentTest, APluggedDeviceWhoseRegionIsNotReadyYetIsTriedAgain) {
  const std::string valid = Slurp(region_path_);
  host_.Unmap();
  const fs::path dev = root_ / "pci/0000:00:02.0";
  fs::create_directories(dev);
  Put(dev / "vendor", "0x1af4\n");
  Put(dev / "device", "0x1110\n");
  Put(dev / "enable", "1\n");
  Put(dev / "resource2", std::string(valid.size(), '\0'));
  options_.region_path.clear();
  options_.sysfs_pci_devices = (root_ / "pci").string();
  options_.run_for_ms = 1500;
  std::thread host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::fstream f(dev / "resource2", std::ios::in | std::ios::out | std::ios::binary);
    f.write(valid.data(), static_cast<std::streamsize>(valid.size()));
  });
  Agent agent(options_);
  EXPECT_EQ(agent.Run(), 0);
  host.join();
  auto m = RegionMapping::Map(dev / "resource2");
  ASSERT_TRUE(m.ok());
  host_ = std::move(*m);
  RegionSnapshot s = Read();
  ASSERT_TRUE(s.guest.present) << "the agent never attached the device";
  EXPECT_EQ(s.guest.status.request_ack, 2u);
}

TEST_F(AgentTest, PublishesTextSymbolsAndSavedCmdlines) {
  Put(root_ / "kallsyms",
      "0000000000000000 A fixed_percpu_data\n"
      "ffffffff81000000 T _text\n"
      "ffffffff82000000 D some_data\n"
      "ffffffff811a2b30 t tracing_mark_write\n"
      "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n");
  Put(root_ / "tracing/saved_cmdlines", "1 init\n242 sh\n");
  Put(root_ / "tracing/saved_cmdlines_size", "128\n");
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(root_ / "tracing/saved_cmdlines_size"), "1024")
      << "raised at the first attach: no buffer holds events, no tracer at the top level";
  EXPECT_EQ(WaitForSymbols(agent, host_), region::kSymbolsPublished);
  agent.Tick(true);
  RegionSnapshot s = Read();
  RegionTextCache texts;
  texts.Update(&s);
  EXPECT_EQ(s.issue_total(), 0u);
  EXPECT_EQ(texts.Text(TextAreaKind::kSymbols, 1),
            "ffffffff81000000 T _text\nffffffff811a2b30 t tracing_mark_write\n"
            "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n");
  EXPECT_EQ(texts.Text(TextAreaKind::kComms, 1), "1 init\n242 sh\n");
  // A new task: republished at the next pump; unchanged: not rewritten.
  const uint64_t seq = s.comms.seq;
  agent.Tick(true);
  EXPECT_EQ(Read().comms.seq, seq);
  Put(root_ / "tracing/saved_cmdlines", "1 init\n242 sh\n243 cat\n");
  agent.Tick(true);
  RegionSnapshot s2 = Read();
  texts.Update(&s2);
  EXPECT_EQ(texts.Text(TextAreaKind::kComms, 1), "1 init\n242 sh\n243 cat\n");
}

TEST_F(AgentTest, ZeroAddressesPublishNoSymbolsAndSaySo) {
  Put(root_ / "kallsyms", "0000000000000000 T _text\n0000000000000000 t tracing_mark_write\n");
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(WaitForSymbols(agent, host_), region::kSymbolsRestricted);
  EXPECT_FALSE(Read().symbols.present);
}

TEST_F(AgentTest, SymbolsThatDoNotFitTheAreaAreNotPublished) {
  std::string big;
  for (int i = 0; big.size() < (1u << 20); ++i) {
    char line[96];
    std::snprintf(line, sizeof line, "ffffffff%08x t f%x_%08x\n", i * 16, i * 2654435761u,
                  i * 40503u);
    big += line;
  }
  Put(root_ / "kallsyms", big);
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(WaitForSymbols(agent, host_), region::kSymbolsTooLarge);
  EXPECT_FALSE(Read().symbols.present);
}

TEST_F(AgentTest, FollowsStopAndEventChanges) {
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  SetRequests("", region::kRequestStop, 3);
  agent.Tick(false);
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "0");
  RegionSnapshot s = Read();
  EXPECT_EQ(s.guest.status.state, region::kStateStopped);
  EXPECT_EQ(s.guest.status.request_ack, 3u);
  SetRequests("sched", 0, 4);  // A whole system.
  agent.Tick(false);
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "1");
  // A snapshot request is answered with a push and an ack.
  requests()->snapshot_seq = 9;
  agent.Tick(false);
  EXPECT_EQ(Read().guest.status.snapshot_ack, 9u);
}

// The format of a module's event as the kernel gives it, with its id.
std::string ModuleEventFormat(int id) {
  return "name: alpha_seq\nID: " + std::to_string(id) +
         "\nformat:\n"
         "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
         "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
         "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
         "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
         "\tfield:u32 seq;\toffset:8;\tsize:4;\tsigned:0;\n\n"
         "print fmt: \"seq=%u\", REC->seq\n";
}

bool HasFormat(const RegionSnapshot& s, const std::string& system, uint32_t id) {
  return std::any_of(s.formats.begin(), s.formats.end(), [&](const RegionFormat& f) {
    return f.system == system && f.id == id && f.parsed.has_value();
  });
}

TEST_F(AgentTest, EventsOfAModuleLoadedLaterAreEnabledAndPublished) {
  // The host asks for a module's events before the module is there.
  SetRequests("sched:sched_switch,hvt_alpha", 0, 2);
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_FALSE(HasFormat(Read(), "hvt_alpha", 1496));
  // insmod: its events appear; the loop's watch reports the change.
  Put(inst() / "events/hvt_alpha/alpha_seq/format", ModuleEventFormat(1496));
  Put(inst() / "events/hvt_alpha/alpha_seq/enable", "0");
  agent.Tick(false);  // The request did not change: nothing yet.
  EXPECT_EQ(Slurp(inst() / "events/hvt_alpha/alpha_seq/enable"), "0");
  agent.EventsChanged();
  EXPECT_EQ(Slurp(inst() / "events/hvt_alpha/alpha_seq/enable"), "1");
  EXPECT_TRUE(HasFormat(Read(), "hvt_alpha", 1496));
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "1");
  // Unloaded and loaded again after another module took its ids: the same
  // name with a new id, disabled. Published and enabled anew.
  Put(inst() / "events/hvt_alpha/alpha_seq/format", ModuleEventFormat(1498));
  Put(inst() / "events/hvt_alpha/alpha_seq/enable", "0");
  agent.EventsChanged();
  EXPECT_EQ(Slurp(inst() / "events/hvt_alpha/alpha_seq/enable"), "1");
  EXPECT_TRUE(HasFormat(Read(), "hvt_alpha", 1498));
  // Unloaded for good: forgotten, nothing written for it.
  fs::remove_all(inst() / "events/hvt_alpha");
  agent.EventsChanged();
  EXPECT_FALSE(fs::exists(inst() / "events/hvt_alpha"));
  EXPECT_EQ(Read().guest.status.events_enabled, 1u);
}

TEST_F(AgentTest, GenerationStaysForARestartAndGrowsForANewBoot) {
  {
    Agent agent(options_);
    ASSERT_TRUE(agent.Attach(region_path_).ok());
    EXPECT_EQ(agent.generation(), 1u);
  }
  EXPECT_EQ(Read().guest.status.state, region::kStateDetached);
  EXPECT_FALSE(fs::exists(root_ / "run/region"));
  {
    Agent agent(options_);  // Same boot: same generation.
    ASSERT_TRUE(agent.Attach(region_path_).ok());
    EXPECT_EQ(agent.generation(), 1u);
  }
  // Pretend the region was written by an earlier boot (as after kexec).
  auto* id = reinterpret_cast<region::GuestIdentity*>(host_.data() + region::kGuestIdentityOffset);
  id->boot_id[0] ^= 0xff;
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(agent.generation(), 2u);
  agent.Tick(true);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u);
  EXPECT_NE(s.FindFormat(1, 310), nullptr);  // The old boot's formats stay.
  EXPECT_NE(s.FindFormat(2, 310), nullptr);
}

TEST_F(AgentTest, FreesDirectWriteRingsOfThreadsThatAreGone) {
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  auto* ring0 = reinterpret_cast<region::DwRingHeader*>(host_.data() + geometry_.DwRingOffset(0));
  auto* ring1 = reinterpret_cast<region::DwRingHeader*>(host_.data() + geometry_.DwRingOffset(1));
  ring0->pid = static_cast<uint32_t>(getpid());
  ring0->owner = (uint64_t{1} << 32) | static_cast<uint32_t>(gettid());  // Alive.
  ring1->pid = 0x7ffffff0;
  ring1->owner = (uint64_t{1} << 32) | 0x7ffffff0u;  // No such thread.
  agent.Tick(false);
  EXPECT_NE(ring0->owner, 0u);
  EXPECT_EQ(ring1->owner, 0u);
}

// The device goes away under the agent: the file shrinks to nothing, so the
// mapping raises SIGBUS as a removed BAR does, before any uevent could say
// so. The agent must live, notice at its next tick, detach, and start the
// next region without the backlog recorded for none.
TEST_F(AgentTest, SurvivesTheRegionVanishingAndStartsTheNextOneClean) {
  Put(inst() / "trace", "backlog");
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(inst() / "trace"), "backlog") << "no region went away: kept";
  agent.Tick(true);
  const uint64_t faults = RegionBusFaults();
  ASSERT_EQ(truncate(region_path_.c_str(), 0), 0);
  agent.Tick(true);  // Touches the region: SIGBUS, absorbed.
  EXPECT_FALSE(agent.attached());
  EXPECT_GT(RegionBusFaults(), faults);
  EXPECT_FALSE(fs::exists(root_ / "run/region"));
  agent.Tick(true);  // Detached: nothing to do, nothing to crash on.

  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "0") << "recording for none";

  // A new region at the same place.
  NewRegion(0xb0b);
  Put(inst() / "trace", "backlog");
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(inst() / "trace"), "") << "the detached backlog must be discarded";
  ExpectTopLevelUntouched();
  agent.Tick(true);
  RegionSnapshot s = Read();
  EXPECT_TRUE(s.guest.present);
  EXPECT_EQ(s.guest.status.state, region::kStateRunning);
  EXPECT_EQ(s.issue_total(), 0u);
  EXPECT_GE(s.clock_sync.size(), 2u);
}

// The initramfs agent stops, the systemd unit's agent starts: the instance
// recorded on in between with the first agent's events; the second takes
// them over and forwards the backlog into the same region.
TEST_F(AgentTest, ARestartedAgentKeepsTheBacklogAndTheEventsOfTheSameRegion) {
  {
    Agent agent(options_);
    ASSERT_TRUE(agent.Attach(region_path_).ok());
    agent.Tick(true);
  }
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "1") << "left recording";
  EXPECT_EQ(Slurp(inst() / "tracing_on"), "1");
  EXPECT_TRUE(fs::is_directory(inst())) << "the instance is never removed";
  Put(inst() / "set_event", "sched:sched_switch\n");  // What the kernel lists then.
  Put(inst() / "trace", "backlog");
  Put(inst() / "per_cpu/cpu0/stats", "entries: 5\noverrun: 0\ncommit overrun: 0\n");
  Put(root_ / "tracing/saved_cmdlines_size", "256\n");  // Someone set it after the first agent.
  // A region that has never seen this sched_switch format (as after kexec).
  auto* id = reinterpret_cast<region::GuestIdentity*>(host_.data() + region::kGuestIdentityOffset);
  id->boot_id[0] ^= 0xff;
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(inst() / "trace"), "backlog") << "same region: the backlog is its events";
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "1");
  EXPECT_EQ(Slurp(root_ / "tracing/saved_cmdlines_size"), "256\n")
      << "a resize would drop the names the backlog needs";
  agent.Tick(true);
  RegionSnapshot s = Read();
  EXPECT_EQ(s.guest.status.events_enabled, 1u);
  EXPECT_NE(s.FindFormat(agent.generation(), 310), nullptr)
      << "a taken-over event's format is published for the new generation";
  // The host no longer wants it: the agent disables what it took over.
  SetRequests("", 0, 3);
  agent.Tick(false);
  EXPECT_EQ(Slurp(inst() / "events/sched/sched_switch/enable"), "0");
}

TEST_F(AgentTest, ARestartedAgentOnAnotherRegionDiscardsTheBacklog) {
  {
    Agent agent(options_);
    ASSERT_TRUE(agent.Attach(region_path_).ok());
  }
  EXPECT_EQ(Slurp(root_ / "run/backlog"), "0\n") << "the region (id 0) owns the backlog";
  NewRegion(0xc0ffee);  // Detached and attached anew while no agent ran.
  Put(inst() / "trace", "backlog");
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(inst() / "trace"), "") << "recorded for another region";
  EXPECT_EQ(Slurp(root_ / "run/backlog"), "c0ffee\n");
  ExpectTopLevelUntouched();
}

// trace-cmd record at the top level: a resize would cost it the names of
// tasks that exited, so the global size stays.
TEST_F(AgentTest, LeavesSavedCmdlinesSizeAloneWhileATracerUsesTheTopLevel) {
  Put(root_ / "tracing/events/enable", "X\n");
  Agent agent(options_);
  ASSERT_TRUE(agent.Attach(region_path_).ok());
  EXPECT_EQ(Slurp(root_ / "tracing/saved_cmdlines_size"), "128\n");
}

TEST_F(AgentTest, CreatesItsInstanceAndSaysWhenTracefsHasNone) {
  fs::remove_all(inst());
  options_.instance = "mine";
  Agent agent(options_);
  const Status s = agent.Attach(region_path_);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(fs::is_directory(root_ / "tracing/instances/mine")) << "mkdir, as the kernel wants";
  EXPECT_NE(s.error().message.find("instances/mine is not a tracefs instance"), std::string::npos)
      << s.error().message;
  options_.instance = "../x";
  EXPECT_FALSE(Agent(options_).OpenInstance().ok());
  ExpectTopLevelUntouched();
}

TEST_F(AgentTest, RefusesARegionWithoutMagic) {
  std::memset(host_.data(), 0, 16);
  Agent agent(options_);
  EXPECT_FALSE(agent.Attach(region_path_).ok());
  EXPECT_FALSE(agent.attached());
}

TEST(Uevent, ParsesKernelMessagesAndIgnoresOthers) {
  const char msg[] =
      "add@/devices/pci0000:00/0000:00:04.0\0ACTION=add\0DEVPATH=/devices/pci0000:00/0000:00:04.0\0"
      "SUBSYSTEM=pci\0PCI_CLASS=50000\0PCI_ID=1AF4:1110\0PCI_SUBSYS_ID=1AF4:1100\0"
      "PCI_SLOT_NAME=0000:00:04.0\0SEQNUM=1234";
  Uevent e;
  ASSERT_TRUE(ParseUevent(std::string_view(msg, sizeof(msg) - 1), &e));
  EXPECT_EQ(e.action, "add");
  EXPECT_EQ(e.pci_slot, "0000:00:04.0");
  EXPECT_TRUE(e.IsIvshmem());
  const char other[] =
      "remove@/devices/virtual/net/lo\0ACTION=remove\0DEVPATH=/devices/virtual/net/"
      "lo\0SUBSYSTEM=net";
  ASSERT_TRUE(ParseUevent(std::string_view(other, sizeof(other) - 1), &e));
  EXPECT_FALSE(e.IsIvshmem());
  EXPECT_FALSE(ParseUevent(std::string_view("libudev\0\xfe\xed", 10), &e));
  EXPECT_FALSE(ParseUevent("", &e));
}

}  // namespace
}  // namespace hvtrace::agent
