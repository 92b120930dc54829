#include "client/kvfabric_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "core/secure_random.h"
#include "core/socket_address.h"
#include "gpu/kernels/compact_int8.h"
#include "proto/model_proto.h"
#include "transport/data_transport.h"

namespace kvfabric::client {
namespace {

std::uint32_t CeilDiv(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

}  // namespace

// ---------------------------------------------------------------- Impl: set-up

Status Client::Impl::Init() {
  if (o_.placement_address.empty()) {
    return Status::InvalidArgument("client: placement_address (--placement-address) is empty");
  }
  if (o_.device == nullptr) return Status::InvalidArgument("client: no device given");
  if (o_.prefill && !RecomputeParametersValid(*o_.prefill)) {
    return Status::InvalidArgument(
        "client: prefill constants (ClientOptions::prefill) c0, c1, c2, c3 must be finite and "
        ">= 0 and split_serial_fraction in [0, 1]; got " +
        FormatRecomputeModel(*o_.prefill) +
        ", s = " + std::to_string(o_.prefill->split_serial_fraction));
  }
  if (!o_.recompute) {
    return Status::InvalidArgument("client: no recompute function (the engine's prefill)");
  }
  KVF_RETURN_IF_ERROR(o_.model.Validate().WithContext("client: model"));
  // Keys of unequal K and V heads are computed, but the history, the block
  // format and attention hold equal halves.
  KVF_RETURN_IF_ERROR(o_.model.RequireEqualKvHalves().WithContext("client: model"));
  KVF_RETURN_IF_ERROR(
      transport::ValidateDataTransportKind(o_.data_transport, "client: data_transport"));
  if (o_.num_q_heads == 0 || o_.num_q_heads % o_.model.kv_heads != 0) {
    return Status::InvalidArgument("client: num_q_heads (--num-q-heads) " +
                                   std::to_string(o_.num_q_heads) +
                                   " must be a positive multiple of kv_heads " +
                                   std::to_string(o_.model.kv_heads));
  }
  if (o_.tile_tokens == 0 || o_.tile_tokens % o_.model.tokens_per_block != 0) {
    return Status::InvalidArgument("client: tile_tokens (--tile-tokens) " +
                                   std::to_string(o_.tile_tokens) +
                                   " must be a positive multiple of tokens_per_block " +
                                   std::to_string(o_.model.tokens_per_block));
  }
  KVF_ASSIGN_OR_RETURN(block_bytes_, o_.model.BlockBytes());
  if (o_.staging_bytes < block_bytes_) {
    return Status::InvalidArgument("client: staging_bytes (--client-staging-bytes) " +
                                   std::to_string(o_.staging_bytes) + " must hold one block of " +
                                   std::to_string(block_bytes_) + " bytes (write-back)");
  }
  // Blocks per write-back batch (one Place call): through staging, what it
  // holds (at most 16); with kStore, about kStoreBatchBytes, sent as kStores
  // of 8 blocks all in flight at once.
  save_batch_ = static_cast<std::size_t>(
      o_.store_by_key
          ? std::clamp<std::uint64_t>(kStoreBatchBytes / block_bytes_, wire::kMaxStoreKeys, 64)
          : std::min<std::uint64_t>(16, o_.staging_bytes / block_bytes_));
  fetch_batch_ = static_cast<std::size_t>(
      std::clamp<std::uint64_t>(kFetchRequestBytes / block_bytes_, 1, wire::kMaxFetchKeys));
  {
    const std::uint32_t layers = o_.model.layer_count;
    layer_bytes_ = block_bytes_ / layers;
    fetch_groups_.clear();
    if (layers == 1) {
      fetch_groups_.push_back({0, 0});
    } else {
      layered_batch_ = static_cast<std::size_t>(
          std::clamp<std::uint64_t>(kFetchPinBytes / block_bytes_, 1, wire::kMaxFetchKeys));
      const auto per_group = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(
          kFetchRequestBytes / (layered_batch_ * layer_bytes_), 1, layers - 1));
      fetch_groups_.push_back({0, 1});
      for (std::uint32_t l = 1; l < layers; l += per_group) {
        fetch_groups_.push_back({l, std::min(per_group, layers - l)});
      }
    }
  }
  if (o_.save_threads < 1 || o_.save_threads > 8) {
    return Status::InvalidArgument("client: save_threads " + std::to_string(o_.save_threads) +
                                   " must be 1..8");
  }
  if (o_.fetch_depth < 1 || o_.fetch_depth > 64) {
    return Status::InvalidArgument("client: fetch_depth (--client-fetch-depth) " +
                                   std::to_string(o_.fetch_depth) + " must be 1..64");
  }
  if (!(o_.straggler_factor == 0 ||
        (std::isfinite(o_.straggler_factor) && o_.straggler_factor >= 1.5)) ||
      o_.straggler_slack.count() < 0) {
    return Status::InvalidArgument("client: straggler_factor " +
                                   std::to_string(o_.straggler_factor) +
                                   " must be 0 (off) or finite and >= 1.5, and straggler_slack "
                                   ">= 0");
  }
  if (o_.rpc_timeout.count() <= 0 || o_.transfer_timeout.count() <= 0) {
    return Status::InvalidArgument("client: rpc_timeout and transfer_timeout must be positive");
  }
  if (o_.compact_extra_decode_us_per_token &&
      (!std::isfinite(*o_.compact_extra_decode_us_per_token) ||
       *o_.compact_extra_decode_us_per_token < 0)) {
    return Status::InvalidArgument(
        "client: compact_extra_decode_us_per_token (--client-compact-extra-decode-us) must be "
        "finite and >= 0");
  }
  // The compact_int8 copy of a block (docs/compact.md): only for the dtypes the
  // codec takes, and only when smaller than the block (daemons make no other).
  compact_bytes_ = 0;
  if (o_.model.dtype == KvDtype::kFp16 || o_.model.dtype == KvDtype::kBf16 ||
      o_.model.dtype == KvDtype::kFp32) {
    const std::uint64_t bytes = gpu::CompactPayloadBytes(
        o_.model.layer_count, o_.model.tokens_per_block, o_.model.kv_heads, o_.model.head_dim);
    if (bytes < block_bytes_) compact_bytes_ = bytes;
  }
  ProbeCompactDecode();

