#include "domain_xml.h"

#include <gtest/gtest.h>

#include <string>

namespace hvtrace::hostd {
namespace {

// Trimmed from `virsh dumpxml` of a running domain on this machine (libvirt 9.0).
constexpr char kRunningPc[] = R"(<domain type='qemu' id='3'>
  <name>t1</name>
  <uuid>5d1c2a34-8c5e-4a43-9d52-1e2f3a4b5c6d</uuid>
  <memory unit='KiB'>524288</memory>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type><cmdline>console=ttyS0</cmdline></os>
  <features><acpi/></features>
  <on_crash>preserve</on_crash>
  <devices>
    <controller type='pci' index='0' model='pci-root'><alias name='pci.0'/></controller>
    <shmem name='hvt-I-test'>
      <model type='ivshmem-plain'/>
      <size unit='M'>4</size>
      <alias name='ua-hvtrace-x'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0'/>
    </shmem>
    <panic model='isa'><address type='isa' iobase='0x505'/></panic>
  </devices>
</domain>)";

TEST(DomainXml, ParsesRunningPcDomain) {
  Result<DomainXmlInfo> info = ParseDomainXml(kRunningPc);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->name, "t1");
  EXPECT_EQ(info->uuid, "5d1c2a34-8c5e-4a43-9d52-1e2f3a4b5c6d");
  EXPECT_EQ(info->type, "qemu");
  EXPECT_EQ(info->id, 3);
  EXPECT_EQ(info->memory_bytes, 512ull << 20);
  EXPECT_FALSE(info->q35);
  EXPECT_TRUE(info->acpi);
  EXPECT_TRUE(info->hotplug_ok) << info->hotplug_reason;
  EXPECT_EQ(info->on_crash, "preserve");
  ASSERT_EQ(info->panic_models.size(), 1u);
  EXPECT_EQ(info->panic_models[0], "isa");
  ASSERT_EQ(info->shmems.size(), 1u);
  EXPECT_EQ(info->shmems[0].name, "hvt-I-test");
  EXPECT_EQ(info->shmems[0].model, "ivshmem-plain");
  EXPECT_EQ(info->shmems[0].size_bytes, 4ull << 20);
  EXPECT_EQ(info->shmems[0].alias, "ua-hvtrace-x");
  EXPECT_EQ(info->cmdline, "console=ttyS0");
}

TEST(DomainXml, PcWithoutAcpiCannotHotplug) {
  std::string xml = kRunningPc;
  xml.replace(xml.find("<features><acpi/></features>"), 28, "");
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->hotplug_ok);
  EXPECT_NE(info->hotplug_reason.find("ACPI"), std::string::npos) << info->hotplug_reason;
}

constexpr char kQ35[] = R"(<domain type='qemu'>
  <name>q</name>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>
  <features><acpi/></features>
  <devices>
    <controller type='pci' index='0' model='pcie-root'/>
    <controller type='pci' index='1' model='pcie-root-port'>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0'/>
    </controller>
    <controller type='sata' index='0'>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x1f' function='0x2'/>
    </controller>
    <interface type='user'>
      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
    </interface>
    EXTRA
  </devices>
</domain>)";

TEST(DomainXml, Q35NeedsAFreeRootPort) {
  std::string full = kQ35;
  full.replace(full.find("EXTRA"), 5, "");
  Result<DomainXmlInfo> info = ParseDomainXml(full);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_TRUE(info->q35);
  EXPECT_FALSE(info->hotplug_ok);
  EXPECT_NE(info->hotplug_reason.find("no free pcie-root-port"), std::string::npos)
      << info->hotplug_reason;

  std::string spare = kQ35;
  spare.replace(spare.find("EXTRA"), 5,
                "<controller type='pci' index='2' model='pcie-root-port'>"
                "<address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/>"
                "</controller>");
  info = ParseDomainXml(spare);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->hotplug_ok) << info->hotplug_reason;
}

