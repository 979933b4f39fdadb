// hvtraced: the hvtrace host daemon. Everything lives in hostd/lib/daemon.cc.
#include "daemon.h"

int main(int argc, char** argv) { return hvtrace::hostd::DaemonMain(argc, argv); }
