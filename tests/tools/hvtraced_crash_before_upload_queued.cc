// hvtraced with one fault built in, for the fleet e2e tests: the daemon
// SIGKILLs itself the moment a capture is committed, before its upload
// queue entry is written (the moment a crash used to lose the upload). It
// enters through CaptureFaults' test seam; the shipped hvtraced has no such
// switch.
#include <signal.h>

#include "daemon.h"

int main(int argc, char** argv) {
  hvtrace::hostd::CaptureFaults faults;
  faults.before_upload_queued = [] { ::raise(SIGKILL); };
  return hvtrace::hostd::DaemonMain(argc, argv, faults);
}
