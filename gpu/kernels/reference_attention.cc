#include "gpu/kernels/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"

namespace kvfabric::gpu {
namespace {

// Validates the shape through ValidateAttentionTile on a synthetic layout
// (so the rules are the same as the kernels') and the span sizes.
Status CheckSpans(const AttentionShape& shape, std::uint32_t tokens, std::size_t q, std::size_t k,
                  std::size_t v, std::size_t out, std::size_t lse) {
  const std::uint64_t qb = std::uint64_t{shape.num_q_heads} * shape.head_dim * 4;
  AttentionTileArgs args;
  args.shape = shape;
  args.scale = 1.0f;
  args.tokens = tokens;
  args.query = {0, qb};
  args.keys = {qb, std::uint64_t{k}};
  args.values = {qb + k, std::uint64_t{v}};
  args.output = {qb + k + v, qb};
  args.lse = {2 * qb + k + v, std::uint64_t{shape.num_q_heads} * 4};
  KVF_RETURN_IF_ERROR(ValidateAttentionTile(args, std::numeric_limits<std::uint64_t>::max()));
  const std::size_t elems = std::size_t{shape.num_q_heads} * shape.head_dim;
  if (q != elems || out != elems || lse != shape.num_q_heads) {
    return Status::InvalidArgument("reference attention: q has " + std::to_string(q) +
                                   " elements, out " + std::to_string(out) + ", lse " +
                                   std::to_string(lse) + "; the shape needs " +
                                   std::to_string(elems) + ", " + std::to_string(elems) + ", " +
                                   std::to_string(shape.num_q_heads));
  }
  return Status::OK();
}

double LoadElement(KvDtype dtype, const std::byte* p) {
  if (dtype == KvDtype::kFp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return dtype == KvDtype::kFp16 ? Fp16BitsToFloat(bits) : Bf16BitsToFloat(bits);
}

}  // namespace

Status NaiveAttentionFp64(const AttentionShape& shape, double scale, std::uint32_t tokens,
                          std::span<const float> q, std::span<const std::byte> k,
                          std::span<const std::byte> v, std::span<double> out,
                          std::span<double> lse) {
  KVF_RETURN_IF_ERROR(
      CheckSpans(shape, tokens, q.size(), k.size(), v.size(), out.size(), lse.size()));
  const std::uint32_t dim = shape.head_dim;
  const std::uint32_t group = shape.num_q_heads / shape.num_kv_heads;
  const std::size_t elem = KvDtypeSize(shape.dtype);
  std::vector<double> s(tokens);
  for (std::uint32_t h = 0; h < shape.num_q_heads; ++h) {
    const std::uint32_t g = h / group;
    auto at = [&](std::span<const std::byte> x, std::uint32_t t, std::uint32_t d) {
      return LoadElement(shape.dtype,
                         x.data() + ((std::size_t{t} * shape.num_kv_heads + g) * dim + d) * elem);
    };
    double m = -std::numeric_limits<double>::infinity();
    for (std::uint32_t t = 0; t < tokens; ++t) {
      double dot = 0;
      for (std::uint32_t d = 0; d < dim; ++d)
        dot += double{q[std::size_t{h} * dim + d]} * at(k, t, d);
      s[t] = scale * dot;
      m = std::max(m, s[t]);
    }
    double sum = 0;
    for (std::uint32_t t = 0; t < tokens; ++t) sum += std::exp(s[t] - m);
    for (std::uint32_t d = 0; d < dim; ++d) {
      double acc = 0;
      for (std::uint32_t t = 0; t < tokens; ++t) acc += std::exp(s[t] - m) * at(v, t, d);
      out[std::size_t{h} * dim + d] = tokens == 0 ? 0.0 : acc / sum;
    }
    lse[h] = tokens == 0 ? -std::numeric_limits<double>::infinity() : m + std::log(sum);
  }
  return Status::OK();
}

Status TiledAttentionHost(const AttentionShape& shape, float scale, std::uint32_t tokens,
                          std::uint32_t tile_tokens, std::span<const float> q,
                          std::span<const std::byte> k, std::span<const std::byte> v,
                          std::span<float> out, std::span<float> lse) {
  if (tile_tokens == 0) return Status::InvalidArgument("TiledAttentionHost: tile_tokens=0");
  KVF_RETURN_IF_ERROR(
      CheckSpans(shape, tokens, q.size(), k.size(), v.size(), out.size(), lse.size()));
  const std::size_t heads = shape.num_q_heads;
  const std::size_t elems = heads * shape.head_dim;
  const std::size_t token_bytes =
      std::size_t{shape.num_kv_heads} * shape.head_dim * KvDtypeSize(shape.dtype);
  // states = [running state; tile state], merged into `out`/`lse`, then copied back.
  std::vector<float> states(2 * elems), state_lses(2 * heads);
  std::fill(out.begin(), out.end(), 0.0f);
  std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
  for (std::uint32_t t0 = 0; t0 < tokens; t0 += std::min(tile_tokens, tokens - t0)) {
    const std::uint32_t n = std::min(tile_tokens, tokens - t0);
    const std::size_t offset = std::size_t{t0} * token_bytes;
    if (t0 == 0) {
      cpu_kernels::DecodeAttentionTile(shape, scale, n, q.data(), k.data() + offset,
                                       v.data() + offset, out.data(), lse.data());
      continue;
    }
    std::copy(out.begin(), out.end(), states.begin());
    std::copy(lse.begin(), lse.end(), state_lses.begin());
    cpu_kernels::DecodeAttentionTile(shape, scale, n, q.data(), k.data() + offset,
                                     v.data() + offset, states.data() + elems,
                                     state_lses.data() + heads);
    cpu_kernels::MergeStates(2, shape.num_q_heads, shape.head_dim, states.data(), state_lses.data(),
                             out.data(), lse.data());
  }
  return Status::OK();
}

}  // namespace kvfabric::gpu
