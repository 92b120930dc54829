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
// Extra keys are byte strings that must also match for a block to be reused,
// e.g. a LoRA adapter id, a multimodal input hash, or a cache salt. Their order
// matters. The keyer hashes them as given; ExtraKeysPerBlock() writes the
// canonical ones (docs/block-key.md, section 6.5: "lora:", "mm:", "salt:")
// following the rule for which blocks carry them, so that engines agree.
//
// The fingerprint's key_version picks the encoding: 2 (the default) or 1, for
// blocks written before version 2. With version 2 and a stated vocab_size, a
// token id outside the vocabulary is refused.
//
// Thread safety: BlockKey and Namespace are values. A BlockKeyer is immutable
// after Create(); its const methods may be called from any number of threads.
// ExtraKeysPerBlock is a pure function.
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
  // if a token id is >= the fingerprint's vocab_size (when stated; the message
  // names the position and both values), or if an extra key is longer than
  // kMaxExtraKeyBytes, or there are more than kMaxExtraKeysPerBlock of them.
  StatusOr<BlockKey> KeyBlock(const BlockKey& parent, std::span<const std::uint32_t> tokens,
                              std::span<const std::string> extra_keys = {}) const;

  // Keys the floor(tokens.size() / tokens_per_block) full blocks of `tokens`,
  // chained from `parent`; a partial tail is ignored. extra_per_block is either
  // empty (no extra keys on any block) or holds one entry per full block, in
  // order, optionally plus one for the partial tail (which is ignored). Any other
  // size is InvalidArgument, as is a bad extra key or a token id outside the
  // vocabulary in a full block (see KeyBlock; the message names the block index
  // and the token's position in `tokens`).
  StatusOr<std::vector<BlockKey>> KeyBlocks(const BlockKey& parent,
                                            std::span<const std::uint32_t> tokens,
                                            std::span<const ExtraKeys> extra_per_block = {}) const;

  const Namespace& ns() const { return ns_; }
  const FingerprintDigest& fingerprint_digest() const { return fingerprint_digest_; }
  std::uint32_t tokens_per_block() const { return tokens_per_block_; }
  // The fingerprint's key_version (1 or 2) and vocab_size (0: not stated).
  std::uint32_t key_version() const { return key_version_; }
  std::uint32_t vocab_size() const { return vocab_size_; }

 private:
  BlockKeyer(Namespace ns, const FingerprintDigest& digest, std::uint32_t tokens_per_block,
             std::uint32_t key_version, std::uint32_t vocab_size)
      : ns_(std::move(ns)),
        fingerprint_digest_(digest),
        tokens_per_block_(tokens_per_block),
        key_version_(key_version),
        vocab_size_(vocab_size) {}

  // OK unless vocab_size_ is stated and a token id reaches it. `block` and
  // `first_position` (the position of tokens[0] in the caller's sequence) name
  // the offender; block < 0 for a lone block (KeyBlock).
  Status CheckVocabulary(std::span<const std::uint32_t> tokens, std::int64_t block,
                         std::size_t first_position) const;

  Namespace ns_;
  FingerprintDigest fingerprint_digest_;
  std::uint32_t tokens_per_block_;
  std::uint32_t key_version_;
  std::uint32_t vocab_size_;
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

// ---------------------------------------------------------------- extra keys

// The typed prefixes of the canonical extra keys (docs/block-key.md, 6.5).
// Other prefixes are free for engine-specific extra keys.
inline constexpr std::string_view kLoraExtraKeyPrefix = "lora:";
inline constexpr std::string_view kMultimodalExtraKeyPrefix = "mm:";
inline constexpr std::string_view kSaltExtraKeyPrefix = "salt:";

// The key of a block's compact copy (docs/block-key.md, section 8): SHA-256
// over the tag "kvfabric/compact-key/v1", the exact block's key, the codec's
// id and its version (length-prefixed string, u32 LE), so that a compact copy
// and its exact block, or two codecs' copies, never share a key, and a
// compact key cannot be any block-key message (other tag). The exact key
// already commits to the namespace and the fingerprint. InvalidArgument for
// an empty codec id or one longer than 64 bytes, or version 0.
StatusOr<BlockKey> CompactBlockKey(const BlockKey& exact, std::string_view codec,
                                   std::uint32_t version);

// The compact_int8 codec's identity (docs/compact.md; its encoder and kernels
// are gpu/kernels/compact_int8.h), hashed into its copies' keys.
inline constexpr char kCompactInt8Codec[] = "int8-kc-vt";
inline constexpr std::uint32_t kCompactInt8Version = 1;
// CompactBlockKey(exact, kCompactInt8Codec, kCompactInt8Version), which
// cannot fail: the key under which daemons publish a block's compact_int8
// copy and a client fetches it.
BlockKey CompactInt8BlockKey(const BlockKey& exact);

// A multimodal input of a request (an image, an audio clip, ...) and the run of
// placeholder tokens the engine replaces with its embeddings.
struct MultimodalPlaceholder {
  // SHA-256 of the input's content as the engine hashes it, 64 hex characters
  // (either case; the key is written lower-case).
  std::string sha256_hex;
  // Position of the placeholder's first token in the request's tokens, and
  // the number of placeholder tokens (>= 1).
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// What a request's blocks depend on besides their tokens.
struct RequestExtras {
  // The LoRA adapter the request runs with, a stable name of its weights (not
  // an engine-local slot number); empty: none. At most kMaxExtraKeyBytes - 5.
  std::string lora_id;
  // The multimodal inputs, in any order; their placeholders must not overlap.
  std::vector<MultimodalPlaceholder> multimodal;
  // The per-request cache salt (a tenant or privacy boundary inside a
  // namespace); empty: none. At most kMaxExtraKeyBytes - 5 bytes.
  std::string cache_salt;
};

// The canonical extra keys of each block of a request of `token_count` tokens
// keyed in blocks of `tokens_per_block` (docs/block-key.md, 6.5): one list per
// block, ceil(token_count / tokens_per_block) lists including a partial tail
// (BlockKeyer::KeyBlocks accepts that), in this order within a block:
//   "lora:<lora_id>"                 on every block, when lora_id is set;
//   "mm:<hex>:<offset>:<length>"     for each placeholder overlapping the
//                                    block, by ascending offset (decimal
//                                    offset and length, lower-case hex);
//   "salt:<cache_salt>"              on block 0 only; the chain carries it on.
// InvalidArgument naming the entry for: tokens_per_block not a power of two in
// [1, 256], a lora_id or cache_salt too long, a hash that is not 64 hex
// characters, a placeholder of length 0 or one that runs past token_count,
// placeholders that overlap, or a block that would carry more than
// kMaxExtraKeysPerBlock keys.
StatusOr<std::vector<ExtraKeys>> ExtraKeysPerBlock(const RequestExtras& extras,
                                                   std::uint64_t token_count,
                                                   std::uint32_t tokens_per_block);

}  // namespace kvfabric

template <>
struct std::hash<kvfabric::BlockKey> {
  std::size_t operator()(const kvfabric::BlockKey& key) const noexcept {
    return kvfabric::BlockKey::Hash()(key);
  }
};

#endif  // KVFABRIC_CORE_BLOCK_KEY_H_
