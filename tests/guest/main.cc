// hvtrace-guest-test: test tools that run inside test guests, kept out of the
// shipped agent. Static, like the agent, so that it runs from the busybox
// initramfs (qemu-scripts/build-guest.sh --guest-test).
//
//   hvtrace-guest-test dw-write ...   direct-write events (dw_write.h)
//   hvtrace-guest-test scribble ...   damage the region on purpose (scribble.h)
#include <cstdio>
#include <cstring>

#include "dw_write.h"
#include "scribble.h"

namespace {

void Usage(std::FILE* out) {
  std::fprintf(out,
               "usage: hvtrace-guest-test dw-write [--region PATH] [--mono|--tsc]\n"
               "           [--count N | --for-ms MS [--every-ms MS] [--stop-file PATH]] TEXT\n"
               "       hvtrace-guest-test scribble [--region PATH] [--repeat-ms MS] MODE...\n");
}

}  // namespace

int main(int argc, char** argv) {
  const char* command = argc > 1 ? argv[1] : "";
  using hvtrace::guest_test::DwWriteMain;
  using hvtrace::guest_test::ScribbleMain;
  if (std::strcmp(command, "dw-write") == 0) return DwWriteMain(argc - 1, argv + 1);
  if (std::strcmp(command, "scribble") == 0) return ScribbleMain(argc - 1, argv + 1);
  if (std::strcmp(command, "--help") == 0 || std::strcmp(command, "-h") == 0) {
    Usage(stdout);
    return 0;
  }
  Usage(stderr);
  return 2;
}
