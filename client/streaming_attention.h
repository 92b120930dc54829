// StreamingAttention: decode attention for one context and layer over a
// history that lives in host memory and may be far larger than the device
// arena, streamed tile by tile through a bounded set of staging buffers.
//
// The history is a pinned host buffer of block payloads back to back (block b
// at b * block_stride), or a HostHistory (client/host_history.h) whose blocks
// lie anywhere, each laid out as docs/block-format.md says: layer-major, each
// layer's K then V, token-major [tokens_per_block, kv_heads, head_dim]. The
// last block may be partly filled (tokens % tokens_per_block valid rows). A
// HostHistory may flag blocks compact (HostHistory::WithCompact): such a
// block holds its compact_int8 payload instead (docs/compact.md: layer l's
// slice, K half then V half of CompactHalfBytes each, at l * 2 *
// CompactHalfBytes); compact blocks are full blocks.
//
// Tiles: consecutive blocks of one representation, in token order. From a
// tile's first block, a tile takes the following blocks while they have the
// same representation, up to a cap: tile_tokens tokens for an exact tile
// (the last of the history may be shorter), and for a compact tile
// min(tile_tokens, kMaxCompactTileTokens) rounded down to whole blocks. So a
// tile is cut where the representation changes, and an unflagged history is
// cut exactly as before flags existed.
//
// Decode(), per step:
//   1. copies the query (written by the caller into query()) to the device;
//   2. for each tile, in token order: leases a staging buffer
//      (client/stage_lease.h: the lease is granted only after a finished wait
//      on the buffer's previous fences), copies the tile host->device block
//      by block and records a fence, makes the compute queue wait for it on
//      the device (QueueWaitEvent, the host does not block), runs the tile's
//      kernel and folds the tile into the running state with a 2-state
//      MergeAttentionStates (running state first), and records a fence. An
//      exact tile copies each block's K and V rows of the layer (K at the
//      buffer's start, V tile_tokens rows further) and runs
//      DecodeAttentionTile; a compact tile copies each block's layer slice (2
//      x CompactHalfBytes, one copy per block) back to back and runs
//      DecodeAttentionCompactTile, whose state merges like any tile's.
//      With two buffers the copy of tile i+1 overlaps the attention of tile i;
//   3. copies the merged output and LSE back to output()/lse() and waits.
// The fold is the one gpu/kernels/reference_attention.h's TiledAttentionHost
// uses, so an all-exact result is bit-identical to fully resident tiled
// attention over the same tile order; on the CPU device a mixed result is
// bit-identical to the same fold on the host with
// DecodeAttentionCompactInt8Blocks for compact tiles and
// cpu_kernels::DecodeAttentionTile for exact ones (streaming_attention_test).
//
// Staging: buffers are sized for exact tiles (PagesPerBuffer: 2 x tile_tokens
// token rows). A compact tile of n blocks copies n x 2 x CompactHalfBytes
// bytes, no more than an exact tile of n blocks, because Decode accepts
// compact blocks only where a compact layer slice is no larger than an exact
// one (2 x CompactHalfBytes(tokens_per_block, kv_heads, head_dim) <= 2 x
// tokens_per_block x kv_heads x head_dim x dtype size; e.g. 36 KiB against
// 64 KiB for fp16, 16 tokens, 8 x 128). Only degenerate blocks fail it (fp16
// or bf16 with one token per block), where a compact copy saves nothing. So
// the existing buffers suffice; nothing is sized for compact tiles.
//
// Device memory: the staging buffers (DeviceArena staging pages, reserved at
// Create) and a scratch range the caller carves out of DeviceArena::scratch()
// (ScratchBytes() says how much): query, and two ping-pong pairs of
// [running state, tile state]. Nothing else; the arena's pool is untouched.
//
// After Create, Decode allocates nothing (no heap, no log line) on success.
//
// Failure: an unknown fence outcome (a wait timing out or a device error)
// quarantines the Stager; Decode then returns FailedPrecondition until
// Drain() proves every copy finished.
//
// Ownership: borrows the Device and the DeviceArena (both outlive it); owns its
// Stager, events and pinned query/output buffer. Threads: one thread drives
// an instance (the decode thread of its layer stream).
#ifndef KVFABRIC_CLIENT_STREAMING_ATTENTION_H_
#define KVFABRIC_CLIENT_STREAMING_ATTENTION_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "client/device_arena.h"
#include "client/host_history.h"
#include "client/stage_lease.h"
#include "core/model_fingerprint.h"
#include "core/status.h"
#include "core/statusor.h"
#include "gpu/device.h"
#include "gpu/kernel_args.h"

