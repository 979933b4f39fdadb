#include "config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace hvtrace::hostd {
namespace {

TEST(ConfigTest, DefaultsAreSane) {
  Config c;
  EXPECT_EQ(c.state_dir, "/var/lib/hvtrace");
  EXPECT_EQ(c.run_dir, "/run/hvtrace");
  EXPECT_EQ(c.EffectiveSocketPath(), "/run/hvtrace/hvtraced.sock");
  EXPECT_EQ(c.panic_policy, PanicPolicy::kPause);
  EXPECT_FALSE(c.vmcore_on_panic);
  EXPECT_GT(c.capture_retention, 0);
  EXPECT_EQ(c.socket_group, "hvtrace");
  EXPECT_EQ(c.admin_group, "hvtrace-admin");
  // Production default: a daemon restart must not take its VMs down.
  EXPECT_EQ(c.vm_on_shutdown, VmOnShutdown::kKeep);
}

TEST(ConfigTest, ParsesEveryKey) {
  auto c = ParseConfig(R"(# comment
state_dir = /tmp/s
  run_dir=/tmp/r
socket = "/tmp/r/x.sock"
socket_group =
admin_group = 4711
capture_retention = 0
panic_policy = quit
vmcore = on-panic
worker_threads = 3
vm_on_shutdown = stop
max_connections = 5
max_requests_per_connection = 2
cache_dir = /var/cache/hvt
harvest_initrd = /usr/lib/hvtrace/initrd.img
capture_bytes_per_vm = 1G
capture_bytes_total = 0
capture_free_reserve = 64MiB
console_log_size = 512k
console_log_files = 3
guest_capture_interval = 1500ms
log_watch = warn
log_watch_interval = 250ms
)",
                       "test.conf");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->state_dir, "/tmp/s");
  EXPECT_EQ(c->run_dir, "/tmp/r");
  EXPECT_EQ(c->EffectiveSocketPath(), "/tmp/r/x.sock");
  EXPECT_EQ(c->socket_group, "");
  EXPECT_EQ(c->admin_group, "4711");
  EXPECT_EQ(c->capture_retention, 0);
  EXPECT_EQ(c->panic_policy, PanicPolicy::kQuit);
  EXPECT_TRUE(c->vmcore_on_panic);
  EXPECT_EQ(c->worker_threads, 3);
  EXPECT_EQ(c->guest_capture_interval, std::chrono::milliseconds(1500));
  EXPECT_FALSE(c->log_watch_oops);
  EXPECT_TRUE(c->log_watch_warn);
  EXPECT_EQ(LogWatchName(*c), "warn");
  EXPECT_EQ(c->log_watch_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c->vm_on_shutdown, VmOnShutdown::kStop);
  EXPECT_EQ(c->max_connections, 5);
  EXPECT_EQ(c->max_requests_per_connection, 2);
  EXPECT_EQ(c->cache_dir, "/var/cache/hvt");
  EXPECT_EQ(c->harvest_initrd, "/usr/lib/hvtrace/initrd.img");
  EXPECT_EQ(c->capture_bytes_per_vm, 1ull << 30);
  EXPECT_EQ(c->capture_bytes_total, 0u);
  EXPECT_EQ(c->capture_free_reserve, 64ull << 20);
  EXPECT_EQ(c->console_log_size, 512u << 10);
  EXPECT_EQ(c->console_log_files, 3);
}

TEST(ConfigTest, LibvirtUriDefaultsToSystemAndMayBeTurnedOff) {
  EXPECT_EQ(Config{}.libvirt_uri, "qemu:///system");
  auto c = ParseConfig("libvirt_uri = qemu:///system?socket=/tmp/lv/sock\n", "t");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->libvirt_uri, "qemu:///system?socket=/tmp/lv/sock");
  auto off = ParseConfig("libvirt_uri =\n", "t");
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_EQ(off->libvirt_uri, "");
}

