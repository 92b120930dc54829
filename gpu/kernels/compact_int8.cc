#include "gpu/kernels/compact_int8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvfabric::gpu {
namespace {

constexpr float kLargestFp16 = 65504.0f;

float Load(KvDtype dtype, const std::byte* p, std::size_t i) {
  switch (dtype) {
    case KvDtype::kFp32: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case KvDtype::kBf16: {
      std::uint16_t b;
      std::memcpy(&b, p + i * 2, 2);
      return Bf16BitsToFloat(b);
    }
    default: {
      std::uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return Fp16BitsToFloat(h);
    }
  }
}

// The fp16-rounded scale of a group whose largest magnitude is `max_abs`, and
// its float value. InvalidArgument when it does not fit fp16.
Status Scale(float max_abs, std::uint16_t* bits, float* value) {
  *bits = FloatToFp16Bits(max_abs / 127.0f);
  *value = Fp16BitsToFloat(*bits);
  if (!std::isfinite(*value) || *value > kLargestFp16) {
    return Status::InvalidArgument("compact_int8: a value of magnitude " + std::to_string(max_abs) +
                                   " has a scale past fp16");
  }
  return Status::OK();
}

std::int8_t Quantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  const float r = std::nearbyint(x / scale);
  return static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f));
}

void PutScale(std::byte* at, std::size_t i, std::uint16_t bits) {
  std::memcpy(at + i * 2, &bits, 2);
}

float GetScale(const std::byte* at, std::size_t i) {
  std::uint16_t bits;
  std::memcpy(&bits, at + i * 2, 2);
  return Fp16BitsToFloat(bits);
}

}  // namespace

std::uint64_t CompactPayloadBytes(std::uint32_t layers, std::uint32_t tokens,
                                  std::uint32_t kv_heads, std::uint32_t head_dim) {
  return std::uint64_t{layers} * 2 * CompactHalfBytes(tokens, kv_heads, head_dim);
}

Status EncodeCompactInt8(const CompactShape& s, std::span<const std::byte> exact,
                         std::span<std::byte> out) {
  if (s.dtype != KvDtype::kFp16 && s.dtype != KvDtype::kBf16 && s.dtype != KvDtype::kFp32) {
    return Status::InvalidArgument("compact_int8 encodes fp16, bf16 or fp32 blocks, not " +
                                   std::string(KvDtypeName(s.dtype)));
  }
  if (s.layers == 0 || s.tokens == 0 || s.kv_heads == 0 || s.head_dim == 0) {
    return Status::InvalidArgument("compact_int8: a zero dimension");
  }
  const std::size_t T = s.tokens, H = s.kv_heads, D = s.head_dim;
  const std::size_t half_elements = T * H * D;
  const std::size_t esize = KvDtypeSize(s.dtype);
  const std::uint64_t half = CompactHalfBytes(s.tokens, s.kv_heads, s.head_dim);
  if (exact.size() != std::uint64_t{s.layers} * 2 * half_elements * esize ||
      out.size() != CompactPayloadBytes(s.layers, s.tokens, s.kv_heads, s.head_dim)) {
    return Status::InvalidArgument("compact_int8: " + std::to_string(exact.size()) +
                                   " exact bytes into " + std::to_string(out.size()) +
                                   " compact bytes do not fit the shape");
  }
  std::memset(out.data(), 0, out.size());
  for (std::size_t l = 0; l < s.layers; ++l) {
    const std::byte* k = exact.data() + l * 2 * half_elements * esize;
    const std::byte* v = k + half_elements * esize;
    std::byte* kq = out.data() + l * 2 * half;
    std::byte* vq = kq + half;
    std::byte* ks = kq + half_elements;
    std::byte* vs = vq + half_elements;
    // K: one scale per channel (h, d) over the block's tokens.
    for (std::size_t c = 0; c < H * D; ++c) {
      float max_abs = 0;
      for (std::size_t t = 0; t < T; ++t) {
        const float x = Load(s.dtype, k, t * H * D + c);
        if (!std::isfinite(x)) {
          return Status::InvalidArgument("compact_int8: a key that is not finite (layer " +
                                         std::to_string(l) + ")");
        }
        max_abs = std::max(max_abs, std::fabs(x));
      }
      std::uint16_t bits;
      float scale;
      KVF_RETURN_IF_ERROR(Scale(max_abs, &bits, &scale));
      PutScale(ks, c, bits);
      for (std::size_t t = 0; t < T; ++t) {
        kq[t * H * D + c] =
            static_cast<std::byte>(Quantize(Load(s.dtype, k, t * H * D + c), scale));
      }
    }
    // V: one scale per token and head over the head's channels.
    for (std::size_t r = 0; r < T * H; ++r) {
      float max_abs = 0;
      for (std::size_t d = 0; d < D; ++d) {
        const float x = Load(s.dtype, v, r * D + d);
        if (!std::isfinite(x)) {
          return Status::InvalidArgument("compact_int8: a value that is not finite (layer " +
                                         std::to_string(l) + ")");
        }
        max_abs = std::max(max_abs, std::fabs(x));
      }
      std::uint16_t bits;
      float scale;
      KVF_RETURN_IF_ERROR(Scale(max_abs, &bits, &scale));
      PutScale(vs, r, bits);
      for (std::size_t d = 0; d < D; ++d) {
        vq[r * D + d] = static_cast<std::byte>(Quantize(Load(s.dtype, v, r * D + d), scale));
      }
    }
  }
  return Status::OK();
}

