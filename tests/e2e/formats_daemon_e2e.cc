// One formats cache, the daemon's (issue #30 item 2), tried the way users
// run it: hvtraced runs as root with socket_group and admin_group set to
// numeric gids and its own cache_dir; the real `hvtrace` CLI runs as uid
// 65534 through setpriv, with HOME in a directory of its own.
//
//   admin: `hvtrace formats harvest --kernel K` boots the 6.12 kernel (TCG)
//     in hvtraced, which harvests with its own initramfs into its cache_dir:
//     the entry appears there, with the client's path in its manifest, and
//     nothing appears in the user's ~/.cache. A second harvest is a hit.
//   observer: `hvtrace formats list` shows the entry from hvtraced's cache;
//     `hvtrace formats harvest` is refused naming the admin group.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "guest_harness.h"
#include "host_command.h"
#include "hvtraced_harness.h"
#include "sha256.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr gid_t kObserverGid = 47031;
constexpr gid_t kAdminGid = 47032;
constexpr uid_t kUser = 65534;

// `hvtrace ARGS... --socket SOCK` as uid 65534 with |gid| as its only
// supplementary group and HOME=|home|.
RunResult AsUser(const HvtracedProcess& daemon, const std::string& cli, gid_t gid,
                 const std::string& home, std::vector<std::string> args) {
  std::vector<std::string> argv = {"setpriv",
                                   "--reuid=" + std::to_string(kUser),
                                   "--regid=" + std::to_string(kUser),
                                   "--groups=" + std::to_string(gid),
                                   "--",
                                   "env",
                                   "-u",
                                   "HVTRACE_CACHE_DIR",
                                   "HOME=" + home,
                                   "XDG_CACHE_HOME=" + home + "/.cache",
                                   cli};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--socket");
  argv.push_back(daemon.socket());
  return RunArgvStatus(argv);
}

TEST(FormatsDaemonE2e, CliHarvestFillsTheDaemonsCacheAndObserversOnlyList) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (std::string why = OtherUserUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  // The daemon's cache is named in its config (a root-only directory), so
  // it cannot coincide with anyone's ~/.cache by accident.
  test_support::TempDir cache_parent("hvtrace-fmt-e2e");
  const fs::path cache = cache_parent.path() / "cache";
  HvtracedProcess daemon({.tag = "fmt",
                          .config = "admin_group = " + std::to_string(kAdminGid) +
                                    "\ncache_dir = " + cache.string() + "\n",
                          .socket_group = std::to_string(kObserverGid)});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  Result<std::string> shared_cli = CliForOtherUsers(daemon);
  ASSERT_TRUE(shared_cli.ok()) << shared_cli.error().message;
  const std::string cli = *shared_cli;
  const std::string kernel = PublicCopy(image->kernel, daemon.dir());
  const std::string home = daemon.dir() + "/home";
  fs::create_directories(home);
  ASSERT_EQ(::chown(home.c_str(), kUser, kUser), 0);
  auto key = hostd::Sha256File(kernel);
  ASSERT_TRUE(key.ok()) << key.error().message;
  const fs::path entry = cache / "formats" / *key;

  // An observer may list but not harvest.
  RunResult refused =
      AsUser(daemon, cli, kObserverGid, home, {"formats", "harvest", "--kernel", kernel});
  EXPECT_EQ(refused.status, 7) << Describe(refused);
  EXPECT_NE(refused.output.find("'formats-harvest' needs the admin role"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("gid " + std::to_string(kAdminGid)), std::string::npos)
      << refused.output;
  EXPECT_FALSE(fs::exists(entry));

  // An admin harvests through the daemon, into the daemon's cache.
  RunResult harvested =
      AsUser(daemon, cli, kAdminGid, home, {"formats", "harvest", "--kernel", kernel});
  std::printf("[formats daemon e2e] admin harvest: %s", Describe(harvested).c_str());
  ASSERT_EQ(harvested.status, 0) << Describe(harvested) << "\n" << daemon.LogTail();
  EXPECT_NE(harvested.output.find("status    harvested in"), std::string::npos) << harvested.output;
  EXPECT_NE(harvested.output.find("path      " + entry.string()), std::string::npos)
      << harvested.output;
  EXPECT_NE(harvested.output.find("hvtraced: kernel " + *key + ": queued for hvtraced's cache " +
                                  (cache / "formats").string()),
            std::string::npos)
      << harvested.output;
  EXPECT_EQ(harvested.output.find("local cache"), std::string::npos) << harvested.output;
  ASSERT_TRUE(fs::is_regular_file(entry / "manifest.json")) << daemon.LogTail();
  const json manifest = json::parse(test_support::ReadText(entry / "manifest.json"));
  EXPECT_EQ(manifest.value("kernel_path", ""), kernel) << manifest.dump();
  EXPECT_EQ(manifest.value("release", ""), image->release) << manifest.dump();
  EXPECT_FALSE(fs::exists(home + "/.cache/hvtrace")) << "the user's own cache was filled";
  // The daemon's copy of the kernel is gone.
  EXPECT_TRUE(fs::is_empty(fs::path(daemon.state_dir()) / "harvest" / "inputs"));

  // The observer sees it in the daemon's cache.
  RunResult listed = AsUser(daemon, cli, kObserverGid, home, {"formats", "list"});
  EXPECT_EQ(listed.status, 0) << Describe(listed);
  EXPECT_NE(listed.output.find("hvtraced's cache " + (cache / "formats").string()),
            std::string::npos)
      << listed.output;
  EXPECT_NE(listed.output.find(image->release), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find(key->substr(0, 16)), std::string::npos) << listed.output;
  RunResult listed_json = AsUser(daemon, cli, kObserverGid, home, {"formats", "list", "--json"});
  ASSERT_EQ(listed_json.status, 0) << Describe(listed_json);
  const json list = json::parse(listed_json.output.substr(listed_json.output.find('{')));
  ASSERT_EQ(list["kernels"].size(), 1u) << list.dump();
  EXPECT_EQ(list["kernels"][0]["key"], *key);
  EXPECT_EQ(list["kernels"][0]["state"], "loaded");  // The harvest loaded it for captures.

  // A second harvest is a cache hit, no guest.
  RunResult again =
      AsUser(daemon, cli, kAdminGid, home, {"formats", "harvest", "--kernel", kernel});
  EXPECT_EQ(again.status, 0) << Describe(again);
  EXPECT_NE(again.output.find("status    cached"), std::string::npos) << again.output;
  EXPECT_FALSE(fs::exists(home + "/.cache/hvtrace"));
}

}  // namespace
}  // namespace hvtrace::e2e
