// ModelFingerprint: everything about a model and its sharding that changes the
// bytes of a KV-cache block, condensed into a 32-byte digest.
//
// Two engines may share a cached block only if they agree on every field here:
// the model and its weights (revision, quantisation), which layers the block
// holds, the element type and its scaling, the per-rank head geometry (key and
// value head dimensions), the positional encoding (RoPE), the block length in
// tokens, the tensor-parallel rank and size, and the block layout version. The
// digest is SHA-256 over a tagged, length-prefixed encoding of these fields,
// specified byte by byte (with golden vectors) in docs/block-key.md; every
// BlockKey commits to it, so blocks of different fingerprints never share a key.
//
// Two encodings exist. Version 2 (the default, key_version = 2) hashes every
// field. Version 1 hashes only the fields that existed before version 2 and
// stays computable for blocks written before; a fingerprint with key_version 1
// must leave every v2-only field at its default (Validate() says which is not).
//
// ModelFingerprint is a plain value. Construct it field by field, then call
// Validate() (Digest() and BlockBytes() validate too and fail on a bad value).
//
// Thread safety: a value; const methods may be called concurrently.
#ifndef KVFABRIC_CORE_MODEL_FINGERPRINT_H_
#define KVFABRIC_CORE_MODEL_FINGERPRINT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric {

// Element type of the cached keys and values. The numbers are hashed into every
// fingerprint digest (docs/block-key.md): they are never renumbered, and a new
// type takes the next unused number.
enum class KvDtype : std::uint32_t {
  kFp16 = 1,     // IEEE 754 binary16, 2 bytes
  kBf16 = 2,     // bfloat16, 2 bytes
  kFp32 = 3,     // IEEE 754 binary32, 4 bytes
  kFp8E4M3 = 4,  // OCP FP8 E4M3, 1 byte
  kInt8 = 5,     // signed 8-bit integer, 1 byte
};

// Bytes per element of `dtype`; 0 for a value that names no KvDtype.
std::uint32_t KvDtypeSize(KvDtype dtype);

// "fp16", "bf16", "fp32", "fp8_e4m3", "int8"; "unknown" for any other value.
std::string_view KvDtypeName(KvDtype dtype);

// Inverse of KvDtypeName. InvalidArgument (listing the accepted names) otherwise.
StatusOr<KvDtype> ParseKvDtype(std::string_view name);

inline constexpr std::size_t kFingerprintDigestSize = 32;
using FingerprintDigest = std::array<std::uint8_t, kFingerprintDigestSize>;

// Longest model id accepted, in bytes.
inline constexpr std::size_t kMaxModelIdBytes = 256;
// tokens_per_block must be a power of two no larger than this (it divides 256).
inline constexpr std::uint32_t kMaxTokensPerBlock = 256;

// The block-key encodings this build computes (docs/block-key.md): 1, and 2,
// the default for new fingerprints.
inline constexpr std::uint32_t kBlockKeyVersion1 = 1;
inline constexpr std::uint32_t kBlockKeyVersion2 = 2;
inline constexpr std::uint32_t kLatestBlockKeyVersion = kBlockKeyVersion2;

// Longest values of the v2 text fields, in bytes.
inline constexpr std::size_t kMaxWeightsRevisionBytes = 256;
inline constexpr std::size_t kMaxQuantizationBytes = 64;
inline constexpr std::size_t kMaxKvScaleSchemeBytes = 64;
inline constexpr std::size_t kMaxRopeBytes = 256;

struct ModelFingerprint {
  // Identifies the model, e.g. "meta-llama/Llama-3.1-8B-Instruct" (with
  // key_version 1, the operator appends a revision or checksum here; version 2
  // has weights_revision for it). Non-empty, at most kMaxModelIdBytes bytes;
  // compared and hashed as bytes (no normalisation).
  std::string model_id;
  // The layer group this block holds: layers [first_layer, first_layer + layer_count).
  std::uint32_t first_layer = 0;
  std::uint32_t layer_count = 0;  // > 0
  KvDtype dtype = KvDtype::kBf16;
  // KV heads held by this TP rank (after sharding), and the size of one head.
  std::uint32_t kv_heads = 0;  // > 0
  std::uint32_t head_dim = 0;  // > 0
  // Tokens per block: a power of two in [1, 256]. Default 16.
  std::uint32_t tokens_per_block = 16;
  // Tensor-parallel rank of the engine process that wrote the block, and the TP
  // degree. tp_rank < tp_size.
  std::uint32_t tp_rank = 0;
  std::uint32_t tp_size = 1;
  // Version of the block's byte layout (core's block format). >= 1; bump it when
  // the layout changes so that old blocks stop matching.
  std::uint32_t layout_version = 1;

  // ---- Block-key encoding v2 (docs/block-key.md, section 6) ----
  // Every field below is hashed by encoding 2 only. With key_version 1 each
  // must hold its default (v_head_dim may also equal head_dim), else Validate()
  // refuses naming the field: version 1 cannot tell such fingerprints apart.

