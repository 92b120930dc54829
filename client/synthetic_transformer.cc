#include "client/synthetic_transformer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "client/synthetic_model.h"
#include "core/units.h"
#include "gpu/kernels/cpu_kernels.h"
#include "gpu/kernels/float_convert.h"
#include "gpu/kernels/lse.h"

namespace kvfabric::client {
namespace {

// Uniform in [-a, a] with a = sqrt(3 / fan_in): unit variance after the
// multiply, so activations neither vanish nor blow up with depth.
void FillWeights(std::vector<float>& w, std::size_t count, std::uint32_t fan_in,
                 std::uint64_t& state) {
  w.resize(count);
  const float a = std::sqrt(3.0f / static_cast<float>(fan_in));
  for (float& x : w) {
    const double u = static_cast<double>(NextSplitMix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    x = static_cast<float>((2 * u - 1) * a);
  }
}

// Row-wise RMS norm of [rows, cols] into out.
void RmsNorm(const float* x, std::uint32_t rows, std::uint32_t cols, float* out) {
  for (std::uint32_t r = 0; r < rows; ++r) {
    const float* xr = x + std::size_t{r} * cols;
    float ss = 0;
    for (std::uint32_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(cols) + 1e-6f);
    float* o = out + std::size_t{r} * cols;
    for (std::uint32_t c = 0; c < cols; ++c) o[c] = xr[c] * inv;
  }
}

// C[m, n] = A[m, k] B[k, n] + beta C.
void Gemm(std::uint32_t m, std::uint32_t n, std::uint32_t k, const float* a, const float* b,
          float beta, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(n), beta, c,
              static_cast<int>(n));
}

// `n` elements of `dtype` at `src` as fp32.
void Widen(KvDtype dtype, const std::byte* src, std::uint32_t n, float* out) {
  if (dtype == KvDtype::kFp32) {
    std::memcpy(out, src, std::size_t{n} * 4);
    return;
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, src + 2 * std::size_t{i}, 2);
    out[i] = dtype == KvDtype::kFp16 ? gpu::Fp16BitsToFloat(h) : gpu::Bf16BitsToFloat(h);
  }
}

}  // namespace

struct SyntheticTransformer::Slot {
  std::vector<float> x;       // [chunk, hidden] residual stream
  std::vector<float> h;       // [chunk, hidden] normed input
  std::vector<float> u;       // [chunk, ffn] MLP inner activations
  std::vector<float> q;       // [chunk, head_dim]
  std::vector<float> attn;    // [chunk, head_dim]
  std::vector<float> k;       // [max_context_tokens, head_dim], KV head 0 widened to fp32
  std::vector<float> v;       // likewise
  std::vector<float> logits;  // [vocab]
  std::vector<float> states;  // [2, head_dim]: a query's running state, then the tile's
  float lses[2] = {0, 0};
  std::vector<float> lse_run;  // [chunk]: each query's running log-sum-exp
};

SyntheticTransformer::SyntheticTransformer(const SyntheticTransformerOptions& o) : o_(o) {}
SyntheticTransformer::~SyntheticTransformer() = default;

StatusOr<std::unique_ptr<SyntheticTransformer>> SyntheticTransformer::Create(
    const SyntheticTransformerOptions& options) {
  KVF_RETURN_IF_ERROR(options.model.Validate().WithContext("synthetic transformer model"));
  const ModelFingerprint& m = options.model;
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("synthetic transformer: " + what);
  };
  if (m.dtype != KvDtype::kFp16 && m.dtype != KvDtype::kBf16 && m.dtype != KvDtype::kFp32) {
    return bad("KV dtype " + std::string(KvDtypeName(m.dtype)) + " (fp16, bf16 or fp32 only)");
  }
  if (options.depth == 0 || options.depth > m.layer_count) {
    return bad("depth " + std::to_string(options.depth) + " must be in [1, layer_count " +
               std::to_string(m.layer_count) + "]");
  }
  if (options.hidden == 0 || options.ffn == 0 || options.vocab == 0 || options.hidden > 65536 ||
      options.ffn > 262144 || options.vocab > (1u << 22)) {
    return bad("hidden " + std::to_string(options.hidden) + ", ffn " + std::to_string(options.ffn) +
               ", vocab " + std::to_string(options.vocab) +
               ": each must be >= 1 (at most 65536, 262144, 4194304)");
  }
  if (options.max_context_tokens == 0 || options.max_context_tokens > (std::uint64_t{1} << 24)) {
    return bad("max_context_tokens " + std::to_string(options.max_context_tokens) +
               " must be in [1, 16777216]");
  }
  if (options.max_chunk_tokens == 0 || options.tile_tokens == 0 || options.concurrency == 0 ||
      options.concurrency > 64) {
    return bad("max_chunk_tokens, tile_tokens must be >= 1 and concurrency in [1, 64]");
  }
  std::unique_ptr<SyntheticTransformer> t(new SyntheticTransformer(options));
  KVF_RETURN_IF_ERROR(t->Allocate());
  if (options.blas_threads > 0) openblas_set_num_threads(static_cast<int>(options.blas_threads));
  return t;
}

