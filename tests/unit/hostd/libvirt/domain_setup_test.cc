#include "domain_setup.h"

#include <gtest/gtest.h>

#include <string>

#include "boot_trace.h"
#include "domain_xml.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

// Inactive definitions as libvirt 9.0 wrote them (`virsh dumpxml --inactive`
// after defining a small pc and q35 domain), and what it gave back after
// defining hvtrace's edit of them.
std::string Fixture(const std::string& name) {
  return test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/libvirt/" + name);
}

DomainSetupRequest Request(uint64_t range = 16 * kMiB) {
  DomainSetupRequest r;
  r.range_bytes = range;
  r.events = "sched:sched_switch";
  return r;
}

TEST(DomainSetup, PcGetsCellsChannelPanicAndRecord) {
  const std::string original = Fixture("setup-pc.xml");
  Result<DomainSetupEdit> edit = AddDomainSetup(original, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_TRUE(edit->changed);
  EXPECT_FALSE(edit->already_set_up);
  const std::string& xml = edit->xml;
  EXPECT_NE(xml.find("<cell id='0' cpus='0-1' memory='524288' unit='KiB'/>"), std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<cell id='1' memory='65536' unit='KiB' memAccess='shared'/>"),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<target type='virtio' name='org.hvtrace.agent.0'/>"), std::string::npos);
  EXPECT_NE(xml.find("<source mode='bind'/>"), std::string::npos);
  EXPECT_NE(xml.find("<panic model='isa'/>"), std::string::npos);
  EXPECT_NE(xml.find("<on_crash>preserve</on_crash>"), std::string::npos);
  // QEMU's vmcoreinfo device: a vmcore of the domain carries VMCOREINFO.
  EXPECT_NE(xml.find("<vmcoreinfo state='on'/>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<memory unit='KiB'>589824</memory>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("xmlns:hvtrace=\"https://hvtrace.dev/setup/1\""), std::string::npos);
  // Everything else is untouched, down to the CPU model libvirt wrote.
  EXPECT_NE(xml.find("<model fallback='forbid'>qemu64</model>"), std::string::npos);
  EXPECT_NE(xml.find("<source file='/tmp/none.qcow2'/>"), std::string::npos);
  EXPECT_TRUE(HasDomainSetup(xml));
  EXPECT_FALSE(HasDomainSetup(original));

  // The daemon finds the range from these cells as it finds one made by
  // `hvtrace domain-xml --numa`.
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  ASSERT_TRUE(info.ok()) << info.error().message;
  Result<DomainBootCell> cell = FindDomainBootCell(*info, "boot_map", "sched:sched_switch");
  ASSERT_TRUE(cell.ok()) << cell.error().message;
  EXPECT_EQ(cell->layout.range_gpa, 512 * kMiB);
  EXPECT_EQ(cell->layout.range_bytes, 16 * kMiB);
  EXPECT_EQ(cell->kernel_params,
            "memmap=16M$0x20000000 trace_instance=boot_map@0x20000000:16M,sched:sched_switch");
}

TEST(DomainSetup, SecondSetupIsAlreadySetUpAndChangesNothing) {
  Result<DomainSetupEdit> first = AddDomainSetup(Fixture("setup-pc.xml"), Request());
  ASSERT_TRUE(first.ok());
  Result<DomainSetupEdit> second = AddDomainSetup(first->xml, Request());
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_TRUE(second->already_set_up);
  EXPECT_FALSE(second->changed);
  EXPECT_EQ(second->xml, first->xml);
}

TEST(DomainSetup, UndoRestoresTheDefinitionExactly) {
  for (const char* name : {"setup-pc.xml", "setup-q35.xml"}) {
    const std::string original = Fixture(name);
    Result<DomainSetupEdit> edit = AddDomainSetup(original, Request());
    ASSERT_TRUE(edit.ok()) << name << ": " << edit.error().message;
    Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
    ASSERT_TRUE(undo.ok()) << name << ": " << undo.error().message;
    EXPECT_EQ(undo->xml, original) << name;
    EXPECT_FALSE(HasDomainSetup(undo->xml));
  }
}

