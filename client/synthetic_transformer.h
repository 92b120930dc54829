// SyntheticTransformer: the engine stand-in of `kvfabric demo` and of the
// benchmarks. A recompute there is a real prefill on the CPU, whose time
// grows with n (tokens prefilled) and p (tokens before them) the way a
// model's does, instead of a sleep for a modelled time.
//
// WHAT IT COMPUTES for a prefill of n tokens after a prefix of p:
//   1. The new blocks' KV (every layer, docs/block-format.md layout) from the
//      deterministic generator (client/synthetic_model.h, SyntheticKv) with
//      each block's seed, so a block's bytes stay a function of its key and
//      fetched and recomputed copies are identical (exactness checks hold).
//   2. A decoder of `depth` layers over those tokens, with random weights from
//      `weight_seed`: embedding lookup (vocab x hidden); per layer an RMS norm,
//      a query projection (hidden -> head_dim, one head), causal attention of
//      each new token over every earlier token's K and V, an output projection
//      (head_dim -> hidden) and a ReLU MLP (hidden -> ffn -> hidden); all
//      projections are OpenBLAS sgemm calls on [n, *] matrices. Layer j reads
//      the stored K and V of model layer j * layer_count / depth, KV head 0:
//      the prefix's from the history (fetched or recomputed earlier, so the
//      result depends on those bytes), the new tokens' from step 1, widened
//      to fp32 once per chunk. Attention is the project's own decode kernel
//      (gpu/kernels/cpu_kernels.h, DecodeAttentionTile) over tiles of
//      `tile_tokens`, merged exactly by log-sum-exp (MergeStates): key tiles
//      outermost, so each tile serves every query of the chunk while it is
//      in cache; each query meets its tiles in order.
//   3. The LM head for the last token: logits = hidden x vocab (one sgemv).
// Prompts longer than max_chunk_tokens run as consecutive chunks (chunked
// prefill): each attends over the prefix and the chunks before it.
//
// COST, per call (the terms of t = c0 + c1 n + c2 n (p + n/2)):
//   c0: the LM head (vocab x hidden multiply-adds, reading vocab*hidden*4 bytes
//       of weights) and the call's fixed work;
//   c1: per token, SyntheticKv's bytes plus
//       depth x 2 x (hidden x head_dim x 2 + hidden x ffn x 2) FLOP of sgemm;
//   c2: per (new token, earlier token) pair, depth x head_dim x 2 multiply-adds
//       and one exp in the kernel (plus the fp32 widening of K and V, once per
//       key per chunk); PrefillResult::attention_pairs counts them:
//       depth x (n p + n (n + 1) / 2).
// The demo's defaults (hidden 256, ffn 1024, depth 2, head_dim 128) make a
// 16-token block near the start of a history cost about what fetching its
// KV costs on a 2-core VM; far into a long history the attention term makes
// recompute much dearer than a fetch, as on real hardware.
//
// MEMORY, all allocated at Create (nothing on the prefill path): weights
// (vocab x hidden + depth x (2 x hidden x head_dim + 2 x hidden x ffn) floats)
// and, per concurrent slot, activations for max_chunk_tokens tokens and K/V
// gathers for max_context_tokens tokens. Describe() prints the arithmetic.
//
// THREADS: Prefill may be called from any number of threads; up to
// `concurrency` run at once (one scratch slot each), further callers wait for
// a slot. OpenBLAS is told to use `blas_threads` threads (process-wide:
// openblas_set_num_threads) at Create.
#ifndef KVFABRIC_CLIENT_SYNTHETIC_TRANSFORMER_H_
#define KVFABRIC_CLIENT_SYNTHETIC_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/host_history.h"
#include "core/model_fingerprint.h"
#include "core/mutex.h"
#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::client {

struct SyntheticTransformerOptions {
  // Block layout of the KV it writes and reads. Required (validated).
  ModelFingerprint model;
  // Residual width. Default 256.
  std::uint32_t hidden = 256;
  // MLP inner width. Default 1024.
  std::uint32_t ffn = 1024;
  // Decoder layers run per token. Default 2; at most model.layer_count.
  std::uint32_t depth = 2;
  // Embedding and LM-head rows. Default 16384.
  std::uint32_t vocab = 16384;
  // Longest history (prefix + new tokens) a call may have. Required.
  std::uint64_t max_context_tokens = 0;
  // Tokens per chunk of a long prompt. Default 2048.
  std::uint32_t max_chunk_tokens = 2048;
  // Keys per attention tile. Default 256.
  std::uint32_t tile_tokens = 256;
  // Prefills that may run at once (scratch slots). Default 2.
  std::uint32_t concurrency = 2;
  // OpenBLAS threads (process-wide). Default 1: loader threads run prefills
  // side by side; 0 leaves OpenBLAS's setting alone.
  std::uint32_t blas_threads = 1;
  std::uint64_t weight_seed = 1;
};

