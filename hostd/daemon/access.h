// Who may do what on the control socket.
//
// Two roles, decided per request from the peer's SO_PEERCRED and
// SO_PEERGROUPS (the credentials the kernel recorded when the client
// connected, so no /proc race and no /etc/group lookup):
//   observer  root, the daemon's own uid, or a member of socket_group:
//             may look (ping, version, list, status, captures, stream,
//             formats-list) and read captures (the state dir is group-owned
//             by socket_group).
//   admin     root, the daemon's own uid, or a member of admin_group: may
//             also change state (boot, adopt, attach, detach, capture, stop,
//             shutdown, formats-harvest). An admin is an observer too.
// Each command names its role in the command table (commands.cc); a command
// that names none is refused to everyone.
#ifndef HVTRACE_HOSTD_ACCESS_H_
#define HVTRACE_HOSTD_ACCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hvtrace::hostd {

enum class Role { kNone, kObserver, kAdmin };
std::string_view RoleName(Role role);

// What the kernel says about the client process.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // Supplementary groups at connect time.
};

struct AccessPolicy {
  uid_t daemon_uid = 0;
  std::optional<gid_t> observer_group;  // socket_group
  std::optional<gid_t> admin_group;     // admin_group
  std::string observer_group_name;      // As configured, for messages.
  std::string admin_group_name;
};

bool InGroup(const PeerCredentials& peer, gid_t group);
// The strongest role |peer| holds.
Role PeerRole(const AccessPolicy& policy, const PeerCredentials& peer);
bool Allows(Role held, Role needed);
// "'boot' needs the admin role (root or group hvtrace-admin, gid 991); uid
// 65534 (pid 123, groups 65534,1001) is only an observer".
std::string RefusalMessage(std::string_view cmd, const AccessPolicy& policy,
                           const PeerCredentials& peer, Role needed);

// A group from the config: a name from the group database or a numeric gid
// (so tests and containers need no /etc/group entry). nullopt when |text| is
// empty or names no group.
std::optional<gid_t> ResolveGroupSpec(const std::string& text);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_ACCESS_H_