  KVF_ASSIGN_OR_RETURN(BlockKeyer keyer, BlockKeyer::Create(Namespace{o_.namespace_name}, o_.model));
  keyer_ = std::make_unique<BlockKeyer>(std::move(keyer));
  KVF_ASSIGN_OR_RETURN(const FingerprintDigest digest, o_.model.Digest());
  fingerprint_digest_.assign(reinterpret_cast<const char*>(digest.data()), digest.size());
  FingerprintToProto(o_.model, &fingerprint_);
  client_node_ = o_.client_node;
  if (client_node_.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    client_node_ = name;
  }

  // The device working set: attention's staging buffers and scratch.
  layout_.layers = o_.model.layer_count;
  layout_.tokens_per_block = o_.model.tokens_per_block;
  layout_.kv_heads = o_.model.kv_heads;
  layout_.head_dim = o_.model.head_dim;
  layout_.dtype = o_.model.dtype;
  StreamingAttentionOptions ao;
  ao.num_q_heads = o_.num_q_heads;
  ao.tile_tokens = o_.tile_tokens;
  DeviceArenaOptions arena = o_.arena;
  if (arena.page_bytes == 0) {
    arena.page_bytes = std::uint64_t{o_.tile_tokens} * o_.model.kv_heads * o_.model.head_dim *
                       KvDtypeSize(o_.model.dtype) * 2;
  }
  const std::uint64_t per_buffer = StreamingAttention::PagesPerBuffer(layout_, ao, arena.page_bytes);
  if (arena.staging_pages == 0) {
    arena.staging_pages = static_cast<std::uint32_t>(per_buffer * ao.staging_buffers);
  }
  if (arena.context_floor_pages == 0) arena.context_floor_pages = 1 + arena.hot_newest_pages;
  arena.scratch_bytes = std::max(arena.scratch_bytes, StreamingAttention::ScratchBytes(layout_, ao));
  arena_options_ = arena;
  KVF_ASSIGN_OR_RETURN(arena_, DeviceArena::Create(o_.device->arena_bytes(), arena));
  const std::string pool_setting = o_.history_pool_setting.empty()
                                       ? "history_pool_bytes (--client-history-pool-bytes)"
                                       : o_.history_pool_setting;
  if (o_.history_pool_bytes == 0) {
    return Status::InvalidArgument(
        "client: " + pool_setting + " is 0; the history pool is "
        "sized explicitly: at least one block of " + std::to_string(block_bytes_) +
        " bytes, a history of T tokens takes ceil(T / " +
        std::to_string(o_.model.tokens_per_block) + ") blocks");
  }
  HistoryPoolOptions hp;
  hp.pool_bytes = o_.history_pool_bytes;
  hp.block_bytes = block_bytes_;
  hp.tokens_per_block = o_.model.tokens_per_block;
  hp.max_context_tokens = o_.max_context_tokens;
  hp.setting = pool_setting;
  // The data plane first: the history pool lives in its memory where daemons
  // on this host can copy into it directly.
  KVF_RETURN_IF_ERROR(OpenDataPlane(hp));
  if (o_.model.layer_count > 1) {
    // Touched now, so the fault path that uses it takes no page faults.
    MutexLock l(&scratch_mu_);
    recompute_scratch_ = std::make_unique<std::byte[]>(block_bytes_);
    std::memset(recompute_scratch_.get(), 0, block_bytes_);
    Log().info(
        "kvfabric client: + {} bytes (one block) of recompute scratch for blocks that fall back "
        "after some of their layers landed",
        block_bytes_);
  }
  KVF_ASSIGN_OR_RETURN(attention_, StreamingAttention::Create(*o_.device, *arena_,
                                                              arena_->scratch(), layout_, ao));
  Log().info("kvfabric client: {}", arena_->DescribeLayout());