struct PrefillResult {
  // A digest of the final hidden state and the logits: changes when any K/V
  // byte the attention read changes (tests use it; it keeps the work live).
  double checksum = 0;
  // Attention (query, key) pairs evaluated, summed over the decoder layers.
  std::uint64_t attention_pairs = 0;
  // sgemm/sgemv floating-point operations (2 per multiply-add).
  std::uint64_t matmul_flops = 0;
};

class SyntheticTransformer {
 public:
  // InvalidArgument naming the option for a bad model or size (e.g. depth 0
  // or above layer_count, max_context_tokens 0); ResourceExhausted if the
  // weights and scratch cannot be allocated.
  static StatusOr<std::unique_ptr<SyntheticTransformer>> Create(
      const SyntheticTransformerOptions& options);
  ~SyntheticTransformer();
  SyntheticTransformer(const SyntheticTransformer&) = delete;
  SyntheticTransformer& operator=(const SyntheticTransformer&) = delete;

  // Prefills tokens [first_block * tokens_per_block, + token_ids.size()):
  //   prefix      the history's blocks [0, first_block) (at least that many);
  //   token_ids   the new tokens' ids (n = size(), >= 1);
  //   block_seeds one SyntheticKv seed per new block (ceil(n / tpb) of them);
  //   out         the new blocks' payloads back to back (seeds.size() blocks).
  // Writes `out` (rows past the last token zero) and runs the decoder.
  // InvalidArgument (naming the argument) for mismatched sizes or a context
  // longer than max_context_tokens.
  StatusOr<PrefillResult> Prefill(const HostHistory& prefix, std::uint32_t first_block,
                                  std::span<const std::uint32_t> token_ids,
                                  std::span<const std::uint64_t> block_seeds,
                                  std::span<std::byte> out);

  // "synthetic transformer: 2 decoder layers (hidden 256, MLP 1024, 1 head of
  //  128 over model layers 0, 16), vocab 16384; weights 18.5 MiB, scratch
  //  2 x 14.0 MiB; 2.62 MFLOP per token, 512 FLOP per attention pair".
  std::string Describe() const;
  const SyntheticTransformerOptions& options() const { return o_; }

 private:
  struct Slot;
  explicit SyntheticTransformer(const SyntheticTransformerOptions& o);
  Status Allocate();
  Slot* Acquire();
  void Release(Slot* slot);
  void RunChunk(Slot& s, const HostHistory& prefix, std::uint32_t first_block,
                std::span<const std::byte> fresh, std::uint64_t chunk_start, std::uint32_t chunk,
                std::span<const std::uint32_t> ids, PrefillResult* result) const;

  const SyntheticTransformerOptions o_;
  std::uint64_t block_bytes_ = 0;
  std::vector<std::uint32_t> layer_of_;  // decoder layer -> model layer it reads
  // Weights (fp32, row-major).
  std::vector<float> embedding_;             // [vocab, hidden]
  std::vector<std::vector<float>> wq_, wo_;  // [hidden, head_dim], [head_dim, hidden]
  std::vector<std::vector<float>> w1_, w2_;  // [hidden, ffn], [ffn, hidden]
  std::vector<std::unique_ptr<Slot>> slots_;
  Mutex mu_;
  CondVar cv_;
  std::vector<Slot*> free_ KVF_GUARDED_BY(mu_);
};

// A prefill callback for core/recompute_probe.h: Run(n, p) prefills n tokens
// after a prefix of p on `engine` and returns the time in microseconds. The
// prefix is a scratch history of up to 64 distinct blocks (128 MiB at the
// demo's model: beyond the CPU caches, as a real history is) repeated to any
// length. Buffers for n <= max_tokens and p <= max_prefix_tokens are
// allocated at Create. Used by `kvfabric demo`, `kvfabric calibrate
// --prefill-probe synthetic` and the benchmarks.
class SyntheticPrefillProbe {
 public:
  // `engine` is borrowed and must outlive the probe. InvalidArgument for
  // sizes beyond the engine's max_context_tokens.
  static StatusOr<std::unique_ptr<SyntheticPrefillProbe>> Create(SyntheticTransformer* engine,
                                                                 std::uint64_t max_tokens,
                                                                 std::uint64_t max_prefix_tokens);
  StatusOr<double> Run(std::uint64_t tokens, std::uint64_t prefix_tokens);

 private:
  SyntheticPrefillProbe() = default;
  SyntheticTransformer* engine_ = nullptr;
  std::uint64_t block_bytes_ = 0;
  std::vector<std::byte> pages_, out_;
  std::vector<std::uint32_t> table_, ids_;
  std::vector<std::uint64_t> seeds_;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_SYNTHETIC_TRANSFORMER_H_
