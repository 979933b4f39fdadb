// hvtraced with one fault built in, for the recovery e2e tests: the daemon
// SIGKILLs itself the moment a capture's region copy and recovery record are
// durable, before the capture is decoded and committed (the moment a crash
// used to lose it). It enters through CaptureService's test seam; the
// shipped hvtraced has no such switch.
#include <signal.h>

#include "daemon.h"

int main(int argc, char** argv) {
  hvtrace::hostd::CaptureFaults faults;
  faults.after_copies_durable = [] { ::raise(SIGKILL); };
  return hvtrace::hostd::DaemonMain(argc, argv, faults);
}
