#include "core/model_fingerprint.h"

#include <string>

#include "core/sha256.h"

namespace kvfabric {
namespace {

// Domain-separation tag of the fingerprint encoding (docs/block-key.md). A new
// encoding gets a new tag; this one is never changed.
constexpr std::string_view kFingerprintTag = "kvfabric/model-fingerprint/v1";

void AppendU32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// u32 little-endian length, then the bytes. REQUIRES: bytes.size() < 2^32.
void AppendLengthPrefixed(std::string& out, std::string_view bytes) {
  AppendU32(out, static_cast<std::uint32_t>(bytes.size()));
  out.append(bytes);
}

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("invalid ModelFingerprint: " + what);
}

}  // namespace

std::uint32_t KvDtypeSize(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
    case KvDtype::kBf16:
      return 2;
    case KvDtype::kFp32:
      return 4;
    case KvDtype::kFp8E4M3:
    case KvDtype::kInt8:
      return 1;
  }
  return 0;
}

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp16:
      return "fp16";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kFp32:
      return "fp32";
    case KvDtype::kFp8E4M3:
      return "fp8_e4m3";
    case KvDtype::kInt8:
      return "int8";
  }
  return "unknown";
}

StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  for (KvDtype d :
       {KvDtype::kFp16, KvDtype::kBf16, KvDtype::kFp32, KvDtype::kFp8E4M3, KvDtype::kInt8}) {
    if (name == KvDtypeName(d)) return d;
  }
  return Status::InvalidArgument("unknown KV dtype \"" + std::string(name) +
                                 "\" (accepted: fp16, bf16, fp32, fp8_e4m3, int8)");
}

Status ModelFingerprint::Validate() const {
  if (model_id.empty()) return Invalid("model_id is empty");
  if (model_id.size() > kMaxModelIdBytes) {
    return Invalid("model_id is " + std::to_string(model_id.size()) + " bytes, the limit is " +
                   std::to_string(kMaxModelIdBytes));
  }
  if (layer_count == 0) return Invalid("layer_count must be > 0, got 0");
  if (std::uint64_t{first_layer} + layer_count > std::uint64_t{0xffffffff} + 1) {
    return Invalid("layer group [" + std::to_string(first_layer) + ", +" +
                   std::to_string(layer_count) + ") runs past layer 2^32");
  }
  if (KvDtypeSize(dtype) == 0) {
    return Invalid("dtype " + std::to_string(static_cast<std::uint32_t>(dtype)) +
                   " is not a known KvDtype (1..5)");
  }
  if (kv_heads == 0) return Invalid("kv_heads must be > 0, got 0");
  if (head_dim == 0) return Invalid("head_dim must be > 0, got 0");
  if (tokens_per_block == 0 || tokens_per_block > kMaxTokensPerBlock ||
      kMaxTokensPerBlock % tokens_per_block != 0) {
    return Invalid("tokens_per_block must divide 256 (1, 2, 4, ..., 256), got " +
                   std::to_string(tokens_per_block));
  }
  if (tp_rank >= tp_size) {
    return Invalid("tp_rank must be < tp_size, got tp_rank=" + std::to_string(tp_rank) +
                   " tp_size=" + std::to_string(tp_size));
  }
  if (layout_version == 0) return Invalid("layout_version must be >= 1, got 0");
  return Status::OK();
}

StatusOr<FingerprintDigest> ModelFingerprint::Digest() const {
  KVF_RETURN_IF_ERROR(Validate());
  // The encoding of docs/block-key.md, "Fingerprint digest": 73 + len(model_id) bytes.
  std::string msg;
  msg.reserve(4 + kFingerprintTag.size() + 4 + model_id.size() + 9 * sizeof(std::uint32_t));
  AppendLengthPrefixed(msg, kFingerprintTag);
  AppendLengthPrefixed(msg, model_id);
  AppendU32(msg, first_layer);
  AppendU32(msg, layer_count);
  AppendU32(msg, static_cast<std::uint32_t>(dtype));
  AppendU32(msg, kv_heads);
  AppendU32(msg, head_dim);
  AppendU32(msg, tokens_per_block);
  AppendU32(msg, tp_rank);
  AppendU32(msg, tp_size);
  AppendU32(msg, layout_version);

  StatusOr<Sha256Digest> digest = Sha256Of(msg);
  if (!digest.ok()) return digest.status().WithContext("digest of a model fingerprint");
  return *digest;
}

StatusOr<std::uint64_t> ModelFingerprint::BlockBytes() const {
  KVF_RETURN_IF_ERROR(Validate());
  const std::uint64_t factors[] = {layer_count, 2,        tokens_per_block,
                                   kv_heads,    head_dim, KvDtypeSize(dtype)};
  std::uint64_t bytes = 1;
  for (std::uint64_t f : factors) {
    if (__builtin_mul_overflow(bytes, f, &bytes)) {
      return Invalid("block size overflows 64 bits: layer_count=" + std::to_string(layer_count) +
                     " x 2 x tokens_per_block=" + std::to_string(tokens_per_block) +
                     " x kv_heads=" + std::to_string(kv_heads) +
                     " x head_dim=" + std::to_string(head_dim) + " x " +
                     std::to_string(KvDtypeSize(dtype)) + " bytes");
    }
  }
  return bytes;
}

std::string ModelFingerprint::ToString() const {
  return "model=" + model_id + " layers=[" + std::to_string(first_layer) + "," +
         std::to_string(std::uint64_t{first_layer} + layer_count) +
         ") dtype=" + std::string(KvDtypeName(dtype)) + " kv_heads=" + std::to_string(kv_heads) +
         " head_dim=" + std::to_string(head_dim) +
         " tokens_per_block=" + std::to_string(tokens_per_block) +
         " tp=" + std::to_string(tp_rank) + "/" + std::to_string(tp_size) +
         " layout_version=" + std::to_string(layout_version);
}

std::string FingerprintDigestToHex(const FingerprintDigest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (std::uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
  return out;
}

}  // namespace kvfabric