  // Placement: it must answer before Open succeeds.
  KVF_ASSIGN_OR_RETURN(
      placement_addresses_,
      SplitAddressList(o_.placement_address, "client: placement_address (--placement-address)", 8));
  KVF_RETURN_IF_ERROR(ValidateClientSecurity(o_.security, o_.placement_address)
                          .WithContext("client: security (ClientOptions::security)"));
  for (const std::string& a : placement_addresses_) {
    StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel(a, o_.security);
    if (!channel.ok()) return channel.status().WithContext("client: placement " + a);
    placement_stubs_.push_back(v1::Placement::NewStub(*channel));
  }
  {
    MutexLock l(&placement_mu_);
    placement_state_.resize(placement_addresses_.size());
    // Each client its own jitter sequence: with one fixed seed every engine
    // cut off at the same moment drew the same factors and came back at the
    // same moment (xorshift needs a nonzero state).
    placement_jitter_ = SecureRandomU64() | 1;
  }
  // One replica must answer before Open succeeds.
  {
    v1::HealthResponse resp;
    const grpc::Status g = CallPlacement([&](v1::Placement::Stub* stub, grpc::ClientContext* ctx) {
      return stub->Health(ctx, v1::HealthRequest(), &resp);
    });
    if (!g.ok()) {
      return Status::Unavailable("client: placement at " + o_.placement_address +
                                 " (--placement-address) does not answer: " + g.error_message());
    }
  }

