#include "uevent.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hvtrace::agent {

bool Uevent::IsIvshmem() const {
  return subsystem == "pci" && (pci_id == "1AF4:1110" || pci_id == "1af4:1110");
}

bool ParseUevent(std::string_view datagram, Uevent* out) {
  *out = Uevent{};
  // The header is "ACTION@DEVPATH"; kernel messages have it, udev's start
  // with "libudev" and are ignored.
  const size_t nul = datagram.find('\0');
  const std::string_view head = datagram.substr(0, nul);
  if (head.find('@') == std::string_view::npos || nul == std::string_view::npos) return false;
  datagram.remove_prefix(nul + 1);
  while (!datagram.empty()) {
    const size_t end = datagram.find('\0');
    const std::string_view kv = datagram.substr(0, end);
    datagram.remove_prefix(end == std::string_view::npos ? datagram.size() : end + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "ACTION")
      out->action = value;
    else if (key == "DEVPATH")
      out->devpath = value;
    else if (key == "SUBSYSTEM")
      out->subsystem = value;
    else if (key == "PCI_ID")
      out->pci_id = value;
    else if (key == "PCI_SLOT_NAME")
      out->pci_slot = value;
  }
  return !out->action.empty() && !out->devpath.empty();
}

UeventSocket::~UeventSocket() {
  if (fd_ >= 0) close(fd_);
}

bool UeventSocket::Open() {
  fd_ = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  if (fd_ < 0) return false;
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = 1;  // Kernel uevents.
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd_);
    fd_ = -1;
    return false;
  }
  // The default buffer holds a few dozen uevents; a boot's module loads
  // send hundreds. Root may exceed rmem_max; if not, overflow is noticed.
  const int bytes = 1 << 20;
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0)
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  return true;
}

int UeventSocket::Receive(Uevent* out) {
  if (fd_ < 0) return -1;
  const ssize_t n = recv(fd_, buffer_, sizeof(buffer_), MSG_DONTWAIT);
  if (n < 0 && errno == ENOBUFS) return kOverflow;
  if (n <= 0) return -1;
  return ParseUevent(std::string_view(buffer_, static_cast<size_t>(n)), out) ? 1 : 0;
}

}  // namespace hvtrace::agent
