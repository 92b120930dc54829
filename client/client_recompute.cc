// Client::Impl's recompute runs: the engine's prefill (RecomputeFn) called
// once per run of adjacent pages on a loader thread, its time observed for
// placement's recompute fit, its blocks marked landed in every layer.
#include <algorithm>
#include <cstring>

#include "client/client_impl.h"

namespace kvfabric::client {

using internal::MicrosSince;

Status Client::Impl::Recompute(Context& c, std::uint32_t first, std::uint32_t count) {
  // One engine call per run of adjacent pages: the engine writes block
  // payloads back to back (RecomputeFn), and a history's pages are adjacent
  // in runs (client/history_pool.h). A block some of whose layers landed
  // (a layer-range fetch that failed part way) is a call of its own, written
  // aside (RecomputeRun).
  const std::uint32_t end = first + count;
  std::vector<bool> partial(count, false);
  {
    MutexLock l(&c.mu);
    for (std::uint32_t b = first; b < end; ++b) partial[b - first] = PartlyLanded(c, b);
  }
  for (std::uint32_t from = first; from < end;) {
    if (partial[from - first]) {
      KVF_RETURN_IF_ERROR(RecomputeRun(c, from, 1, /*partial=*/true));
      ++from;
      continue;
    }
    std::uint32_t to = from + 1;
    while (to < end && c.pages[to] == c.pages[to - 1] + 1 && !partial[to - first]) ++to;
    KVF_RETURN_IF_ERROR(RecomputeRun(c, from, to - from));
    from = to;
  }
  return Status::OK();
}

Status Client::Impl::RecomputeRun(Context& c, std::uint32_t first, std::uint32_t count,
                                  bool partial) {
  const std::uint64_t tpb = o_.model.tokens_per_block;
  RecomputeRequest req;
  req.context = c.id;
  req.first_block = first;
  req.block_count = count;
  req.first_token = first * tpb;
  req.prefix_tokens = req.first_token;
  req.tokens = std::min<std::uint64_t>((first + count) * tpb, c.tokens) - req.first_token;
  const std::span<std::byte> page(BlockBytes(c, first).data(), std::uint64_t{count} * block_bytes_);
  {
    // The prefill attends to every block before `first`: wait until they
    // landed (fetched by the other loader, or recomputed earlier), or until
    // the load failed elsewhere.
    MutexLock l(&c.mu);
    c.cv.Wait(&c.mu,
              [&]() KVF_REQUIRES(c.mu) { return c.landed_prefix >= first || !c.load_status.ok(); });
    if (c.landed_prefix < first) {
      return c.load_status.WithContext("client: recompute of blocks [" + std::to_string(first) +
                                       ", " + std::to_string(first + count) +
                                       ") not started: the blocks before it did not land");
    }
  }
  // A partly landed block: the engine may be reading its landed layers
  // (WaitLayer said they were ready), so the prefill writes aside and only
  // the missing layers are copied in (they are not ready: nobody reads them).
  std::optional<MutexLock> scratch_lock;
  if (partial) scratch_lock.emplace(&scratch_mu_);
  const std::span<std::byte> out =
      partial ? std::span<std::byte>(recompute_scratch_.get(), block_bytes_) : page;
  // Blocks [0, first) landed, so their compact flags are final (a fetch
  // thread may still flag later blocks: other bytes of the vector).
  std::span<const std::uint8_t> flags;
  {
    MutexLock l(&c.mu);
    flags = std::span<const std::uint8_t>(c.compact).first(first);
  }
  req.prefix =
      HostHistory::Paged(history_pool_->base(),
                         std::span<const std::uint32_t>(c.pages).first(first), block_bytes_)
          .WithCompact(flags);
  bool beside_fetch = false;
  const auto start = Clock::now();
  {
    MutexLock l(&c.mu);
    beside_fetch = c.fetching;
    c.prefill_running = true;
    c.prefill_since = start;
  }
  Status s = o_.recompute(req, out);
  const double us = MicrosSince(start);
  {
    MutexLock l(&c.mu);
    c.prefill_running = false;
    c.prefill_us += us;
  }
  if (!s.ok()) {
    return s.WithContext("client: recompute of blocks [" + std::to_string(first) + ", " +
                         std::to_string(first + count) + ")");
  }
  std::vector<std::uint32_t> missing;  // partial: the layers copied in
  if (partial) {
    {
      MutexLock l(&c.mu);
      const std::uint64_t* bits = &c.landed_layer_bits[std::size_t{first} * c.layer_words];
      for (std::uint32_t layer = 0; layer < o_.model.layer_count; ++layer) {
        if ((bits[layer / 64] & (std::uint64_t{1} << (layer % 64))) == 0) missing.push_back(layer);
      }
    }
    for (std::uint32_t layer : missing) {
      const std::uint64_t at = std::uint64_t{layer} * layer_bytes_;
      std::memcpy(page.data() + at, out.data() + at, layer_bytes_);
    }
    scratch_lock.reset();
  }
  {
    MutexLock l(&c.mu);
    v1::RecomputeObservation o;
    o.set_tokens(req.tokens);
    o.set_prefix_tokens(req.prefix_tokens);
    o.set_observed_us(us);
    // Overlapped the fetch at its start or its end: a split's front.
    o.set_beside_fetch(beside_fetch || c.fetching);
    c.recomputes.push_back(o);
    c.report.blocks_recomputed += count;
    // The engine's prefill wrote every layer of these blocks (of a partly
    // landed block, the missing ones were copied in above).
    const double landed = MicrosSince(c.load_start);
    for (std::uint32_t b = first; b < first + count && b < c.landed_us.size(); ++b) {
      if (!partial) {
        MarkLayersLanded(c, b, 0, o_.model.layer_count, landed);
        continue;
      }
      for (std::uint32_t layer : missing) MarkLayersLanded(c, b, layer, 1, landed);
    }
  }
  prom_->ObserveRecompute(us);
  MutexLock l(&metrics_mu_);
  m_.blocks_recomputed += count;
  m_.tokens_recomputed += req.tokens;
  m_.recompute_us += static_cast<std::uint64_t>(us);
  return Status::OK();
}

void Client::Impl::RecomputeRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs) {
  Status status;
  for (std::size_t ri : runs) {
    const MatchResult::Run& run = c->match.runs[ri];
    status = Recompute(*c, run.first_block, run.block_count);
    if (!status.ok()) break;
  }
  // The tokens after the chain: the partial tail (and any full blocks the
  // chain did not name) are always prefilled.
  const auto chain = static_cast<std::uint32_t>(c->match.chain.size());
  if (status.ok() && c->blocks > chain) status = Recompute(*c, chain, c->blocks - chain);
  WorkerDone(*c, status);
}

}  // namespace kvfabric::client
