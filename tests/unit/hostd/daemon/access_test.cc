#include "access.h"

#include <gtest/gtest.h>

namespace hvtrace::hostd {
namespace {

AccessPolicy Policy() {
  AccessPolicy p;
  p.daemon_uid = 0;
  p.observer_group = 500;
  p.admin_group = 501;
  p.observer_group_name = "hvtrace";
  p.admin_group_name = "hvtrace-admin";
  return p;
}

TEST(AccessTest, RolesFollowTheGroupsTheKernelReported) {
  const AccessPolicy p = Policy();
  EXPECT_EQ(PeerRole(p, {1, 0, 0, {}}), Role::kAdmin);              // root
  EXPECT_EQ(PeerRole(p, {1, 1000, 1000, {500}}), Role::kObserver);  // supplementary
  EXPECT_EQ(PeerRole(p, {1, 1000, 500, {}}), Role::kObserver);      // primary
  EXPECT_EQ(PeerRole(p, {1, 1000, 1000, {500, 501}}), Role::kAdmin);
  EXPECT_EQ(PeerRole(p, {1, 1000, 1000, {501}}), Role::kAdmin);  // An admin may also look.
  EXPECT_EQ(PeerRole(p, {1, 1000, 1000, {4, 27}}), Role::kNone);
  AccessPolicy own = p;
  own.daemon_uid = 990;  // A daemon run as a user: that user has all its rights.
  EXPECT_EQ(PeerRole(own, {1, 990, 990, {}}), Role::kAdmin);
  AccessPolicy none = p;
  none.observer_group.reset();
  none.admin_group.reset();
  EXPECT_EQ(PeerRole(none, {1, 1000, 500, {501}}), Role::kNone);
}

TEST(AccessTest, NothingIsAllowedWithoutARole) {
  EXPECT_TRUE(Allows(Role::kAdmin, Role::kObserver));
  EXPECT_TRUE(Allows(Role::kObserver, Role::kObserver));
  EXPECT_FALSE(Allows(Role::kObserver, Role::kAdmin));
  EXPECT_FALSE(Allows(Role::kNone, Role::kObserver));
  // A command that names no role is refused even to root.
  EXPECT_FALSE(Allows(Role::kAdmin, Role::kNone));
}

TEST(AccessTest, RefusalNamesCommandUserAndGroup) {
  const std::string m = RefusalMessage("boot", Policy(), {77, 1000, 1000, {500}}, Role::kAdmin);
  EXPECT_NE(m.find("'boot' needs the admin role"), std::string::npos) << m;
  EXPECT_NE(m.find("group hvtrace-admin (gid 501)"), std::string::npos) << m;
  EXPECT_NE(m.find("uid 1000 (pid 77"), std::string::npos) << m;
  EXPECT_NE(m.find("only an observer"), std::string::npos) << m;
  AccessPolicy missing = Policy();
  missing.admin_group.reset();
  const std::string m2 = RefusalMessage("stop", missing, {77, 1000, 1000, {500}}, Role::kAdmin);
  EXPECT_NE(m2.find("group 'hvtrace-admin', which does not exist"), std::string::npos) << m2;
}

TEST(AccessTest, GroupSpecIsANameOrANumber) {
  EXPECT_EQ(ResolveGroupSpec("4711"), gid_t{4711});
  EXPECT_EQ(ResolveGroupSpec("root"), gid_t{0});
  EXPECT_FALSE(ResolveGroupSpec("").has_value());
  EXPECT_FALSE(ResolveGroupSpec("no-such-group-hvtrace-test").has_value());
  EXPECT_FALSE(ResolveGroupSpec("4294967295").has_value());  // (gid_t)-1 means "none".
  EXPECT_FALSE(ResolveGroupSpec("99999999999999999999").has_value());
}

}  // namespace
}  // namespace hvtrace::hostd
