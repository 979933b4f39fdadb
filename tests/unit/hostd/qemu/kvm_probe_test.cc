// The KVM probe's decision logic, with stand-in "QEMU" scripts for each way
// a probe can end (the real QEMU on this host: HvtracedLifecycleE2e /
// KvmProbeE2e). Assertions are on the reported reason, never on timings.
#include "kvm_probe.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

class KvmProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/hvt-kvmprobe-" + std::to_string(::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A fake qemu-system binary: |body| runs with $SERIAL set to the path of
  // the probe's "-serial file:PATH" argument.
  std::string FakeQemu(const std::string& body) {
    const std::string path = dir_ + "/qemu-" + std::to_string(counter_++);
    std::ofstream(path)
        << "#!/bin/sh\nSERIAL=\nfor a in \"$@\"; do case \"$a\" in file:*) SERIAL=${a#file:};; "
           "esac; done\n"
        << body << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }

  KvmProbeOptions Options(const std::string& qemu) {
    KvmProbeOptions o;
    o.qemu_binary = qemu;
    o.device = "/dev/null";  // Opens read-write anywhere; the fake decides.
    o.deadline = std::chrono::milliseconds(1500);
    return o;
  }

  std::string dir_;
  int counter_ = 0;
};

TEST_F(KvmProbeTest, MissingDeviceIsUnusableAndNamed) {
  KvmProbeOptions o;
  o.device = "/nonexistent/kvm";
  KvmProbeResult r = ProbeKvm(o);
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("/nonexistent/kvm cannot be opened"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeTest, BannerOnTheSerialPortMeansUsable) {
  KvmProbeResult r =
      ProbeKvm(Options(FakeQemu("printf 'HVTRACE-KVM-PROBE-OK\\n' > \"$SERIAL\"; sleep 30")));
  EXPECT_TRUE(r.usable) << r.reason;
  EXPECT_NE(r.reason.find("wrote 'HVTRACE-KVM-PROBE-OK' under KVM"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeTest, KvmInternalErrorWinsOverAnything) {
  KvmProbeResult r = ProbeKvm(Options(FakeQemu(
      "echo 'KVM internal error. Suberror: 1' >&2; echo 'emulation failure' >&2; sleep 30")));
  EXPECT_FALSE(r.usable);
  EXPECT_NE(
      r.reason.find(
          "QEMU reported a KVM failure running the probe guest: KVM internal error. Suberror: 1"),
      std::string::npos)
      << r.reason;
}

TEST_F(KvmProbeTest, SilenceUntilTheDeadlineIsUnusable) {
  KvmProbeResult r = ProbeKvm(Options(FakeQemu("echo 'some warning' >&2; sleep 30")));
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("wrote nothing to its serial port"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("some warning"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeTest, WrongTextIsNotTheBanner) {
  KvmProbeResult r = ProbeKvm(Options(FakeQemu("printf 'HVTRACE-KVM' > \"$SERIAL\"; sleep 30")));
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("it wrote 'HVTRACE-KVM'"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeTest, QemuExitingEarlyIsUnusable) {
  KvmProbeResult r =
      ProbeKvm(Options(FakeQemu("echo 'failed to initialise something' >&2; exit 1")));
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("exited with status 1"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("failed to initialise something"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeTest, MissingQemuBinaryIsUnusable) {
  KvmProbeResult r = ProbeKvm(Options(dir_ + "/no-such-qemu"));
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("exited with status 127"), std::string::npos) << r.reason;
}

// Stage 2: a fake QEMU that passes the boot sector (-drive) and then does
// |kernel_body| when asked to boot a kernel.
class KvmProbeKernelTest : public KvmProbeTest {
 protected:
  KvmProbeResult Probe(const std::string& kernel_body) {
    KvmProbeOptions o = Options(FakeQemu("case \"$*\" in *-kernel*) " + kernel_body +
                                         ";; *) printf 'HVTRACE-KVM-PROBE-OK\\n' > \"$SERIAL\"; "
                                         "sleep 30;; esac"));
    o.kernel = "/boot/vmlinuz-probe";
    o.kernel_deadline = std::chrono::milliseconds(1500);
    return ProbeKvm(o);
  }
};

TEST_F(KvmProbeKernelTest, KernelThatFinishesBootingMeansUsable) {
  KvmProbeResult r = Probe(
      "printf '[ 0.9] VFS: Cannot open root device\\n[ 0.9] Kernel panic - not syncing: VFS: "
      "Unable to mount "
      "root fs on unknown-block(0,0)\\n' > \"$SERIAL\"; exit 0");
  EXPECT_TRUE(r.usable) << r.reason;
  EXPECT_NE(r.reason.find("kernel /boot/vmlinuz-probe wrote 'Unable to mount root fs' under KVM"),
            std::string::npos)
      << r.reason;
}

// What this project's CI hosts do: the boot sector runs, the kernel's
// decompressor hits an instruction KVM cannot emulate.
TEST_F(KvmProbeKernelTest, BootSectorFineButKernelEmulationFailureIsUnusable) {
  KvmProbeResult r = Probe(
      "printf 'Decompressing Linux... ' > \"$SERIAL\"; echo 'KVM internal error. Suberror: 1' >&2; "
      "echo 'emulation failure' >&2; sleep 30");
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("KVM failure running the kernel /boot/vmlinuz-probe: KVM internal error"),
            std::string::npos)
      << r.reason;
}

TEST_F(KvmProbeKernelTest, KernelThatStopsHalfwayIsUnusable) {
  KvmProbeResult r = Probe("printf 'Linux version 6.12\\n' > \"$SERIAL\"; sleep 30");
  EXPECT_FALSE(r.usable);
  EXPECT_NE(r.reason.find("matching the end of its boot within 1500 ms"), std::string::npos)
      << r.reason;
  EXPECT_NE(r.reason.find("Linux version 6.12"), std::string::npos) << r.reason;
}

TEST_F(KvmProbeKernelTest, QemuExitingBeforeTheKernelFinishesIsUnusable) {
  KvmProbeResult r = Probe("echo 'qemu: could not load kernel' >&2; exit 1");
  EXPECT_FALSE(r.usable);
  EXPECT_NE(
      r.reason.find("exited with status 1 before the end of its boot: qemu: could not load kernel"),
      std::string::npos)
      << r.reason;
}

}  // namespace
}  // namespace hvtrace::hostd
