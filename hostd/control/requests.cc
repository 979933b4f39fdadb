#include "requests.h"

#include <cctype>
#include <string_view>

#include "hvtrace/region.h"
#include "state_dir.h"

namespace hvtrace::hostd {

Status CheckVmNameArg(const char* command, const std::string& name) {
  if (Status s = ValidateVmName(name); !s.ok()) {
    return Error{std::string(command) + ": " + s.error().message};
  }
  return {};
}

Status CaptureFilesRequest::Check() const {
  if (capture.empty()) return Error{"capture-files: args.capture (a capture id) is empty"};
  if (name) return CheckVmNameArg(kCommand, *name);
  return {};
}

Status StreamRequest::Check() const {
  if (format != "text" && format != "json")
    return Error{"stream: format '" + format + "' is not text or json"};
  if (from != "now" && from != "start")
    return Error{"stream: from '" + from + "' is not now or start"};
  return CheckVmNameArg(kCommand, name);
}

Status AttachRequest::Check() const {
  if (events.size() > region::kEventsTextSize) {
    return Error{"attach: args.events is " + std::to_string(events.size()) + " bytes; at most " +
                 std::to_string(region::kEventsTextSize) + " fit in the region"};
  }
  return CheckVmNameArg(kCommand, name);
}

Status DetachRequest::Check() const { return CheckVmNameArg(kCommand, name); }

Status AdoptRequest::Check() const {
  // Two kinds of VM at once is a contradiction, not a choice to make here.
  if (qmp && domain) {
    return Error{"adopt " + name +
                 ": args.qmp (a QEMU of your own) and args.domain (a libvirt domain) exclude "
                 "each other"};
  }
  if (boot_region && !qmp) {
    return Error{"adopt " + name + ": args.boot_region needs args.qmp (the QEMU it belongs to)"};
  }
  return CheckVmNameArg(kCommand, name);
}

Status FormatsHarvestRequest::Check() const {
  if (kernel.empty()) {
    return Error{"formats-harvest: args.kernel (the kernel image's path) is required"};
  }
  if (kernel.size() > kMaxKernelPathBytes) {
    return Error{"formats-harvest: args.kernel is longer than " +
                 std::to_string(kMaxKernelPathBytes) + " bytes"};
  }
  if (initrd) {
    return Error{"formats-harvest " + kernel +
                 ": hvtraced harvests only with its own initramfs (harvest_initrd in "
                 "hvtraced.conf), never a client's: the harvest guest's report becomes the "
                 "formats of every VM with that kernel; for another initrd harvest into a "
                 "cache of your own (`hvtrace formats harvest --cache DIR --initrd I`)"};
  }
  return {};
}

Status SetupRequest::Check() const {
  if (domain.empty()) return Error{"setup needs args.domain (a libvirt domain name or UUID)"};
  constexpr uint64_t kPage = 4096;
  if (range && (*range == 0 || *range % kPage != 0 || *range > kMaxSetupRangeBytes)) {
    return Error{"setup: --range " + std::to_string(*range) +
                 " must be a multiple of 4 KiB of at most 1 GiB"};
  }
  // They end up on the guest's kernel command line.
  for (char c : events.value_or("")) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view(":,_*^-").find(c) != std::string_view::npos)) {
      return Error{"setup: events '" + *events + "' may only hold names, ':', ',', '*', '^'"};
    }
  }
  return {};
}

}  // namespace hvtrace::hostd