TEST(DomainSetup, OtherMetadataAndAMissingCpuElement) {
  std::string xml = Fixture("setup-pc.xml");
  const size_t cpu = xml.find("  <cpu ");
  xml.erase(cpu, xml.find("  </cpu>\n") + 9 - cpu);
  xml.insert(xml.find("  <memory"),
             "  <metadata>\n    <app:owner xmlns:app=\"http://example.com/app\">ops</app:owner>\n"
             "  </metadata>\n");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_NE(edit->xml.find("<hvtrace:added element=\"cpu\"/>"), std::string::npos) << edit->xml;
  EXPECT_EQ(edit->xml.find("<hvtrace:added element=\"metadata\"/>"), std::string::npos);
  EXPECT_NE(edit->xml.find("  <cpu>\n    <numa>\n      <cell id='0'"), std::string::npos)
      << edit->xml;
  Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
  ASSERT_TRUE(undo.ok()) << undo.error().message;
  EXPECT_EQ(undo->xml, xml);
}

// The boot timeline's host side: QEMU's handshake trace events from the
// domain's start, through libvirt's QEMU namespace, with no -D (they go to
// the domain's libvirt log).
TEST(DomainSetup, AddsTheQemuTraceEventsAndUndoesThem) {
  const std::string original = Fixture("setup-pc.xml");
  Result<DomainSetupEdit> edit = AddDomainSetup(original, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  const std::string& xml = edit->xml;
  EXPECT_NE(xml.find("xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"), std::string::npos)
      << xml;
  EXPECT_NE(xml.find("  <qemu:commandline>\n    <qemu:arg value='-trace'/>\n"
                     "    <qemu:arg value='enable=fw_cfg_select'/>\n"),
            std::string::npos)
      << xml;
  EXPECT_EQ(xml.find("value='-D'"), std::string::npos) << "QEMU's stderr is libvirt's log";
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->qemu_trace_events, BootTraceEvents());
  Result<DomainSetupEdit> undo = RemoveDomainSetup(xml);
  ASSERT_TRUE(undo.ok()) << undo.error().message;
  EXPECT_EQ(undo->xml, original);
}

// A domain with its own <qemu:commandline> (another prefix, one of hvtrace's
// events already enabled) keeps it: setup adds only the missing events and
// undo removes only those.
TEST(DomainSetup, KeepsTheDomainsOwnQemuCommandline) {
  std::string xml = Fixture("setup-pc.xml");
  // The declaration first: libxml2 writes it before the attributes (libvirt
  // writes the definition again on define anyway).
  xml.replace(xml.find("<domain type='qemu'"), 19,
              "<domain xmlns:q='http://libvirt.org/schemas/domain/qemu/1.0' type='qemu'");
  xml.insert(xml.rfind("</domain>"),
             "  <q:commandline>\n    <q:arg value='-trace'/>\n"
             "    <q:arg value='enable=virtio_set_status'/>\n"
             "    <q:arg value='-no-user-config'/>\n  </q:commandline>\n");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_EQ(edit->xml.find("xmlns:qemu="), std::string::npos) << edit->xml;
  Result<DomainXmlInfo> info = ParseDomainXml(edit->xml);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->qemu_trace_events.size(), BootTraceEvents().size());
  Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
  ASSERT_TRUE(undo.ok()) << undo.error().message;
  EXPECT_EQ(undo->xml, xml);
}

