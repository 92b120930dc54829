#include "transport/verbs/verbs_probe.h"

#include <gtest/gtest.h>

namespace kvfabric::verbs {
namespace {

TEST(VerbsProbeTest, ListsDevicesWithNames) {
  VerbsProbeResult r = ProbeVerbs();
  if (r.devices.empty()) GTEST_SKIP() << "no RDMA device on this machine";
  for (const std::string& d : r.devices) EXPECT_FALSE(d.empty());
}

}  // namespace
}  // namespace kvfabric::verbs
