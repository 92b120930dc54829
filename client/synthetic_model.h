// A synthetic model for `kvfabric demo` and end-to-end tests: deterministic
// KV "prefill" and the fully resident reference attention a streamed result
// must equal bit for bit.
//
// SyntheticKv fills a block payload (docs/block-format.md layout: layer-major,
// each layer's K then V, token-major [tokens_per_block, kv_heads, head_dim])
// from a 64-bit seed with values of magnitude in [1/16, 1) and random sign,
// built directly as fp16 / bf16 / fp32 bit patterns (no rounding involved,
// so every machine produces the same bytes). Callers derive the seed from the
// block's key, so a block's KV is a function of its whole prefix, as a real
// model's is. Rows past `valid_tokens` (a partial last block) are zero.
//
// ResidentAttention gathers layer `layer`'s K and V of the first `tokens`
// tokens of a history (block payloads back to back) and runs
// gpu::TiledAttentionHost with scale 1/sqrt(head_dim): what
// Client::Attend must reproduce exactly with the same tile size.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_CLIENT_SYNTHETIC_MODEL_H_
#define KVFABRIC_CLIENT_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <span>

#include "client/host_history.h"
#include "core/block_key.h"
#include "core/model_fingerprint.h"
#include "core/status.h"

namespace kvfabric::client {

// The next value of a SplitMix64 stream (advances `state`): the generator
// behind seeds and the synthetic transformer's weights.
std::uint64_t NextSplitMix64(std::uint64_t& state);

// A block's seed from its key (the first 8 bytes mixed with `salt`).
std::uint64_t SeedFromKey(const BlockKey& key, std::uint64_t salt);

// InvalidArgument if `out` is not one block of `model` or the dtype is not
// fp16, bf16 or fp32.
Status SyntheticKv(const ModelFingerprint& model, std::uint64_t seed, std::uint32_t valid_tokens,
                   std::span<std::byte> out);

// q [num_q_heads * head_dim], out likewise, lse [num_q_heads].
// InvalidArgument for a history shorter than `tokens` or bad sizes.
Status ResidentAttention(const ModelFingerprint& model, std::uint32_t num_q_heads,
                         std::uint32_t tile_tokens, std::span<const std::byte> history,
                         std::uint32_t tokens, std::uint32_t layer, std::span<const float> q,
                         std::span<float> out, std::span<float> lse);
// The same over a history whose blocks may lie anywhere (Client::History).
Status ResidentAttention(const ModelFingerprint& model, std::uint32_t num_q_heads,
                         std::uint32_t tile_tokens, const HostHistory& history,
                         std::uint32_t tokens, std::uint32_t layer, std::span<const float> q,
                         std::span<float> out, std::span<float> lse);

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_SYNTHETIC_MODEL_H_