TEST(DomainSetup, VmcoreinfoAddedWithoutFeaturesIsUndoneWithThem) {
  std::string original = Fixture("setup-pc.xml");
  const size_t from = original.find("  <features>");
  const size_t to = original.find("</features>\n") + std::string("</features>\n").size();
  ASSERT_NE(from, std::string::npos);
  original.erase(from, to - from);
  Result<DomainSetupEdit> edit = AddDomainSetup(original, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_NE(edit->xml.find("<features>"), std::string::npos) << edit->xml;
  EXPECT_NE(edit->xml.find("<vmcoreinfo state='on'/>"), std::string::npos) << edit->xml;
  Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
  ASSERT_TRUE(undo.ok()) << undo.error().message;
  EXPECT_EQ(undo->xml.find("<features>"), std::string::npos) << undo->xml;
  EXPECT_EQ(undo->xml.find("vmcoreinfo"), std::string::npos) << undo->xml;
}

TEST(DomainSetup, UndoOfADomainNotSetUpSaysSo) {
  Result<DomainSetupEdit> undo = RemoveDomainSetup(Fixture("setup-pc.xml"));
  ASSERT_FALSE(undo.ok());
  EXPECT_NE(undo.error().message.find("domain 'setup-pc': not set up by `hvtrace setup`"),
            std::string::npos)
      << undo.error().message;
}

TEST(DomainSetup, KeepsAnExistingPanicDeviceAndOnCrash) {
  std::string xml = Fixture("setup-pc.xml");
  xml.replace(xml.find("<on_crash>destroy</on_crash>"), 28, "<on_crash>restart</on_crash>");
  xml.insert(xml.find("    <memballoon"), "    <panic model='hyperv'/>\n");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_EQ(edit->xml.find("<panic model='isa'/>"), std::string::npos);
  EXPECT_NE(edit->xml.find("<on_crash>restart</on_crash>"), std::string::npos);
  Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
  ASSERT_TRUE(undo.ok());
  EXPECT_EQ(undo->xml, xml);
}

TEST(DomainSetup, RefusesANumaTopologyThatIsNotHvtraces) {
  std::string xml = Fixture("setup-pc.xml");
  xml.replace(xml.find("  </cpu>"), 8,
              "    <numa>\n      <cell id='0' cpus='0' memory='262144' unit='KiB'/>\n"
              "      <cell id='1' cpus='1' memory='262144' unit='KiB'/>\n    </numa>\n  </cpu>");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_FALSE(edit.ok());
  EXPECT_NE(edit.error().message.find(
                "domain 'setup-pc': it already has a NUMA topology that is not hvtrace's"),
            std::string::npos)
      << edit.error().message;
}

TEST(DomainSetup, KeepsTheCellsOfDomainXmlNuma) {
  std::string xml = Fixture("setup-pc.xml");
  xml.replace(xml.find("  </cpu>"), 8,
              "    <numa>\n      <cell id='0' cpus='0-1' memory='458752' unit='KiB'/>\n"
              "      <cell id='1' memory='65536' unit='KiB' memAccess='shared'/>\n"
              "    </numa>\n  </cpu>");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_TRUE(edit.ok()) << edit.error().message;
  EXPECT_NE(edit->xml.find("memory='458752'"), std::string::npos);
  EXPECT_NE(edit->xml.find("<memory unit='KiB'>524288</memory>"), std::string::npos);
  Result<DomainSetupEdit> undo = RemoveDomainSetup(edit->xml);
  ASSERT_TRUE(undo.ok());
  EXPECT_EQ(undo->xml, xml);
}

TEST(DomainSetup, RangeSizesLayOutAsDomainXmlNuma) {
  for (uint64_t range : {4 * kMiB, 16 * kMiB, 64 * kMiB, 10 * kMiB + 4096}) {
    Result<DomainSetupEdit> edit = AddDomainSetup(Fixture("setup-q35.xml"), Request(range));
    ASSERT_TRUE(edit.ok()) << range << ": " << edit.error().message;
    Result<DomainXmlInfo> info = ParseDomainXml(edit->xml);
    ASSERT_TRUE(info.ok());
    Result<DomainBootCell> cell = FindDomainBootCell(*info, "boot_map", "");
    ASSERT_TRUE(cell.ok()) << cell.error().message;
    EXPECT_EQ(cell->layout.range_gpa, 512 * kMiB);
    // Cell 1 is rounded up to 2 MiB, and the range grows with it.
    EXPECT_GE(cell->layout.range_bytes, range);
    EXPECT_LT(cell->layout.range_bytes, range + 2 * kMiB);
  }
}

TEST(DomainSetup, RefusesMemoryAboveTheLowMemoryLimit) {
  std::string xml = Fixture("setup-q35.xml");
  for (const char* tag : {"memory", "currentMemory"}) {
    const std::string open = std::string("<") + tag + " unit='KiB'>";
    xml.replace(xml.find(open) + open.size(), 6, "3145728");
  }
  Result<DomainSetupEdit> edit = AddDomainSetup(xml, Request());
  ASSERT_FALSE(edit.ok());
  EXPECT_NE(edit.error().message.find("domain 'setup-q35': "), std::string::npos);
  EXPECT_NE(edit.error().message.find("low-memory limit"), std::string::npos)
      << edit.error().message;
}

TEST(DomainSetup, FinishRecordsControllersLibvirtAddedAndUndoRemovesThem) {
  for (const char* name : {"setup-pc", "setup-q35"}) {
    const std::string original = Fixture(std::string(name) + ".xml");
    const std::string defined = Fixture(std::string(name) + "-defined.xml");
    Result<DomainSetupEdit> finish = FinishDomainSetup(original, defined);
    ASSERT_TRUE(finish.ok()) << name << ": " << finish.error().message;
    EXPECT_TRUE(finish->changed) << name;
    EXPECT_NE(finish->xml.find("element=\"controller\" type=\"virtio-serial\" index=\"0\""),
              std::string::npos)
        << finish->xml;
    const bool q35 = std::string(name) == "setup-q35";
    // On q35 the virtio-serial controller took the only free root port
    // (bus 0x03), so a new one is added for `hvtrace attach`; libvirt gives
    // it an index when defined, and the next round records it.
    EXPECT_EQ(
        finish->xml.find("<controller type='pci' model='pcie-root-port'/>") != std::string::npos,
        q35)
        << finish->xml;
    if (!q35) {
      // Nothing more to record once libvirt's additions are in the record.
      Result<DomainSetupEdit> again = FinishDomainSetup(original, finish->xml);
      ASSERT_TRUE(again.ok());
      EXPECT_FALSE(again->changed) << name << ": " << again->xml;
    }
    Result<DomainSetupEdit> undo = RemoveDomainSetup(finish->xml);
    ASSERT_TRUE(undo.ok()) << undo.error().message;
    EXPECT_EQ(undo->xml.find("virtio-serial"), std::string::npos) << undo->xml;
    EXPECT_EQ(undo->xml.find("hvtrace"), std::string::npos) << undo->xml;
    EXPECT_EQ(undo->xml.find("<numa>"), std::string::npos) << undo->xml;
  }
}

TEST(DomainSetup, Malicious_SetupRecordNamingOtherElementsIsRefused) {
  Result<DomainSetupEdit> edit = AddDomainSetup(Fixture("setup-pc.xml"), Request());
  ASSERT_TRUE(edit.ok());
  std::string xml = edit->xml;
  xml.replace(xml.find("element=\"panic\""), 15, "element=\"disk\"");
  Result<DomainSetupEdit> undo = RemoveDomainSetup(xml);
  ASSERT_FALSE(undo.ok());
  EXPECT_NE(undo.error().message.find("<disk>, which hvtrace setup never adds"), std::string::npos)
      << undo.error().message;
}

TEST(DomainSetup, Malicious_TruncatedXmlIsAnError) {
  const std::string xml = Fixture("setup-pc.xml");
  Result<DomainSetupEdit> edit = AddDomainSetup(xml.substr(0, xml.size() / 2), Request());
  ASSERT_FALSE(edit.ok());
  EXPECT_NE(edit.error().message.find("does not parse"), std::string::npos) << edit.error().message;
}

}  // namespace
}  // namespace hvtrace::hostd