Status SyntheticTransformer::Allocate() {
  const ModelFingerprint& m = o_.model;
  KVF_ASSIGN_OR_RETURN(block_bytes_, m.BlockBytes());
  for (std::uint32_t j = 0; j < o_.depth; ++j) {
    layer_of_.push_back(static_cast<std::uint32_t>(std::uint64_t{j} * m.layer_count / o_.depth));
  }
  const std::uint32_t hd = m.head_dim;
  try {
    std::uint64_t state = o_.weight_seed ^ 0x5eed5eed5eed5eedull;
    FillWeights(embedding_, std::size_t{o_.vocab} * o_.hidden, o_.hidden, state);
    wq_.resize(o_.depth);
    wo_.resize(o_.depth);
    w1_.resize(o_.depth);
    w2_.resize(o_.depth);
    for (std::uint32_t j = 0; j < o_.depth; ++j) {
      FillWeights(wq_[j], std::size_t{o_.hidden} * hd, o_.hidden, state);
      FillWeights(wo_[j], std::size_t{hd} * o_.hidden, hd, state);
      FillWeights(w1_[j], std::size_t{o_.hidden} * o_.ffn, o_.hidden, state);
      FillWeights(w2_[j], std::size_t{o_.ffn} * o_.hidden, o_.ffn, state);
    }
    const std::size_t chunk = std::min<std::uint64_t>(o_.max_chunk_tokens, o_.max_context_tokens);
    const std::size_t kv = o_.max_context_tokens * hd;
    for (std::uint32_t i = 0; i < o_.concurrency; ++i) {
      auto s = std::make_unique<Slot>();
      s->x.assign(chunk * o_.hidden, 0.0f);
      s->h.assign(chunk * o_.hidden, 0.0f);
      s->u.assign(chunk * o_.ffn, 0.0f);
      s->q.assign(chunk * hd, 0.0f);
      s->attn.assign(chunk * hd, 0.0f);
      s->k.assign(kv, 0.0f);
      s->v.assign(kv, 0.0f);
      s->logits.assign(o_.vocab, 0.0f);
      s->states.assign(2 * std::size_t{hd}, 0.0f);
      s->lse_run.assign(chunk, 0.0f);
      slots_.push_back(std::move(s));
    }
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("synthetic transformer: cannot allocate " + Describe());
  }
  MutexLock l(&mu_);
  for (auto& s : slots_) free_.push_back(s.get());
  return Status::OK();
}

std::string SyntheticTransformer::Describe() const {
  const std::uint32_t hd = o_.model.head_dim;
  const double weights = 4.0 * (static_cast<double>(o_.vocab) * o_.hidden +
                                o_.depth * (2.0 * o_.hidden * hd + 2.0 * o_.hidden * o_.ffn));
  const std::uint64_t chunk = std::min<std::uint64_t>(o_.max_chunk_tokens, o_.max_context_tokens);
  const double scratch = 4.0 * (chunk * (2.0 * o_.hidden + o_.ffn + 2.0 * hd) + o_.vocab) +
                         8.0 * o_.max_context_tokens * hd;
  const double per_token = o_.depth * 2.0 * (2.0 * o_.hidden * hd + 2.0 * o_.hidden * o_.ffn);
  std::string layers;
  for (std::uint32_t l : layer_of_) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "synthetic transformer: %u decoder layers (hidden %u, MLP %u, 1 head of %u over "
                "model layers %s, KV head 0), vocab %u; weights %s, scratch %u x %s; %.2f MFLOP "
                "per token, %u multiply-adds + 1 exp per attention pair per layer",
                o_.depth, o_.hidden, o_.ffn, hd, layers.c_str(), o_.vocab,
                FormatBytes(static_cast<std::uint64_t>(weights)).c_str(), o_.concurrency,
                FormatBytes(static_cast<std::uint64_t>(scratch)).c_str(), per_token / 1e6, 2 * hd);
  return buf;
}

