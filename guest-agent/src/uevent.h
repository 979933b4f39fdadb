// Kernel uevents over netlink (NETLINK_KOBJECT_UEVENT), the way the agent
// learns that an ivshmem device came or went. The kernel sends no signal to a
// process that maps a BAR of a removed device, so the remove uevent is the
// only warning the agent gets.
#ifndef HVTRACE_AGENT_UEVENT_H_
#define HVTRACE_AGENT_UEVENT_H_

#include <string>
#include <string_view>

namespace hvtrace::agent {

struct Uevent {
  std::string action;     // "add", "remove", ...
  std::string devpath;    // "/devices/pci0000:00/0000:00:04.0"
  std::string subsystem;  // "pci"
  std::string pci_id;     // "1AF4:1110"
  std::string pci_slot;   // "0000:00:04.0"

  bool IsIvshmem() const;
};

// Parses one kernel uevent datagram ("add@/devices/...\0KEY=VALUE\0...").
// Returns false for anything else (udev's "libudev" messages, garbage).
bool ParseUevent(std::string_view datagram, Uevent* out);

class UeventSocket {
 public:
  UeventSocket() = default;
  ~UeventSocket();
  UeventSocket(const UeventSocket&) = delete;
  UeventSocket& operator=(const UeventSocket&) = delete;

  // Opens and binds the socket (non-blocking). False with errno set.
  bool Open();
  int fd() const { return fd_; }
  // Reads one datagram: 1 with |out| filled, 0 for a datagram that is not
  // a kernel uevent, -1 when none is pending, kOverflow when the kernel
  // dropped datagrams because the socket's buffer was full (a burst of
  // module loads at boot does that): the caller must look again for itself.
  static constexpr int kOverflow = -2;
  int Receive(Uevent* out);

 private:
  int fd_ = -1;
  char buffer_[8192];
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_UEVENT_H_