Status DecodeCompactInt8(const CompactShape& s, std::span<const std::byte> compact,
                         std::span<float> out) {
  const std::size_t T = s.tokens, H = s.kv_heads, D = s.head_dim;
  const std::size_t half_elements = T * H * D;
  const std::uint64_t half = CompactHalfBytes(s.tokens, s.kv_heads, s.head_dim);
  if (compact.size() != CompactPayloadBytes(s.layers, s.tokens, s.kv_heads, s.head_dim) ||
      out.size() != std::uint64_t{s.layers} * 2 * half_elements) {
    return Status::InvalidArgument("compact_int8: sizes do not fit the shape");
  }
  for (std::size_t l = 0; l < s.layers; ++l) {
    const std::byte* kq = compact.data() + l * 2 * half;
    const std::byte* vq = kq + half;
    const std::byte* ks = kq + half_elements;
    const std::byte* vs = vq + half_elements;
    float* k = out.data() + l * 2 * half_elements;
    float* v = k + half_elements;
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t c = 0; c < H * D; ++c) {
        const std::size_t i = t * H * D + c;
        k[i] = static_cast<float>(static_cast<std::int8_t>(kq[i])) * GetScale(ks, c);
        v[i] = static_cast<float>(static_cast<std::int8_t>(vq[i])) * GetScale(vs, i / D);
      }
    }
  }
  return Status::OK();
}

namespace {

// The two inner loops of the kernel: a key row's dot product with the scaled
// query, and a value row added with its weight. Scalar, and AVX2 + FMA
// (chosen at run time, as cpu_kernels.h's kernel): eight int8 widened to
// float per step. The two paths sum in different orders (compact decode is
// approximate anyway; each path is deterministic).
struct RowOps {
  float (*dot)(const float* qs, const std::int8_t* row, std::size_t n);
  void (*axpy)(float w, const std::int8_t* row, float* o, std::size_t n);
};

float DotScalar(const float* qs, const std::int8_t* row, std::size_t n) {
  float s = 0;
  for (std::size_t d = 0; d < n; ++d) s += qs[d] * static_cast<float>(row[d]);
  return s;
}

void AxpyScalar(float w, const std::int8_t* row, float* o, std::size_t n) {
  for (std::size_t d = 0; d < n; ++d) o[d] += w * static_cast<float>(row[d]);
}

#if defined(__x86_64__)
#define KVF_AVX2 __attribute__((target("avx2,fma")))

KVF_AVX2 __m256 Widen(const std::int8_t* p) {
  std::int64_t eight;
  std::memcpy(&eight, p, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(eight)));
}

KVF_AVX2 float DotAvx2(const float* qs, const std::int8_t* row, std::size_t n) {
  __m256 acc = _mm256_setzero_ps();
  std::size_t d = 0;
  for (; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qs + d), Widen(row + d), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
            ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < n; ++d) s += qs[d] * static_cast<float>(row[d]);
  return s;
}

KVF_AVX2 void AxpyAvx2(float w, const std::int8_t* row, float* o, std::size_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  std::size_t d = 0;
  for (; d + 8 <= n; d += 8) {
    _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, Widen(row + d), _mm256_loadu_ps(o + d)));
  }
  for (; d < n; ++d) o[d] += w * static_cast<float>(row[d]);
}
#endif

RowOps RowOpsFor(cpu_kernels::KernelIsa isa) {
#if defined(__x86_64__)
  if (isa == cpu_kernels::KernelIsa::kAvx2) return {DotAvx2, AxpyAvx2};
#endif
  return {DotScalar, AxpyScalar};
}

