// hvtraced: the hvtrace host daemon. The daemon is hostd/daemon/daemon.cc.
#include "daemon.h"

int main(int argc, char** argv) { return hvtrace::hostd::DaemonMain(argc, argv); }