SyntheticTransformer::Slot* SyntheticTransformer::Acquire() {
  MutexLock l(&mu_);
  cv_.Wait(&mu_, [&]() KVF_REQUIRES(mu_) { return !free_.empty(); });
  Slot* s = free_.back();
  free_.pop_back();
  return s;
}

void SyntheticTransformer::Release(Slot* slot) {
  MutexLock l(&mu_);
  free_.push_back(slot);
  cv_.NotifyOne();
}

StatusOr<PrefillResult> SyntheticTransformer::Prefill(const HostHistory& prefix,
                                                      std::uint32_t first_block,
                                                      std::span<const std::uint32_t> token_ids,
                                                      std::span<const std::uint64_t> block_seeds,
                                                      std::span<std::byte> out) {
  const std::uint64_t tpb = o_.model.tokens_per_block;
  const std::uint64_t n = token_ids.size();
  const std::uint64_t blocks = (n + tpb - 1) / tpb;
  const std::uint64_t start = std::uint64_t{first_block} * tpb;
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("synthetic transformer: prefill " + what);
  };
  if (n == 0) return bad("of 0 tokens");
  if (block_seeds.size() != blocks || out.size() != blocks * block_bytes_) {
    return bad("of " + std::to_string(n) + " tokens (" + std::to_string(blocks) + " blocks) with " +
               std::to_string(block_seeds.size()) + " seeds and " + std::to_string(out.size()) +
               " output bytes (blocks of " + std::to_string(block_bytes_) + ")");
  }
  if (start + n > o_.max_context_tokens) {
    return bad("to token " + std::to_string(start + n) + " beyond max_context_tokens " +
               std::to_string(o_.max_context_tokens));
  }
  if (first_block > 0 && (prefix.blocks() < first_block || prefix.block_bytes() < block_bytes_)) {
    return bad("after " + std::to_string(first_block) + " blocks with a prefix of " +
               std::to_string(prefix.blocks()) + " blocks of " +
               std::to_string(prefix.block_bytes()) + " bytes");
  }
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const auto valid = static_cast<std::uint32_t>(std::min<std::uint64_t>(tpb, n - b * tpb));
    KVF_RETURN_IF_ERROR(
        SyntheticKv(o_.model, block_seeds[b], valid, out.subspan(b * block_bytes_, block_bytes_)));
  }
  Slot* slot = Acquire();
  PrefillResult result;
  for (std::uint64_t c = 0; c < n; c += o_.max_chunk_tokens) {
    const auto chunk =
        static_cast<std::uint32_t>(std::min<std::uint64_t>(o_.max_chunk_tokens, n - c));
    RunChunk(*slot, prefix, first_block, out, c, chunk, token_ids.subspan(c, chunk), &result);
  }
  // The LM head for the last token.
  Slot& s = *slot;
  const std::uint64_t last = (n - 1) % o_.max_chunk_tokens;
  RmsNorm(s.x.data() + last * o_.hidden, 1, o_.hidden, s.h.data());
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(o_.vocab), static_cast<int>(o_.hidden),
              1.0f, embedding_.data(), static_cast<int>(o_.hidden), s.h.data(), 1, 0.0f,
              s.logits.data(), 1);
  result.matmul_flops += 2ull * o_.vocab * o_.hidden;
  double sum = 0;
  for (std::uint32_t i = 0; i < o_.hidden; ++i) sum += s.x[last * o_.hidden + i];
  result.checksum = sum + *std::max_element(s.logits.begin(), s.logits.end());
  Release(slot);
  return result;
}

