#include "boot_buffer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "boot_request.h"
#include "domain_xml.h"
#include "test_support.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1ull << 20;

void Put32(std::vector<std::byte>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// An SRAT laid out as QEMU's build_srat writes it for two nodes on a pc
// machine: processor affinities, node 0's memory split at 640 KiB, node 1's
// memory, and a disabled hot-plug entry.
std::vector<std::byte> QemuSrat(uint64_t node0, uint64_t node1) {
  std::vector<std::byte> t(48, std::byte{0});
  std::memcpy(t.data(), "SRAT", 4);
  auto cpu = [&](uint8_t pxm) {
    std::vector<std::byte> s(16, std::byte{0});
    s[0] = std::byte{0};
    s[1] = std::byte{16};
    s[2] = std::byte{pxm};
    t.insert(t.end(), s.begin(), s.end());
  };
  auto mem = [&](uint32_t pxm, uint64_t base, uint64_t len, uint32_t flags) {
    std::vector<std::byte> s(40, std::byte{0});
    s[0] = std::byte{1};
    s[1] = std::byte{40};
    Put32(s, 2, pxm);
    Put32(s, 8, static_cast<uint32_t>(base));
    Put32(s, 12, static_cast<uint32_t>(base >> 32));
    Put32(s, 16, static_cast<uint32_t>(len));
    Put32(s, 20, static_cast<uint32_t>(len >> 32));
    Put32(s, 28, flags);
    t.insert(t.end(), s.begin(), s.end());
  };
  cpu(0);
  cpu(0);
  mem(0, 0, 640 * 1024, 1);
  mem(0, 1 * kMiB, node0 - 1 * kMiB, 1);
  mem(1, node0, node1, 1);
  mem(0, 0, 0, 0);
  mem(1, 4096 * kMiB, 1024 * kMiB, 3);  // Hot-pluggable: not boot memory.
  Put32(t, 4, static_cast<uint32_t>(t.size()));
  return t;
}

TEST(BootBuffer, SratGivesNodeOne) {
  const std::vector<std::byte> srat = QemuSrat(512 * kMiB, 64 * kMiB);
  Result<NodeRange> node = NodeRangeFromSrat(srat, 1);
  ASSERT_TRUE(node.ok()) << node.error().message;
  EXPECT_EQ(node->start, 512 * kMiB);
  EXPECT_EQ(node->bytes, 64 * kMiB);
  EXPECT_EQ(node->source, "ACPI SRAT");
  EXPECT_FALSE(NodeRangeFromSrat(srat, 2).ok());
}

TEST(BootBuffer, Malicious_TruncatedOrLyingSratIsAnError) {
  const std::vector<std::byte> srat = QemuSrat(512 * kMiB, 64 * kMiB);
  for (size_t cut = 0; cut < srat.size(); ++cut) {
    Result<std::vector<SratMemory>> r = ParseSrat(std::span(srat).first(cut));
    EXPECT_FALSE(r.ok()) << cut;
  }
  std::vector<std::byte> zero_length = srat;
  zero_length[48 + 1] = std::byte{0};  // A structure of length 0 would loop forever.
  EXPECT_FALSE(ParseSrat(zero_length).ok());
  std::vector<std::byte> long_entry = srat;
  long_entry[48 + 16 + 16 + 1] = std::byte{250};  // Runs past the table.
  Result<std::vector<SratMemory>> r = ParseSrat(long_entry);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("offset 80"), std::string::npos) << r.error().message;
  std::vector<std::byte> not_srat = srat;
  std::memcpy(not_srat.data(), "APIC", 4);
  EXPECT_FALSE(ParseSrat(not_srat).ok());
}

