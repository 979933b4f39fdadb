// The fleet tests' main: one Ceph cluster (ceph_fixture.h) for every test of
// this binary, started before the first test and stopped after the last, so
// the ~10-15 s start is paid once. ctest runs this binary as one test
// (FleetE2e) for that reason.
#include <gtest/gtest.h>

#include <cstdio>

#include "fleet_e2e_support.h"

namespace hvtrace::e2e {
namespace {

class CephEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string why = CephCluster::UnavailableReason();
    if (!why.empty()) {
      SharedCephState().unavailable = why;
      std::printf("[fleet e2e] no Ceph: %s\n", why.c_str());
      return;
    }
    Status s = SharedCephState().cluster.Start();
    if (!s.ok()) {
      SharedCephState().start_error = s.error().message;
      return;
    }
    std::printf(
        "[fleet e2e] single-node Ceph (mon, mgr, memstore OSD, radosgw) started in %.1f s; "
        "RGW at %s\n",
        SharedCephState().cluster.start_seconds(), SharedCephState().cluster.endpoint().c_str());
    std::fflush(stdout);
  }
  void TearDown() override { SharedCephState().cluster.Stop(); }
};

}  // namespace

SharedCeph& SharedCephState() {
  static SharedCeph* state = new SharedCeph;
  return *state;
}

}  // namespace hvtrace::e2e

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new hvtrace::e2e::CephEnvironment);
  return RUN_ALL_TESTS();
}
