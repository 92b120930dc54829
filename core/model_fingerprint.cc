#include "core/model_fingerprint.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <system_error>

#include "core/sha256.h"

namespace kvfabric {
namespace {

// Domain-separation tags of the fingerprint encodings (docs/block-key.md). A
// new encoding gets a new tag; these are never changed.
constexpr std::string_view kFingerprintTagV1 = "kvfabric/model-fingerprint/v1";
constexpr std::string_view kFingerprintTagV2 = "kvfabric/model-fingerprint/v2";

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

Status CheckLength(std::string_view field, std::string_view value, std::size_t limit) {
  if (value.size() <= limit) return Status::OK();
  return Invalid(std::string(field) + " is " + std::to_string(value.size()) +
                 " bytes, the limit is " + std::to_string(limit));
}

bool IsZero(const FingerprintDigest& d) {
  for (std::uint8_t b : d) {
    if (b != 0) return false;
  }
  return true;
}

// The v2-only fields against key_version 1: each must hold its default.
Status CheckExpressibleInV1(const ModelFingerprint& fp) {
  const char* field = nullptr;
  std::string value;
  if (!fp.weights_revision.empty()) {
    field = "weights_revision";
    value = "\"" + fp.weights_revision + "\"";
  } else if (!fp.quantization.empty()) {
    field = "quantization";
    value = "\"" + fp.quantization + "\"";
  } else if (!fp.kv_scale_scheme.empty()) {
    field = "kv_scale_scheme";
    value = "\"" + fp.kv_scale_scheme + "\"";
  } else if (!IsZero(fp.kv_scales_digest)) {
    field = "kv_scales_digest";
    value = FingerprintDigestToHex(fp.kv_scales_digest);
  } else if (!fp.rope.empty()) {
    field = "rope";
    value = "\"" + fp.rope + "\"";
  } else if (fp.v_head_dim != 0 && fp.v_head_dim != fp.head_dim) {
    field = "v_head_dim";
    value = std::to_string(fp.v_head_dim) + " (head_dim " + std::to_string(fp.head_dim) + ")";
  } else if (fp.vocab_size != 0) {
    field = "vocab_size";
    value = std::to_string(fp.vocab_size);
  } else {
    return Status::OK();
  }
  return Invalid(std::string(field) + " " + value +
                 " cannot be expressed in block-key v1; set key_version 2 (or clear " + field +
                 " to compute the keys of blocks written under v1)");
}

bool IsRopeKeyChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }
bool IsRopeNameChar(char c) { return IsRopeKeyChar(c) || c == '.' || c == '-'; }

// One comma-separated list of numbers, each in canonical form.
Status CheckRopeNumbers(std::string_view key, std::string_view list) {
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = list.find(',', pos);
    const std::string_view text =
        list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    double v = 0;
    const auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        !std::isfinite(v)) {
      return Invalid("rope: " + std::string(key) + "=" + std::string(list) + ": \"" +
                     std::string(text) + "\" is not a finite decimal number");
    }
    StatusOr<std::string> canonical = CanonicalRopeNumber(v);
    if (!canonical.ok()) return canonical.status();
    if (*canonical != text) {
      return Invalid("rope: " + std::string(key) + "=" + std::string(list) + ": write " +
                     std::string(text) + " as " + *canonical +
                     " (numbers are the shortest round-trip decimal, without exponent)");
    }
    if (comma == std::string_view::npos) return Status::OK();
    pos = comma + 1;
  }
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
  if (key_version != kBlockKeyVersion1 && key_version != kBlockKeyVersion2) {
    return Invalid(
        "key_version must be 1 or 2 (the block-key encodings this build computes), got " +
        std::to_string(key_version));
  }
  if (key_version == kBlockKeyVersion1) return CheckExpressibleInV1(*this);
  KVF_RETURN_IF_ERROR(CheckLength("weights_revision", weights_revision, kMaxWeightsRevisionBytes));
  KVF_RETURN_IF_ERROR(CheckLength("quantization", quantization, kMaxQuantizationBytes));
  KVF_RETURN_IF_ERROR(CheckLength("kv_scale_scheme", kv_scale_scheme, kMaxKvScaleSchemeBytes));
  if (kv_scale_scheme.empty() != IsZero(kv_scales_digest)) {
    return kv_scale_scheme.empty()
               ? Invalid("kv_scales_digest " + FingerprintDigestToHex(kv_scales_digest) +
                         " is set but kv_scale_scheme is empty: name the scheme the scales "
                         "belong to, or clear the digest (unscaled)")
               : Invalid("kv_scale_scheme \"" + kv_scale_scheme +
                         "\" needs kv_scales_digest, the SHA-256 of its scales "
                         "(KvScalesDigest); it is all zero");
  }
  return ValidateRope(rope);
}

