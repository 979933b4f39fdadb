// The kernel and initramfs a control request names (`boot`,
// `formats-harvest`): one field group for both. The paths are for messages
// and manifests only: the client opens the files with its own rights and
// sends the descriptors, whose indices OpenRequestFiles (control_protocol.h)
// writes as kernel_fd / initrd_fd. hvtraced never opens a path a client
// names.
#ifndef HVTRACE_HOSTD_BASE_KERNEL_FILE_ARGS_H_
#define HVTRACE_HOSTD_BASE_KERNEL_FILE_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace hvtrace::hostd {

struct KernelFileArgs {
  std::string kernel;
  std::optional<std::string> initrd;
  std::optional<uint64_t> kernel_fd;
  std::optional<uint64_t> initrd_fd;

  // The group's fields, for the Fields of a message that derives from it.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("kernel", r.kernel);
    m.Field("initrd", r.initrd);
    m.Field("kernel_fd", r.kernel_fd);
    m.Field("initrd_fd", r.initrd_fd);
  }
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BASE_KERNEL_FILE_ARGS_H_