TEST(BootBuffer, SysfsMemoryBlocksGiveNodeOne) {
  const fs::path sys = fs::path(::testing::TempDir()) / ("bb_sys." + std::to_string(::getpid()));
  fs::create_directories(sys / "devices/system/memory");
  fs::create_directories(sys / "devices/system/node/node1");
  std::ofstream(sys / "devices/system/memory/block_size_bytes") << "8000000\n";
  for (const char* m : {"memory4", "memory5"}) {
    std::ofstream(sys / "devices/system/node/node1" / m) << "";
  }
  std::ofstream(sys / "devices/system/node/node1/meminfo") << "";
  Result<NodeRange> node = NodeRangeFromSysfs(sys, 1);
  ASSERT_TRUE(node.ok()) << node.error().message;
  EXPECT_EQ(node->start, 512 * kMiB);
  EXPECT_EQ(node->bytes, 256 * kMiB);
  EXPECT_FALSE(NodeRangeFromSysfs(sys, 2).ok());
  // QEMU's e820 for 576 MiB: RAM below 640 KiB, then from 1 MiB to the end.
  for (auto [n, start, end] :
       {std::tuple{"0", "0x0", "0x9fbff"}, {"1", "0x100000", "0x23ffffff"}}) {
    fs::create_directories(sys / "firmware/memmap" / n);
    std::ofstream(sys / "firmware/memmap" / n / "start") << start << "\n";
    std::ofstream(sys / "firmware/memmap" / n / "end") << end << "\n";
    std::ofstream(sys / "firmware/memmap" / n / "type") << "System RAM\n";
  }
  node = NodeRangeFromSysfs(sys, 1);
  ASSERT_TRUE(node.ok()) << node.error().message;
  EXPECT_EQ(node->start, 512 * kMiB);
  EXPECT_EQ(node->bytes, 64 * kMiB);
  fs::remove_all(sys);
}

// The agent's copy of the host's rule gives what the host tells the user
// (`hvtrace setup`, `hvtrace adopt`) for the same cells.
TEST(BootBuffer, ParamsEqualTheHostsForSeveralSizes) {
  EXPECT_STREQ(kBootBufferDefaultEvents, hostd::kDefaultBootEvents);
  for (bool q35 : {false, true}) {
    for (uint64_t node1 : {50 * kMiB, 64 * kMiB, 112 * kMiB, 306 * kMiB}) {
      hostd::DomainXmlInfo info;
      info.name = "d";
      info.q35 = q35;
      info.numa_cells = {{0, 512 * kMiB, ""}, {1, node1, "shared"}};
      Result<hostd::DomainBootCell> host =
          hostd::FindDomainBootCell(info, kBootBufferInstance, kBootBufferDefaultEvents);
      ASSERT_TRUE(host.ok()) << host.error().message;
      Result<BootBufferParams> guest = BootBufferKernelParams(
          NodeRange{512 * kMiB, node1, "test"}, kBootBufferInstance, kBootBufferDefaultEvents);
      ASSERT_TRUE(guest.ok()) << guest.error().message;
      EXPECT_EQ(guest->kernel_params, host->kernel_params) << node1;
      // The handshake kprobes the host's `hvtrace boot --trace-boot` adds
      // (hostd/qemu/boot_request.cc), the same text, and the clock that
      // keeps their records until the initramfs copies them.
      EXPECT_EQ(guest->loader_params, guest->kernel_params + " " +
                                          std::string(hostd::kHandshakeKprobeParam) +
                                          " trace_clock=local");
      EXPECT_EQ(guest->bytes, host->layout.range_bytes);
    }
  }
  EXPECT_FALSE(BootBufferKernelParams(NodeRange{512 * kMiB, 48 * kMiB, "t"}, "b", "").ok());
}

constexpr char kSyslinux[] =
    "DEFAULT debian\n"
    "TIMEOUT 1\n"
    "LABEL debian\n"
    "  KERNEL /vmlinuz\n"
    "  APPEND root=/dev/vda2 ro console=ttyS0\n"
    "LABEL rescue\n"
    "  append root=/dev/vda2 single\n";

