#include "client/streaming_attention.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvfabric::client {
namespace {

constexpr std::uint64_t kAlign = 256;

std::uint64_t AlignUp(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
std::string Num(std::uint64_t v) { return std::to_string(v); }

std::uint64_t TokenBytes(const HistoryLayout& l) {
  return std::uint64_t{l.kv_heads} * l.head_dim * KvDtypeSize(l.dtype);
}

// Releases a held lease on every path out of a tile.
class LeaseGuard {
 public:
  LeaseGuard(Stager& stager, const StageLease& lease) : stager_(stager), lease_(lease) {}
  ~LeaseGuard() {
    // A stale lease cannot happen here: the guard holds the only copy.
    stager_.Release(lease_).IgnoreError();
  }
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

 private:
  Stager& stager_;
  StageLease lease_;
};

}  // namespace

std::uint64_t StreamingAttention::ScratchBytes(const HistoryLayout& layout,
                                               const StreamingAttentionOptions& options) {
  const std::uint64_t q = std::uint64_t{options.num_q_heads} * layout.head_dim * 4;
  const std::uint64_t l = std::uint64_t{options.num_q_heads} * 4;
  return AlignUp(q) + 2 * AlignUp(2 * q) + 2 * AlignUp(2 * l);
}

std::uint64_t StreamingAttention::PagesPerBuffer(const HistoryLayout& layout,
                                                 const StreamingAttentionOptions& options,
                                                 std::uint64_t page_bytes) {
  const std::uint64_t bytes = 2 * std::uint64_t{options.tile_tokens} * TokenBytes(layout);
  return page_bytes == 0 ? 0 : (bytes + page_bytes - 1) / page_bytes;
}

StatusOr<std::unique_ptr<StreamingAttention>> StreamingAttention::Create(
    gpu::Device& device, DeviceArena& arena, gpu::DeviceRange scratch, const HistoryLayout& layout,
    const StreamingAttentionOptions& options) {
  const bool dtype_ok = layout.dtype == KvDtype::kFp16 || layout.dtype == KvDtype::kBf16 ||
                        layout.dtype == KvDtype::kFp32;
  if (layout.layers == 0 || layout.tokens_per_block == 0 || layout.kv_heads == 0 ||
      layout.head_dim == 0 || !dtype_ok) {
    return Status::InvalidArgument(
        "streaming attention: layout layers " + Num(layout.layers) + ", tokens_per_block " +
        Num(layout.tokens_per_block) + ", kv_heads " + Num(layout.kv_heads) + ", head_dim " +
        Num(layout.head_dim) + ", dtype " + std::string(KvDtypeName(layout.dtype)) +
        ": each count must be > 0 and the dtype fp16, bf16 or fp32");
  }
  if (options.num_q_heads == 0 || options.num_q_heads % layout.kv_heads != 0) {
    return Status::InvalidArgument("streaming attention: num_q_heads " + Num(options.num_q_heads) +
                                   " is not a positive multiple of " + Num(layout.kv_heads) +
                                   " kv heads");
  }
  if (options.tile_tokens == 0 || options.tile_tokens % layout.tokens_per_block != 0) {
    return Status::InvalidArgument("streaming attention: tile_tokens " + Num(options.tile_tokens) +
                                   " is not a positive multiple of " +
                                   Num(layout.tokens_per_block) + " tokens per block");
  }
  const std::uint64_t layer_bytes = 2 * std::uint64_t{layout.tokens_per_block} * TokenBytes(layout);
  const std::uint64_t payload = layout.layers * layer_bytes;
  if (layout.block_stride != 0 && layout.block_stride < payload) {
    return Status::InvalidArgument("streaming attention: block_stride " + Num(layout.block_stride) +
                                   " < block payload " + Num(payload));
  }
  const std::uint64_t need = ScratchBytes(layout, options);
  if (scratch.bytes < need || scratch.offset % kAlign != 0) {
    return Status::InvalidArgument("streaming attention: scratch [" + Num(scratch.offset) + ", +" +
                                   Num(scratch.bytes) + ") must be 256-byte aligned and hold " +
                                   Num(need) + " bytes (raise --device-scratch-bytes)");
  }
  std::unique_ptr<StreamingAttention> sa(new StreamingAttention(device, layout, options));
  sa->block_stride_ = layout.block_stride != 0 ? layout.block_stride : payload;
  sa->token_bytes_ = TokenBytes(layout);
  sa->layer_bytes_ = layer_bytes;
  sa->compact_slice_bytes_ =
      2 * gpu::CompactHalfBytes(layout.tokens_per_block, layout.kv_heads, layout.head_dim);
  // A compact tile must fit the staging sized for exact tiles (class comment).
  if (sa->compact_slice_bytes_ <= layer_bytes) {
    sa->compact_tile_tokens_ = std::min(options.tile_tokens, gpu::kMaxCompactTileTokens) /
                               layout.tokens_per_block * layout.tokens_per_block;
  }

  StagerOptions so;
  so.buffers = options.staging_buffers;
  so.pages_per_buffer =
      static_cast<std::uint32_t>(PagesPerBuffer(layout, options, arena.page_bytes()));
  so.fences_per_buffer = 2;  // the tile's copy, the tile's attention + merge
  so.fence_timeout = options.fence_timeout;
  KVF_ASSIGN_OR_RETURN(sa->stager_, Stager::Create(device, arena, so));

  const std::uint64_t q_elems = std::uint64_t{options.num_q_heads} * layout.head_dim;
  const std::uint64_t host_floats = 2 * q_elems + options.num_q_heads;
  KVF_ASSIGN_OR_RETURN(sa->host_io_, device.AllocatePinnedHost(host_floats * sizeof(float)));
  float* f = reinterpret_cast<float*>(sa->host_io_->bytes().data());
  sa->query_ = {f, q_elems};
  sa->output_ = {f + q_elems, q_elems};
  sa->lse_ = {f + 2 * q_elems, options.num_q_heads};
  std::fill(f, f + host_floats, 0.0f);

  std::uint64_t at = scratch.offset;
  sa->query_dev_ = {at, q_elems * 4};
  at += AlignUp(q_elems * 4);
  for (int p = 0; p < 2; ++p) {
    sa->states_[p] = {at, 2 * q_elems * 4};
    at += AlignUp(2 * q_elems * 4);
  }
  for (int p = 0; p < 2; ++p) {
    sa->lses_[p] = {at, 2 * std::uint64_t{options.num_q_heads} * 4};
    at += AlignUp(2 * std::uint64_t{options.num_q_heads} * 4);
  }
  KVF_ASSIGN_OR_RETURN(sa->query_copied_, device.CreateEvent());
  KVF_ASSIGN_OR_RETURN(sa->state_ready_, device.CreateEvent());
  KVF_ASSIGN_OR_RETURN(sa->output_copied_, device.CreateEvent());
  return sa;
}

StreamingAttention::StreamingAttention(gpu::Device& device, const HistoryLayout& layout,
                                       const StreamingAttentionOptions& options)
    : device_(device), layout_(layout), options_(options) {}

Status StreamingAttention::EnqueueTileCopies(const HostHistory& history,
                                             std::uint32_t layer, std::uint32_t first_token,
                                             std::uint32_t tokens, gpu::DeviceRange buffer) {
  const std::uint32_t tpb = layout_.tokens_per_block;
  const std::uint64_t v_region = std::uint64_t{options_.tile_tokens} * token_bytes_;
  for (std::uint32_t t = 0; t < tokens; t += tpb) {
    const std::uint64_t block = (first_token + t) / tpb;
    const std::uint64_t rows = std::min<std::uint32_t>(tpb, tokens - t);
    const std::span<const std::byte> b = history.block(static_cast<std::uint32_t>(block));
    const std::uint64_t k_host = layer * layer_bytes_;
    const std::uint64_t v_host = k_host + layer_bytes_ / 2;
    const std::uint64_t dev = buffer.offset + std::uint64_t{t} * token_bytes_;
    KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(b.subspan(k_host, rows * token_bytes_),
                                                 {dev, rows * token_bytes_}));
    KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(b.subspan(v_host, rows * token_bytes_),
                                                 {dev + v_region, rows * token_bytes_}));
  }
  return Status::OK();
}