TEST(ConfigTest, LibvirtQemuLogDirIsAnAbsolutePath) {
  EXPECT_EQ(Config{}.libvirt_qemu_log_dir, "/var/log/libvirt/qemu");
  auto c = ParseConfig("libvirt_qemu_log_dir = /tmp/lv/log/qemu\n", "t");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->libvirt_qemu_log_dir, "/tmp/lv/log/qemu");
  auto relative = ParseConfig("libvirt_qemu_log_dir = log/qemu\n", "t");
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.error().message.find("not an absolute path"), std::string::npos)
      << relative.error().message;
}

TEST(ConfigTest, SocketFollowsRunDir) {
  auto c = ParseConfig("run_dir = /tmp/rr\n", "t");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->EffectiveSocketPath(), "/tmp/rr/hvtraced.sock");
}

struct BadConfig {
  const char* text;
  const char* fragment;
};

class ConfigBadTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigBadTest, ErrorsNameFileLineAndKey) {
  auto c = ParseConfig(GetParam().text, "/etc/x.conf");
  ASSERT_FALSE(c.ok()) << GetParam().text;
  EXPECT_NE(c.error().message.find("/etc/x.conf:"), std::string::npos) << c.error().message;
  EXPECT_NE(c.error().message.find(GetParam().fragment), std::string::npos) << c.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    All, ConfigBadTest,
    ::testing::Values(
        BadConfig{"state_dir\n", ":1: expected 'key = value'"},
        BadConfig{"\n\nstat_dir = /x\n", ":3: unknown key 'stat_dir'"},
        BadConfig{"state_dir = relative\n", "not an absolute path"},
        BadConfig{"cache_dir = ~/cache\n", "not an absolute path"},
        BadConfig{"panic_policy = explode\n", "pause, resume, quit"},
        BadConfig{"worker_threads = 0\n", "outside 1..64"},
        BadConfig{"guest_capture_interval = 2d\n", "guest_capture_interval"},
        BadConfig{"guest_capture_interval = 25h\n", "at most 24h"},
        BadConfig{"log_watch = oops,panic\n", "'panic' is not one of oops, warn"},
        BadConfig{"log_watch = \n", "'' is not one of oops, warn"},
        BadConfig{"log_watch_interval = 10ms\n", "between 100ms and 1h"},
        BadConfig{"worker_threads = 2x\n", "not an integer"},
        BadConfig{"capture_retention = 99999999999\n", "not an integer"},
        BadConfig{"run_dir = /a\nrun_dir = /b\n", ":2: 'run_dir' is set twice"},
        BadConfig{" = 3\n", "missing key"},
        BadConfig{"capture_bytes_total = lots\n", "capture_bytes_total: "},
        BadConfig{"console_log_size = 100\n", "at least 4096"},
        BadConfig{"console_log_files = 0\n", "outside 1..100"},
        BadConfig{"log_level = loud\n", "log_level: 'loud' is not one of err"},
        BadConfig{"qemu_sandbox = yes\n", "qemu_sandbox: 'yes' is not one of on, off"},
        BadConfig{"qemu_user = a,b\n", "qemu_user: 'a,b' is not a user name"},
        BadConfig{"qemu_binary = my qemu\n", "qemu_binary: 'my qemu' is not a program"},
        BadConfig{"vm_on_shutdown = kill\n", "vm_on_shutdown: 'kill' is not one of keep, stop"}));

TEST(ConfigTest, MissingDefaultFileMeansDefaults) {
  auto c = LoadConfigFile("/nonexistent/hvtraced.conf", false);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state_dir, "/var/lib/hvtrace");
  auto named = LoadConfigFile("/nonexistent/hvtraced.conf", true);
  ASSERT_FALSE(named.ok());
  EXPECT_NE(named.error().message.find("/nonexistent/hvtraced.conf"), std::string::npos);
}

