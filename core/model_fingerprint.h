// ModelFingerprint: everything about a model and its sharding that changes the
// bytes of a KV-cache block, condensed into a 32-byte digest.
//
// Two engines may share a cached block only if they agree on every field here:
// the model, which layers the block holds, the element type, the per-rank head
// geometry, the block length in tokens, the tensor-parallel rank and size, and the
// block layout version. The digest is SHA-256 over a tagged, length-prefixed
// encoding of these fields, specified byte by byte (with golden vectors) in
// docs/block-key.md; every BlockKey commits to it, so blocks of different
// fingerprints never share a key.
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

struct ModelFingerprint {
  // Identifies the weights, e.g. "meta-llama/Llama-3.1-8B-Instruct" (a revision
  // or checksum may be appended by the operator). Non-empty, at most
  // kMaxModelIdBytes bytes; compared and hashed as bytes (no normalisation).
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

  // OK, or InvalidArgument naming the first bad field and its value.
  Status Validate() const;

  // SHA-256 over the encoding in docs/block-key.md ("Fingerprint digest").
  // InvalidArgument if !Validate().ok(); Internal if libcrypto fails.
  StatusOr<FingerprintDigest> Digest() const;

  // Bytes of one block, all layers of the group, keys and values:
  //   layer_count * 2 * tokens_per_block * kv_heads * head_dim * KvDtypeSize(dtype).
  // InvalidArgument if !Validate().ok() or the product overflows 64 bits.
  StatusOr<std::uint64_t> BlockBytes() const;

  // One line for logs and error messages, e.g.
  // "model=meta-llama/Llama-3.1-8B-Instruct layers=[0,32) dtype=bf16 kv_heads=8 ...".
  std::string ToString() const;

  friend bool operator==(const ModelFingerprint&, const ModelFingerprint&) = default;
};

// Lower-case hex, 64 characters.
std::string FingerprintDigestToHex(const FingerprintDigest& digest);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_MODEL_FINGERPRINT_H_