  prom_ = std::make_shared<ClientPrometheus>([this] {
    ClientPrometheus::Snapshot s;
    s.client = metrics();
    s.arena = arena_->metrics();
    s.block_bytes = block_bytes_;
    return s;
  });
  if (!o_.metrics_address.empty()) {
    KVF_ASSIGN_OR_RETURN(metrics_server_,
                         metrics::MetricsServer::Start(o_.metrics_address, {prom_}));
    Log().info("kvfabric client: metrics at {}", metrics_server_->url());
  }
  // Several savers pipeline write-back: one batch's Place call overlaps
  // another's kStores. The Reserve/kPut/Commit path copies each batch into
  // the one staging region, so it keeps one.
  const std::uint32_t savers = o_.store_by_key ? o_.save_threads : 1;
  for (std::uint32_t i = 0; i < savers; ++i) savers_.emplace_back([this] { SaverLoop(); });
  if (o_.connect_at_open) connector_ = std::thread([this] { ConnectAll(); });
  return Status::OK();
}

void Client::Impl::ConnectAll() {
  const auto start = Clock::now();
  v1::ListHostsResponse resp;
  const grpc::Status g = CallPlacement([&](v1::Placement::Stub* stub, grpc::ClientContext* ctx) {
    return stub->ListHosts(ctx, v1::ListHostsRequest(), &resp);
  });
  if (!g.ok()) {
    Log().info("kvfabric client: no daemon connected at open: placement ListHosts: {}",
               g.error_message());
    return;
  }
  int tried = 0;
  int connected = 0;
  for (const v1::HostStatus& h : resp.hosts()) {
    if (closing_.load(std::memory_order_relaxed) || tried == kMaxDaemonsConnectedAtOpen) break;
    if (h.status() != v1::SERVING_STATUS_SERVING) continue;
    ++tried;
    const MatchResult::Host host{h.host().host_id(), h.host().grpc_address(),
                                 h.host().transport_address()};
    StatusOr<std::shared_ptr<Daemon>> d = GetDaemon(host);
    if (d.ok()) {
      ++connected;
    } else {
      Log().info("kvfabric client: daemon {} not connected at open (connected on first use): {}",
                 host.host_id, d.status().ToString());
    }
  }
  Log().info("kvfabric client: connected to {} of {} serving daemons at open in {:.1f} ms",
             connected, tried, internal::MicrosSince(start) / 1e3);
}

Client::Impl::~Impl() {
  Close().IgnoreError();
  metrics_server_.reset();
  if (prom_) prom_->Detach();  // an engine may hold it longer than this client
  // Sessions, then the data plane, then the transport they borrow.
  std::map<std::string, std::shared_ptr<DaemonSlot>> daemons;
  {
    MutexLock l(&daemons_mu_);
    daemons.swap(daemons_);
  }
  daemons.clear();
  data_.reset();
  staging_.reset();
  // A pool in the transport's memory goes first (unpinned, then freed with
  // the region); a registered pool after its registration.
  if (history_in_transport_) history_pool_.reset();
  history_region_.reset();
  transport_.reset();
}

Status Client::Impl::Close() {
  std::vector<ContextId> ids;
  {
    MutexLock l(&mu_);
    if (closed_) return Status::OK();
    closed_ = true;
    for (const auto& [id, c] : contexts_) ids.push_back(id);
  }
  closing_.store(true, std::memory_order_relaxed);
  if (connector_.joinable()) connector_.join();
  Status first;
  for (ContextId id : ids) {
    ContextReport report;
    Status s = Finish(id, &report);
    if (!s.ok() && first.ok()) first = s;
  }
  {
    MutexLock l(&save_mu_);
    save_stop_ = true;
  }
  save_cv_.NotifyAll();
  for (std::thread& t : savers_) t.join();
  savers_.clear();
  return first;
}

StatusOr<std::vector<BlockKey>> Client::Impl::KeyTokens(
    std::span<const std::uint32_t> tokens) const {
  return keyer_->KeyBlocks(kRootParentKey, tokens);
}

StatusOr<std::shared_ptr<Context>> Client::Impl::Find(ContextId id) const {
  MutexLock l(&mu_);
  auto it = contexts_.find(id);
  if (it == contexts_.end()) {
    return Status::NotFound("client: no context " + std::to_string(id) +
                            " (never created, or finished)");
  }
  return it->second;
}

// ---------------------------------------------------------------- contexts

StatusOr<ContextId> Client::Impl::NewContext(std::uint64_t tokens) {
  const std::uint32_t tpb = o_.model.tokens_per_block;
  if (tokens == 0) return Status::InvalidArgument("client: NewContext of 0 tokens");
  std::shared_ptr<Context> c;
  {
    MutexLock l(&mu_);
    if (!free_contexts_.empty()) {
      c = std::move(free_contexts_.back());
      free_contexts_.pop_back();
    }
  }
  if (c == nullptr) c = std::make_shared<Context>();
  c->tokens = tokens;
  c->blocks = CeilDiv(tokens, tpb);
  c->full_blocks = static_cast<std::uint32_t>(tokens / tpb);
  {
    MutexLock l(&mu_);
    if (closed_) return Status::FailedPrecondition("client: closed");
    c->id = next_context_++;
  }
  ContextBudget budget;
  budget.floor = arena_options_.context_floor_pages;
  budget.target = budget.floor;
  budget.logical_pages = CeilDiv(tokens, o_.tile_tokens);
  KVF_RETURN_IF_ERROR(arena_->AdmitContext(c->id, budget));
  Status taken = history_pool_->Take(c->blocks, &c->pages,
                                     "a context of " + std::to_string(tokens) + " tokens");
  if (!taken.ok()) {
    arena_->ReleaseContext(c->id).IgnoreError();
    return taken.WithContext("client: NewContext");
  }
  c->layer_words = (o_.model.layer_count + 63) / 64;
  {
    MutexLock l(&c->mu);  // not shared yet: for the analysis
    c->layer_bits.assign(std::size_t{c->full_blocks} * c->layer_words, 0);
    c->layers_saved.assign(c->full_blocks, 0);
    c->save_queued.assign(c->full_blocks, false);
    // A plan has at most one run per block: Load copies the plan's runs and
    // their outcomes into memory this context keeps when it is recycled, so
    // sizing it here for the largest plan of this many blocks keeps a later
    // plan with more runs than the first (a balanced assignment alternates
    // daemons block by block) from allocating on the load path.
    c->match.runs.reserve(c->blocks);
    c->report.runs.reserve(c->blocks);
  }
  MutexLock l(&mu_);
  contexts_[c->id] = c;
  return c->id;
}

Status Client::Impl::Load(const MatchResult& match, ContextId id) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  if (match.chain.size() > c->full_blocks) {
    return Status::InvalidArgument("client: Load of a " + std::to_string(match.chain.size()) +
                                   "-block chain into context " + std::to_string(id) + " of " +
                                   std::to_string(c->full_blocks) + " full blocks");
  }
  std::vector<std::size_t> fetch_runs, recompute_runs;
  for (std::size_t i = 0; i < match.runs.size(); ++i) {
    (match.runs[i].fetch ? fetch_runs : recompute_runs).push_back(i);
  }
  MutexLock l(&c->mu);
  if (c->load_started) {
    return Status::FailedPrecondition("client: context " + std::to_string(id) +
                                      " was already loaded");
  }
  c->load_started = true;
  c->match = match;
  c->load_start = Clock::now();
  c->landed_us.assign(c->blocks, -1.0);
  c->landed_prefix = 0;
  c->landed_layer_bits.assign(std::size_t{c->blocks} * c->layer_words, 0);
  c->layer_ready.assign(o_.model.layer_count, 0);
  c->compact.assign(c->blocks, 0);
  c->landed_blocks = 0;
  c->report.plan_id = match.plan_id;
  c->report.kind = match.kind;
  c->report.predicted_us = match.predicted_us;
  for (const MatchResult::Run& r : match.runs) {
    RunOutcome ro;
    ro.first_block = r.first_block;
    ro.block_count = r.block_count;
    ro.fetch = r.fetch;
    if (r.fetch) ro.host_id = match.hosts[r.host].host_id;
    ro.tier = r.fetch ? r.tier : "";
    ro.predicted_end_us = r.predicted_end_us;
    c->report.runs.push_back(std::move(ro));
  }
  // Fetches and recomputes run concurrently, as the plan assumes.
  c->load_workers = 2;
  c->fetching = !fetch_runs.empty();
  // A recompute run that starts before a fetched block does not wait for
  // it: it prefills beside the streams (client_impl.h, fetch_beside_prefill).
  std::uint32_t first_recomputed = UINT32_MAX, last_fetched = 0;
  for (const MatchResult::Run& r : match.runs) {
    if (r.fetch) {
      last_fetched = std::max(last_fetched, r.first_block + r.block_count);
    } else {
      first_recomputed = std::min(first_recomputed, r.first_block);
    }
  }
  c->fetch_beside_prefill = !fetch_runs.empty() && first_recomputed < last_fetched;
  c->workers.Run(&loaders_, [this, c, fetch_runs] { FetchRuns(c, fetch_runs); });
  c->workers.Run(&loaders_, [this, c, recompute_runs] { RecomputeRuns(c, recompute_runs); });
  return Status::OK();
}