Status StreamingAttention::EnqueueCompactTileCopies(const HostHistory& history, std::uint32_t layer,
                                                    std::uint32_t first_block, std::uint32_t blocks,
                                                    gpu::DeviceRange buffer) {
  const std::uint64_t slice = compact_slice_bytes_;
  for (std::uint32_t i = 0; i < blocks; ++i) {
    const std::span<const std::byte> b = history.block(first_block + i);
    KVF_RETURN_IF_ERROR(device_.CopyHostToDevice(b.subspan(layer * slice, slice),
                                                 {buffer.offset + i * slice, slice}));
  }
  return Status::OK();
}

StreamingAttention::Tile StreamingAttention::NextTile(const HostHistory& history,
                                                      std::uint32_t first,
                                                      std::uint32_t tokens) const {
  const std::uint32_t tpb = layout_.tokens_per_block;
  const std::uint32_t block = first / tpb;
  const bool compact = history.compact(block);
  std::uint32_t n = std::min(compact ? compact_tile_tokens_ : options_.tile_tokens, tokens - first);
  if (history.compact_flags().empty()) return {n, false};
  for (std::uint32_t t = tpb; t < n; t += tpb) {
    if (history.compact(block + t / tpb) != compact) return {t, compact};
  }
  return {n, compact};
}