  // Which encoding keys this fingerprint: 2 (default) for new blocks, 1 to keep
  // computing the keys of blocks written before version 2 existed.
  std::uint32_t key_version = kLatestBlockKeyVersion;
  // The exact weights: a commit hash or checksum (e.g. a Hugging Face revision
  // "5206a32e0bd3067aef1ce90f5528ade7d866253f"). 0..256 bytes, hashed as bytes;
  // empty: not stated (the model_id alone names the weights).
  std::string weights_revision;
  // The weights' quantisation scheme as the engine names it, e.g. "awq-int4",
  // "gptq-int4-g128", "fp8". 0..64 bytes; empty: unquantised weights.
  std::string quantization;
  // How the cached values are scaled, e.g. "fp8-per-tensor", "fp8-per-head";
  // 0..64 bytes. Empty: unscaled, the stored values are the engine's K and V
  // cast to dtype (a scale of 1.0 everywhere). Any dtype may carry a scheme;
  // fp8_e4m3 and int8 without one are accepted and mean unscaled.
  std::string kv_scale_scheme;
  // SHA-256 of the scale values in the canonical encoding of KvScalesDigest()
  // (below). All zero exactly when kv_scale_scheme is empty: a scheme needs
  // its scales' digest, and a digest needs a scheme.
  FingerprintDigest kv_scales_digest{};
  // The rotary position embedding, in the canonical form of docs/block-key.md
  // (section 6.4), e.g. "factor=8;high_freq_factor=4;low_freq_factor=1;
  // original_max_position_embeddings=8192;scaling=llama3;theta=500000": pairs
  // key=value joined by ';', keys ascending, numbers in shortest round-trip
  // decimal without exponent. 0..256 bytes; empty: not stated. A value not in
  // canonical form is refused (CanonicalRopeNumber says how to write one).
  std::string rope;
  // Elements per value head when it differs from the key head (MLA-style
  // models); 0 (default): the same as head_dim. Hashed as its effective value,
  // so 0 and head_dim give the same key. The block format, attention and the
  // cache host hold equal K and V halves only: RequireEqualKvHalves() says
  // where that matters.
  std::uint32_t v_head_dim = 0;
  // Tokens in the vocabulary; 0 (default): not stated. When set, BlockKeyer
  // refuses a token id >= vocab_size.
  std::uint32_t vocab_size = 0;

  // OK, or InvalidArgument naming the first bad field and its value.
  Status Validate() const;

  // SHA-256 over the fingerprint message of encoding key_version
  // (docs/block-key.md: "Fingerprint digest", and "Fingerprint message v2").
  // InvalidArgument if !Validate().ok(); Internal if libcrypto fails.
  StatusOr<FingerprintDigest> Digest() const;

  // Bytes of one block, all layers of the group, keys and values:
  //   layer_count * tokens_per_block * kv_heads * (head_dim + EffectiveVHeadDim())
  //   * KvDtypeSize(dtype)
  // (with equal heads, layer_count * 2 * tokens_per_block * kv_heads * head_dim
  // * dtype size). InvalidArgument if !Validate().ok() or the product overflows
  // 64 bits.
  StatusOr<std::uint64_t> BlockBytes() const;

  // v_head_dim, or head_dim when v_head_dim is 0.
  std::uint32_t EffectiveVHeadDim() const { return v_head_dim == 0 ? head_dim : v_head_dim; }

  // OK when each layer's K and V halves have the same size (v_head_dim 0 or
  // head_dim). Otherwise Unimplemented naming v_head_dim and head_dim: keys of
  // such a model are computed, but kvfabric's block format, attention kernels
  // and cache host store and read equal halves only, so the client and the
  // daemons refuse it where a block would be stored or attended.
  Status RequireEqualKvHalves() const;

  // One line for logs and error messages, e.g.
  // "model=meta-llama/Llama-3.1-8B-Instruct layers=[0,32) dtype=bf16 kv_heads=8 ...".
  std::string ToString() const;

  friend bool operator==(const ModelFingerprint&, const ModelFingerprint&) = default;
};

// Lower-case hex, 64 characters.
std::string FingerprintDigestToHex(const FingerprintDigest& digest);

// The kv_scales_digest of a scaling scheme (docs/block-key.md, section 6.3):
// SHA-256 over, for each layer of the fingerprint's group in order, that
// layer's k scales then its v scales, each an IEEE 754 binary32 in
// little-endian byte order. k_scales and v_scales hold layer_count * n values,
// layer-major (n = 1 per tensor, n = kv_heads of this TP rank per head, in
// head order). InvalidArgument if the two sizes differ, are 0 or not a
// multiple of layer_count, or a scale is not finite and > 0.
StatusOr<FingerprintDigest> KvScalesDigest(std::span<const float> k_scales,
                                           std::span<const float> v_scales,
                                           std::uint32_t layer_count);

// The canonical spelling of a RoPE number (docs/block-key.md, section 6.4):
// the shortest decimal that reads back as the same IEEE 754 binary64 value,
// written without exponent, without a trailing ".0" or zeros after the point,
// "-" for negatives, 0 for either zero; e.g. 500000, 0.25, 0.00001.
// InvalidArgument for a value that is not finite.
StatusOr<std::string> CanonicalRopeNumber(double value);

// OK if `rope` is empty or in the canonical form; else InvalidArgument naming
// the pair and, for a number, its canonical spelling.
Status ValidateRope(std::string_view rope);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_MODEL_FINGERPRINT_H_
