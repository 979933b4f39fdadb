// LeakSanitizer's suppressions for every unit test executable (one
// definition per executable: each links this file).
//
// libtracecmd 1.3 (trace-cmd 3.1.6) never frees the clock name it sscanf's
// out of a file's TRACECLOCK option (6 bytes per tracecmd_open); that is its
// leak, not ours. Its stack stops inside glibc's sscanf (libtracecmd has no
// frame pointers), so that is the frame named: __isoc99_vsscanf, or
// __isoc23_vsscanf where a library was built against glibc 2.38+ with
// _GNU_SOURCE (Debian 13). Names match only when llvm-symbolizer is there
// (install-deps.sh installs llvm). hvtrace calls sscanf with %m nowhere.
// Only LeakSanitizer reads this (the sanitizer build).
extern "C" const char* __lsan_default_suppressions();
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libtracecmd.so\nleak:__isoc99_vsscanf\nleak:__isoc23_vsscanf\n";
}