Status ModelFingerprint::RequireEqualKvHalves() const {
  if (EffectiveVHeadDim() == head_dim) return Status::OK();
  return Status::Unimplemented(
      "v_head_dim " + std::to_string(v_head_dim) + " != head_dim " + std::to_string(head_dim) +
      ": blocks whose value heads differ from their key heads are keyed, but kvfabric's block "
      "format, attention and cache host hold equal K and V halves only; set v_head_dim 0 "
      "(the same as head_dim)");
}

StatusOr<FingerprintDigest> ModelFingerprint::Digest() const {
  KVF_RETURN_IF_ERROR(Validate());
  // The encodings of docs/block-key.md: "Fingerprint digest" (v1, 73 + len(model_id)
  // bytes) and "Fingerprint message v2" (the v1 fields under their own tag, then
  // the v2 fields).
  const bool v2 = key_version == kBlockKeyVersion2;
  std::string msg;
  msg.reserve(4 + kFingerprintTagV2.size() + 4 + model_id.size() + 9 * sizeof(std::uint32_t) +
              (v2 ? 4 * 5 + weights_revision.size() + quantization.size() + kv_scale_scheme.size() +
                        kv_scales_digest.size() + rope.size()
                  : 0));
  AppendLengthPrefixed(msg, v2 ? kFingerprintTagV2 : kFingerprintTagV1);
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
  if (v2) {
    AppendLengthPrefixed(msg, weights_revision);
    AppendLengthPrefixed(msg, quantization);
    AppendLengthPrefixed(msg, kv_scale_scheme);
    msg.append(reinterpret_cast<const char*>(kv_scales_digest.data()), kv_scales_digest.size());
    AppendLengthPrefixed(msg, rope);
    AppendU32(msg, EffectiveVHeadDim());
    AppendU32(msg, vocab_size);
  }

  StatusOr<Sha256Digest> digest = Sha256Of(msg);
  if (!digest.ok()) return digest.status().WithContext("digest of a model fingerprint");
  return *digest;
}

StatusOr<std::uint64_t> ModelFingerprint::BlockBytes() const {
  KVF_RETURN_IF_ERROR(Validate());
  // K and V of one head together: head_dim + v_head_dim elements (2 * head_dim
  // when they are equal).
  const std::uint64_t kv_dims = std::uint64_t{head_dim} + EffectiveVHeadDim();
  const std::uint64_t factors[] = {layer_count, tokens_per_block, kv_heads, kv_dims,
                                   KvDtypeSize(dtype)};
  std::uint64_t bytes = 1;
  for (std::uint64_t f : factors) {
    if (__builtin_mul_overflow(bytes, f, &bytes)) {
      return Invalid("block size overflows 64 bits: layer_count=" + std::to_string(layer_count) +
                     " x tokens_per_block=" + std::to_string(tokens_per_block) + " x kv_heads=" +
                     std::to_string(kv_heads) + " x (head_dim=" + std::to_string(head_dim) +
                     " + v_head_dim=" + std::to_string(EffectiveVHeadDim()) + ") x " +
                     std::to_string(KvDtypeSize(dtype)) + " bytes");
    }
  }
  return bytes;
}