TEST(BootBuffer, SyslinuxEnableAndExactUndo) {
  const std::string params = "memmap=16M$0x20000000 trace_instance=boot_map@0x20000000:16M,irq";
  const std::string on = SyslinuxEnable(kSyslinux, params);
  EXPECT_NE(on.find("  APPEND root=/dev/vda2 ro console=ttyS0 " + params + "\n"), std::string::npos)
      << on;
  EXPECT_NE(on.find("  append root=/dev/vda2 single " + params + "\n"), std::string::npos);
  EXPECT_EQ(SyslinuxEnable(on, params), on);  // Idempotent.
  Result<std::string> off = SyslinuxDisable(on);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, kSyslinux);
  EXPECT_FALSE(SyslinuxDisable(kSyslinux).ok());
  // A new range replaces the old one rather than adding a second.
  const std::string other = SyslinuxEnable(on, "memmap=32M$0x20000000");
  EXPECT_EQ(other.find(params), std::string::npos);
  EXPECT_EQ(*SyslinuxDisable(other), kSyslinux);
}

// The drop-in is shell that grub-mkconfig sources; what reaches grub.cfg must
// be \$ (GRUB expands $ itself).
TEST(BootBuffer, GrubDropInEscapesTheDollar) {
  const std::string params = "memmap=16M$0x20000000 trace_instance=boot_map@0x20000000:16M";
  const fs::path file =
      fs::path(::testing::TempDir()) / ("hvtrace.cfg." + std::to_string(getpid()));
  std::ofstream(file) << GrubDropIn(params);
  // popen runs /bin/sh, which sources the file as grub-mkconfig does.
  const test_support::CommandResult value =
      test_support::RunCommandStatus("GRUB_CMDLINE_LINUX_DEFAULT=quiet; . " + file.string() +
                                     "; printf %s \"$GRUB_CMDLINE_LINUX_DEFAULT\"");
  fs::remove(file);
  ASSERT_EQ(value.status, 0);
  EXPECT_EQ(value.out, "quiet memmap=16M\\$0x20000000 trace_instance=boot_map@0x20000000:16M");
}

// kprobe_event= holds ';' (a GRUB command separator), '>' and '$': grub.cfg
// must get each behind one backslash, or GRUB ends the linux line at the
// first ';' and the guest gets one probe definition cut short.
TEST(BootBuffer, GrubDropInEscapesTheKprobeDefinitions) {
  const std::string params = hostd::kHandshakeKprobeParam;
  const fs::path file =
      fs::path(::testing::TempDir()) / ("hvtrace-kp.cfg." + std::to_string(getpid()));
  std::ofstream(file) << GrubDropIn(params);
  const test_support::CommandResult value =
      test_support::RunCommandStatus("GRUB_CMDLINE_LINUX_DEFAULT=; . " + file.string() +
                                     "; printf %s \"$GRUB_CMDLINE_LINUX_DEFAULT\"");
  fs::remove(file);
  ASSERT_EQ(value.status, 0);
  // GRUB's unescaping: a backslash quotes the next character.
  std::string grub_passes;
  for (size_t i = 0; i < value.out.size(); ++i) {
    if (value.out[i] == '\\' && i + 1 < value.out.size()) ++i;
    grub_passes += value.out[i];
  }
  EXPECT_EQ(grub_passes, " " + params);
  for (char metachar : {';', '>', '$'}) {
    for (size_t at = value.out.find(metachar); at != std::string::npos;
         at = value.out.find(metachar, at + 1)) {
      EXPECT_EQ(value.out[at - 1], '\\') << "unescaped '" << metachar << "' at " << at;
    }
  }
}

