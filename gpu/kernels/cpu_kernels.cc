#include "gpu/kernels/cpu_kernels.h"

#include <math.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/lse.h"

namespace kvfabric::gpu::cpu_kernels {
namespace {

// Query heads sharing one pass over the tile (whole kv-head groups where
// they fit). Any value gives the same bits: each head's arithmetic is
// independent.
constexpr std::uint32_t kHeadsPerBlock = 64;
// Tokens whose V rows the value accumulation visits for every kv head
// before moving on (32 tokens x 8 heads x 128 x 2 bytes = 64 KiB; 32 was
// fastest of 16, 32 and 64 in attention_bench).
constexpr std::uint32_t kValueTokens = 32;
// Logits buffered per head between the two passes: a tile of up to this many
// tokens computes each dot product once; longer tiles recompute the dots of
// every chunk after the first (the same function, so the same bits).
constexpr std::uint32_t kChunk = 256;

// exp(x), the same bits in every path: Cephes' expf polynomial after
// reduction by ln 2 (split in two), every step one correctly rounded fma or
// mul. About 1 ulp on [-87, 88]; below -87 (e^-87 ~ 1.6e-38, nothing against
// the tile's maximum term of 1) it is 0, above 88 +inf, NaN stays NaN.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;
constexpr float kExpLow = -87.0f;
constexpr float kExpHigh = 88.0f;

float ExpScalar(float x) {
  if (x != x) return x;
  if (x < kExpLow) return 0.0f;
  if (x > kExpHigh) return lse::PositiveInfinity();
  const float fx = nearbyintf(x * kLog2e);
  float r = fmaf(-fx, kLn2Hi, x);
  r = fmaf(-fx, kLn2Lo, r);
  const float z = r * r;
  float y = kExpP0;
  y = fmaf(y, r, kExpP1);
  y = fmaf(y, r, kExpP2);
  y = fmaf(y, r, kExpP3);
  y = fmaf(y, r, kExpP4);
  y = fmaf(y, r, kExpP5);
  y = fmaf(y, z, r);
  y = y + 1.0f;
  const auto e = static_cast<std::uint32_t>(static_cast<std::int32_t>(fx) + 127);
  return y * FloatFromBits(e << 23);
}

// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)): how 8 lanes combine.
inline float Tree8(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// The scalar kernel's pieces. Every vector path below computes the same
// operations in the same order: lane j of a dot product accumulates the
// elements d = j mod 8 in order by fma (the last, partial group of 8 goes to
// lanes 0..r-1), the lanes combine by Tree8; value accumulation is one fma
// per element per token, tokens in order.
struct ScalarOps {
  template <KvDtype kDtype>
  static void LoadRow(const std::byte* src, std::uint32_t n, float* dst) {
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
  // s[j] = scale * dot(q + j * dim, row) for j < nh.
  static void Dots(const float* q, std::uint32_t nh, std::uint32_t dim, const float* row,
                   float scale, float* s) {
    for (std::uint32_t j = 0; j < nh; ++j) {
      const float* a = q + std::size_t{j} * dim;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::uint32_t d = 0;
      for (; d + 8 <= dim; d += 8) {
        for (int l = 0; l < 8; ++l) acc[l] = fmaf(a[d + l], row[d + l], acc[l]);
      }
      for (int l = 0; d < dim; ++d, ++l) acc[l] = fmaf(a[d], row[d], acc[l]);
      s[j] = scale * Tree8(acc);
    }
  }
  // Dots against the row of `kDtype` elements at src (row: scratch).
  template <KvDtype kDtype>
  static void DotsRow(const float* q, std::uint32_t nh, std::uint32_t dim, const std::byte* src,
                      float scale, float* s, float* row) {
    LoadRow<kDtype>(src, dim, row);
    Dots(q, nh, dim, row, scale, s);
  }
  // x[t] = exp(x[t] - m) for t < n.
  static void Exp(float* x, std::uint32_t n, float m) {
    for (std::uint32_t t = 0; t < n; ++t) x[t] = ExpScalar(x[t] - m);
  }
  // For tokens t < n in order: out[j * dim + d] = fma(p[j][t], v_t[d],
  // out[j * dim + d]) for j < nh, where p[j] is logits + j * stride and v_t
  // the row of `dtype` elements at v + t * token_bytes (row: scratch).
  template <KvDtype kDtype>
  static void AxpyChunk(float* out, std::uint32_t nh, std::uint32_t dim, const float* p,
                        std::size_t stride, std::uint32_t n, const std::byte* v,
                        std::size_t token_bytes, float* row) {
    for (std::uint32_t t = 0; t < n; ++t) {
      LoadRow<kDtype>(v + t * token_bytes, dim, row);
      for (std::uint32_t j = 0; j < nh; ++j) {
        float* o = out + std::size_t{j} * dim;
        const float pj = p[j * stride + t];
        for (std::uint32_t d = 0; d < dim; ++d) o[d] = fmaf(pj, row[d], o[d]);
      }
    }
  }
};

#if defined(__x86_64__)
#define KVF_AVX2 __attribute__((target("avx2,fma,f16c")))

// AVX2 + FMA + F16C: 8 lanes are the scalar kernel's 8 partial sums.
struct Avx2Ops {
  template <KvDtype kDtype>
  KVF_AVX2 static void LoadRow(const std::byte* src, std::uint32_t n, float* dst) {
    if constexpr (kDtype == KvDtype::kFp32) {
      std::memcpy(dst, src, std::size_t{n} * 4);
    } else {
      std::uint32_t d = 0;
      for (; d + 8 <= n; d += 8) {
        const __m128i h =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + std::size_t{d} * 2));
        __m256 f;
        if constexpr (kDtype == KvDtype::kFp16) {
          f = _mm256_cvtph_ps(h);  // exact, like Fp16BitsToFloat
        } else {
          f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
        _mm256_storeu_ps(dst + d, f);
      }
      ScalarOps::LoadRow<kDtype>(src + std::size_t{d} * 2, n - d, dst + d);
    }
  }

  KVF_AVX2 static __m256 TailMask(std::uint32_t r) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), lanes));
  }

  KVF_AVX2 static float Finish(__m256 acc, float scale) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    return scale * Tree8(lanes);
  }

  // Where Dot4 reads K: a converted fp32 row, or the tile's own elements.
  struct RowLoader {
    const float* row;
    KVF_AVX2 __m256 operator()(std::uint32_t d) const { return _mm256_loadu_ps(row + d); }
  };
  template <KvDtype kDtype>
  struct KvLoader {
    const std::byte* src;
    KVF_AVX2 __m256 operator()(std::uint32_t d) const {
      return Load8<kDtype>(src + std::size_t{d} * (kDtype == KvDtype::kFp32 ? 4 : 2));
    }
  };
  // Lanes of the dots of the 4 query heads at a0, a0 + dim, ... with K over
  // elements [0, whole) (a multiple of 8).
  template <typename Loader>
  KVF_AVX2 static void Dot4(const float* a0, std::uint32_t dim, std::uint32_t whole, Loader k_at,
                            __m256* c0, __m256* c1, __m256* c2, __m256* c3) {
    const float* a1 = a0 + dim;
    const float* a2 = a1 + dim;
    const float* a3 = a2 + dim;
    __m256 x0 = _mm256_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
    for (std::uint32_t d = 0; d < whole; d += 8) {
      const __m256 k = k_at(d);
      x0 = _mm256_fmadd_ps(_mm256_loadu_ps(a0 + d), k, x0);
      x1 = _mm256_fmadd_ps(_mm256_loadu_ps(a1 + d), k, x1);
      x2 = _mm256_fmadd_ps(_mm256_loadu_ps(a2 + d), k, x2);
      x3 = _mm256_fmadd_ps(_mm256_loadu_ps(a3 + d), k, x3);
    }
    *c0 = x0;
    *c1 = x1;
    *c2 = x2;
    *c3 = x3;
  }

  KVF_AVX2 static void Dots(const float* q, std::uint32_t nh, std::uint32_t dim, const float* row,
                            float scale, float* s) {
    const std::uint32_t whole = dim / 8 * 8;
    const std::uint32_t r = dim - whole;
    const __m256 mask = TailMask(r);
    std::uint32_t j = 0;
    // Four heads at once: four independent fma chains over one K row.
    for (; j + 4 <= nh; j += 4) {
      const float* a0 = q + std::size_t{j} * dim;
      const float* a1 = a0 + dim;
      const float* a2 = a1 + dim;
      const float* a3 = a2 + dim;
      __m256 c0, c1, c2, c3;
      Dot4(a0, dim, whole, RowLoader{row}, &c0, &c1, &c2, &c3);
      if (r != 0) {
        const __m256i mi = _mm256_castps_si256(mask);
        const __m256 k = _mm256_maskload_ps(row + whole, mi);
        // Lanes past the row keep their sums as they are (blend, not fma
        // with zeros, which would turn -0 into +0).
        c0 = _mm256_blendv_ps(c0, _mm256_fmadd_ps(_mm256_maskload_ps(a0 + whole, mi), k, c0), mask);
        c1 = _mm256_blendv_ps(c1, _mm256_fmadd_ps(_mm256_maskload_ps(a1 + whole, mi), k, c1), mask);
        c2 = _mm256_blendv_ps(c2, _mm256_fmadd_ps(_mm256_maskload_ps(a2 + whole, mi), k, c2), mask);
        c3 = _mm256_blendv_ps(c3, _mm256_fmadd_ps(_mm256_maskload_ps(a3 + whole, mi), k, c3), mask);
      }
      s[j] = Finish(c0, scale);
      s[j + 1] = Finish(c1, scale);
      s[j + 2] = Finish(c2, scale);
      s[j + 3] = Finish(c3, scale);
    }
    for (; j < nh; ++j) {
      const float* a = q + std::size_t{j} * dim;
      __m256 c = _mm256_setzero_ps();
      for (std::uint32_t d = 0; d < whole; d += 8) {
        c = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(row + d), c);
      }
      if (r != 0) {
        const __m256i mi = _mm256_castps_si256(mask);
        c = _mm256_blendv_ps(c,
                             _mm256_fmadd_ps(_mm256_maskload_ps(a + whole, mi),
                                             _mm256_maskload_ps(row + whole, mi), c),
                             mask);
      }
      s[j] = Finish(c, scale);
    }
  }

  // Dots reading the K row directly (converted 8 lanes at a time); a
  // row whose length is not a multiple of 8 (or heads not a multiple of 4)
  // goes through `row` and Dots.
  template <KvDtype kDtype>
  KVF_AVX2 static void DotsRow(const float* q, std::uint32_t nh, std::uint32_t dim,
                               const std::byte* src, float scale, float* s, float* row) {
    if (dim % 8 != 0 || nh % 4 != 0) {
      ScalarOps::LoadRow<kDtype>(src, dim, row);
      Dots(q, nh, dim, row, scale, s);
      return;
    }
    for (std::uint32_t j = 0; j < nh; j += 4) {
      __m256 c0, c1, c2, c3;
      Dot4(q + std::size_t{j} * dim, dim, dim, KvLoader<kDtype>{src}, &c0, &c1, &c2, &c3);
      s[j] = Finish(c0, scale);
      s[j + 1] = Finish(c1, scale);
      s[j + 2] = Finish(c2, scale);
      s[j + 3] = Finish(c3, scale);
    }
  }

  // ExpScalar on 8 lanes, step for step.
  KVF_AVX2 static __m256 Exp8(__m256 x) {
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLow), _CMP_LT_OQ);
    const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(kExpHigh), _CMP_GT_OQ);
    const __m256 xc =
        _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLow)), _mm256_set1_ps(kExpHigh));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), xc);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), r);
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(kExpP0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kExpP5));
    y = _mm256_fmadd_ps(y, z, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(lse::PositiveInfinity()), over);
    return _mm256_blendv_ps(y, x, nan);
  }

  KVF_AVX2 static void Exp(float* x, std::uint32_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    std::uint32_t t = 0;
    for (; t + 8 <= n; t += 8) {
      _mm256_storeu_ps(x + t, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + t), mv)));
    }
    ScalarOps::Exp(x + t, n - t, m);
  }

  // Eight elements of `kDtype` at src as fp32 (exact).
  template <KvDtype kDtype>
  KVF_AVX2 static __m256 Load8(const std::byte* src) {
    if constexpr (kDtype == KvDtype::kFp32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      if constexpr (kDtype == KvDtype::kFp16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }

  // ScalarOps::AxpyChunk with the accumulators in registers: for each group
  // of 4 heads and 16 dims, every token of the chunk in order, so each
  // element sees the same fmas in the same order.
  template <KvDtype kDtype>
  KVF_AVX2 static void AxpyChunk(float* out, std::uint32_t nh, std::uint32_t dim, const float* p,
                                 std::size_t stride, std::uint32_t n, const std::byte* v,
                                 std::size_t token_bytes, float* row) {
    constexpr std::size_t kElem = kDtype == KvDtype::kFp32 ? 4 : 2;
    const std::uint32_t whole = dim / 16 * 16;
    for (std::uint32_t j0 = 0; j0 < nh; j0 += 4) {
      const std::uint32_t jn = std::min<std::uint32_t>(4, nh - j0);
      float* o = out + std::size_t{j0} * dim;
      const float* pj = p + j0 * stride;
      for (std::uint32_t d = 0; d < whole; d += 16) {
        __m256 a[4][2];
        for (std::uint32_t j = 0; j < 4; ++j) {
          if (j >= jn) break;
          a[j][0] = _mm256_loadu_ps(o + j * dim + d);
          a[j][1] = _mm256_loadu_ps(o + j * dim + d + 8);
        }
        const std::byte* vd = v + std::size_t{d} * kElem;
        if (jn == 4) {
          for (std::uint32_t t = 0; t < n; ++t) {
            const __m256 v0 = Load8<kDtype>(vd + t * token_bytes);
            const __m256 v1 = Load8<kDtype>(vd + t * token_bytes + 8 * kElem);
            for (std::uint32_t j = 0; j < 4; ++j) {
              const __m256 pv = _mm256_broadcast_ss(pj + j * stride + t);
              a[j][0] = _mm256_fmadd_ps(pv, v0, a[j][0]);
              a[j][1] = _mm256_fmadd_ps(pv, v1, a[j][1]);
            }
          }
        } else {
          for (std::uint32_t t = 0; t < n; ++t) {
            const __m256 v0 = Load8<kDtype>(vd + t * token_bytes);
            const __m256 v1 = Load8<kDtype>(vd + t * token_bytes + 8 * kElem);
            for (std::uint32_t j = 0; j < jn; ++j) {
              const __m256 pv = _mm256_broadcast_ss(pj + j * stride + t);
              a[j][0] = _mm256_fmadd_ps(pv, v0, a[j][0]);
              a[j][1] = _mm256_fmadd_ps(pv, v1, a[j][1]);
            }
          }
        }
        for (std::uint32_t j = 0; j < jn; ++j) {
          _mm256_storeu_ps(o + j * dim + d, a[j][0]);
          _mm256_storeu_ps(o + j * dim + d + 8, a[j][1]);
        }
      }
      if (whole == dim) continue;
      // The last dim % 16 elements: the scalar path's loop over them.
      for (std::uint32_t t = 0; t < n; ++t) {
        ScalarOps::LoadRow<kDtype>(v + t * token_bytes + std::size_t{whole} * kElem, dim - whole,
                                   row);
        for (std::uint32_t j = 0; j < jn; ++j) {
          const float pt = pj[j * stride + t];
          for (std::uint32_t d = whole; d < dim; ++d) {
            o[j * dim + d] = fmaf(pt, row[d - whole], o[j * dim + d]);
          }
        }
      }
    }
  }
};
#endif  // __x86_64__

template <typename Ops, KvDtype kDtype>
void DecodeTile(const AttentionShape& shape, float scale, std::uint32_t tokens, const float* q,
                const std::byte* k, const std::byte* v, float* out, float* lse) {
  const std::uint32_t dim = shape.head_dim;
  const std::uint32_t group = shape.num_q_heads / shape.num_kv_heads;
  const std::size_t elem = KvDtypeSize(kDtype);
  const std::size_t row_bytes = std::size_t{dim} * elem;  // one kv head of one token
  const std::size_t token_bytes = row_bytes * shape.num_kv_heads;
  alignas(32) float row[kMaxHeadDim];
  alignas(32) float logits[kHeadsPerBlock][kChunk];
  float m[kHeadsPerBlock];
  float sum[kHeadsPerBlock];
  float s[kHeadsPerBlock];

  // Heads [h0, h1) are a block: whole kv-head groups (or part of one group
  // larger than a block). Each block reads the tile token by token, every kv
  // head of a token together, so K and V stream through the cache once.
  std::uint32_t h1 = 0;
  for (std::uint32_t h0 = 0; h0 < shape.num_q_heads; h0 = h1) {
    const std::uint32_t g0 = h0 / group;
    h1 = std::min(h0 + kHeadsPerBlock, shape.num_q_heads);
    if (h1 / group > g0 && h1 % group != 0) h1 = h1 / group * group;  // whole groups
    const std::uint32_t nh = h1 - h0;
    float* oh = out + std::size_t{h0} * dim;
    for (std::uint32_t j = 0; j < nh; ++j) {
      m[j] = lse::NegativeInfinity();
      sum[j] = 0.0f;
    }
    std::fill_n(oh, std::size_t{nh} * dim, 0.0f);
    // The logits of tokens [c0, c0 + n) into logits[][0..n); the maximum of
    // each head too when `max` is set.
    auto logits_of = [&](std::uint32_t c0, std::uint32_t n, bool keep, bool max) {
      for (std::uint32_t t = 0; t < n; ++t) {
        for (std::uint32_t h = h0; h < h1;) {
          const std::uint32_t g = h / group;
          const std::uint32_t end = std::min(h1, (g + 1) * group);
          Ops::template DotsRow<kDtype>(q + std::size_t{h} * dim, end - h, dim,
                                        k + (c0 + t) * token_bytes + g * row_bytes, scale,
                                        s + (h - h0), row);
          h = end;
        }
        for (std::uint32_t j = 0; j < nh; ++j) {
          if (max && (s[j] > m[j] || s[j] != s[j])) m[j] = s[j];
          if (keep) logits[j][t] = s[j];
        }
      }
    };
    // Pass 1: every logit (the first chunk's kept), the maximum of each head.
    logits_of(0, std::min(tokens, kChunk), true, true);
    for (std::uint32_t c0 = kChunk; c0 < tokens; c0 += kChunk) {
      logits_of(c0, std::min(kChunk, tokens - c0), false, true);
    }
    // Pass 2, a chunk at a time: max-subtracted exponentials, their sum
    // (tokens in order) and the weighted values, a few tokens at a time for
    // every kv head (their V rows stay in L1 across the group's heads).
    for (std::uint32_t c0 = 0; c0 < tokens; c0 += kChunk) {
      const std::uint32_t n = std::min(kChunk, tokens - c0);
      if (c0 != 0) logits_of(c0, n, true, false);
      for (std::uint32_t j = 0; j < nh; ++j) {
        Ops::Exp(logits[j], n, m[j]);
        for (std::uint32_t t = 0; t < n; ++t) sum[j] += logits[j][t];
      }
      for (std::uint32_t t0 = 0; t0 < n; t0 += kValueTokens) {
        const std::uint32_t nt = std::min(kValueTokens, n - t0);
        for (std::uint32_t h = h0; h < h1;) {
          const std::uint32_t g = h / group;
          const std::uint32_t end = std::min(h1, (g + 1) * group);
          Ops::template AxpyChunk<kDtype>(
              out + std::size_t{h} * dim, end - h, dim, &logits[h - h0][t0], kChunk, nt,
              v + (c0 + t0) * token_bytes + g * row_bytes, token_bytes, row);
          h = end;
        }
      }
    }
    for (std::uint32_t j = 0; j < nh; ++j) {
      float* o = oh + std::size_t{j} * dim;
      if (tokens == 0) {
        lse[h0 + j] = lse::NegativeInfinity();
        continue;
      }
      for (std::uint32_t d = 0; d < dim; ++d) o[d] = o[d] / sum[j];
      lse[h0 + j] = m[j] + logf(sum[j]);
    }
  }
}

template <typename Ops>
void DecodeTileOf(const AttentionShape& shape, float scale, std::uint32_t tokens, const float* q,
                  const std::byte* k, const std::byte* v, float* out, float* lse) {
  switch (shape.dtype) {
    case KvDtype::kFp16:
      return DecodeTile<Ops, KvDtype::kFp16>(shape, scale, tokens, q, k, v, out, lse);
    case KvDtype::kBf16:
      return DecodeTile<Ops, KvDtype::kBf16>(shape, scale, tokens, q, k, v, out, lse);
    case KvDtype::kFp32:
      return DecodeTile<Ops, KvDtype::kFp32>(shape, scale, tokens, q, k, v, out, lse);
    default:
      return;  // excluded by ValidateAttentionTile
  }
}

// AVX2, FMA and F16C, and an OS that saves the YMM registers (CPUID and
// XGETBV read directly: not every compiler's __builtin_cpu_supports knows
// "f16c").
bool CpuHasAvx2FmaF16c() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
  if (!fma || !osxsave || !f16c) return false;
  unsigned xlo = 0, xhi = 0;
  __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  if ((xlo & 0x6) != 0x6) return false;  // XMM and YMM state enabled
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  return (b >> 5) & 1;  // AVX2
#else
  return false;
#endif
}

