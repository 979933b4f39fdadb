// What the fleet tests share: the binary's one Ceph cluster (fleet_e2e_main.cc).
#ifndef HVTRACE_TESTS_E2E_FLEET_E2E_SUPPORT_H_
#define HVTRACE_TESTS_E2E_FLEET_E2E_SUPPORT_H_

#include <string>

#include "ceph_fixture.h"

namespace hvtrace::e2e {

struct SharedCeph {
  CephCluster cluster;
  std::string unavailable;  // Why there is no cluster (binaries missing).
  std::string start_error;  // Why it did not start.
};
SharedCeph& SharedCephState();

// In a test body: skips without Ceph binaries, fails when the cluster did not
// start, else leaves |var| pointing at the cluster.
#define HVTRACE_REQUIRE_CEPH(var)                                    \
  if (!::hvtrace::e2e::SharedCephState().unavailable.empty())        \
    GTEST_SKIP() << ::hvtrace::e2e::SharedCephState().unavailable;   \
  ASSERT_TRUE(::hvtrace::e2e::SharedCephState().start_error.empty()) \
      << ::hvtrace::e2e::SharedCephState().start_error;              \
  ::hvtrace::e2e::CephCluster& var = ::hvtrace::e2e::SharedCephState().cluster

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_FLEET_E2E_SUPPORT_H_
