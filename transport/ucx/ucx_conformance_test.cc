// The transport conformance suite (transport/testing/transport_conformance.h)
// run against the UCX backend, over TCP and over shared memory.
#include <memory>

#include <gtest/gtest.h>

#include "transport/testing/transport_conformance.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::transport {
namespace {

using conformance::ConformanceParamName;
using conformance::TransportConformanceParam;
using conformance::TransportConformanceTest;
using conformance::TransportPair;

TransportPair MakeUcxPair(const std::string& tls) {
  kvfabric::ucx::UcxTransportOptions options;
  options.tls = tls;
  TransportPair pair;
  StatusOr<std::unique_ptr<Transport>> server = kvfabric::ucx::CreateUcxTransport(options);
  StatusOr<std::unique_ptr<Transport>> client = kvfabric::ucx::CreateUcxTransport(options);
  EXPECT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(client.ok()) << client.status();
  if (!server.ok() || !client.ok()) return pair;
  pair.server = std::move(server).value();
  pair.client = std::move(client).value();
  pair.listen_address = "127.0.0.1:0";
  // No stall hook: UCX cannot hold off a peer's one-sided access, so the
  // tests that need entries parked in flight skip for this backend.
  return pair;
}

INSTANTIATE_TEST_SUITE_P(
    Ucx, TransportConformanceTest,
    ::testing::Values(TransportConformanceParam{"tcp", [] { return MakeUcxPair("tcp"); }},
                      TransportConformanceParam{"sm",
                                                [] { return MakeUcxPair("sm,self,tcp"); }}),
    ConformanceParamName);

}  // namespace
}  // namespace kvfabric::transport
