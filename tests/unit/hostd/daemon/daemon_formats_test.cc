// The daemon's formats cache through the real hvtraced and the real hvtrace
// CLI, without booting a guest: formats-list shows the cache the daemon
// decodes with, `hvtrace formats` goes to the daemon when one answers and to
// the local cache (saying so) when none does, and a harvest that cannot run
// fails with the kernel's path and the reason, leaving no copy behind. The
// harvest itself (a TCG guest) is tested in tests/e2e/formats_daemon_e2e.cc.
#include "fixture_bundle.h"
#include "formats_cache.h"
#include "hostd/daemon/daemon_process.h"

namespace hvtrace::hostd {
namespace {

using namespace testing_daemon;  // NOLINT: the tests' own helpers.
namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

const std::string kKey(64, 'c');

// A daemon whose config names its own cache (|d.dir()|/cache) holding one
// entry, the boot_map fixture kernel's.
void StartWithOneCachedKernel(DaemonProcess& d, const std::string& extra_config = "") {
  const fs::path cache = d.dir() / "cache";
  ASSERT_TRUE(FormatCache(cache)
                  .Store(kKey, test_support::BootMapFixtureBundle(),
                         {{"kernel_path", "/boot/vmlinuz-fixture"}})
                  .ok());
  d.config_text = "socket_group =\ncache_dir = " + cache.string() + "\n" + extra_config;
  d.Start();
}

// `hvtrace ARGS...` with HOME and XDG_CACHE_HOME in |home| and no
// HVTRACE_CACHE_DIR: where a local cache would go is known and empty.
int Cli(const fs::path& home, std::vector<std::string> args, std::string* out,
        const fs::path& out_file) {
  std::vector<std::string> argv = {"/usr/bin/env",
                                   "-u",
                                   "HVTRACE_CACHE_DIR",
                                   "-u",
                                   "HVTRACE_SOCKET",
                                   "HOME=" + home.string(),
                                   "XDG_CACHE_HOME=" + (home / ".cache").string(),
                                   (kBinDir / "hvtrace").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return DaemonProcess::Run(argv, out, out_file);
}

TEST(DaemonFormatsTest, ListShowsTheDaemonsCache) {
  DaemonProcess d;
  StartWithOneCachedKernel(d);
  auto c = d.Client();
  Reply r = Call(c, "formats-list");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result["cache"], (d.dir() / "cache" / "formats").string());
  ASSERT_EQ(r.result["kernels"].size(), 1u) << r.result.dump();
  EXPECT_EQ(r.result["kernels"][0]["key"], kKey);
  EXPECT_EQ(r.result["kernels"][0]["release"], "6.12.95+deb12-amd64");
  EXPECT_EQ(r.result["kernels"][0]["kernel"], "/boot/vmlinuz-fixture");
  EXPECT_EQ(r.result["kernels"][0]["state"], "cached");
  EXPECT_EQ(r.result["harvests"], json::array());
  EXPECT_EQ(r.result["problems"], json::array());
}

// The CLI asks the daemon that answers, and says which cache it used when
// none does; the local cache is never touched while the daemon answers.
TEST(DaemonFormatsTest, CliListsTheDaemonsCacheAndFallsBackToTheLocalOneWithoutADaemon) {
  DaemonProcess d;
  StartWithOneCachedKernel(d);
  const fs::path home = d.dir() / "home";
  fs::create_directories(home);
  std::string out;
  ASSERT_EQ(
      Cli(home, {"formats", "list", "--socket", d.socket().string()}, &out, d.dir() / "cli.out"), 0)
      << out;
  EXPECT_NE(out.find("hvtraced's cache " + (d.dir() / "cache" / "formats").string()),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("6.12.95+deb12-amd64"), std::string::npos) << out;
  EXPECT_EQ(out.find("local cache"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(home / ".cache" / "hvtrace")) << out;

  // No daemon on that socket: the local cache, said in one line.
  const fs::path none = d.dir() / "run" / "none.sock";
  ASSERT_EQ(Cli(home, {"formats", "list", "--socket", none.string()}, &out, d.dir() / "cli2.out"),
            0)
      << out;
  EXPECT_NE(out.find("hvtrace formats list: no hvtraced answers on " + none.string() +
                     "; using the local cache " + (home / ".cache" / "hvtrace").string() + "\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("no cached kernels in " + (home / ".cache" / "hvtrace" / "formats").string()),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("6.12.95+deb12-amd64"), std::string::npos) << out;

  // --initrd is for a local cache: through the daemon it is a usage error
  // that says why, and nothing is sent.
  const fs::path kernel = d.dir() / "vmlinuz";
  std::ofstream(kernel) << "not a kernel";
  ASSERT_EQ(Cli(home,
                {"formats", "harvest", "--kernel", kernel.string(), "--initrd", kernel.string(),
                 "--socket", d.socket().string()},
                &out, d.dir() / "cli3.out"),
            2)
      << out;
  EXPECT_NE(out.find("hvtraced harvests with its own initramfs (harvest_initrd)"),
            std::string::npos)
      << out;
  EXPECT_EQ(d.Log().find("asked for the formats"), std::string::npos) << d.Log();
}

// A harvest the daemon cannot run (its harvest initramfs is writable by
// others, so its report could not be trusted) fails with the client's kernel
// path and the reason, before any guest boots; the daemon's private copy of
// the kernel is gone afterwards and the cache holds nothing new.
TEST(DaemonFormatsTest, Malicious_HarvestWithAnUntrustedInitramfsFailsNamingKernelAndCause) {
  DaemonProcess d;
  const fs::path initrd = d.dir() / "initrd.img";
  std::ofstream(initrd) << "not an initramfs";
  fs::permissions(initrd, fs::perms::all);
  StartWithOneCachedKernel(d, "harvest_initrd = " + initrd.string() + "\n");
  const fs::path kernel = d.dir() / "vmlinuz-other";
  std::ofstream(kernel) << "another kernel build";
  const fs::path home = d.dir() / "home";
  fs::create_directories(home);
  std::string out;
  EXPECT_EQ(
      Cli(home,
          {"formats", "harvest", "--kernel", kernel.string(), "--socket", d.socket().string()},
          &out, d.dir() / "cli.out"),
      1)
      << out;
  EXPECT_NE(
      out.find("hvtrace formats harvest: harvest of " + kernel.string() + ": harvest initramfs"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("writable by others"), std::string::npos) << out;
  // The progress line came from the daemon and named its cache.
  EXPECT_NE(out.find("hvtraced: kernel "), std::string::npos) << out;
  EXPECT_NE(out.find("queued for hvtraced's cache " + (d.dir() / "cache" / "formats").string()),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(home / ".cache" / "hvtrace")) << out;
  const fs::path inputs = d.state() / "harvest" / "inputs";
  ASSERT_TRUE(fs::is_directory(inputs));
  EXPECT_TRUE(fs::is_empty(inputs));
  struct stat st;
  ASSERT_EQ(::stat(inputs.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  // formats-list reports the failed harvest beside the cached kernel.
  auto c = d.Client();
  Reply r = Call(c, "formats-list");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result["kernels"].size(), 1u) << r.result.dump();
  ASSERT_EQ(r.result["harvests"].size(), 1u) << r.result.dump();
  EXPECT_NE(r.result["harvests"][0]["state"].get<std::string>().find("harvest failed"),
            std::string::npos)
      << r.result.dump();
}

}  // namespace
}  // namespace hvtrace::hostd
