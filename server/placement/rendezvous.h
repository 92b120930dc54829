// Weighted rendezvous (highest-random-weight) hashing: which daemons a new block should be
// written to. For block key k and a host h of weight w_h > 0,
//
//   u(h, k)     = (top 53 bits of splitmix64(KeyHash(k) xor HostHash(h)) + 0.5) / 2^53   in (0, 1)
//   score(h, k) = -w_h / ln(u(h, k))
//
// and the r hosts of highest score hold the key, best first. -1/ln(u) for uniform u is the
// Fréchet-transformed uniform whose maximum over hosts lands on host h with probability
// w_h / sum(w): the exponential race (Schindelhauer & Schomaker, "Weighted distributed hash
// tables", 2005). Properties the tests check:
//   - proportional: a host is the first choice of a fraction of keys equal to its share of the
//     total weight;
//   - minimal disruption: removing a host moves only the keys it held (every other host's
//     score of every key is unchanged), adding one moves only keys to it;
//   - deterministic: the same hosts, weights and key give the same answer in every process
//     (no seeds, no pointer values; ties broken by host id).
//
// KeyHash folds all 32 key bytes (block keys are SHA-256 outputs, but tests and tools use
// arbitrary keys); HostHash is FNV-1a over the host id, finished with splitmix64.
//
// Weights are free capacity in bytes (host pool free + NVMe free, floor 1), see
// PlacementNode::Place. Scores are only compared between hosts for one key.
//
// Cost: O(hosts) per key (one mix and one log per host), O(r log r) to order the top r.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_SERVER_PLACEMENT_RENDEZVOUS_H_
#define KVFABRIC_SERVER_PLACEMENT_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/block_key.h"

namespace kvfabric::placement {

// The splitmix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix.
std::uint64_t SplitMix64(std::uint64_t x);
std::uint64_t HostHash(std::string_view host_id);
std::uint64_t KeyHash(const BlockKey& key);

// One candidate host. `index` is the caller's (e.g. into its host table) and is returned as is.
struct RendezvousCandidate {
  std::uint32_t index = 0;
  std::uint64_t host_hash = 0;  // HostHash(host_id)
  double weight = 0;            // > 0; candidates with weight <= 0 are never chosen
  std::string_view host_id;     // tie-break only
};

struct RendezvousChoice {
  std::uint32_t index = 0;
  double score = 0;
};

// score(h, k) as above; 0 for weight <= 0 (or not finite).
double RendezvousScore(std::uint64_t host_hash, std::uint64_t key_hash, double weight);

// The min(r, eligible candidates) highest-scoring candidates for `key`, best first (ties: lower
// host_id first).
std::vector<RendezvousChoice> RendezvousTop(std::span<const RendezvousCandidate> candidates,
                                            const BlockKey& key, std::size_t r);

}  // namespace kvfabric::placement

#endif  // KVFABRIC_SERVER_PLACEMENT_RENDEZVOUS_H_
