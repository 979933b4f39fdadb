// qmp_vm.json: what a restarted hvtraced reads to re-adopt a VM. It is our own
// file, but it outlives versions of the daemon and may be damaged: old specs
// load with defaults, broken ones are refused with the file named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "qmp_vm.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

class QmpVmSpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path("/tmp") / ("hvt-spec-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(QmpVmSpecTest, RoundTripKeepsWhatReadoptionNeeds) {
  QmpVmSpec spec;
  spec.qmp_socket = "/run/hvtrace/web1.qmp";
  spec.region_path = "/dev/shm/hvtrace-web1";
  spec.region_size = 16 << 20;
  spec.region_gpa = 0x40000000;
  spec.pid = 4242;
  spec.pid_start_time = 987654321;
  spec.console_socket = "/run/hvtrace/web1.console";
  spec.owned_paths = {"/run/hvtrace/web1.qmp", "/run/hvtrace/web1.console",
                      "/dev/shm/hvtrace-web1"};
  spec.booted_by_daemon = true;
  spec.exited = true;
  spec.region_owner = 994;
  ASSERT_TRUE(SaveQmpVmSpec(dir_, spec).ok());
  auto loaded = LoadQmpVmSpec(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->pid, 4242);
  EXPECT_EQ(loaded->pid_start_time, 987654321u);
  EXPECT_EQ(loaded->console_socket, spec.console_socket);
  EXPECT_EQ(loaded->owned_paths, spec.owned_paths);
  EXPECT_TRUE(loaded->booted_by_daemon);
  EXPECT_TRUE(loaded->exited);
  EXPECT_EQ(loaded->region_gpa, 0x40000000u);
  EXPECT_EQ(loaded->region_owner, std::optional<uid_t>(994));
}

TEST_F(QmpVmSpecTest, SpecFromAnOlderDaemonLoadsWithDefaults) {
  // Written before pid_start_time/owned_paths existed: re-adoption then
  // cannot prove the pid is that QEMU and must not claim it.
  std::ofstream(dir_ / "qmp_vm.json") << R"({"qmp_socket":"/run/x.qmp","region_path":"/dev/shm/x",
      "region_offset":0,"region_size":4096,"pid":17,"booted_by_daemon":true})";
  auto loaded = LoadQmpVmSpec(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->pid_start_time, 0u);
  EXPECT_TRUE(loaded->owned_paths.empty());
  EXPECT_FALSE(loaded->exited);
  EXPECT_FALSE(loaded->region_owner.has_value());  // Not checked at re-adoption.
}

TEST_F(QmpVmSpecTest, Malicious_DamagedSpecsAreRefusedWithThePath) {
  for (const char* text :
       {"not json", "[]", R"({"qmp_socket":"/x"})",
        R"({"qmp_socket":"/x","region_path":"/y","region_offset":0,"region_size":0})",
        R"({"qmp_socket":"/x","region_path":"/y","region_offset":0,"region_size":4096,
                               "owned_paths":"not-a-list"})"}) {
    std::ofstream(dir_ / "qmp_vm.json", std::ios::trunc) << text;
    auto loaded = LoadQmpVmSpec(dir_);
    ASSERT_FALSE(loaded.ok()) << text;
    EXPECT_NE(loaded.error().message.find((dir_ / "qmp_vm.json").string()), std::string::npos)
        << loaded.error().message;
  }
}

}  // namespace
}  // namespace hvtrace::hostd