Status Client::Impl::WaitLayer(ContextId id, std::uint32_t layer,
                               std::chrono::milliseconds timeout) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  if (layer >= o_.model.layer_count) {
    return Status::InvalidArgument("client: WaitLayer layer " + std::to_string(layer) +
                                   " of a " + std::to_string(o_.model.layer_count) +
                                   "-layer model");
  }
  MutexLock l(&c->mu);
  if (!c->load_started) {
    return Status::FailedPrecondition("client: context " + std::to_string(id) + " has no load");
  }
  // Ready when every block's slice of this layer landed and verified (layer
  // ranges arrive layer-major, so layer 0 is ready long before the last), or
  // when the load ended (then its status: a failed load fails every wait).
  auto ready = [&]() KVF_REQUIRES(c->mu) {
    return c->load_done || c->layer_ready[layer] == c->blocks;
  };
  if (!c->cv.WaitFor(&c->mu, timeout, ready)) {
    return Status::DeadlineExceeded("client: layer " + std::to_string(layer) + " of context " +
                                    std::to_string(id) + " not loaded after " +
                                    std::to_string(timeout.count()) + " ms (" +
                                    std::to_string(c->layer_ready[layer]) + " of " +
                                    std::to_string(c->blocks) + " blocks have it)");
  }
  return c->load_done ? c->load_status : Status::OK();
}