// Attention of one query over `blocks` compact slices of `block_tokens`
// tokens each (keys k_halves[b], values v_halves[b]), in order, into one
// state: every score first (their max), then the weighted values.
void AttendBlocks(const RowOps& ops, const AttentionShape& shape, float scale,
                  std::uint32_t block_tokens, std::uint32_t blocks, const float* q,
                  const std::byte* const* k_halves, const std::byte* const* v_halves, float* out,
                  float* lse) {
  const std::size_t H = shape.num_kv_heads, D = shape.head_dim;
  const std::size_t group = shape.num_q_heads / shape.num_kv_heads;
  const std::size_t half_elements = std::size_t{block_tokens} * H * D;
  std::array<float, kMaxHeadDim> qs;
  std::array<float, kMaxCompactTileTokens> scores;
  for (std::size_t h = 0; h < shape.num_q_heads; ++h) {
    const std::size_t g = h / group;
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t b = 0; b < blocks; ++b) {
      // The keys' channel scales (per block) fold into the query.
      const std::byte* ks = k_halves[b] + half_elements;
      for (std::size_t d = 0; d < D; ++d) qs[d] = scale * q[h * D + d] * GetScale(ks, g * D + d);
      const auto* kq = reinterpret_cast<const std::int8_t*>(k_halves[b]);
      for (std::size_t t = 0; t < block_tokens; ++t) {
        float& s = scores[b * block_tokens + t];
        s = ops.dot(qs.data(), kq + (t * H + g) * D, D);
        m = std::max(m, s);
      }
    }
    float* o = out + h * D;
    std::fill(o, o + D, 0.0f);
    float sum = 0;
    for (std::size_t b = 0; b < blocks; ++b) {
      const auto* vq = reinterpret_cast<const std::int8_t*>(v_halves[b]);
      const std::byte* vs = v_halves[b] + half_elements;
      for (std::size_t t = 0; t < block_tokens; ++t) {
        const float p = std::exp(scores[b * block_tokens + t] - m);
        sum += p;
        // The values' token scale folds into the weight.
        ops.axpy(p * GetScale(vs, t * H + g), vq + (t * H + g) * D, o, D);
      }
    }
    for (std::size_t d = 0; d < D; ++d) o[d] /= sum;
    lse[h] = m + std::log(sum);
  }
}

}  // namespace

void DecodeAttentionCompactInt8(const AttentionShape& shape, float scale, std::uint32_t tokens,
                                const float* q, const std::byte* k_half, const std::byte* v_half,
                                float* out, float* lse) {
  static const cpu_kernels::KernelIsa isa = cpu_kernels::BestKernelIsa();
  DecodeAttentionCompactInt8With(isa, shape, scale, tokens, q, k_half, v_half, out, lse);
}

void DecodeAttentionCompactInt8With(cpu_kernels::KernelIsa isa, const AttentionShape& shape,
                                    float scale, std::uint32_t tokens, const float* q,
                                    const std::byte* k_half, const std::byte* v_half, float* out,
                                    float* lse) {
  AttendBlocks(RowOpsFor(isa), shape, scale, tokens, 1, q, &k_half, &v_half, out, lse);
}

void DecodeAttentionCompactInt8Blocks(const AttentionShape& shape, float scale,
                                      std::uint32_t block_tokens, std::uint32_t blocks,
                                      const float* q, const std::byte* const* slices, float* out,
                                      float* lse) {
  static const cpu_kernels::KernelIsa isa = cpu_kernels::BestKernelIsa();
  DecodeAttentionCompactInt8BlocksWith(isa, shape, scale, block_tokens, blocks, q, slices, out,
                                       lse);
}

void DecodeAttentionCompactInt8BlocksWith(cpu_kernels::KernelIsa isa, const AttentionShape& shape,
                                          float scale, std::uint32_t block_tokens,
                                          std::uint32_t blocks, const float* q,
                                          const std::byte* const* slices, float* out, float* lse) {
  const std::uint64_t half = CompactHalfBytes(block_tokens, shape.num_kv_heads, shape.head_dim);
  std::array<const std::byte*, kMaxCompactTileTokens> v_halves;
  for (std::uint32_t b = 0; b < blocks; ++b) v_halves[b] = slices[b] + half;
  AttendBlocks(RowOpsFor(isa), shape, scale, block_tokens, blocks, q, slices, v_halves.data(), out,
               lse);
}

Status DecodeAttentionCompactTileInArena(cpu_kernels::KernelIsa isa,
                                         const CompactAttentionTileArgs& args,
                                         std::span<std::byte> arena) {
  KVF_RETURN_IF_ERROR(ValidateCompactAttentionTile(args, arena.size()));
  const std::uint64_t slice =
      2 * CompactHalfBytes(args.block_tokens, args.shape.num_kv_heads, args.shape.head_dim);
  std::array<const std::byte*, kMaxCompactTileTokens> slices;
  for (std::uint32_t b = 0; b < args.blocks; ++b) {
    slices[b] = arena.data() + args.slices.offset + b * slice;
  }
  DecodeAttentionCompactInt8BlocksWith(
      isa, args.shape, args.scale, args.block_tokens, args.blocks,
      reinterpret_cast<const float*>(arena.data() + args.query.offset), slices.data(),
      reinterpret_cast<float*>(arena.data() + args.output.offset),
      reinterpret_cast<float*>(arena.data() + args.lse.offset));
  return Status::OK();
}

}  // namespace kvfabric::gpu