namespace kvfabric::client {

// The shape of a host history: a ModelFingerprint's block geometry.
struct HistoryLayout {
  std::uint32_t layers = 0;  // layers per block (the layer group)
  std::uint32_t tokens_per_block = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  KvDtype dtype = KvDtype::kFp16;  // fp16, bf16 or fp32
  // Bytes from one block's payload to the next; 0 means the payload size
  // (payloads back to back, no headers between them).
  std::uint64_t block_stride = 0;
};

struct StreamingAttentionOptions {
  // Query heads: a multiple of kv_heads (grouped-query attention).
  std::uint32_t num_q_heads = 0;
  // Tokens per tile: a multiple of tokens_per_block. No default. Larger tiles
  // mean fewer kernel launches and merges, more staging pages per buffer.
  std::uint32_t tile_tokens = 0;
  // Staging buffers. Default 2 (double-buffered).
  std::uint32_t staging_buffers = 2;
  // How long a fence or the final output wait may take before its outcome is
  // unknown (quarantine). Default 10 s.
  std::chrono::microseconds fence_timeout = std::chrono::seconds(10);
};

class StreamingAttention {
 public:
  // Device scratch bytes Create needs for these options (query and the two
  // state pairs, each 256-byte aligned).
  static std::uint64_t ScratchBytes(const HistoryLayout& layout,
                                    const StreamingAttentionOptions& options);
  // Staging pages per buffer for these options and a page size.
  static std::uint64_t PagesPerBuffer(const HistoryLayout& layout,
                                      const StreamingAttentionOptions& options,
                                      std::uint64_t page_bytes);

  // InvalidArgument for a bad layout or options (naming the field), or a
  // `scratch` range smaller than ScratchBytes; ResourceExhausted when the arena
  // has too few staging pages.
  static StatusOr<std::unique_ptr<StreamingAttention>> Create(
      gpu::Device& device, DeviceArena& arena, gpu::DeviceRange scratch,
      const HistoryLayout& layout, const StreamingAttentionOptions& options);

  StreamingAttention(const StreamingAttention&) = delete;
  StreamingAttention& operator=(const StreamingAttention&) = delete;

  // Pinned host memory: write the query ([num_q_heads, head_dim] fp32) here
  // before Decode; read the result after it returns OK.
  std::span<float> query() { return query_; }
  std::span<const float> output() const { return output_; }
  std::span<const float> lse() const { return lse_; }

  // Attention of query() over tokens [0, tokens) of `layer` in `history`
  // (see the class comment). `host_generation` is the host pages' generation
  // (carried by the stage leases). InvalidArgument when `history` is too short
  // for `tokens` or `layer` is out of range; FailedPrecondition in quarantine;
  // DeadlineExceeded / Internal (and quarantine) when a wait fails.
  Status Decode(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                std::uint64_t host_generation, const gpu::PinnedHostBuffer& history,
                std::uint32_t tokens, float scale);
  // The same over a history whose blocks may lie anywhere in pinned host
  // memory (the pages of the client's history pool), some of them compact.
  // Also InvalidArgument, before anything is enqueued, when the history has
  // flags but fewer than the blocks of `tokens`, when a block is compact and
  // this layout cannot decode compact blocks (see Staging above;
  // tokens_per_block > kMaxCompactTileTokens also), or when the partly
  // attended last block is compact.
  Status Decode(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                std::uint64_t host_generation, const HostHistory& history, std::uint32_t tokens,
                float scale);

  // See Stager::Drain.
  Status Drain(gpu::Deadline deadline) { return stager_->Drain(deadline); }
  const Stager& stager() const { return *stager_; }

 private:
  StreamingAttention(gpu::Device& device, const HistoryLayout& layout,
                     const StreamingAttentionOptions& options);
  // Enqueues the tiles; *pair is the state pair whose slot 0 holds the result.
  Status RunTiles(std::uint32_t layer, const HostHistory& history, std::uint32_t tokens,
                  float scale, std::uint32_t* pair);
  Status EnqueueTileCopies(const HostHistory& history, std::uint32_t layer,
                           std::uint32_t first_token, std::uint32_t tokens,
                           gpu::DeviceRange buffer);
  // Block [first_block, first_block + blocks)'s slice of `layer`, back to back.
  Status EnqueueCompactTileCopies(const HostHistory& history, std::uint32_t layer,
                                  std::uint32_t first_block, std::uint32_t blocks,
                                  gpu::DeviceRange buffer);
  struct Tile {
    std::uint32_t tokens;
    bool compact;
  };
  // The tile that starts at token `first` (a block boundary; see Tiles).
  Tile NextTile(const HostHistory& history, std::uint32_t first, std::uint32_t tokens) const;
  // Decode's checks of the compact flags (see Decode). Allocates only on error.
  Status CheckCompactBlocks(const HostHistory& history, std::uint32_t tokens) const;

  gpu::Device& device_;
  const HistoryLayout layout_;
  const StreamingAttentionOptions options_;
  std::uint64_t block_stride_ = 0;
  std::uint64_t token_bytes_ = 0;  // one token's K (or V) row in one layer
  std::uint64_t layer_bytes_ = 0;  // one layer of one block, K and V
  std::uint64_t compact_slice_bytes_ = 0;  // one layer of one compact block, 2 halves
  std::uint32_t compact_tile_tokens_ = 0;  // a compact tile's cap; 0: compact refused
  std::unique_ptr<Stager> stager_;
  std::unique_ptr<gpu::PinnedHostBuffer> host_io_;
  std::span<float> query_, output_, lse_;
  gpu::DeviceRange query_dev_;
  gpu::DeviceRange states_[2];  // [2, num_q_heads, head_dim] fp32: running, tile
  gpu::DeviceRange lses_[2];    // [2, num_q_heads] fp32
  std::unique_ptr<gpu::Event> query_copied_, state_ready_, output_copied_;
};

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_STREAMING_ATTENTION_H_
