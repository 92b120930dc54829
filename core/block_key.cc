#include "core/block_key.h"

#include <cstring>
#include <string>
#include <utility>

#include "core/sha256.h"

namespace kvfabric {
namespace {

// Domain-separation tag of the block-key encoding (docs/block-key.md). A new
// encoding gets a new tag; this one is never changed.
constexpr std::string_view kBlockKeyTag = "kvfabric/block-key/v1";

void StoreU32(std::uint8_t* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// Streams one block-key message into a Sha256. A libcrypto failure is
// remembered by the Sha256 and reported by Finish().
class KeyHasher {
 public:
  explicit KeyHasher(Sha256& sha) : sha_(sha) {}

  void Bytes(const void* data, std::size_t size) { sha_.Update(data, size); }
  void U32(std::uint32_t v) {
    std::uint8_t le[4];
    StoreU32(le, v);
    Bytes(le, sizeof(le));
  }
  // REQUIRES: s.size() < 2^32 (callers bound it far lower).
  void LengthPrefixed(std::string_view s) {
    U32(static_cast<std::uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }

  // The key; the Sha256 is then ready for the next block.
  StatusOr<BlockKey> Finish() {
    KVF_ASSIGN_OR_RETURN(Sha256Digest digest, sha_.Finish());
    return BlockKey(digest);
  }

 private:
  Sha256& sha_;
};

Status ValidateExtraKeys(std::span<const std::string> extra_keys) {
  if (extra_keys.size() > kMaxExtraKeysPerBlock) {
    return Status::InvalidArgument("block has " + std::to_string(extra_keys.size()) +
                                   " extra keys, the limit is " +
                                   std::to_string(kMaxExtraKeysPerBlock));
  }
  for (std::size_t i = 0; i < extra_keys.size(); ++i) {
    if (extra_keys[i].size() > kMaxExtraKeyBytes) {
      return Status::InvalidArgument("extra key " + std::to_string(i) + " is " +
                                     std::to_string(extra_keys[i].size()) +
                                     " bytes, the limit is " + std::to_string(kMaxExtraKeyBytes));
    }
  }
  return Status::OK();
}

// The block-key message of docs/block-key.md, hashed.
// REQUIRES: tokens.size() <= kMaxTokensPerBlock; extra_keys validated.
StatusOr<BlockKey> HashBlock(Sha256& sha, const Namespace& ns,
                             const FingerprintDigest& fingerprint_digest, const BlockKey& parent,
                             std::span<const std::uint32_t> tokens,
                             std::span<const std::string> extra_keys) {
  KeyHasher h(sha);
  h.LengthPrefixed(kBlockKeyTag);
  h.LengthPrefixed(ns.tenant);
  h.Bytes(fingerprint_digest.data(), fingerprint_digest.size());
  h.Bytes(parent.bytes().data(), parent.bytes().size());
  h.U32(static_cast<std::uint32_t>(tokens.size()));
  std::uint8_t token_bytes[4 * kMaxTokensPerBlock];
  for (std::size_t i = 0; i < tokens.size(); ++i) StoreU32(token_bytes + 4 * i, tokens[i]);
  h.Bytes(token_bytes, 4 * tokens.size());
  h.U32(static_cast<std::uint32_t>(extra_keys.size()));
  for (const std::string& e : extra_keys) h.LengthPrefixed(e);
  return h.Finish();
}

}  // namespace

Status Namespace::Validate() const {
  if (tenant.size() > kMaxNamespaceBytes) {
    return Status::InvalidArgument("namespace (tenant) is " + std::to_string(tenant.size()) +
                                   " bytes, the limit is " + std::to_string(kMaxNamespaceBytes));
  }
  return Status::OK();
}

std::string BlockKey::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * kSize);
  for (std::uint8_t b : bytes_) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

StatusOr<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kSize) {
    return Status::InvalidArgument("a BlockKey is 64 hex characters, got " +
                                   std::to_string(hex.size()));
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes bytes;
  for (std::size_t i = 0; i < kSize; ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      std::size_t at = hi < 0 ? 2 * i : 2 * i + 1;
      return Status::InvalidArgument("BlockKey hex has a non-hex character at offset " +
                                     std::to_string(at));
    }
    bytes[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return BlockKey(bytes);
}

std::size_t BlockKey::Hash::operator()(const BlockKey& key) const noexcept {
  std::size_t h;
  std::memcpy(&h, key.bytes_.data(), sizeof(h));
  return h;
}

StatusOr<BlockKeyer> BlockKeyer::Create(Namespace ns, const ModelFingerprint& fingerprint) {
  KVF_RETURN_IF_ERROR(ns.Validate());
  KVF_ASSIGN_OR_RETURN(FingerprintDigest digest, fingerprint.Digest());
  return BlockKeyer(std::move(ns), digest, fingerprint.tokens_per_block);
}

StatusOr<BlockKey> BlockKeyer::KeyBlock(const BlockKey& parent,
                                        std::span<const std::uint32_t> tokens,
                                        std::span<const std::string> extra_keys) const {
  if (tokens.size() != tokens_per_block_) {
    return Status::InvalidArgument(
        "a block key needs exactly tokens_per_block=" + std::to_string(tokens_per_block_) +
        " tokens, got " + std::to_string(tokens.size()));
  }
  KVF_RETURN_IF_ERROR(ValidateExtraKeys(extra_keys));
  KVF_ASSIGN_OR_RETURN(Sha256 sha, Sha256::Create());
  return HashBlock(sha, ns_, fingerprint_digest_, parent, tokens, extra_keys);
}

StatusOr<std::vector<BlockKey>> BlockKeyer::KeyBlocks(
    const BlockKey& parent, std::span<const std::uint32_t> tokens,
    std::span<const ExtraKeys> extra_per_block) const {
  const std::size_t full_blocks = tokens.size() / tokens_per_block_;
  const std::size_t all_blocks = (tokens.size() + tokens_per_block_ - 1) / tokens_per_block_;
  if (!extra_per_block.empty() &&
      (extra_per_block.size() < full_blocks || extra_per_block.size() > all_blocks)) {
    return Status::InvalidArgument(
        "extra_per_block has " + std::to_string(extra_per_block.size()) + " entries for " +
        std::to_string(tokens.size()) + " tokens (" + std::to_string(full_blocks) +
        " full blocks of " + std::to_string(tokens_per_block_) +
        "); pass none, one per full block, or one per block including the partial tail");
  }
  for (std::size_t i = 0; i < full_blocks && !extra_per_block.empty(); ++i) {
    Status s = ValidateExtraKeys(extra_per_block[i]);
    if (!s.ok()) return s.WithContext("block " + std::to_string(i));
  }

  std::vector<BlockKey> keys;
  keys.reserve(full_blocks);
  if (full_blocks == 0) return keys;
  KVF_ASSIGN_OR_RETURN(Sha256 sha, Sha256::Create());
  BlockKey prev = parent;
  for (std::size_t i = 0; i < full_blocks; ++i) {
    std::span<const std::string> extra;
    if (!extra_per_block.empty()) extra = extra_per_block[i];
    KVF_ASSIGN_OR_RETURN(
        prev, HashBlock(sha, ns_, fingerprint_digest_, prev,
                        tokens.subspan(i * tokens_per_block_, tokens_per_block_), extra));
    keys.push_back(prev);
  }
  return keys;
}

StatusOr<BlockKey> ComputeBlockKey(const Namespace& ns, const ModelFingerprint& fingerprint,
                                   const BlockKey& parent, std::span<const std::uint32_t> tokens,
                                   std::span<const std::string> extra_keys) {
  KVF_ASSIGN_OR_RETURN(BlockKeyer keyer, BlockKeyer::Create(ns, fingerprint));
  return keyer.KeyBlock(parent, tokens, extra_keys);
}

StatusOr<std::vector<BlockKey>> ComputeBlockKeys(const Namespace& ns,
                                                 const ModelFingerprint& fingerprint,
                                                 std::span<const std::uint32_t> tokens,
                                                 std::span<const ExtraKeys> extra_per_block) {
  KVF_ASSIGN_OR_RETURN(BlockKeyer keyer, BlockKeyer::Create(ns, fingerprint));
  return keyer.KeyBlocks(kRootParentKey, tokens, extra_per_block);
}

}  // namespace kvfabric