Status StreamingAttention::RunTiles(std::uint32_t layer, const HostHistory& history,
                                    std::uint32_t tokens, float scale, std::uint32_t* pair) {
  const std::uint64_t q_bytes = query_dev_.bytes;
  const std::uint64_t l_bytes = std::uint64_t{options_.num_q_heads} * 4;
  std::uint32_t p = 0;
  gpu::AttentionTileArgs tile;
  tile.shape = {options_.num_q_heads, layout_.kv_heads, layout_.head_dim, layout_.dtype};
  tile.scale = scale;
  tile.query = query_dev_;
  gpu::CompactAttentionTileArgs compact;
  compact.shape = {options_.num_q_heads, layout_.kv_heads, layout_.head_dim, KvDtype::kInt8};
  compact.scale = scale;
  compact.block_tokens = layout_.tokens_per_block;
  compact.query = query_dev_;
  gpu::MergeStatesArgs merge;
  merge.num_states = 2;
  merge.num_heads = options_.num_q_heads;
  merge.head_dim = layout_.head_dim;

  if (tokens == 0) {
    tile.tokens = 0;
    tile.keys = tile.values = {query_dev_.offset, 0};
    tile.output = {states_[0].offset, q_bytes};
    tile.lse = {lses_[0].offset, l_bytes};
    KVF_RETURN_IF_ERROR(device_.DecodeAttentionTile(tile));
  }
  for (std::uint32_t first = 0; first < tokens;) {
    const Tile next = NextTile(history, first, tokens);
    const std::uint32_t n = next.tokens;
    KVF_ASSIGN_OR_RETURN(const StageLease lease, stager_->Acquire());
    LeaseGuard guard(*stager_, lease);
    if (next.compact) {
      KVF_RETURN_IF_ERROR(EnqueueCompactTileCopies(history, layer, first / layout_.tokens_per_block,
                                                   n / layout_.tokens_per_block, lease.range));
    } else {
      KVF_RETURN_IF_ERROR(EnqueueTileCopies(history, layer, first, n, lease.range));
    }
    KVF_ASSIGN_OR_RETURN(const gpu::Event* copied,
                         stager_->RecordUse(lease, gpu::Queue::kHostToDevice));
    KVF_RETURN_IF_ERROR(device_.QueueWaitEvent(gpu::Queue::kCompute, *copied));
    // The first tile becomes the running state (slot 0 of pair p); every later
    // tile lands in slot 1 and pair p merges into slot 0 of the other pair.
    const std::uint64_t slot = first == 0 ? 0 : 1;
    const gpu::DeviceRange output{states_[p].offset + slot * q_bytes, q_bytes};
    const gpu::DeviceRange lse{lses_[p].offset + slot * l_bytes, l_bytes};
    if (next.compact) {
      compact.blocks = n / layout_.tokens_per_block;
      compact.slices = {lease.range.offset, compact.blocks * compact_slice_bytes_};
      compact.output = output;
      compact.lse = lse;
      KVF_RETURN_IF_ERROR(device_.DecodeAttentionCompactTile(compact));
    } else {
      tile.tokens = n;
      tile.keys = {lease.range.offset, std::uint64_t{n} * token_bytes_};
      tile.values = {lease.range.offset + std::uint64_t{options_.tile_tokens} * token_bytes_,
                     std::uint64_t{n} * token_bytes_};
      tile.output = output;
      tile.lse = lse;
      KVF_RETURN_IF_ERROR(device_.DecodeAttentionTile(tile));
    }
    if (slot == 1) {
      merge.outputs = states_[p];
      merge.lses = lses_[p];
      merge.output = {states_[1 - p].offset, q_bytes};
      merge.lse = {lses_[1 - p].offset, l_bytes};
      KVF_RETURN_IF_ERROR(device_.MergeAttentionStates(merge));
      p = 1 - p;
    }
    KVF_RETURN_IF_ERROR(stager_->RecordUse(lease, gpu::Queue::kCompute).status());
    first += n;
  }
  *pair = p;
  return Status::OK();
}

