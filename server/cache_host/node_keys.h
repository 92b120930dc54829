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
#include "core/sha256.h"
#include "core/statusor.h"

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

// The key of (tenant, key) on the NVMe tier: its blocks' header key and its
// catalog key. SHA-256 of a domain tag, the tenant's length (2 bytes, little-
// endian), the tenant and the block key: one block key in two namespaces is
// two NVMe blocks, and no choice of tenant and key reaches another's.
inline StatusOr<BlockDigest> NvmeKeyOf(const std::string& tenant, const BlockKey& key) {
  KVF_ASSIGN_OR_RETURN(Sha256 hasher, Sha256::Create());
  static constexpr char kTag[] = "kvfabric nvme key v1";
  hasher.Update(kTag, sizeof(kTag));  // with its NUL
  const std::uint8_t length[2] = {static_cast<std::uint8_t>(tenant.size()),
                                  static_cast<std::uint8_t>(tenant.size() >> 8)};
  hasher.Update(length, sizeof(length));
  hasher.Update(tenant);
  hasher.Update(key.bytes().data(), key.bytes().size());
  KVF_ASSIGN_OR_RETURN(const Sha256Digest digest, hasher.Finish());
  BlockDigest out;
  std::memcpy(out.data(), digest.data(), out.size());
  return out;
}

}  // namespace kvfabric::cache_host::internal

#endif  // KVFABRIC_SERVER_CACHE_HOST_NODE_KEYS_H_
