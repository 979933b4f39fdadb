// qemu_user.h: which user QEMU runs as, and who a running process is.
#include "qemu_user.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

namespace hvtrace::hostd {
namespace {

using ::testing::HasSubstr;

TEST(QemuUserTest, RootIsOnlyWhatTheConfigSaysAndIsWarnedAbout) {
  Result<QemuUser> root = ResolveQemuUser("root", "web1");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->run_as, "");
  EXPECT_THAT(root->warning, HasSubstr("VM 'web1': QEMU runs as root (qemu_user = root)"));
}

TEST(QemuUserTest, ANamedUserIsResolved) {
  const passwd* nobody = ::getpwnam("nobody");
  ASSERT_NE(nobody, nullptr) << "Debian always has nobody";
  Result<QemuUser> user = ResolveQemuUser("nobody", "web1");
  ASSERT_TRUE(user.ok()) << user.error().message;
  EXPECT_EQ(user->run_as, "nobody");
  EXPECT_EQ(user->uid, nobody->pw_uid);
  EXPECT_EQ(user->gid, nobody->pw_gid);
  EXPECT_EQ(user->warning, "");
}

TEST(QemuUserTest, AMissingNamedUserIsAnErrorNamingItAndTheVm) {
  Result<QemuUser> user = ResolveQemuUser("hvtrace-no-such-user", "web1");
  ASSERT_FALSE(user.ok());
  EXPECT_THAT(user.error().message, HasSubstr("VM 'web1'"));
  EXPECT_THAT(user.error().message, HasSubstr("'hvtrace-no-such-user' does not exist"));
}

TEST(QemuUserTest, TheDefaultIsTheQemuUserWhenItExistsElseRootWithAWarning) {
  Result<QemuUser> user = ResolveQemuUser("", "web1");
  ASSERT_TRUE(user.ok()) << user.error().message;
  if (::getpwnam(kDefaultQemuUser) != nullptr) {
    EXPECT_EQ(user->run_as, kDefaultQemuUser);
    EXPECT_EQ(user->warning, "");
  } else {
    EXPECT_EQ(user->run_as, "");
    EXPECT_THAT(user->warning, HasSubstr("there is no user 'hvtrace-qemu'"));
  }
}

TEST(QemuUserTest, ReadsAProcesssEffectiveIds) {
  auto creds = ReadProcessCredentials(::getpid());
  ASSERT_TRUE(creds.has_value());
  EXPECT_EQ(creds->uid, ::geteuid());
  EXPECT_EQ(creds->gid, ::getegid());
  EXPECT_FALSE(ReadProcessCredentials(0).has_value());
}

}  // namespace
}  // namespace hvtrace::hostd
