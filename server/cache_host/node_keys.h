// Small conversions between the node's key types, shared by the files of
// CacheHostNode (cache_host_node.cc, cache_host_node_tiers.cc). Internal.
#ifndef KVFABRIC_SERVER_CACHE_HOST_NODE_KEYS_H_
#define KVFABRIC_SERVER_CACHE_HOST_NODE_KEYS_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/block_format.h"
#include "core/block_key.h"

namespace kvfabric::cache_host::internal {

inline Namespace Ns(const std::string& tenant) { return Namespace{tenant}; }

// Constant time: no early exit on the first mismatching byte.
inline bool TokensEqual(const std::array<std::uint8_t, 16>& a,
                        const std::array<std::uint8_t, 16>& b) {
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

inline BlockDigest DigestOf(const BlockKey& key) {
  BlockDigest d;
  std::memcpy(d.data(), key.bytes().data(), d.size());
  return d;
}

inline BlockKey KeyOf(const BlockDigest& d) {
  BlockKey::Bytes b;
  std::memcpy(b.data(), d.data(), b.size());
  return BlockKey(b);
}

}  // namespace kvfabric::cache_host::internal

#endif  // KVFABRIC_SERVER_CACHE_HOST_NODE_KEYS_H_
