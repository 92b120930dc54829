#include "server/placement/rendezvous.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/testing/test_seed.h"

namespace kvfabric::placement {
namespace {

BlockKey RandomKey(std::mt19937_64& rng) {
  BlockKey::Bytes b;
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return BlockKey(b);
}

// Host ids and weights; `candidates` views into `ids` and is rebuilt on every Add.
struct Hosts {
  std::vector<std::string> ids;
  std::vector<double> weights;
  std::vector<RendezvousCandidate> candidates;

  void Add(std::string id, double weight) {
    ids.push_back(std::move(id));
    weights.push_back(weight);
    candidates.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      candidates.push_back({static_cast<std::uint32_t>(i), HostHash(ids[i]), weights[i], ids[i]});
    }
  }
};

TEST(RendezvousTest, FirstChoiceIsProportionalToWeight) {
  const std::uint64_t seed = TestSeed("RendezvousTest.FirstChoiceIsProportionalToWeight");
  std::mt19937_64 rng(seed);
  Hosts hosts;
  const std::vector<double> w = {1e9, 2e9, 3e9, 4e9, 10e9};
  double total = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    hosts.Add("cache-" + std::to_string(i), w[i]);
    total += w[i];
  }
  constexpr int kKeys = 200000;
  std::vector<int> firsts(w.size(), 0);
  for (int k = 0; k < kKeys; ++k) {
    const auto top = RendezvousTop(hosts.candidates, RandomKey(rng), 1);
    ASSERT_EQ(top.size(), 1u);
    ++firsts[top[0].index];
  }
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double share = static_cast<double>(firsts[i]) / kKeys;
    // Binomial standard deviation is at most 0.0011 here; 0.006 is over 5 sigma.
    EXPECT_NEAR(share, w[i] / total, 0.006) << "host " << i;
  }
}

TEST(RendezvousTest, RemovingAHostMovesOnlyItsKeys) {
  const std::uint64_t seed = TestSeed("RendezvousTest.RemovingAHostMovesOnlyItsKeys");
  std::mt19937_64 rng(seed);
  Hosts all;
  Hosts without;
  for (int i = 0; i < 8; ++i) {
    const double weight = 1e9 * static_cast<double>(1 + rng() % 8);
    all.Add("cache-" + std::to_string(i), weight);
    if (i != 3) without.Add("cache-" + std::to_string(i), weight);
  }
  constexpr int kKeys = 20000;
  constexpr std::size_t kReplicas = 3;
  int moved = 0;
  for (int k = 0; k < kKeys; ++k) {
    const BlockKey key = RandomKey(rng);
    const auto before = RendezvousTop(all.candidates, key, kReplicas);
    const auto after = RendezvousTop(without.candidates, key, kReplicas);
    ASSERT_EQ(before.size(), kReplicas);
    ASSERT_EQ(after.size(), kReplicas);
    std::vector<std::string> b, a;
    for (const auto& c : before) b.push_back(all.ids[c.index]);
    for (const auto& c : after) a.push_back(without.ids[c.index]);
    bool held = false;
    for (const auto& id : b) held |= id == "cache-3";
    if (!held) {
      EXPECT_EQ(a, b) << "key " << k << " moved though cache-3 did not hold it";
    } else {
      ++moved;
      // The surviving hosts keep their order; one new host joins at the end.
      std::vector<std::string> kept;
      for (const auto& id : b) {
        if (id != "cache-3") kept.push_back(id);
      }
      EXPECT_EQ(std::vector<std::string>(a.begin(), a.begin() + 2), kept);
    }
  }
  EXPECT_GT(moved, 0);
}

TEST(RendezvousTest, IsDeterministicAndIndependentOfCandidateOrder) {
  const std::uint64_t seed =
      TestSeed("RendezvousTest.IsDeterministicAndIndependentOfCandidateOrder");
  std::mt19937_64 rng(seed);
  Hosts forward;
  Hosts backward;
  for (int i = 0; i < 6; ++i) forward.Add("h" + std::to_string(i), 1e9 * (i + 1));
  for (int i = 5; i >= 0; --i) backward.Add("h" + std::to_string(i), 1e9 * (i + 1));
  for (int k = 0; k < 1000; ++k) {
    const BlockKey key = RandomKey(rng);
    const auto a = RendezvousTop(forward.candidates, key, 6);
    const auto a2 = RendezvousTop(forward.candidates, key, 6);
    const auto b = RendezvousTop(backward.candidates, key, 6);
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].index, a2[i].index);
      EXPECT_EQ(a[i].score, a2[i].score);
      EXPECT_EQ(forward.ids[a[i].index], backward.ids[b[i].index]);
      if (i > 0) {
        EXPECT_GE(a[i - 1].score, a[i].score);
      }
    }
  }
}

TEST(RendezvousTest, KnownValuesDoNotChangeAcrossBuilds) {
  // Placement decisions must agree across placement replicas and releases: pin the hash.
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  BlockKey::Bytes b{};
  b[0] = 1;
  EXPECT_EQ(KeyHash(BlockKey(b)), 0xE28195DDD9EE4956ull);
  EXPECT_EQ(HostHash("cache-0"), 0x8755C05C46F8FF13ull);
  EXPECT_DOUBLE_EQ(RendezvousScore(HostHash("cache-0"), KeyHash(BlockKey(b)), 1e9),
                   0x1.240eb68aa583cp+29);
  EXPECT_NE(KeyHash(BlockKey(b)), KeyHash(BlockKey()));
}

TEST(RendezvousTest, SkipsNonPositiveWeightsAndCapsAtCandidates) {
  Hosts hosts;
  hosts.Add("a", 0);
  hosts.Add("b", 5);
  hosts.Add("c", -1);
  const auto top = RendezvousTop(hosts.candidates, BlockKey(), 3);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(hosts.ids[top[0].index], "b");
  EXPECT_GT(top[0].score, 0);
  EXPECT_TRUE(RendezvousTop({}, BlockKey(), 2).empty());
}

}  // namespace
}  // namespace kvfabric::placement