std::string ModelFingerprint::ToString() const {
  std::string out =
      "model=" + model_id + " layers=[" + std::to_string(first_layer) + "," +
      std::to_string(std::uint64_t{first_layer} + layer_count) +
      ") dtype=" + std::string(KvDtypeName(dtype)) + " kv_heads=" + std::to_string(kv_heads) +
      " head_dim=" + std::to_string(head_dim) +
      " tokens_per_block=" + std::to_string(tokens_per_block) + " tp=" + std::to_string(tp_rank) +
      "/" + std::to_string(tp_size) + " layout_version=" + std::to_string(layout_version) +
      " key_version=" + std::to_string(key_version);
  // The v2 fields when set, so that two fingerprints that log alike are alike.
  if (!weights_revision.empty()) out += " weights_revision=" + weights_revision;
  if (!quantization.empty()) out += " quantization=" + quantization;
  if (!kv_scale_scheme.empty()) {
    out += " kv_scales=" + kv_scale_scheme + ":" + FingerprintDigestToHex(kv_scales_digest);
  }
  if (!rope.empty()) out += " rope=" + rope;
  if (v_head_dim != 0) out += " v_head_dim=" + std::to_string(v_head_dim);
  if (vocab_size != 0) out += " vocab_size=" + std::to_string(vocab_size);
  return out;
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

StatusOr<FingerprintDigest> KvScalesDigest(std::span<const float> k_scales,
                                           std::span<const float> v_scales,
                                           std::uint32_t layer_count) {
  if (layer_count == 0 || k_scales.empty() || k_scales.size() != v_scales.size() ||
      k_scales.size() % layer_count != 0) {
    return Status::InvalidArgument(
        "kv scales: " + std::to_string(k_scales.size()) + " k and " +
        std::to_string(v_scales.size()) + " v scales for " + std::to_string(layer_count) +
        " layers; both must hold the same positive multiple of layer_count (1 per tensor, "
        "kv_heads per head, per layer)");
  }
  const std::size_t per_layer = k_scales.size() / layer_count;
  std::string msg;
  msg.reserve(8 * k_scales.size());
  for (std::uint32_t l = 0; l < layer_count; ++l) {
    for (std::span<const float> scales : {k_scales, v_scales}) {
      for (std::size_t i = l * per_layer; i < (l + 1) * per_layer; ++i) {
        const float v = scales[i];
        if (!std::isfinite(v) || v <= 0) {
          return Status::InvalidArgument(
              std::string("kv scales: ") + (scales.data() == k_scales.data() ? "k" : "v") +
              " scale " + std::to_string(i) + " (layer " + std::to_string(l) + ") is " +
              std::to_string(v) + "; scales are finite and > 0");
        }
        std::uint32_t bits;
        std::memcpy(&bits, &v, sizeof(bits));
        AppendU32(msg, bits);
      }
    }
  }
  StatusOr<Sha256Digest> digest = Sha256Of(msg);
  if (!digest.ok()) return digest.status().WithContext("digest of KV cache scales");
  return *digest;
}

StatusOr<std::string> CanonicalRopeNumber(double value) {
  if (!std::isfinite(value)) {
    return Status::InvalidArgument("a RoPE number must be finite, got " + std::to_string(value));
  }
  if (value == 0) return std::string("0");  // either zero
  // Fixed notation with no precision: the shortest digits that read back as
  // `value` (C++17 [charconv]), with no exponent. 1e308 needs 309 characters.
  char buf[400];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  if (ec != std::errc()) return Status::Internal("to_chars failed on a finite double");
  return std::string(buf, end);
}

Status ValidateRope(std::string_view rope) {
  if (rope.empty()) return Status::OK();
  KVF_RETURN_IF_ERROR(CheckLength("rope", rope, kMaxRopeBytes));
  std::string_view previous_key;
  std::size_t pos = 0;
  while (true) {
    const std::size_t semi = rope.find(';', pos);
    const std::string_view pair =
        rope.substr(pos, semi == std::string_view::npos ? std::string_view::npos : semi - pos);
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      return Invalid("rope: \"" + std::string(pair) +
                     "\" is not key=value (pairs are joined by ';', with no trailing ';')");
    }
    const std::string_view key = pair.substr(0, eq);
    const std::string_view value = pair.substr(eq + 1);
    if (key.empty() ||
        key.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string_view::npos) {
      return Invalid("rope: key \"" + std::string(key) + "\" must be 1 or more of a-z 0-9 _");
    }
    if (!previous_key.empty() && key <= previous_key) {
      return Invalid("rope: key " + std::string(key) + " follows " + std::string(previous_key) +
                     "; keys appear once each, in ascending byte order");
    }
    previous_key = key;
    if (value.empty()) return Invalid("rope: " + std::string(key) + " has an empty value");
    if (value[0] == '-' || (value[0] >= '0' && value[0] <= '9')) {
      KVF_RETURN_IF_ERROR(CheckRopeNumbers(key, value));
    } else {
      bool name = value[0] >= 'a' && value[0] <= 'z';
      for (char c : value) name = name && IsRopeNameChar(c);
      if (!name) {
        return Invalid("rope: " + std::string(key) + "=" + std::string(value) +
                       ": a value is a number list (1.5,2) or a name of a-z 0-9 _ . - starting "
                       "with a letter");
      }
    }
    if (semi == std::string_view::npos) return Status::OK();
    pos = semi + 1;
  }
}

}  // namespace kvfabric
