#include "access.h"

#include <grp.h>

#include <algorithm>
#include <array>
#include <charconv>

namespace hvtrace::hostd {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kNone:
      return "none";
    case Role::kObserver:
      return "observer";
    case Role::kAdmin:
      return "admin";
  }
  return "none";
}

bool InGroup(const PeerCredentials& peer, gid_t group) {
  return peer.gid == group ||
         std::find(peer.groups.begin(), peer.groups.end(), group) != peer.groups.end();
}

Role PeerRole(const AccessPolicy& policy, const PeerCredentials& peer) {
  if (peer.uid == 0 || peer.uid == policy.daemon_uid) return Role::kAdmin;
  if (policy.admin_group && InGroup(peer, *policy.admin_group)) return Role::kAdmin;
  if (policy.observer_group && InGroup(peer, *policy.observer_group)) return Role::kObserver;
  return Role::kNone;
}

bool Allows(Role held, Role needed) {
  if (needed == Role::kNone) return false;  // A command with no role is no one's.
  return static_cast<int>(held) >= static_cast<int>(needed);
}

namespace {

std::string GroupText(const std::string& name, const std::optional<gid_t>& gid) {
  if (!gid)
    return name.empty() ? "no group configured" : "group '" + name + "', which does not exist";
  if (name == std::to_string(*gid)) return "gid " + name;
  return "group " + name + " (gid " + std::to_string(*gid) + ")";
}

}  // namespace

std::string RefusalMessage(std::string_view cmd, const AccessPolicy& policy,
                           const PeerCredentials& peer, Role needed) {
  std::string who = "uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) +
                    ", gid " + std::to_string(peer.gid);
  if (!peer.groups.empty()) {
    who += ", groups ";
    for (size_t i = 0; i < peer.groups.size(); ++i)
      who += (i ? "," : "") + std::to_string(peer.groups[i]);
  }
  who += ")";
  if (needed == Role::kNone) {
    return "'" + std::string(cmd) + "' is allowed to no one; refused for " + who;
  }
  const std::string group = needed == Role::kAdmin
                                ? GroupText(policy.admin_group_name, policy.admin_group)
                                : GroupText(policy.observer_group_name, policy.observer_group);
  const Role held = PeerRole(policy, peer);
  return "'" + std::string(cmd) + "' needs the " + std::string(RoleName(needed)) +
         " role (root or " + group + " [" +
         (needed == Role::kAdmin ? "admin_group" : "socket_group") + "]); " + who + " is " +
         (held == Role::kNone ? std::string("neither observer nor admin")
                              : "only an " + std::string(RoleName(held)));
}

std::optional<gid_t> ResolveGroupSpec(const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    unsigned long value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() ||
        value >= static_cast<unsigned long>(static_cast<gid_t>(-1))) {
      return std::nullopt;
    }
    return static_cast<gid_t>(value);
  }
  std::array<char, 16384> buf;
  struct group grp;
  struct group* found = nullptr;
  if (getgrnam_r(text.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return std::nullopt;
  }
  return grp.gr_gid;
}

}  // namespace hvtrace::hostd
