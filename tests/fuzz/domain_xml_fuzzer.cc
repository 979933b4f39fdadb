// Fuzzes the domain XML reader (libvirt hands hvtraced a domain's XML; a
// domain's owner writes most of it). Seeds: tests/fixtures/fuzz/domain_xml/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "domain_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string_view xml(reinterpret_cast<const char*>(data), size);
  auto info = hvtrace::hostd::ParseDomainXml(xml);
  if (info.ok()) {
    // Everything it hands out is used by the backend: touch it.
    size_t n = info->name.size() + info->uuid.size() + info->cmdline.size();
    for (const auto& s : info->shmems) n += s.name.size() + s.alias.size();
    for (const auto& c : info->numa_cells) n += c.mem_access.size();
    if (n == 1) return 1;
  }
  (void)hvtrace::hostd::ValidateShmName(xml);
  return 0;
}
