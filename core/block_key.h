// BlockKey: the engine-neutral content address of one full KV-cache block.
//
// Keys form a chain. For block i of a context (tokens [i*T, (i+1)*T), T =
// tokens_per_block):
//
//   key_i = SHA-256(encode(namespace, fingerprint digest, key_{i-1},
//                          token ids of block i, extra keys of block i))
//
// with key_{-1} = kRootParentKey (32 zero bytes). A key therefore commits to the
// tenant, the model fingerprint and every token and extra key of the whole prefix
// up to and including its block: equal keys mean equal prefixes, and keys of
// different tenants or fingerprints never collide (barring a SHA-256 collision).
// The byte encoding is injective and is specified, with golden vectors, in
// docs/block-key.md; tools/block_key_reference.py is an independent
// implementation. Only full blocks are keyed: a partial tail has no key.
//
// Extra keys are opaque byte strings that must also match for a block to be
// reused, e.g. a LoRA adapter id, a multimodal input hash, or a cache salt.
// Their order matters.
//
// Thread safety: BlockKey and Namespace are values. A BlockKeyer is immutable
// after Create(); its const methods may be called from any number of threads.
#ifndef KVFABRIC_CORE_BLOCK_KEY_H_
#define KVFABRIC_CORE_BLOCK_KEY_H_

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Longest tenant name accepted, in bytes.
inline constexpr std::size_t kMaxNamespaceBytes = 256;
// Longest single extra key, in bytes, and most extra keys on one block.
inline constexpr std::size_t kMaxExtraKeyBytes = 256;
inline constexpr std::size_t kMaxExtraKeysPerBlock = 64;

// The tenant a key belongs to. Blocks are never shared across namespaces. The
// empty string is a valid namespace (single-tenant deployments); names are
// hashed as bytes, with no normalisation.
struct Namespace {
  std::string tenant;

  // OK, or InvalidArgument if tenant is longer than kMaxNamespaceBytes.
  Status Validate() const;
};

// 32 bytes. Ordered and compared bytewise (lexicographically).
class BlockKey {
 public:
  static constexpr std::size_t kSize = 32;
  using Bytes = std::array<std::uint8_t, kSize>;

  // All zero bytes: kRootParentKey.
  constexpr BlockKey() = default;
  constexpr explicit BlockKey(const Bytes& bytes) : bytes_(bytes) {}

  const Bytes& bytes() const { return bytes_; }

  // 64 lower-case hex characters.
  std::string ToHex() const;
  // Accepts exactly 64 hex characters, either case; InvalidArgument otherwise.
  static StatusOr<BlockKey> FromHex(std::string_view hex);

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  friend std::strong_ordering operator<=>(const BlockKey&, const BlockKey&) = default;

  // For std::unordered_map<BlockKey, V, BlockKey::Hash>. Keys are SHA-256
  // outputs, so their first 8 bytes are already uniformly distributed.
  struct Hash {
    std::size_t operator()(const BlockKey& key) const noexcept;
  };

 private:
  Bytes bytes_{};
};

// The parent of the first block of every chain: 32 zero bytes.
inline constexpr BlockKey kRootParentKey{};

// The extra keys of one block.
using ExtraKeys = std::vector<std::string>;

// Computes keys for one (namespace, fingerprint) pair, with the fingerprint
// digest computed once. Cheap to copy.
class BlockKeyer {
 public:
  // InvalidArgument if ns or fingerprint does not validate; Internal if
  // libcrypto fails.
  static StatusOr<BlockKeyer> Create(Namespace ns, const ModelFingerprint& fingerprint);

  // The key of one full block whose predecessor has key `parent`
  // (kRootParentKey for the first block).
  // InvalidArgument if tokens.size() != tokens_per_block (the message names both),
  // or if an extra key is longer than kMaxExtraKeyBytes, or there are more than
  // kMaxExtraKeysPerBlock of them.
  StatusOr<BlockKey> KeyBlock(const BlockKey& parent, std::span<const std::uint32_t> tokens,
                              std::span<const std::string> extra_keys = {}) const;

  // Keys the floor(tokens.size() / tokens_per_block) full blocks of `tokens`,
  // chained from `parent`; a partial tail is ignored. extra_per_block is either
  // empty (no extra keys on any block) or holds one entry per full block, in
  // order, optionally plus one for the partial tail (which is ignored). Any other
  // size is InvalidArgument, as is a bad extra key (see KeyBlock).
  StatusOr<std::vector<BlockKey>> KeyBlocks(const BlockKey& parent,
                                            std::span<const std::uint32_t> tokens,
                                            std::span<const ExtraKeys> extra_per_block = {}) const;

  const Namespace& ns() const { return ns_; }
  const FingerprintDigest& fingerprint_digest() const { return fingerprint_digest_; }
  std::uint32_t tokens_per_block() const { return tokens_per_block_; }

 private:
  BlockKeyer(Namespace ns, const FingerprintDigest& digest, std::uint32_t tokens_per_block)
      : ns_(std::move(ns)), fingerprint_digest_(digest), tokens_per_block_(tokens_per_block) {}

  Namespace ns_;
  FingerprintDigest fingerprint_digest_;
  std::uint32_t tokens_per_block_;
};

// One-shot forms of BlockKeyer::KeyBlock and BlockKeyer::KeyBlocks (the latter
// chained from kRootParentKey). Prefer a BlockKeyer when keying repeatedly: these
// recompute the fingerprint digest on every call.
StatusOr<BlockKey> ComputeBlockKey(const Namespace& ns, const ModelFingerprint& fingerprint,
                                   const BlockKey& parent, std::span<const std::uint32_t> tokens,
                                   std::span<const std::string> extra_keys = {});
StatusOr<std::vector<BlockKey>> ComputeBlockKeys(const Namespace& ns,
                                                 const ModelFingerprint& fingerprint,
                                                 std::span<const std::uint32_t> tokens,
                                                 std::span<const ExtraKeys> extra_per_block = {});

}  // namespace kvfabric

template <>
struct std::hash<kvfabric::BlockKey> {
  std::size_t operator()(const kvfabric::BlockKey& key) const noexcept {
    return kvfabric::BlockKey::Hash()(key);
  }
};

#endif  // KVFABRIC_CORE_BLOCK_KEY_H_