StatusOr<std::span<std::byte>> Client::Impl::BlockPayload(ContextId id, std::uint32_t block) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  KVF_RETURN_IF_ERROR(internal::BlockInRange(*c, id, block));
  {
    MutexLock l(&c->mu);
    if (block < c->compact.size() && c->compact[block] != 0) {
      return Status::FailedPrecondition(
          "client: block " + std::to_string(block) + " of context " + std::to_string(id) +
          " holds its compact_int8 copy (the request's accuracy policy allowed it): its page is "
          "not the exact payload; read it with DecodeBlock");
    }
  }
  return BlockBytes(*c, block);
}

StatusOr<HostHistory> Client::Impl::History(ContextId id) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  MutexLock l(&c->mu);
  return HostHistory::Paged(history_pool_->base(), c->pages, block_bytes_).WithCompact(c->compact);
}

Status Client::Impl::Save(ContextId id, std::uint32_t layer, std::uint32_t first_block,
                          std::span<const BlockKey> keys) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  if (layer >= o_.model.layer_count) {
    return Status::InvalidArgument("client: Save of layer " + std::to_string(layer) + " of a " +
                                   std::to_string(o_.model.layer_count) + "-layer model");
  }
  if (keys.empty() || std::uint64_t{first_block} + keys.size() > c->full_blocks) {
    return Status::InvalidArgument("client: Save of blocks [" + std::to_string(first_block) +
                                   ", " + std::to_string(first_block + keys.size()) +
                                   ") of context " + std::to_string(id) + " with " +
                                   std::to_string(c->full_blocks) +
                                   " full blocks (a partial block is never saved)");
  }
  // Distinct layers per block (a bit per layer): a block goes out only once
  // every layer is in the history. A layer saved twice is refused, and a
  // refused call changes nothing.
  const std::uint64_t bit = std::uint64_t{1} << (layer % 64);
  // Per engine thread, emptied before return: it keeps its capacity, so a
  // warm Save that completes 1,024 blocks does not allocate 56 KiB of jobs.
  thread_local std::vector<SaveJob> ready;
  ready.clear();
  {
    MutexLock l(&c->mu);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const std::uint32_t b = first_block + static_cast<std::uint32_t>(k);
      if (b < c->compact.size() && c->compact[b] != 0) {
        // Its page holds approximate KV: writing it back would publish it as exact.
        return Status::FailedPrecondition(
            "client: Save of block " + std::to_string(b) + " of context " + std::to_string(id) +
            ", which holds its compact_int8 copy (loaded under a compact_after policy): only "
            "exact KV is written back (nothing of this call was recorded)");
      }
      if ((c->layer_bits[std::size_t{b} * c->layer_words + layer / 64] & bit) != 0) {
        return Status::FailedPrecondition(
            "client: Save of layer " + std::to_string(layer) + " of block " + std::to_string(b) +
            " of context " + std::to_string(id) + ", which was already saved (each layer of a "
            "block is saved once; nothing of this call was recorded)");
      }
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const std::uint32_t b = first_block + static_cast<std::uint32_t>(k);
      c->layer_bits[std::size_t{b} * c->layer_words + layer / 64] |= bit;
      if (++c->layers_saved[b] == o_.model.layer_count) {
        c->save_queued[b] = true;
        ++c->pending_saves;
        ready.push_back({c, b, keys[k]});
      }
    }
  }
  if (!ready.empty()) {
    MutexLock l(&save_mu_);
    for (SaveJob& j : ready) save_queue_.push_back(std::move(j));
  }
  ready.clear();
  save_cv_.NotifyOne();
  return Status::OK();
}

// ---------------------------------------------------------------- attention