// The packaged default config must parse and match the built-in defaults, so
// installing it changes nothing by surprise.
TEST(ConfigTest, PackagedConfigParsesToDefaults) {
  auto c = LoadConfigFile(std::string(HVTRACE_SOURCE_DIR) + "/hostd/packaging/hvtraced.conf", true);
  ASSERT_TRUE(c.ok()) << c.error().message;
  Config d;
  EXPECT_EQ(c->state_dir, d.state_dir);
  EXPECT_EQ(c->run_dir, d.run_dir);
  EXPECT_EQ(c->EffectiveSocketPath(), d.EffectiveSocketPath());
  EXPECT_EQ(c->socket_group, d.socket_group);
  EXPECT_EQ(c->capture_retention, d.capture_retention);
  EXPECT_EQ(c->panic_policy, d.panic_policy);
  EXPECT_EQ(c->vm_on_shutdown, d.vm_on_shutdown);
  EXPECT_EQ(c->capture_bytes_per_vm, d.capture_bytes_per_vm);
  EXPECT_EQ(c->capture_bytes_total, d.capture_bytes_total);
  EXPECT_EQ(c->capture_free_reserve, d.capture_free_reserve);
  EXPECT_EQ(c->console_log_size, d.console_log_size);
  EXPECT_EQ(c->console_log_files, d.console_log_files);
  EXPECT_EQ(c->log_level, d.log_level);
  EXPECT_EQ(c->qemu_sandbox, d.qemu_sandbox);
  EXPECT_EQ(c->qemu_user, d.qemu_user);
  EXPECT_EQ(c->qemu_binary, d.qemu_binary);
  EXPECT_EQ(c->cache_dir, d.cache_dir);
}

TEST(ConfigTest, ServiceKeysDefaultToInfoSandboxOnAndRoot) {
  Config d;
  EXPECT_EQ(d.log_level, LogLevel::kInfo);
  EXPECT_TRUE(d.qemu_sandbox);
  EXPECT_EQ(d.qemu_user, "");
  EXPECT_EQ(d.qemu_binary, "qemu-system-x86_64");
  auto c = ParseConfig(
      "log_level = debug\nqemu_sandbox = off\nqemu_user = hvtrace-qemu\n"
      "qemu_binary = /opt/qemu-10/bin/qemu-system-x86_64\n",
      "t");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->qemu_binary, "/opt/qemu-10/bin/qemu-system-x86_64");
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_FALSE(c->qemu_sandbox);
  EXPECT_EQ(c->qemu_user, "hvtrace-qemu");
}

// systemd's StateDirectory=/RuntimeDirectory=/CacheDirectory= are defaults;
// a key in the file wins over them.
TEST(ConfigTest, SystemdDirectoriesAreDefaultsTheFileOverrides) {
  auto env = [](const char* name) -> const char* {
    std::string_view n(name);
    if (n == "STATE_DIRECTORY") return "/var/lib/hvtrace2:/var/lib/other";
    if (n == "RUNTIME_DIRECTORY") return "/run/hvtrace2";
    if (n == "CACHE_DIRECTORY") return "/var/cache/hvtrace";
    return nullptr;
  };
  Config d = ServiceDefaults(env);
  EXPECT_EQ(d.state_dir, "/var/lib/hvtrace2");
  EXPECT_EQ(d.run_dir, "/run/hvtrace2");
  EXPECT_EQ(d.cache_dir, "/var/cache/hvtrace");
  auto c = ParseConfig("cache_dir = /srv/cache\n", "t", d);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cache_dir, "/srv/cache");
  EXPECT_EQ(c->state_dir, "/var/lib/hvtrace2");
  // Nothing set, or a relative value: the built-in defaults.
  Config none = ServiceDefaults([](const char* name) -> const char* {
    return std::string_view(name) == "STATE_DIRECTORY" ? "relative" : nullptr;
  });
  EXPECT_EQ(none.state_dir, "/var/lib/hvtrace");
  EXPECT_EQ(none.run_dir, "/run/hvtrace");
  EXPECT_TRUE(none.cache_dir.empty());
}

TEST(ConfigTest, ClientSocketPrecedence) {
  EXPECT_EQ(ResolveClientSocket("/flag.sock"), "/flag.sock");
  setenv("HVTRACE_SOCKET", "/env.sock", 1);
  EXPECT_EQ(ResolveClientSocket(""), "/env.sock");
  EXPECT_EQ(ResolveClientSocket("/flag.sock"), "/flag.sock");
  unsetenv("HVTRACE_SOCKET");
}

}  // namespace
}  // namespace hvtrace::hostd
