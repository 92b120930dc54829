#include "server/placement/rendezvous.h"

#include <algorithm>
#include <cmath>

namespace kvfabric::placement {

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t HostHash(std::string_view host_id) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a 64 offset basis
  for (char c : host_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;  // FNV-1a 64 prime
  }
  return SplitMix64(h);
}

std::uint64_t KeyHash(const BlockKey& key) {
  std::uint64_t h = 0;
  const BlockKey::Bytes& b = key.bytes();
  for (std::size_t word = 0; word < BlockKey::kSize / 8; ++word) {
    std::uint64_t w = 0;
    for (std::size_t i = 0; i < 8; ++i) w |= std::uint64_t{b[word * 8 + i]} << (8 * i);
    h = SplitMix64(h ^ w);
  }
  return h;
}

double RendezvousScore(std::uint64_t host_hash, std::uint64_t key_hash, double weight) {
  if (!(weight > 0) || !std::isfinite(weight)) return 0;
  const std::uint64_t x = SplitMix64(key_hash ^ host_hash);
  // 53 bits, centred in their interval: u is never 0 or 1, so ln(u) is finite and < 0.
  const double u = (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
  return -weight / std::log(u);
}

std::vector<RendezvousChoice> RendezvousTop(std::span<const RendezvousCandidate> candidates,
                                            const BlockKey& key, std::size_t r) {
  const std::uint64_t kh = KeyHash(key);
  struct Scored {
    double score;
    std::size_t at;
  };
  std::vector<Scored> scored;
  scored.reserve(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const double s = RendezvousScore(candidates[i].host_hash, kh, candidates[i].weight);
    if (s > 0) scored.push_back({s, i});
  }
  const auto better = [&](const Scored& a, const Scored& b) {
    if (a.score != b.score) return a.score > b.score;
    return candidates[a.at].host_id < candidates[b.at].host_id;
  };
  const std::size_t n = std::min(r, scored.size());
  std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(n), scored.end(),
                    better);
  std::vector<RendezvousChoice> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back({candidates[scored[i].at].index, scored[i].score});
  }
  return out;
}

}  // namespace kvfabric::placement