Status StreamingAttention::Decode(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                                  std::uint64_t host_generation,
                                  const gpu::PinnedHostBuffer& history, std::uint32_t tokens,
                                  float scale) {
  const std::span<const std::byte> bytes = history.bytes();
  const std::uint64_t blocks =
      (std::uint64_t{tokens} + layout_.tokens_per_block - 1) / layout_.tokens_per_block;
  const std::uint64_t needed =
      blocks == 0 ? 0 : (blocks - 1) * block_stride_ + layout_.layers * layer_bytes_;
  if (layer >= layout_.layers || bytes.size() < needed) {
    return Status::InvalidArgument("streaming attention: layer " + Num(layer) + " of " +
                                   Num(layout_.layers) + ", " + Num(tokens) +
                                   " tokens need a history of " + Num(needed) + " bytes, have " +
                                   Num(bytes.size()));
  }
  return Decode(owner, layer, step, host_generation,
                HostHistory::Contiguous(bytes.data(), static_cast<std::uint32_t>(blocks),
                                        block_stride_),
                tokens, scale);
}

Status StreamingAttention::CheckCompactBlocks(const HostHistory& history,
                                              std::uint32_t tokens) const {
  const std::span<const std::uint8_t> flags = history.compact_flags();
  if (flags.empty()) return Status::OK();
  const std::uint32_t tpb = layout_.tokens_per_block;
  const std::uint64_t blocks = (std::uint64_t{tokens} + tpb - 1) / tpb;
  if (flags.size() < blocks) {
    return Status::InvalidArgument("streaming attention: " + Num(flags.size()) +
                                   " compact flags for the " + Num(blocks) + " blocks of " +
                                   Num(tokens) + " tokens (one flag per block)");
  }
  const auto first_compact =
      std::find_if(flags.begin(), flags.begin() + blocks, [](std::uint8_t f) { return f != 0; });
  if (first_compact == flags.begin() + blocks) return Status::OK();
  if (compact_tile_tokens_ == 0) {
    return Status::InvalidArgument(
        "streaming attention: block " + Num(first_compact - flags.begin()) +
        " is compact, but this layout cannot decode compact blocks: a compact layer slice of " +
        Num(compact_slice_bytes_) + " bytes must fit the exact slice of " + Num(layer_bytes_) +
        " bytes (the staging is sized for exact tiles) and tokens_per_block " + Num(tpb) +
        " must be <= " + Num(gpu::kMaxCompactTileTokens));
  }
  if (tokens % tpb != 0 && flags[blocks - 1] != 0) {
    return Status::InvalidArgument("streaming attention: block " + Num(blocks - 1) +
                                   " is compact but only " + Num(tokens % tpb) + " of its " +
                                   Num(tpb) + " tokens are attended: compact blocks are full");
  }
  return Status::OK();
}

Status StreamingAttention::Decode(std::uint64_t owner, std::uint32_t layer, std::uint64_t step,
                                  std::uint64_t host_generation, const HostHistory& history,
                                  std::uint32_t tokens, float scale) {
  const std::uint64_t blocks =
      (std::uint64_t{tokens} + layout_.tokens_per_block - 1) / layout_.tokens_per_block;
  if (layer >= layout_.layers || history.blocks() < blocks) {
    return Status::InvalidArgument("streaming attention: layer " + Num(layer) + " of " +
                                   Num(layout_.layers) + ", " + Num(tokens) + " tokens need " +
                                   Num(blocks) + " blocks, the history has " +
                                   Num(history.blocks()));
  }
  KVF_RETURN_IF_ERROR(CheckCompactBlocks(history, tokens));
  KVF_RETURN_IF_ERROR(stager_->BeginStage(owner, layer, step, host_generation));
  std::uint32_t pair = 0;
  Status s = device_.CopyHostToDevice(std::as_bytes(std::span<const float>(query_)), query_dev_);
  if (s.ok()) s = device_.Record(*query_copied_, gpu::Queue::kHostToDevice);
  if (s.ok()) s = device_.QueueWaitEvent(gpu::Queue::kCompute, *query_copied_);
  if (s.ok()) s = RunTiles(layer, history, tokens, scale, &pair);
  if (s.ok()) s = device_.Record(*state_ready_, gpu::Queue::kCompute);
  if (s.ok()) s = device_.QueueWaitEvent(gpu::Queue::kDeviceToHost, *state_ready_);
  if (s.ok()) {
    s = device_.CopyDeviceToHost({states_[pair].offset, query_dev_.bytes},
                                 std::as_writable_bytes(output_));
  }
  if (s.ok()) {
    s = device_.CopyDeviceToHost({lses_[pair].offset, lse_.size_bytes()},
                                 std::as_writable_bytes(lse_));
  }
  if (s.ok()) s = device_.Record(*output_copied_, gpu::Queue::kDeviceToHost);
  if (s.ok()) {
    s = output_copied_->Wait(std::chrono::steady_clock::now() + options_.fence_timeout);
    if (!s.ok()) stager_->EnterQuarantine(s);
  }
  // Every lease was released by its guard, so the stage seals.
  Status sealed = stager_->Seal();
  return s.ok() ? sealed : s;
}

}  // namespace kvfabric::client
