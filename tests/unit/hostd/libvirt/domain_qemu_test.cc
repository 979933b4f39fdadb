// The parts of FindDomainQemu that need no libvirtd: which socket a URI
// names and what a pid file may hold. The whole path (a fake `-name
// guest=NAME` process next to the real domain) is tested end to end in
// tests/e2e/libvirt_domain_e2e.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "libvirt_domain.h"

namespace hvtrace::hostd {
namespace {

using ::testing::HasSubstr;

TEST(DomainQemuTest, SocketOfUri) {
  EXPECT_EQ(*LibvirtSocketOfUri("qemu:///system"), "/run/libvirt/libvirt-sock");
  EXPECT_EQ(*LibvirtSocketOfUri("qemu:///system?socket=/tmp/lv/sock/libvirt-sock"),
            "/tmp/lv/sock/libvirt-sock");
  EXPECT_EQ(*LibvirtSocketOfUri("qemu+unix:///system?mode=legacy&socket=/s"), "/s");
  EXPECT_THAT(LibvirtSocketOfUri("qemu:///session").error().message, HasSubstr("system daemon"));
  EXPECT_THAT(LibvirtSocketOfUri("qemu+ssh://host/system").error().message,
              HasSubstr("not a local"));
  EXPECT_THAT(LibvirtSocketOfUri("qemu:///system?socket=rel").error().message,
              HasSubstr("not absolute"));
}

TEST(DomainQemuTest, Malicious_PidFileText) {
  EXPECT_EQ(*ParsePidFileText("1234\n"), 1234);
  EXPECT_EQ(*ParsePidFileText("77"), 77);
  for (const char* bad : {"", "\n", "-5", "12 34", "0x10", "1", "99999999999", "12\n\n", "abc"}) {
    EXPECT_FALSE(ParsePidFileText(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace hvtrace::hostd
