#include "gpu/kernels/cpu_kernels.h"

#include <math.h>

#include <algorithm>
#include <cstring>

#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/lse.h"

namespace kvfabric::gpu::cpu_kernels {
namespace {

// Query heads sharing one pass over the tile (they read the same kv head).
// Any value gives the same bits: each head's arithmetic is independent.
constexpr std::uint32_t kHeadsPerPass = 8;

// Converts `n` elements of type `dtype` at `src` to fp32.
template <KvDtype kDtype>
void LoadRow(const std::byte* src, std::uint32_t n, float* dst) {
  if constexpr (kDtype == KvDtype::kFp32) {
    std::memcpy(dst, src, std::size_t{n} * 4);
  } else {
    for (std::uint32_t d = 0; d < n; ++d) {
      std::uint16_t bits;
      std::memcpy(&bits, src + std::size_t{d} * 2, 2);
      dst[d] = kDtype == KvDtype::kFp16 ? Fp16BitsToFloat(bits) : Bf16BitsToFloat(bits);
    }
  }
}

// dot(a, b) in eight partial sums (lane d % 8) combined as a fixed tree: the
// order is written out, so the compiler may vectorise it but cannot change it.
inline float Dot(const float* a, const float* b, std::uint32_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[d + j] * b[d + j];
  }
  for (int j = 0; d < n; ++d, ++j) acc[j] += a[d] * b[d];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <KvDtype kDtype>
void DecodeTile(const AttentionShape& shape, float scale, std::uint32_t tokens, const float* q,
                const std::byte* k, const std::byte* v, float* out, float* lse) {
  const std::uint32_t dim = shape.head_dim;
  const std::uint32_t group = shape.num_q_heads / shape.num_kv_heads;
  const std::size_t elem = KvDtypeSize(kDtype);
  const std::size_t row_bytes = std::size_t{dim} * elem;  // one kv head of one token
  const std::size_t token_bytes = row_bytes * shape.num_kv_heads;
  float k_row[kMaxHeadDim];
  float v_row[kMaxHeadDim];
  float m[kHeadsPerPass];
  float sum[kHeadsPerPass];

  std::uint32_t h1 = 0;
  for (std::uint32_t h0 = 0; h0 < shape.num_q_heads; h0 = h1) {
    // Heads [h0, h1) share a kv head: passes never straddle a group boundary.
    const std::uint32_t g = h0 / group;
    h1 = std::min({h0 + kHeadsPerPass, (g + 1) * group, shape.num_q_heads});
    const std::uint32_t nh = h1 - h0;
    const std::byte* k_g = k + g * row_bytes;
    const std::byte* v_g = v + g * row_bytes;
    for (std::uint32_t j = 0; j < nh; ++j) {
      m[j] = lse::NegativeInfinity();
      sum[j] = 0.0f;
      std::fill_n(out + std::size_t{h0 + j} * dim, dim, 0.0f);
    }
    // Pass 1: the maximum logit of each head.
    for (std::uint32_t t = 0; t < tokens; ++t) {
      LoadRow<kDtype>(k_g + t * token_bytes, dim, k_row);
      for (std::uint32_t j = 0; j < nh; ++j) {
        const float s = scale * Dot(q + std::size_t{h0 + j} * dim, k_row, dim);
        if (s > m[j] || s != s) m[j] = s;
      }
    }
    // Pass 2: max-subtracted exponentials, their sum and the weighted values.
    for (std::uint32_t t = 0; t < tokens; ++t) {
      LoadRow<kDtype>(k_g + t * token_bytes, dim, k_row);
      LoadRow<kDtype>(v_g + t * token_bytes, dim, v_row);
      for (std::uint32_t j = 0; j < nh; ++j) {
        const float s = scale * Dot(q + std::size_t{h0 + j} * dim, k_row, dim);
        const float p = expf(s - m[j]);
        sum[j] += p;
        float* o = out + std::size_t{h0 + j} * dim;
        for (std::uint32_t d = 0; d < dim; ++d) o[d] += p * v_row[d];
      }
    }
    for (std::uint32_t j = 0; j < nh; ++j) {
      float* o = out + std::size_t{h0 + j} * dim;
      if (tokens == 0) {
        lse[h0 + j] = lse::NegativeInfinity();
        continue;
      }
      for (std::uint32_t d = 0; d < dim; ++d) o[d] = o[d] / sum[j];
      lse[h0 + j] = m[j] + logf(sum[j]);
    }
  }
}

template <typename T>
T* At(std::span<std::byte> arena, const DeviceRange& r) {
  return reinterpret_cast<T*>(arena.data() + r.offset);
}

}  // namespace

void DecodeAttentionTile(const AttentionShape& shape, float scale, std::uint32_t tokens,
                         const float* q, const std::byte* k, const std::byte* v, float* out,
                         float* lse) {
  switch (shape.dtype) {
    case KvDtype::kFp16:
      return DecodeTile<KvDtype::kFp16>(shape, scale, tokens, q, k, v, out, lse);
    case KvDtype::kBf16:
      return DecodeTile<KvDtype::kBf16>(shape, scale, tokens, q, k, v, out, lse);
    case KvDtype::kFp32:
      return DecodeTile<KvDtype::kFp32>(shape, scale, tokens, q, k, v, out, lse);
    default:
      return;  // excluded by ValidateAttentionTile
  }
}

void MergeStates(std::uint32_t num_states, std::uint32_t num_heads, std::uint32_t head_dim,
                 const float* outputs, const float* lses, float* out, float* lse) {
  const std::size_t state_stride = std::size_t{num_heads} * head_dim;
  for (std::uint32_t h = 0; h < num_heads; ++h) {
    lse::MergeHead(outputs + std::size_t{h} * head_dim, state_stride, lses + h, num_heads,
                   num_states, head_dim, out + std::size_t{h} * head_dim, lse + h);
  }
}

void GatherPages(std::uint32_t num_pages, std::uint64_t page_bytes,
                 const std::uint64_t* page_offsets, const std::byte* arena,
                 std::byte* destination) {
  for (std::uint32_t i = 0; i < num_pages; ++i) {
    std::memcpy(destination + i * page_bytes, arena + page_offsets[i], page_bytes);
  }
}

Status DecodeAttentionTileInArena(const AttentionTileArgs& args, std::span<std::byte> arena) {
  KVF_RETURN_IF_ERROR(ValidateAttentionTile(args, arena.size()));
  DecodeAttentionTile(args.shape, args.scale, args.tokens, At<const float>(arena, args.query),
                      At<const std::byte>(arena, args.keys),
                      At<const std::byte>(arena, args.values), At<float>(arena, args.output),
                      At<float>(arena, args.lse));
  return Status::OK();
}

Status MergeStatesInArena(const MergeStatesArgs& args, std::span<std::byte> arena) {
  KVF_RETURN_IF_ERROR(ValidateMergeStates(args, arena.size()));
  MergeStates(args.num_states, args.num_heads, args.head_dim, At<const float>(arena, args.outputs),
              At<const float>(arena, args.lses), At<float>(arena, args.output),
              At<float>(arena, args.lse));
  return Status::OK();
}

Status GatherPagesInArena(const GatherPagesArgs& args, std::span<std::byte> arena) {
  KVF_RETURN_IF_ERROR(ValidateGatherPages(args, arena.size()));
  const std::uint64_t* offsets = At<const std::uint64_t>(arena, args.page_offsets);
  for (std::uint32_t i = 0; i < args.num_pages; ++i) {
    KVF_RETURN_IF_ERROR(ValidateGatherSource(args, i, offsets[i], arena.size()));
  }
  GatherPages(args.num_pages, args.page_bytes, offsets, arena.data(),
              At<std::byte>(arena, args.destination));
  return Status::OK();
}

}  // namespace kvfabric::gpu::cpu_kernels
