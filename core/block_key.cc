#include "core/block_key.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "core/sha256.h"

namespace kvfabric {
namespace {

// Domain-separation tags of the block-key encodings (docs/block-key.md). A new
// encoding gets a new tag; these are never changed.
constexpr std::string_view kBlockKeyTagV1 = "kvfabric/block-key/v1";
constexpr std::string_view kBlockKeyTagV2 = "kvfabric/block-key/v2";
constexpr std::string_view kCompactKeyTag = "kvfabric/compact-key/v1";

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

// The block-key message of docs/block-key.md, hashed. Versions 1 and 2 differ
// only in their tag (the fingerprint digest under them differs too).
// REQUIRES: tokens.size() <= kMaxTokensPerBlock; extra_keys validated.
StatusOr<BlockKey> HashBlock(Sha256& sha, std::string_view tag, const Namespace& ns,
                             const FingerprintDigest& fingerprint_digest, const BlockKey& parent,
                             std::span<const std::uint32_t> tokens,
                             std::span<const std::string> extra_keys) {
  KeyHasher h(sha);
  h.LengthPrefixed(tag);
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

std::string_view TagOf(std::uint32_t key_version) {
  return key_version == kBlockKeyVersion1 ? kBlockKeyTagV1 : kBlockKeyTagV2;
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
  return BlockKeyer(std::move(ns), digest, fingerprint.tokens_per_block, fingerprint.key_version,
                    fingerprint.vocab_size);
}

Status BlockKeyer::CheckVocabulary(std::span<const std::uint32_t> tokens, std::int64_t block,
                                   std::size_t first_position) const {
  if (vocab_size_ == 0) return Status::OK();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < vocab_size_) continue;
    const std::string where = block < 0 ? "token " + std::to_string(i) + " of the block"
                                        : "block " + std::to_string(block) + ", token " +
                                              std::to_string(first_position + i) + " (" +
                                              std::to_string(i) + " within the block)";
    return Status::InvalidArgument(where + ": token id " + std::to_string(tokens[i]) +
                                   " >= vocab_size " + std::to_string(vocab_size_) +
                                   " of the model fingerprint");
  }
  return Status::OK();
}

StatusOr<BlockKey> BlockKeyer::KeyBlock(const BlockKey& parent,
                                        std::span<const std::uint32_t> tokens,
                                        std::span<const std::string> extra_keys) const {
  if (tokens.size() != tokens_per_block_) {
    return Status::InvalidArgument(
        "a block key needs exactly tokens_per_block=" + std::to_string(tokens_per_block_) +
        " tokens, got " + std::to_string(tokens.size()));
  }
  KVF_RETURN_IF_ERROR(CheckVocabulary(tokens, -1, 0));
  KVF_RETURN_IF_ERROR(ValidateExtraKeys(extra_keys));
  KVF_ASSIGN_OR_RETURN(Sha256 sha, Sha256::Create());
  return HashBlock(sha, TagOf(key_version_), ns_, fingerprint_digest_, parent, tokens, extra_keys);
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
  for (std::size_t i = 0; i < full_blocks; ++i) {
    KVF_RETURN_IF_ERROR(CheckVocabulary(tokens.subspan(i * tokens_per_block_, tokens_per_block_),
                                        static_cast<std::int64_t>(i), i * tokens_per_block_));
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
        prev, HashBlock(sha, TagOf(key_version_), ns_, fingerprint_digest_, prev,
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

// ---------------------------------------------------------------- extra keys

StatusOr<BlockKey> CompactBlockKey(const BlockKey& exact, std::string_view codec,
                                   std::uint32_t version) {
  if (codec.empty() || codec.size() > 64 || version == 0) {
    return Status::InvalidArgument("compact key: codec id '" + std::string(codec) +
                                   "' (1..64 bytes) version " + std::to_string(version) +
                                   " (>= 1)");
  }
  KVF_ASSIGN_OR_RETURN(Sha256 sha, Sha256::Create());
  KeyHasher h(sha);
  h.LengthPrefixed(kCompactKeyTag);
  h.Bytes(exact.bytes().data(), exact.bytes().size());
  h.LengthPrefixed(codec);
  h.U32(version);
  return h.Finish();
}

StatusOr<std::vector<ExtraKeys>> ExtraKeysPerBlock(const RequestExtras& extras,
                                                   std::uint64_t token_count,
                                                   std::uint32_t tokens_per_block) {
  if (tokens_per_block == 0 || tokens_per_block > kMaxTokensPerBlock ||
      kMaxTokensPerBlock % tokens_per_block != 0) {
    return Status::InvalidArgument("extra keys: tokens_per_block must divide 256, got " +
                                   std::to_string(tokens_per_block));
  }
  for (const auto& [field, value, prefix] :
       {std::tuple{"lora_id", &extras.lora_id, kLoraExtraKeyPrefix},
        std::tuple{"cache_salt", &extras.cache_salt, kSaltExtraKeyPrefix}}) {
    if (value->size() + prefix.size() > kMaxExtraKeyBytes) {
      return Status::InvalidArgument(
          std::string("extra keys: ") + field + " is " + std::to_string(value->size()) +
          " bytes, the limit is " + std::to_string(kMaxExtraKeyBytes - prefix.size()) +
          " (an extra key is at most " + std::to_string(kMaxExtraKeyBytes) + " bytes)");
    }
  }

  // The placeholders by offset, each checked, then checked against the next.
  struct Span {
    std::size_t index;  // in extras.multimodal
    std::uint64_t offset, length;
    std::string key;
  };
  std::vector<Span> spans;
  spans.reserve(extras.multimodal.size());
  for (std::size_t i = 0; i < extras.multimodal.size(); ++i) {
    const MultimodalPlaceholder& m = extras.multimodal[i];
    const std::string field = "extra keys: multimodal[" + std::to_string(i) + "]";
    std::string hex = m.sha256_hex;
    bool is_hex = hex.size() == 2 * kSha256DigestSize;
    for (char& c : hex) {
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
      is_hex = is_hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    }
    if (!is_hex) {
      return Status::InvalidArgument(field + ".sha256_hex: \"" + m.sha256_hex +
                                     "\" is not 64 hex characters (the SHA-256 of the input)");
    }
    if (m.length == 0 || m.offset > token_count || m.length > token_count - m.offset) {
      return Status::InvalidArgument(
          field + ": placeholder at offset " + std::to_string(m.offset) + " of length " +
          std::to_string(m.length) + (m.length == 0 ? " is empty" : " runs past the end") +
          " of the request's " + std::to_string(token_count) + " tokens");
    }
    spans.push_back({i, m.offset, m.length,
                     std::string(kMultimodalExtraKeyPrefix) + hex + ":" + std::to_string(m.offset) +
                         ":" + std::to_string(m.length)});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.offset < b.offset; });
  for (std::size_t j = 1; j < spans.size(); ++j) {
    const Span& a = spans[j - 1];
    const Span& b = spans[j];
    if (b.offset < a.offset + a.length) {
      return Status::InvalidArgument(
          "extra keys: multimodal[" + std::to_string(b.index) + "] (tokens [" +
          std::to_string(b.offset) + ", " + std::to_string(b.offset + b.length) +
          ")) overlaps multimodal[" + std::to_string(a.index) + "] (tokens [" +
          std::to_string(a.offset) + ", " + std::to_string(a.offset + a.length) + "))");
    }
  }

  const std::uint64_t blocks = (token_count + tokens_per_block - 1) / tokens_per_block;
  std::vector<ExtraKeys> out(blocks);
  if (!extras.lora_id.empty()) {
    for (ExtraKeys& keys : out) keys.push_back(std::string(kLoraExtraKeyPrefix) + extras.lora_id);
  }
  for (const Span& span : spans) {  // by offset, so each block's mm keys are in offset order
    const std::uint64_t last = (span.offset + span.length - 1) / tokens_per_block;
    for (std::uint64_t b = span.offset / tokens_per_block; b <= last; ++b) {
      out[b].push_back(span.key);
    }
  }
  if (!extras.cache_salt.empty() && !out.empty()) {
    out[0].push_back(std::string(kSaltExtraKeyPrefix) + extras.cache_salt);
  }
  for (std::size_t b = 0; b < out.size(); ++b) {
    if (out[b].size() > kMaxExtraKeysPerBlock) {
      return Status::InvalidArgument("extra keys: block " + std::to_string(b) + " would carry " +
                                     std::to_string(out[b].size()) + " extra keys, the limit is " +
                                     std::to_string(kMaxExtraKeysPerBlock));
    }
  }
  return out;
}

BlockKey CompactInt8BlockKey(const BlockKey& exact) {
  return *CompactBlockKey(exact, kCompactInt8Codec, kCompactInt8Version);
}

}  // namespace kvfabric