Status Client::Impl::Attend(ContextId id, std::uint32_t layer, std::uint64_t step,
                            std::span<const float> q, std::span<float> out,
                            std::span<float> lse) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  const std::size_t qn = std::size_t{o_.num_q_heads} * o_.model.head_dim;
  if (q.size() != qn || out.size() != qn || lse.size() != o_.num_q_heads) {
    return Status::InvalidArgument("client: Attend needs q and out of " + std::to_string(qn) +
                                   " floats and lse of " + std::to_string(o_.num_q_heads) +
                                   "; got " + std::to_string(q.size()) + ", " +
                                   std::to_string(out.size()) + ", " + std::to_string(lse.size()));
  }
  std::span<const std::uint8_t> compact;  // final once the layer loaded
  {
    MutexLock l(&c->mu);
    compact = c->compact;
    // This layer of every block landed and verified (WaitLayer), while later
    // layers may still be on the wire; a failed load is refused.
    const bool ready =
        c->load_done || (layer < c->layer_ready.size() && c->layer_ready[layer] == c->blocks);
    if (!ready || !c->load_status.ok()) {
      return Status::FailedPrecondition("client: Attend on layer " + std::to_string(layer) +
                                        " of context " + std::to_string(id) +
                                        " before that layer loaded OK (WaitLayer)");
    }
  }
  const auto start = Clock::now();
  MutexLock l(&attend_mu_);
  KVF_RETURN_IF_ERROR(arena_->Touch(id));
  std::copy(q.begin(), q.end(), attention_->query().begin());
  const float scale = 1.0f / std::sqrt(static_cast<float>(o_.model.head_dim));
  KVF_RETURN_IF_ERROR(attention_->Decode(
      id, layer, step, /*host_generation=*/1,
      // Compact blocks (a compact_after load) are decoded as compact tiles;
      // the flags are final once the layer loaded.
      HostHistory::Paged(history_pool_->base(), c->pages, block_bytes_).WithCompact(compact),
      static_cast<std::uint32_t>(c->tokens), scale));
  std::copy(attention_->output().begin(), attention_->output().end(), out.begin());
  std::copy(attention_->lse().begin(), attention_->lse().end(), lse.begin());
  const DeviceArenaMetrics am = arena_->metrics();
  MutexLock ml(&metrics_mu_);
  ++m_.attends;
  m_.attend_us += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
  m_.peak_arena_pages = std::max(m_.peak_arena_pages,
                                 am.peak_held_pages + am.peak_staging_in_use);
  return Status::OK();
}

// ---------------------------------------------------------------- finish

Status Client::Impl::Finish(ContextId id, ContextReport* report) {
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<Context> c, Find(id));
  c->workers.Wait();
  {
    // No thread touches the context after its saves: reporting holds its
    // lock only for the analysis' sake (and costs nothing).
    MutexLock l(&c->mu);
    c->cv.Wait(&c->mu, [&]() KVF_REQUIRES(c->mu) { return c->pending_saves == 0; });
    ReportObservations(*c);
  }
  {
    MutexLock l(&mu_);
    contexts_.erase(id);
  }
  Status result = arena_->ReleaseContext(id);
  {
    MutexLock l(&c->mu);
    history_pool_->Return(c->pages);
    c->pages.clear();
    *report = c->report;
    // The engine cannot miss a failure: the load's, then the write-backs'.
    if (!c->load_status.ok()) {
      result =
          c->load_status.WithContext("client: context " + std::to_string(id) + "'s load failed");
    } else if (c->report.save_failures > 0) {
      const std::uint32_t tried =
          c->report.blocks_written + c->report.blocks_already_cached + c->report.save_failures;
      result = Status(c->save_status.code(),
                      "client: context " + std::to_string(id) + ": " +
                          std::to_string(c->report.save_failures) + " of " +
                          std::to_string(tried) + " blocks were not written back; first: " +
                          std::string(c->save_status.message()));
    }
  }
  Recycle(std::move(c));
  return result;
}

void Client::Impl::Recycle(std::shared_ptr<Context> c) {
  // Write-backs let go of a context before Finish sees its last save done
  // (FinishSaves), so this is its last reference; anything else still holding
  // one (a bug) makes it simply freed.
  if (c.use_count() != 1) return;
  c->Reset();
  MutexLock l(&mu_);
  if (free_contexts_.size() < kMaxFreeContexts) free_contexts_.push_back(std::move(c));
}