void SyntheticTransformer::RunChunk(Slot& s, const HostHistory& prefix, std::uint32_t first_block,
                                    std::span<const std::byte> fresh, std::uint64_t chunk_start,
                                    std::uint32_t chunk, std::span<const std::uint32_t> ids,
                                    PrefillResult* result) const {
  const ModelFingerprint& m = o_.model;
  const std::uint32_t hd = m.head_dim;
  const std::uint64_t tpb = m.tokens_per_block;
  const std::uint64_t elem = KvDtypeSize(m.dtype);
  const std::uint64_t row = std::uint64_t{m.kv_heads} * hd * elem;  // one token, every head
  const std::uint64_t half = row * tpb;                             // K (or V) of one layer
  const std::uint64_t start = std::uint64_t{first_block} * tpb;  // the new tokens' first position
  const std::uint64_t end = start + chunk_start + chunk;         // keys the chunk's last query sees
  for (std::uint32_t i = 0; i < chunk; ++i) {
    std::memcpy(&s.x[std::size_t{i} * o_.hidden],
                &embedding_[std::size_t{ids[i] % o_.vocab} * o_.hidden], o_.hidden * 4);
  }
  // The gather widens K and V to fp32 once per chunk (O(keys)); the kernel
  // then runs on fp32 rows, as a GPU's tensor cores consume fp16 natively
  // where this CPU would convert every element of every pair.
  const gpu::AttentionShape shape{1, 1, hd, KvDtype::kFp32};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::uint32_t j = 0; j < o_.depth; ++j) {
    const std::uint64_t layer_offset = std::uint64_t{layer_of_[j]} * 2 * half;
    // KV head 0 of this layer for every key the chunk sees, from the history
    // (blocks before first_block) and the new blocks.
    for (std::uint64_t t = 0; t < end; ++t) {
      const std::uint64_t b = t / tpb;
      const std::byte* block = b < first_block ? prefix.block(static_cast<std::uint32_t>(b)).data()
                                               : fresh.data() + (b - first_block) * block_bytes_;
      const std::byte* k = block + layer_offset + (t % tpb) * row;
      Widen(m.dtype, k, hd, &s.k[t * hd]);
      Widen(m.dtype, k + half, hd, &s.v[t * hd]);
    }
    RmsNorm(s.x.data(), chunk, o_.hidden, s.h.data());
    Gemm(chunk, hd, o_.hidden, s.h.data(), wq_[j].data(), 0.0f, s.q.data());
    // Key tiles outermost: each tile of K and V (tile_tokens x head_dim x 2
    // floats) is read once per chunk and used by every query that sees it
    // while it is in cache, so a pair costs the same at any prefix length
    // (one query at a time over all keys streamed the whole prefix from
    // memory per query once it outgrew the cache, and a long prefix's pairs
    // cost 2-3x a short one's). Each query still meets the same tiles in the
    // same order, each merged into its running state (s.attn's row) exactly
    // as before, so the result is the same bit for bit.
    const std::uint64_t first_keys = start + chunk_start + 1;  // query 0's, itself included
    for (std::uint64_t t0 = 0; t0 < first_keys + chunk - 1; t0 += o_.tile_tokens) {
      const auto* k = reinterpret_cast<const std::byte*>(&s.k[t0 * hd]);
      const auto* v = reinterpret_cast<const std::byte*>(&s.v[t0 * hd]);
      // Queries before i0 have fewer keys than t0: their last tile is behind them.
      const std::uint64_t i0 = t0 < first_keys ? 0 : t0 - first_keys + 1;
      for (std::uint64_t i = i0; i < chunk; ++i) {
        const std::uint64_t keys = first_keys + i;
        const auto t =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(o_.tile_tokens, keys - t0));
        const float* q = &s.q[i * hd];
        float* run = &s.attn[i * hd];
        if (t0 == 0) {
          gpu::cpu_kernels::DecodeAttentionTile(shape, scale, t, q, k, v, run, &s.lse_run[i]);
          continue;
        }
        float* tile = s.states.data() + hd;
        gpu::cpu_kernels::DecodeAttentionTile(shape, scale, t, q, k, v, tile, &s.lses[1]);
        std::memcpy(s.states.data(), run, hd * 4);
        s.lses[0] = s.lse_run[i];
        gpu::cpu_kernels::MergeStates(2, 1, hd, s.states.data(), s.lses, run, &s.lse_run[i]);
      }
    }
    for (std::uint32_t i = 0; i < chunk; ++i) result->attention_pairs += first_keys + i;
    Gemm(chunk, o_.hidden, hd, s.attn.data(), wo_[j].data(), 1.0f, s.x.data());
    RmsNorm(s.x.data(), chunk, o_.hidden, s.h.data());
    Gemm(chunk, o_.ffn, o_.hidden, s.h.data(), w1_[j].data(), 0.0f, s.u.data());
    for (std::size_t i = 0; i < std::size_t{chunk} * o_.ffn; ++i) s.u[i] = std::max(s.u[i], 0.0f);
    Gemm(chunk, o_.hidden, o_.ffn, s.u.data(), w2_[j].data(), 1.0f, s.x.data());
    result->matmul_flops += 2ull * chunk * (2ull * o_.hidden * hd + 2ull * o_.hidden * o_.ffn);
  }
}