TEST(DomainXml, Malicious_BrokenAndHostileXml) {
  EXPECT_FALSE(ParseDomainXml("").ok());
  EXPECT_FALSE(ParseDomainXml("<domain><name>x</name>").ok());
  EXPECT_FALSE(ParseDomainXml("<notadomain/>").ok());
  EXPECT_FALSE(ParseDomainXml("<domain type='qemu'></domain>").ok());  // No name.
  EXPECT_FALSE(
      ParseDomainXml("<domain><name>x</name><memory unit='parsec'>1</memory></domain>").ok());
  EXPECT_FALSE(
      ParseDomainXml("<domain><name>x</name><memory unit='TiB'>99999999999999</memory></domain>")
          .ok());
  EXPECT_FALSE(ParseDomainXml("<domain><name>x</name><memory>-5</memory></domain>").ok());
  Result<DomainXmlInfo> r = ParseDomainXml(
      "<domain><name>x</name><devices><shmem name='a'><size "
      "unit='M'>zz</size></shmem></devices></domain>");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("shmem 'a'"), std::string::npos) << r.error().message;
  EXPECT_FALSE(ParseDomainXml(std::string(17u << 20, ' ')).ok());
  // An external entity is never fetched: the name stays without the file.
  Result<DomainXmlInfo> ext = ParseDomainXml(
      "<!DOCTYPE domain [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>"
      "<domain><name>x&e;</name></domain>");
  if (ext.ok()) {
    EXPECT_EQ(ext->name.find("root:"), std::string::npos) << ext->name;
  }
}

TEST(DomainXml, ShmemDeviceXml) {
  Result<std::string> xml = ShmemDeviceXml("hvt-vm1", 4u << 20, "ua-hvtrace-0");
  ASSERT_TRUE(xml.ok()) << xml.error().message;
  EXPECT_EQ(*xml,
            "<shmem name='hvt-vm1'><model type='ivshmem-plain'/><size unit='M'>4</size>"
            "<alias name='ua-hvtrace-0'/></shmem>");
  EXPECT_FALSE(ShmemDeviceXml("hvt", 3u << 20, "ua-x").ok());    // Not a power of two.
  EXPECT_FALSE(ShmemDeviceXml("hvt", 512u << 10, "ua-x").ok());  // Below 1 MiB.
  EXPECT_FALSE(ShmemDeviceXml("../etc", 4u << 20, "ua-x").ok());
  EXPECT_FALSE(ShmemDeviceXml("a'b", 4u << 20, "ua-x").ok());
  EXPECT_FALSE(ShmemDeviceXml(".hidden", 4u << 20, "ua-x").ok());
  EXPECT_FALSE(ShmemDeviceXml("ok", 4u << 20, "shmem0").ok());  // Not a user alias.
}

TEST(DomainXml, BootBufferDomainUsesGpaLayoutAndRoundTrips) {
  BootBufferDomainRequest req;
  req.name = "bb";
  req.kernel = "/k/it's <a&b>/vmlinuz";  // Markup characters are data, not XML.
  req.initrd = "/k/initrd.img";
  req.memory_bytes = 1088ull << 20;
  req.range_bytes = 16ull << 20;
  req.events = "sched:sched_switch,irq";
  req.on_crash = "destroy";
  Result<BootBufferDomainXml> out = MakeBootBufferDomainXml(req);
  ASSERT_TRUE(out.ok()) << out.error().message;
  BootRangeRequest layout_req;
  layout_req.memory_bytes = req.memory_bytes;
  layout_req.range_bytes = req.range_bytes;
  Result<BootRangeLayout> expect = ComputeBootRangeLayout(layout_req);
  ASSERT_TRUE(expect.ok());
  EXPECT_EQ(out->layout.range_gpa, expect->range_gpa);
  EXPECT_EQ(out->layout.node1_bytes, expect->node1_bytes);
  char gpa[32];
  std::snprintf(gpa, sizeof gpa, "0x%llx", static_cast<unsigned long long>(expect->range_gpa));
  EXPECT_EQ(out->kernel_params, std::string("memmap=16M$") + gpa + " trace_instance=boot_map@" +
                                    gpa + ":16M,sched:sched_switch,irq");

  // What we write, we read back the same way libvirt would.
  Result<DomainXmlInfo> info = ParseDomainXml(out->domain_xml);
  ASSERT_TRUE(info.ok()) << info.error().message << "\n" << out->domain_xml;
  EXPECT_EQ(info->name, "bb");
  EXPECT_EQ(info->on_crash, "destroy");
  EXPECT_EQ(info->memory_bytes, expect->node0_bytes + expect->node1_bytes);
  ASSERT_EQ(info->numa_cells.size(), 2u);
  EXPECT_EQ(info->numa_cells[0].memory_bytes, expect->node0_bytes);
  EXPECT_EQ(info->numa_cells[1].memory_bytes, expect->node1_bytes);
  EXPECT_EQ(info->numa_cells[1].mem_access, "shared");
  EXPECT_EQ(info->memory_backing_source, "");  // Node 0 stays anonymous RAM.
  EXPECT_EQ(info->cmdline, "console=ttyS0 " + out->kernel_params);
  EXPECT_EQ(info->kernel, req.kernel);
  EXPECT_EQ(info->initrd, req.initrd);
  EXPECT_TRUE(info->hotplug_ok);
}

