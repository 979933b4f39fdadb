// The capabilities of the QEMUs whose outputs tests/fixtures/qemu/ records
// (Debian 12's QEMU 7.2, Debian 13's QEMU 10.0), for tests that plan command
// lines without running a QEMU.
#ifndef HVTRACE_TESTS_UNIT_HOSTD_QEMU_RECORDED_QEMU_H_
#define HVTRACE_TESTS_UNIT_HOSTD_QEMU_RECORDED_QEMU_H_

#include <string>

#include "qemu_caps.h"
#include "test_support.h"

namespace hvtrace::hostd {

// |version|: "7.2" or "10.0", a folder of tests/fixtures/qemu/.
inline QemuCapsText RecordedQemuText(const std::string& version) {
  const std::string dir = "qemu/" + version + "/";
  return QemuCapsText{test_support::ReadFixture(dir + "version.txt"),
                      test_support::ReadFixture(dir + "help.txt"),
                      test_support::ReadFixture(dir + "device-help.txt"),
                      test_support::ReadFixture(dir + "trace-help.txt")};
}

inline QemuCaps RecordedQemu(const std::string& version) {
  return ParseQemuCaps(RecordedQemuText(version), "/usr/bin/qemu-system-x86_64");
}

}  // namespace hvtrace::hostd

#endif  // HVTRACE_TESTS_UNIT_HOSTD_QEMU_RECORDED_QEMU_H_