TEST(BootBuffer, CommandEditsTheSyslinuxConfigAndUndoes) {
  const fs::path root = fs::path(::testing::TempDir()) / ("bb_root." + std::to_string(getpid()));
  fs::create_directories(root / "boot/syslinux");
  fs::create_directories(root / "sys/firmware/acpi/tables");
  std::ofstream(root / "boot/syslinux/syslinux.cfg") << kSyslinux;
  const std::vector<std::byte> srat = QemuSrat(512 * kMiB, 64 * kMiB);
  std::ofstream(root / "sys/firmware/acpi/tables/SRAT", std::ios::binary)
      .write(reinterpret_cast<const char*>(srat.data()), static_cast<std::streamsize>(srat.size()));
  BootBufferPaths paths;
  paths.root = root;
  paths.sys = root / "sys";
  paths.proc_cmdline = root / "cmdline";
  paths.tracefs = root / "tracing";
  paths.update_grub = "";
  std::ofstream(paths.proc_cmdline) << "root=/dev/vda2\n";
  const std::string expected =
      "memmap=16M$0x20000000 trace_instance=boot_map@0x20000000:16M,sched:sched_switch";

  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  EXPECT_EQ(RunBootBufferCommand({"enable", "--dry-run", "--events", "sched:sched_switch"}, paths,
                                 out, stderr),
            0);
  EXPECT_EQ(test_support::ReadText((root / "boot/syslinux/syslinux.cfg").string()), kSyslinux);
  EXPECT_EQ(RunBootBufferCommand({"enable", "--events", "sched:sched_switch"}, paths, out, stderr),
            0);
  EXPECT_NE(test_support::ReadText((root / "boot/syslinux/syslinux.cfg").string())
                .find(expected + " " + hostd::kHandshakeKprobeParam + " trace_clock=local\n"),
            std::string::npos);
  EXPECT_EQ(RunBootBufferCommand({"status"}, paths, out, stderr), 0);
  EXPECT_EQ(RunBootBufferCommand({"disable"}, paths, out, stderr), 0);
  EXPECT_EQ(test_support::ReadText((root / "boot/syslinux/syslinux.cfg").string()), kSyslinux);
  EXPECT_EQ(RunBootBufferCommand({"enable", "--bogus"}, paths, out, stderr), 2);
  std::fclose(out);
  const std::string printed(buf, len);
  std::free(buf);
  EXPECT_NE(printed.find("kernel parameters: " + expected + " " + hostd::kHandshakeKprobeParam),
            std::string::npos)
      << printed;
  EXPECT_NE(printed.find("node 1: 67108864 bytes at 0x20000000 (ACPI SRAT)"), std::string::npos);
  EXPECT_NE(printed.find("boot buffer enabled"), std::string::npos) << printed;
  fs::remove_all(root);
}

TEST(BootBuffer, CommandWritesTheGrubDropInAndRunsUpdateGrub) {
  const fs::path root = fs::path(::testing::TempDir()) / ("bb_grub." + std::to_string(getpid()));
  fs::create_directories(root / "etc/default");
  fs::create_directories(root / "sys/firmware/acpi/tables");
  std::ofstream(root / "etc/default/grub") << "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\n";
  const std::vector<std::byte> srat = QemuSrat(1024 * kMiB, 112 * kMiB);
  std::ofstream(root / "sys/firmware/acpi/tables/SRAT", std::ios::binary)
      .write(reinterpret_cast<const char*>(srat.data()), static_cast<std::streamsize>(srat.size()));
  BootBufferPaths paths;
  paths.root = root;
  paths.sys = root / "sys";
  paths.update_grub = "true";  // /bin/true stands in for update-grub: only its status counts.
  std::FILE* out = std::tmpfile();
  ASSERT_EQ(RunBootBufferCommand({"enable", "--events", "irq"}, paths, out, out), 0);
  const fs::path dropin = root / "etc/default/grub.d/hvtrace.cfg";
  EXPECT_EQ(test_support::ReadText(dropin.string()),
            GrubDropIn("memmap=64M$0x40000000 trace_instance=boot_map@0x40000000:64M,irq " +
                       std::string(hostd::kHandshakeKprobeParam) + " trace_clock=local"));
  paths.update_grub = "false";  // A failing update-grub is an error, not a silent success.
  EXPECT_EQ(RunBootBufferCommand({"disable"}, paths, out, out), 1);
  EXPECT_FALSE(fs::exists(dropin));
  paths.update_grub = "true";
  EXPECT_EQ(RunBootBufferCommand({"disable"}, paths, out, out), 0);  // "not enabled".
  std::fclose(out);
  fs::remove_all(root);
}

}  // namespace
}  // namespace hvtrace::agent
