#include "fd_passing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "control_protocol.h"

namespace hvtrace::hostd {
namespace {

struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd), 0); }
  ~SocketPair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  int fd[2] = {-1, -1};
};

std::string TempFile(const std::string& text) {
  char path[] = "/tmp/hvt-fdpass-XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}

TEST(FdPassingTest, DescriptorsArriveWithTheirRequestAndReadTheSameFile) {
  SocketPair sp;
  const std::string path = TempFile("kernel bytes");
  int file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  const int fds[] = {file};
  ASSERT_TRUE(SendWithFds(sp.fd[0], "{\"id\":1}\n", fds).ok());
  ::close(file);
  ::unlink(path.c_str());  // The descriptor outlives the name.
  std::array<char, 64> buf;
  std::vector<SharedFd> got;
  bool truncated = true;
  ssize_t n = RecvWithFds(sp.fd[1], buf, got, &truncated);
  ASSERT_EQ(n, 9);
  EXPECT_FALSE(truncated);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(::fcntl(got[0]->get(), F_GETFD) & FD_CLOEXEC);
  char text[32] = {};
  EXPECT_EQ(::pread(got[0]->get(), text, sizeof text, 0), 12);
  EXPECT_STREQ(text, "kernel bytes");
}

TEST(FdPassingTest, Malicious_TooManyDescriptorsAreDetectedNotSilentlyKept) {
  SocketPair sp;
  // Sent raw: SendWithFds itself refuses more than kMaxFdsPerRequest.
  std::vector<int> many(kMaxFdsPerRequest * 2 + 2, STDIN_FILENO);
  EXPECT_FALSE(SendWithFds(sp.fd[0], "x\n", many).ok());
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 10)] = {};
  char byte = 'x';
  struct iovec iov = {&byte, 1};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * many.size());
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * many.size());
  std::memcpy(CMSG_DATA(cmsg), many.data(), sizeof(int) * many.size());
  ASSERT_EQ(::sendmsg(sp.fd[0], &msg, 0), 1);
  std::array<char, 8> buf;
  std::vector<SharedFd> got;
  bool truncated = false;
  EXPECT_EQ(RecvWithFds(sp.fd[1], buf, got, &truncated), 1);
  EXPECT_TRUE(truncated);
}

TEST(FdPassingTest, RequestDeclaresItsDescriptorCount) {
  auto ok = ParseRequest(R"({"id":1,"cmd":"boot","fds":2,"args":{"kernel_fd":0}})");
  ASSERT_TRUE(std::holds_alternative<Request>(ok));
  EXPECT_EQ(std::get<Request>(ok).fd_count, 2u);
  EXPECT_FALSE(std::get<Request>(ok).peer_uid.has_value());  // Never from the wire.
  for (const char* bad : {R"({"id":1,"cmd":"boot","fds":5})", R"({"id":1,"cmd":"boot","fds":-1})",
                          R"({"id":1,"cmd":"boot","fds":"1"})"}) {
    auto r = ParseRequest(bad);
    ASSERT_TRUE(std::holds_alternative<RequestError>(r)) << bad;
    EXPECT_NE(std::get<RequestError>(r).message.find("\"fds\""), std::string::npos);
  }
}

TEST(FdPassingTest, ClientOpensBootAndAdoptFilesItselfAndNamesThemByIndex) {
  const std::string kernel = TempFile("k");
  const std::string region = TempFile("r");
  nlohmann::json boot = {{"name", "vm"}, {"kernel", kernel}, {"initrd", ""}};
  auto opened = OpenRequestFiles("boot", boot);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened->fds.size(), 1u);  // An empty initrd is none.
  EXPECT_EQ(boot["kernel_fd"], 0);
  EXPECT_FALSE(boot.contains("initrd_fd"));
  nlohmann::json adopt = {{"name", "vm"}, {"qmp", "/q"}, {"boot_region", region + "@0x1000:4096"}};
  auto adopted = OpenRequestFiles("adopt", adopt);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  EXPECT_EQ(adopt["boot_region_fd"], 0);
  nlohmann::json missing = {{"kernel", "/nonexistent/vmlinuz"}};
  auto failed = OpenRequestFiles("boot", missing);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error().message.find("cannot open kernel /nonexistent/vmlinuz as uid"),
            std::string::npos)
      << failed.error().message;
  nlohmann::json list = {{"name", "vm"}};
  EXPECT_TRUE(OpenRequestFiles("list", list)->fds.empty());
  ::unlink(kernel.c_str());
  ::unlink(region.c_str());
}

}  // namespace
}  // namespace hvtrace::hostd
