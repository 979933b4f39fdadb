// A real single-node Ceph cluster with radosgw, for tests of the fleet
// upload against a real S3 store (docs/fleet.md). No systemd, no disk: one
// monitor, one manager, one OSD on memstore (pool size 1) and radosgw
// (beast) on a free 127.0.0.1 port, all from a ceph.conf and keyrings
// generated in a private temp dir (DESIGN.md §4.6). The daemons run in the
// foreground as children of the test process with PR_SET_PDEATHSIG, so they
// die with it even when a test crashes; Stop kills them and removes the dir.
//
// Start waits until RGW answers, then creates a user (radosgw-admin) whose
// keys the tests sign with. One cluster per test binary: starting one takes
// ~10-15 s here (start_seconds()).
#ifndef HVTRACE_TESTS_E2E_CEPH_FIXTURE_H_
#define HVTRACE_TESTS_E2E_CEPH_FIXTURE_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::e2e {

class CephCluster {
 public:
  CephCluster() = default;
  ~CephCluster();
  CephCluster(const CephCluster&) = delete;
  CephCluster& operator=(const CephCluster&) = delete;

  // Why a cluster cannot run here (a Ceph binary missing), or "".
  static std::string UnavailableReason();

  // Starts everything and creates the user; errors carry the daemons' logs.
  Status Start();
  // Kills every daemon and removes the directory (HVTRACE_KEEP_TMP keeps it).
  void Stop();

  // radosgw alone: the store goes down (connections refused) and comes back.
  void StopRgw();
  Status StartRgw();

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(rgw_port_); }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  const std::string& dir() const { return dir_; }
  double start_seconds() const { return start_seconds_; }

  // Creates |bucket| (PUT with the user's keys, through curl).
  Status CreateBucket(const std::string& bucket);
  // A file with "access_key = …\nsecret_key = …", mode 0600, in dir().
  Result<std::string> WriteCredentials(const std::string& name, const std::string& access_key,
                                       const std::string& secret_key) const;

  // The last bytes of every daemon's log, for failure messages.
  std::string Logs() const;

 private:
  Status Run(const std::vector<std::string>& argv, std::string* out = nullptr) const;
  Result<pid_t> Spawn(const std::string& name, const std::vector<std::string>& argv);
  Status WaitForRgw(double seconds);
  void Kill(const std::string& name);

  std::string dir_;
  std::string conf_;
  int mon_port_ = 0;
  int rgw_port_ = 0;
  std::string access_key_ = "HVTRACETESTKEY0000";
  std::string secret_key_ = "hvtrace-test-secret-0000000000000000000000";
  std::map<std::string, pid_t> daemons_;  // name → pid.
  double start_seconds_ = 0;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_CEPH_FIXTURE_H_
