// The libvirt VM record hvtraced keeps in its state dir so a restarted daemon
// re-adopts the domain: round trip, and what a hand-edited file gets.
#include "daemon_libvirt.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace hvtrace::hostd {
namespace {

class LibvirtVmRecordTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.empty()); }
  void Write(const std::string& text) { std::ofstream(LibvirtVmRecordPath(dir_)) << text; }
  test_support::TempDir tmp_{"hvt-lvrec"};
  std::filesystem::path dir_ = tmp_.path();
};

TEST_F(LibvirtVmRecordTest, RoundTrips) {
  LibvirtVmRecord r{"web1", "0b7c1c7e-1111-2222-3333-444455556666", "qemu:///system"};
  ASSERT_TRUE(SaveLibvirtVmRecord(dir_, r).ok());
  Result<LibvirtVmRecord> back = LoadLibvirtVmRecord(dir_);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->domain, "web1");
  EXPECT_EQ(back->uuid, r.uuid);
  EXPECT_EQ(back->uri, "qemu:///system");
  EXPECT_FALSE(std::filesystem::exists(LibvirtVmRecordPath(dir_).string() + ".tmp"));
}

TEST_F(LibvirtVmRecordTest, MissingFileIsAnErrorNamingThePath) {
  Result<LibvirtVmRecord> r = LoadLibvirtVmRecord(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(LibvirtVmRecordPath(dir_).string()), std::string::npos);
}

TEST_F(LibvirtVmRecordTest, MalformedFilesAreRefusedWithThePath) {
  const std::vector<std::string> bad = {"",
                                        "not json",
                                        "[]",
                                        "{\"domain\": 3, \"uuid\": \"x\"}",
                                        "{\"domain\": \"a\"}",
                                        std::string(70000, ' ') + "{}"};
  for (const std::string& text : bad) {
    Write(text);
    Result<LibvirtVmRecord> r = LoadLibvirtVmRecord(dir_);
    ASSERT_FALSE(r.ok()) << text.substr(0, 40);
    EXPECT_NE(r.error().message.find("libvirt_vm.json"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace hvtrace::hostd