TEST(DomainXml, BootBufferRejectsBadRequests) {
  BootBufferDomainRequest req;
  req.name = "bb";
  req.kernel = "/k";
  req.range_bytes = 3;  // Not page-sized.
  EXPECT_FALSE(MakeBootBufferDomainXml(req).ok());
  req.range_bytes = 16ull << 20;
  req.events = "sched:x; rm -rf /";
  EXPECT_FALSE(MakeBootBufferDomainXml(req).ok());
  req.events = "";
  req.name = "a</name><x>";
  EXPECT_FALSE(MakeBootBufferDomainXml(req).ok());
  req.name = "bb";
  req.on_crash = "explode";
  EXPECT_FALSE(MakeBootBufferDomainXml(req).ok());
}

// A disk-booted domain: the NUMA cell from `hvtrace domain-xml --numa`, no
// kernel parameters in <cmdline> (the guest's boot loader has them). The
// cell alone gives back the range domain-xml laid out, for pc and q35.
TEST(DomainXml, BootCellGivesBackTheRangeDomainXmlLaidOut) {
  for (const uint64_t range : {16ull << 20, 64ull << 20, (16ull << 20) + 4096}) {
    BootBufferDomainRequest req;
    req.name = "disk";
    req.kernel = "-";
    req.memory_bytes = 1088ull << 20;
    req.range_bytes = range;
    Result<BootBufferDomainXml> made = MakeBootBufferDomainXml(req);
    ASSERT_TRUE(made.ok()) << made.error().message;
    Result<DomainXmlInfo> info =
        ParseDomainXml("<domain type='kvm'><name>disk</name><memory unit='KiB'>" +
                       std::to_string((1088ull << 20) / 1024) +
                       "</memory><os><type machine='pc-i440fx-7.2'>hvm</type></os>" +
                       made->numa_xml + "</domain>");
    ASSERT_TRUE(info.ok()) << info.error().message;
    EXPECT_TRUE(info->cmdline.empty());
    Result<DomainBootCell> cell = FindDomainBootCell(*info, "boot_map", "");
    ASSERT_TRUE(cell.ok()) << cell.error().message;
    EXPECT_EQ(cell->layout.range_gpa, made->layout.range_gpa);
    EXPECT_EQ(cell->layout.node0_bytes, made->layout.node0_bytes);
    EXPECT_EQ(cell->layout.file_offset, 0u);
    // A range that is not a multiple of the 2 MiB node alignment comes back
    // as the largest one the cell holds: at most 2 MiB more, never less.
    EXPECT_GE(cell->layout.range_bytes, range);
    EXPECT_LT(cell->layout.range_bytes, range + (2u << 20));
    if (range % (2u << 20) == 0) {
      EXPECT_EQ(cell->layout.range_bytes, range);
      EXPECT_EQ(cell->kernel_params, made->kernel_params);  // Same events (none).
    }
    EXPECT_TRUE(cell->cmdline_note.empty()) << cell->cmdline_note;
  }

  // q35 places RAM the same way below its lower limit; the events ride along.
  DomainXmlInfo q35;
  q35.name = "q";
  q35.q35 = true;
  q35.numa_cells = {{0, 448ull << 20, ""}, {1, 64ull << 20, "shared"}};
  Result<DomainBootCell> cell = FindDomainBootCell(q35, "boot_map", "sched:sched_switch");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_EQ(cell->layout.range_gpa, 448ull << 20);
  EXPECT_EQ(cell->layout.range_bytes, 16ull << 20);
  EXPECT_EQ(cell->kernel_params,
            "memmap=16M$0x1c000000 trace_instance=boot_map@0x1c000000:16M,sched:sched_switch");
}