StatusOr<std::unique_ptr<SyntheticPrefillProbe>> SyntheticPrefillProbe::Create(
    SyntheticTransformer* engine, std::uint64_t max_tokens, std::uint64_t max_prefix_tokens) {
  const ModelFingerprint& m = engine->options().model;
  const std::uint64_t tpb = m.tokens_per_block;
  if (max_tokens == 0 || max_tokens + max_prefix_tokens > engine->options().max_context_tokens) {
    return Status::InvalidArgument("synthetic prefill probe: " + std::to_string(max_tokens) +
                                   " tokens after " + std::to_string(max_prefix_tokens) +
                                   " beyond the engine's max_context_tokens " +
                                   std::to_string(engine->options().max_context_tokens));
  }
  std::unique_ptr<SyntheticPrefillProbe> p(new SyntheticPrefillProbe);
  p->engine_ = engine;
  KVF_ASSIGN_OR_RETURN(p->block_bytes_, m.BlockBytes());
  const std::uint64_t distinct = std::clamp<std::uint64_t>(max_prefix_tokens / tpb, 1, 64);
  p->pages_.resize(distinct * p->block_bytes_);
  for (std::uint64_t b = 0; b < distinct; ++b) {
    KVF_RETURN_IF_ERROR(
        SyntheticKv(m, b + 1, static_cast<std::uint32_t>(tpb),
                    std::span(p->pages_).subspan(b * p->block_bytes_, p->block_bytes_)));
  }
  p->table_.resize(max_prefix_tokens / tpb);
  for (std::size_t i = 0; i < p->table_.size(); ++i) {
    p->table_[i] = static_cast<std::uint32_t>(i % distinct);
  }
  p->out_.resize((max_tokens + tpb - 1) / tpb * p->block_bytes_);
  p->ids_.resize(max_tokens);
  for (std::size_t i = 0; i < p->ids_.size(); ++i) {
    p->ids_[i] = static_cast<std::uint32_t>(i * 2654435761u);
  }
  p->seeds_.resize(p->out_.size() / p->block_bytes_);
  for (std::size_t i = 0; i < p->seeds_.size(); ++i) p->seeds_[i] = 7919 + i;
  return p;
}

StatusOr<double> SyntheticPrefillProbe::Run(std::uint64_t n, std::uint64_t prefix) {
  const std::uint64_t tpb = engine_->options().model.tokens_per_block;
  const std::uint64_t blocks = (n + tpb - 1) / tpb;
  if (n == 0 || n > ids_.size() || prefix / tpb > table_.size() || prefix % tpb != 0) {
    return Status::InvalidArgument("synthetic prefill probe: n=" + std::to_string(n) +
                                   " p=" + std::to_string(prefix) +
                                   " outside what it was created for (or p not whole blocks)");
  }
  const auto start = std::chrono::steady_clock::now();
  KVF_RETURN_IF_ERROR(
      engine_
          ->Prefill(HostHistory::Paged(pages_.data(),
                                       std::span<const std::uint32_t>(table_).first(prefix / tpb),
                                       block_bytes_),
                    static_cast<std::uint32_t>(prefix / tpb), std::span(ids_).first(n),
                    std::span(seeds_).first(blocks), std::span(out_).first(blocks * block_bytes_))
          .status());
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace kvfabric::client
