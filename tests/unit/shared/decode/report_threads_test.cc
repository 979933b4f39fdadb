// WriteReport prints on several threads (ReportPrinter): its output must not
// depend on how many, nor on where the batches end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "hvtrace/output.h"
#include "hvtrace/tracedat.h"
#include "hvtrace/tracedat_writer.h"
#include "test_support.h"

namespace hvtrace {
namespace {

std::string Fixture(const char* name) {
  return std::string(HVTRACE_FIXTURES_DIR) + "/tracedat/" + name;
}

// |name| rewritten without its saved_cmdlines: every task is then named by
// the first sched_switch or sched_wakeup that prints it, so a record's name
// depends on the records before it.
std::string WithoutCmdlines(const char* name, const std::string& dir) {
  Result<TraceDat> dat = TraceDat::Open(Fixture(name));
  EXPECT_TRUE(dat.ok());
  if (!dat.ok()) return {};
  TraceDatWriterInput in;
  in.page_size = dat->page_size();
  in.long_size = dat->long_size();
  in.header_page = dat->header_page();
  in.header_event = dat->header_event();
  in.formats = dat->formats();
  in.kallsyms = dat->kallsyms();
  in.printk_formats = dat->printk_formats();
  in.trace_clock = "local";
  std::vector<std::vector<std::vector<std::byte>>> pages(dat->cpus().size());
  for (size_t i = 0; i < dat->cpus().size(); ++i) {
    EXPECT_TRUE(dat->ForEachPage(i,
                                 [&](std::span<const std::byte> page, uint64_t) {
                                   pages[i].emplace_back(page.begin(), page.end());
                                   return true;
                                 })
                    .ok());
  }
  in.cpus.resize(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    for (const auto& page : pages[i]) in.cpus[i].emplace_back(page);
  }
  const std::string path = dir + "/no-cmdlines.dat";
  EXPECT_TRUE(WriteTraceDat(path, in).ok());
  return path;
}

// WriteReport's output and stats for |options|.
std::string Report(const std::string& path, const ReportOptions& options, ReportStats* stats) {
  const int fd = ::memfd_create("report", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  Result<ReportStats> r = WriteReport(path, options, fd);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (r.ok()) *stats = *r;
  std::string text(static_cast<size_t>(::lseek(fd, 0, SEEK_END)), '\0');
  EXPECT_EQ(::pread(fd, text.data(), text.size(), 0), static_cast<ssize_t>(text.size()));
  ::close(fd);
  return text;
}

struct Case {
  const char* fixture;
  OutputFormat format;
  bool time_names;
  bool drop_cmdlines = false;
  bool fast_paths = true;
};

class ReportThreadsTest : public testing::TestWithParam<Case> {};

TEST_P(ReportThreadsTest, EveryThreadCountAndBatchSizePrintsTheSameBytes) {
  const Case& c = GetParam();
  test_support::TempDir dir;
  const std::string path =
      c.drop_cmdlines ? WithoutCmdlines(c.fixture, dir.path().string()) : Fixture(c.fixture);
  ReportOptions single;
  single.format = c.format;
  single.time_names = c.time_names;
  single.fast_paths = c.fast_paths;
  single.threads = 0;  // The calling thread prints every record.
  ReportStats single_stats;
  const std::string expected = Report(path, single, &single_stats);
  ASSERT_GT(single_stats.events, 500u);

  for (int threads : {1, 2, 5}) {
    for (size_t batch : {size_t{1}, size_t{7}, size_t{0}}) {
      ReportOptions parallel = single;
      parallel.threads = threads;
      parallel.batch_records = batch;
      ReportStats stats;
      const std::string text = Report(path, parallel, &stats);
      EXPECT_TRUE(text == expected)
          << c.fixture << ": " << threads << " threads, batches of " << batch << ": " << text.size()
          << " vs " << expected.size() << " bytes";
      EXPECT_EQ(stats.events, single_stats.events);
      EXPECT_EQ(stats.fast_path_events, single_stats.fast_path_events);
      EXPECT_EQ(stats.issues, single_stats.issues);
    }
  }
}

// ReportOptions::leave_to_exit (`hvtrace report`) leaves the decoder and
// the file's texts to the process's exit: the same bytes, stats and
// warnings, and no trial child left running.
TEST(ReportLeaveToExitTest, PrintsTheSameAndEndsTheTrialChild) {
  for (int threads : {0, 2}) {
    SCOPED_TRACE(threads);
    ReportOptions freed;
    freed.threads = threads;
    ReportStats freed_stats;
    const std::string expected = Report(Fixture("real-v7-zstd.dat"), freed, &freed_stats);
    ASSERT_GT(freed_stats.events, 500u);
    ReportOptions left = freed;
    left.leave_to_exit = true;
    ReportStats left_stats;
    EXPECT_TRUE(Report(Fixture("real-v7-zstd.dat"), left, &left_stats) == expected);
    EXPECT_EQ(left_stats.events, freed_stats.events);
    EXPECT_EQ(left_stats.issues, freed_stats.issues);
    EXPECT_EQ(test_support::ChildProcesses(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReportThreadsTest,
                         testing::Values(Case{"real-v6.dat", OutputFormat::kText, false},
                                         Case{"real-v7-zstd.dat", OutputFormat::kText, false},
                                         Case{"real-v7-zstd.dat", OutputFormat::kText, true},
                                         Case{"real-v7-zstd.dat", OutputFormat::kJson, false},
                                         Case{"real-v7-zstd.dat", OutputFormat::kJson, true},
                                         Case{"real-v7-zstd.dat", OutputFormat::kText, false, true},
                                         Case{"real-v6.dat", OutputFormat::kText, false, false,
                                              false},
                                         Case{"instance-v7-zstd.dat", OutputFormat::kText, false}));

}  // namespace
}  // namespace hvtrace
