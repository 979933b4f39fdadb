// hvtraced with one fault built in, for the shutdown e2e test: the moment a
// capture's region copy is durable, the daemon sends itself SIGTERM (as
// `systemctl stop` would) and gives its I/O thread time to begin the exit
// before the capture goes on to decode and read the guest's kernel log. It
// enters through CaptureService's test seam; the shipped hvtraced has no such
// switch.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "daemon.h"

int main(int argc, char** argv) {
  hvtrace::hostd::CaptureFaults faults;
  faults.after_copies_durable = [] {
    // To the process: this pool thread blocks SIGTERM, the I/O thread takes it.
    ::kill(::getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  };
  return hvtrace::hostd::DaemonMain(argc, argv, faults);
}