void Context::Reset() {
  id = 0;
  tokens = 0;
  blocks = 0;
  full_blocks = 0;
  pages.clear();
  layer_words = 0;
  MutexLock l(&mu);
  load_started = false;
  load_done = false;
  load_workers = 0;
  load_status = Status::OK();
  load_start = {};
  std::vector<RunOutcome> runs = std::move(report.runs);
  runs.clear();
  report = ContextReport{};
  report.runs = std::move(runs);
  transfers.clear();
  recomputes.clear();
  stale.clear();
  fallback_runs.clear();
  landed_us.clear();
  landed_prefix = 0;
  landed_layer_bits.clear();
  layer_ready.clear();
  compact.clear();
  landed_blocks = 0;
  layer_bits.clear();
  layers_saved.clear();
  save_queued.clear();
  pending_saves = 0;
  save_status = Status::OK();
  pages_safe = Status::OK();
  writes_quiet_after = {};
}

ClientMetrics Client::Impl::metrics() const {
  const DeviceArenaMetrics am = arena_->metrics();
  MutexLock l(&metrics_mu_);
  ClientMetrics m = m_;
  m.arena_pages = am.pool_pages + am.staging_pages;
  m.history_pool_pages = history_pool_->pages();
  m.history_pages_in_use = history_pool_->pages_in_use();
  m.peak_history_pages_in_use = history_pool_->peak_pages_in_use();
  m.peak_arena_pages = std::max(m.peak_arena_pages, am.peak_held_pages + am.peak_staging_in_use);
  return m;
}

// ---------------------------------------------------------------- Client

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Open(ClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  KVF_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Status Client::Close() { return impl_->Close(); }
std::shared_ptr<prometheus::Collectable> Client::metrics_collectable() const {
  return impl_->metrics_collectable();
}
std::string Client::metrics_url() const { return impl_->metrics_url(); }
StatusOr<std::vector<BlockKey>> Client::KeyTokens(std::span<const std::uint32_t> tokens) const {
  return impl_->KeyTokens(tokens);
}
StatusOr<MatchResult> Client::Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
                                    bool explain) {
  return impl_->Match(chain, suffix_tokens, explain);
}
Status Client::Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens, bool explain,
                     MatchResult* out) {
  MatchOptions options;
  options.explain = explain;
  return impl_->Match(chain, suffix_tokens, options, out);
}
Status Client::Match(std::span<const BlockKey> chain, std::uint64_t suffix_tokens,
                     const MatchOptions& options, MatchResult* out) {
  return impl_->Match(chain, suffix_tokens, options, out);
}
StatusOr<ContextId> Client::NewContext(std::uint64_t tokens) { return impl_->NewContext(tokens); }
Status Client::Load(const MatchResult& match, ContextId context) {
  return impl_->Load(match, context);
}
Status Client::WaitLayer(ContextId context, std::uint32_t layer,
                         std::chrono::milliseconds timeout) {
  return impl_->WaitLayer(context, layer, timeout);
}
StatusOr<std::span<std::byte>> Client::BlockPayload(ContextId context, std::uint32_t block) {
  return impl_->BlockPayload(context, block);
}
double Client::compact_extra_decode_us_per_token() const {
  return impl_->compact_extra_decode_us_per_token();
}
StatusOr<bool> Client::BlockIsCompact(ContextId context, std::uint32_t block) {
  return impl_->BlockIsCompact(context, block);
}
Status Client::DecodeBlock(ContextId context, std::uint32_t block, std::span<float> out) {
  return impl_->DecodeBlock(context, block, out);
}
StatusOr<HostHistory> Client::History(ContextId context) const {
  return impl_->History(context);
}
Status Client::Save(ContextId context, std::uint32_t layer, std::uint32_t first_block,
                    std::span<const BlockKey> keys) {
  return impl_->Save(context, layer, first_block, keys);
}
Status Client::Attend(ContextId context, std::uint32_t layer, std::uint64_t step,
                      std::span<const float> q, std::span<float> out, std::span<float> lse) {
  return impl_->Attend(context, layer, step, q, out, lse);
}
StatusOr<ContextReport> Client::Finish(ContextId context) {
  ContextReport report;
  KVF_RETURN_IF_ERROR(impl_->Finish(context, &report));
  return report;
}
Status Client::Finish(ContextId context, ContextReport* report) {
  return impl_->Finish(context, report);
}
ClientMetrics Client::metrics() const { return impl_->metrics(); }
const ClientOptions& Client::options() const { return impl_->options(); }
std::string Client::DescribeArena() const { return impl_->DescribeArena(); }
std::string Client::DescribeHistoryPool() const { return impl_->DescribeHistoryPool(); }

}  // namespace kvfabric::client
