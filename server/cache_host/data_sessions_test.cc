#include "server/cache_host/data_sessions.h"

#include <gtest/gtest.h>

namespace kvfabric::cache_host {
namespace {

std::array<std::uint8_t, wire::kHelloBytes> Nonce(std::uint8_t seed) {
  std::array<std::uint8_t, wire::kHelloBytes> n{};
  for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<std::uint8_t>(seed + i);
  return n;
}

TEST(DataSessionsTest, AProofOpensOnlyItsOwnSessionForItsOwnNonce) {
  DataSessions sessions(DataSessionOptions{});
  auto a = sessions.Open({"alpha", {"alpha"}}, 1000);
  auto b = sessions.Open({"beta", {"beta"}}, 1000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id, b->id);
  EXPECT_NE(a->secret, b->secret);

  const auto proof = HelloProof(a->secret, Nonce(1), a->id);
  auto t = sessions.Verify(a->id, Nonce(1), proof, 2000);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->name, "alpha");
  EXPECT_TRUE(t->MayUse("alpha"));
  EXPECT_FALSE(t->MayUse("beta"));

  // Replayed against another nonce (another connection), claimed for
  // another session, or made with another secret: refused alike.
  EXPECT_TRUE(sessions.Verify(a->id, Nonce(2), proof, 2000).status().code() ==
              StatusCode::kPermissionDenied);
  EXPECT_TRUE(sessions.Verify(b->id, Nonce(1), proof, 2000).status().code() ==
              StatusCode::kPermissionDenied);
  EXPECT_TRUE(sessions.Verify(a->id, Nonce(1), HelloProof(b->secret, Nonce(1), a->id), 2000)
                  .status()
                  .code() == StatusCode::kPermissionDenied);
  EXPECT_TRUE(sessions.Verify(12345, Nonce(1), proof, 2000).status().code() ==
              StatusCode::kPermissionDenied);
}

TEST(DataSessionsTest, SessionsExpireAndAreBounded) {
  DataSessionOptions o;
  o.max_sessions = 2;
  o.ttl_us = 1000;
  DataSessions sessions(o);
  auto a = sessions.Open({"t", {"*"}}, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(sessions.Open({"t", {"*"}}, 0).ok());
  auto full = sessions.Open({"t", {"*"}}, 10);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("--max-data-sessions 2"), std::string::npos)
      << full.status().ToString();
  // Past the TTL the old ones are dropped to make room, and no longer verify.
  EXPECT_TRUE(sessions.Open({"t", {"*"}}, 5000).ok());
  EXPECT_EQ(sessions.size(), 1u);
  EXPECT_FALSE(sessions.Verify(a->id, Nonce(3), HelloProof(a->secret, Nonce(3), a->id), 5000).ok());
}

}  // namespace
}  // namespace kvfabric::cache_host