KernelIsa DetectIsa() { return CpuHasAvx2FmaF16c() ? KernelIsa::kAvx2 : KernelIsa::kScalar; }

template <typename T>
T* At(std::span<std::byte> arena, const DeviceRange& r) {
  return reinterpret_cast<T*>(arena.data() + r.offset);
}

}  // namespace

KernelIsa BestKernelIsa() {
  static const KernelIsa isa = DetectIsa();
  return isa;
}

bool KernelIsaSupported(KernelIsa isa) {
  if (isa == KernelIsa::kScalar) return true;
  return CpuHasAvx2FmaF16c();
}

const char* KernelIsaName(KernelIsa isa) {
  return isa == KernelIsa::kAvx2 ? "avx2+fma+f16c" : "scalar";
}

void DecodeAttentionTileWith(KernelIsa isa, const AttentionShape& shape, float scale,
                             std::uint32_t tokens, const float* q, const std::byte* k,
                             const std::byte* v, float* out, float* lse) {
#if defined(__x86_64__)
  if (isa == KernelIsa::kAvx2) {
    return DecodeTileOf<Avx2Ops>(shape, scale, tokens, q, k, v, out, lse);
  }
#endif
  (void)isa;
  DecodeTileOf<ScalarOps>(shape, scale, tokens, q, k, v, out, lse);
}

void DecodeAttentionTile(const AttentionShape& shape, float scale, std::uint32_t tokens,
                         const float* q, const std::byte* k, const std::byte* v, float* out,
                         float* lse) {
  DecodeAttentionTileWith(BestKernelIsa(), shape, scale, tokens, q, k, v, out, lse);
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
  return DecodeAttentionTileInArena(BestKernelIsa(), args, arena);
}

Status DecodeAttentionTileInArena(KernelIsa isa, const AttentionTileArgs& args,
                                  std::span<std::byte> arena) {
  KVF_RETURN_IF_ERROR(ValidateAttentionTile(args, arena.size()));
  DecodeAttentionTileWith(isa, args.shape, args.scale, args.tokens,
                          At<const float>(arena, args.query), At<const std::byte>(arena, args.keys),
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