// <cmdline> is never the source: a memmap= that names another range (or
// does not parse) is only reported, the cell wins; one that agrees is quiet.
TEST(DomainXml, BootCellTrustsTheCellOverCmdline) {
  DomainXmlInfo info;
  info.name = "c";
  info.numa_cells = {{0, 448ull << 20, ""}, {1, 64ull << 20, "shared"}};
  info.cmdline = "console=ttyS0 memmap=16M$0x1c000000 trace_instance=boot_map@0x1c000000:16M";
  Result<DomainBootCell> cell = FindDomainBootCell(info, "boot_map", "");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_TRUE(cell->cmdline_note.empty()) << cell->cmdline_note;

  info.cmdline = "memmap=32M$0x10000000";
  cell = FindDomainBootCell(info, "boot_map", "");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_EQ(cell->layout.range_gpa, 0x1c000000u);
  EXPECT_EQ(cell->layout.range_bytes, 16u << 20);
  EXPECT_NE(cell->cmdline_note.find("memmap=32M$0x10000000"), std::string::npos)
      << cell->cmdline_note;
  EXPECT_NE(cell->cmdline_note.find("the cell is used"), std::string::npos);

  info.cmdline = "memmap=16M$zz";
  cell = FindDomainBootCell(info, "boot_map", "");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_NE(cell->cmdline_note.find("cannot parse 'memmap=16M$zz'"), std::string::npos)
      << cell->cmdline_note;
}

// Hostile or foreign definitions: refused with what was expected.
TEST(DomainXml, Malicious_BootCellRefusesWhatItCannotPlace) {
  auto refuse = [](DomainXmlInfo info, const std::string& expect) {
    info.name = "h";
    Result<DomainBootCell> cell = FindDomainBootCell(info, "boot_map", "");
    ASSERT_FALSE(cell.ok()) << expect;
    EXPECT_NE(cell.error().message.find(expect), std::string::npos) << cell.error().message;
    EXPECT_NE(cell.error().message.find("domain 'h'"), std::string::npos);
  };
  const DomainNumaCell c0{0, 448ull << 20, ""}, c1{1, 64ull << 20, "shared"};
  DomainXmlInfo info;
  refuse(info, "0 cell(s)");  // No NUMA at all: an ordinary domain.
  info.numa_cells = {c0};
  refuse(info, "memAccess='shared'");
  info.numa_cells = {c0, {1, 64ull << 20, "private"}};
  refuse(info, "memAccess='shared'");
  info.numa_cells = {c0, c1, {2, 64ull << 20, ""}};
  refuse(info, "3 cell(s)");
  info.numa_cells = {c1, c0};  // Ids swapped.
  refuse(info, "cell 0");
  info.numa_cells = {{0, 448ull << 20, "shared"}, c1};
  refuse(info, "cell 0 is shared");
  info.numa_cells = {c0, {1, 32ull << 20, "shared"}};  // No room past the headroom.
  refuse(info, "cannot hold a range");
  info.numa_cells = {c0, {1, UINT64_MAX - (1ull << 20), "shared"}};
  refuse(info, "cannot hold a range");
  info.numa_cells = {c0, c1};
  info.memory_bytes = 1ull << 30;  // Not the cells' sum.
  refuse(info, "not the sum");
  info.memory_bytes = 0;
  info.numa_cells = {{0, (448ull << 20) + 1024, ""}, c1};  // Not 2 MiB aligned.
  refuse(info, "2 MiB");
  info.numa_cells = {{0, (448ull << 20) + (1ull << 20), ""}, {1, 63ull << 20, "shared"}};
  refuse(info, "aligned");                       // The sum is, node 0 is not.
  info.numa_cells = {{0, 64ull << 20, ""}, c1};  // Too little below the range.
  refuse(info, "at least 128 MiB");
  info.numa_cells = {{0, 3ull << 30, ""}, {1, 1ull << 30, "shared"}};  // Past the PCI hole.
  refuse(info, "low-memory limit");
}

// The metadata channel as libvirt shows it in a running domain's XML; other
// channels (the QEMU guest agent's) are not it.
TEST(DomainXml, FindsTheMetaChannelSocket) {
  const std::string xml = R"(<domain type='qemu' id='3'><name>deb</name><devices>
    <channel type='unix'>
      <source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-3-deb/org.qemu.guest_agent.0'/>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
    </channel>
    <channel type='unix'>
      <source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-3-deb/org.hvtrace.agent.0'/>
      <target type='virtio' name='org.hvtrace.agent.0' state='connected'/>
    </channel>
  </devices></domain>)";
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_TRUE(info->meta_channel);
  EXPECT_EQ(info->meta_channel_path,
            "/var/lib/libvirt/qemu/channel/target/domain-3-deb/org.hvtrace.agent.0");
  Result<DomainXmlInfo> none = ParseDomainXml(
      "<domain type='qemu'><name>x</name><devices><channel type='pty'><target type='virtio' "
      "name='org.hvtrace.agent.0'/></channel></devices></domain>");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->meta_channel);
  EXPECT_TRUE(none->meta_channel_path.empty());
}

}  // namespace
}  // namespace hvtrace::hostd
