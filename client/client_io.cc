// Client::Impl's data movement in: the data-plane sessions to daemons and
// plan execution (fetch with fallbacks) on loader threads. One daemon's stream
// (FetchFrom) is client_stream.cc, recompute runs client_recompute.cc,
// write-back client_save.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iterator>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "core/block_format.h"
#include "proto/grpc_status.h"
#include "transport/data_transport.h"

namespace kvfabric::client {

using internal::HostDown;
using internal::KeyBytes;
using internal::MicrosSince;
using internal::Observation;

// ---------------------------------------------------------------- daemons

Status Client::Impl::OpenDataPlane(const HistoryPoolOptions& history) {
  transport::DataTransportOptions topts;
  topts.kind = o_.data_transport;
  topts.ucx_tls = o_.ucx_tls;
  topts.ucx_tls_setting =
      o_.ucx_tls_setting.empty() ? std::string("ucx_tls (--ucx-tls)") : o_.ucx_tls_setting;
  // UCX's messages go where the engine sends the library's (client_log.h).
  topts.ucx_log_sink = [](spdlog::level::level_enum level, std::string_view line) {
    Log().log(level, "{}", line);
  };
  if (o_.data_plane_tls) {
    if (o_.data_transport != "tcp" || o_.security.ca_file.empty()) {
      return Status::InvalidArgument(
          "client: data_plane_tls needs data_transport \"tcp\" and security.ca_file (the CA "
          "that signs the daemons' certificates)");
    }
    topts.tcp_tls_enabled = true;
    topts.tcp_tls.ca_file = o_.security.ca_file;
  }
  KVF_ASSIGN_OR_RETURN(transport_, transport::CreateDataTransport(topts));
  shared_memory_ = transport::UsesSharedMemory(topts);
  ucx_data_plane_ = topts.kind == "ucx";
  KVF_ASSIGN_OR_RETURN(staging_,
                       transport_->AllocateMemory(o_.staging_bytes, transport::MemoryKind::kHost));
  KVF_ASSIGN_OR_RETURN(data_, DataPlaneClient::Create(transport_.get()));
  // Daemons write fetched blocks straight into context pages, so the pool is
  // exported with the staging region to every daemon. Over UCX shared
  // memory it is the transport's own memory, pinned for the device: a daemon
  // on this host maps it and copies each block in with one memcpy, where
  // memory registered from elsewhere costs a protocol round trip per block
  // or layer slice (docs/benchmarks.md, 2026-12-04 19:07: 2-3x the load
  // rate). Otherwise (or when the device cannot pin foreign memory) the
  // device allocates it and the transport registers it.
  const std::uint64_t pool_bytes =
      history.block_bytes == 0 ? 0 : history.pool_bytes / history.block_bytes * history.block_bytes;
  if (shared_memory_ && ucx_data_plane_ && pool_bytes != 0) {
    auto region = transport_->AllocateMemory(pool_bytes, transport::MemoryKind::kHost);
    StatusOr<std::unique_ptr<gpu::PinnedHostBuffer>> pinned =
        region.ok() ? o_.device->PinHostMemory((*region)->bytes()) : region.status();
    if (pinned.ok()) {
      history_region_ = std::move(*region);
      history_in_transport_ = true;
      KVF_ASSIGN_OR_RETURN(history_pool_,
                           HistoryPool::Create(*o_.device, history, std::move(*pinned)));
      return Status::OK();
    }
    Log().info("kvfabric client: history pool in device memory, registered with the transport ({})",
               pinned.status().ToString());
  }
  KVF_ASSIGN_OR_RETURN(history_pool_, HistoryPool::Create(*o_.device, history));
  KVF_ASSIGN_OR_RETURN(
      history_region_,
      transport_->RegisterMemory(
          std::span<std::byte>(history_pool_->base(),
                               std::uint64_t{history_pool_->pages()} * history_pool_->page_bytes()),
          transport::MemoryKind::kHost));
  return Status::OK();
}

StatusOr<std::shared_ptr<Daemon>> Client::Impl::GetDaemon(const MatchResult::Host& host) {
  auto usable = [&](const std::shared_ptr<Daemon>& d) {
    return d != nullptr && d->transport_address() == host.transport_address && d->health().ok();
  };
  std::shared_ptr<DaemonSlot> slot;
  {
    MutexLock l(&daemons_mu_);
    std::shared_ptr<DaemonSlot>& s = daemons_[host.grpc_address];
    if (s == nullptr) s = std::make_shared<DaemonSlot>();
    if (usable(s->session)) return s->session;
    slot = s;
  }
  // Connecting can take up to rpc_timeout: only threads wanting this daemon wait.
  MutexLock serial(&slot->connect_mu);
  std::shared_ptr<Daemon> old;
  {
    MutexLock l(&daemons_mu_);
    if (usable(slot->session)) return slot->session;  // another thread connected meanwhile
    old = std::move(slot->session);
  }
  if (old != nullptr) old->Close();  // the daemon moved or its connection failed
  CacheHostSessionOptions so;
  so.host_id = host.host_id;
  so.grpc_address = host.grpc_address;
  so.transport_address = host.transport_address;
  so.ns = o_.namespace_name;
  so.security = o_.security;
  so.rpc_timeout = o_.rpc_timeout;
  so.transfer_timeout = o_.transfer_timeout;
  so.region_id = kStagingRegionId;
  so.extra_regions = {{kHistoryRegionId, history_region_.get()}};
  so.check_shared_memory = shared_memory_;
  so.check_ucx_listener = ucx_data_plane_;
  so.ucx_tls = o_.ucx_tls;
  so.ucx_tls_setting = o_.ucx_tls_setting.empty() ? "ucx_tls (--ucx-tls)" : o_.ucx_tls_setting;
  StatusOr<std::shared_ptr<Daemon>> opened =
      CacheHostSession::Open(data_.get(), *staging_, std::move(so));
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kFailedPrecondition && !slot->refusal_logged) {
      slot->refusal_logged = true;
      Log().error("kvfabric client: {}", opened.status().message());
    }
    return std::move(opened).status();
  }
  std::shared_ptr<Daemon> d = std::move(opened).value();
  MutexLock l(&daemons_mu_);
  slot->session = d;
  auto it = daemons_.find(host.grpc_address);
  if (it == daemons_.end() || it->second != slot) daemons_[host.grpc_address] = slot;
  return d;
}

void Client::Impl::DropDaemon(const std::shared_ptr<Daemon>& d) {
  {
    MutexLock l(&daemons_mu_);
    auto it = daemons_.find(d->grpc_address());
    if (it != daemons_.end() && it->second->session == d) it->second->session.reset();
  }
  d->Close();
}

// ---------------------------------------------------------------- loading

void Client::Impl::FetchRuns(std::shared_ptr<Context> c, std::vector<std::size_t> runs) {
  const MatchResult& m = c->match;
  // Placement spreads a chain over hosts block by block, so runs are short
  // and alternate: fetch every planned block of a host in full batches, all
  // hosts at once.
  // Compact runs' blocks (their compact copies) go in a list of their own
  // per host, fetched after the host's exact blocks on the same stream.
  // Blocks the plan has on a daemon's NVMe only go last in its list
  // (nvme_from): FetchFrom leases them from the start instead of asking the
  // host pool first.
  std::vector<std::vector<std::uint32_t>> by_host(m.hosts.size());
  std::vector<std::vector<std::uint32_t>> nvme_by_host(m.hosts.size());
  std::vector<std::vector<std::uint32_t>> compact_by_host(m.hosts.size());
  std::vector<std::size_t> run_of(m.chain.size(), 0);
  for (std::size_t ri : runs) {
    const MatchResult::Run& run = m.runs[ri];
    auto& list = run.compact ? compact_by_host : run.tier == "nvme" ? nvme_by_host : by_host;
    for (std::uint32_t b = run.first_block; b < run.first_block + run.block_count; ++b) {
      list[run.host].push_back(b);
      run_of[b] = ri;
    }
  }
  std::vector<std::size_t> nvme_from(m.hosts.size(), 0);
  for (std::size_t h = 0; h < by_host.size(); ++h) {
    nvme_from[h] = by_host[h].size();
    by_host[h].insert(by_host[h].end(), nvme_by_host[h].begin(), nvme_by_host[h].end());
  }
  std::vector<Status> host_status(m.hosts.size());
  // Each stream's predicted end: the latest placement predicted for the
  // host's runs. Its cut-off (ClientOptions::straggler_factor) is that times
  // the factor, plus slack.
  std::vector<double> predicted(m.hosts.size(), 0);
  for (std::size_t ri : runs) {
    const MatchResult::Run& run = m.runs[ri];
    if (run.host < predicted.size()) {
      predicted[run.host] = std::max(predicted[run.host], run.predicted_end_us);
    }
  }
  std::vector<double> cut_after(m.hosts.size(), 0);
  if (o_.straggler_factor > 0) {
    const double slack_us = static_cast<double>(o_.straggler_slack.count()) * 1e3;
    for (std::size_t h = 0; h < predicted.size(); ++h) {
      if (predicted[h] > 0) cut_after[h] = o_.straggler_factor * predicted[h] + slack_us;
    }
  }
  {
    std::vector<std::size_t> hosts;
    for (std::size_t h = 0; h < by_host.size(); ++h) {
      if (!by_host[h].empty() || !compact_by_host[h].empty()) hosts.push_back(h);
    }
    std::vector<StreamTally> tallies(m.hosts.size());
    for (std::size_t h = 0; h < tallies.size(); ++h) tallies[h].predicted_us = predicted[h];
    std::size_t streams = 0;
    for (std::size_t h : hosts) streams += by_host[h].empty() ? 0 : 1;
    Layer0Gate gate(streams);
    const auto start = Clock::now();
    auto fetch = [&](std::size_t h) {
      StreamTally& t = tallies[h];
      if (!by_host[h].empty()) {
        host_status[h] =
            FetchFrom(*c, m.hosts[h], &by_host[h], nvme_from[h], &t, cut_after[h], &gate);
      }
      if (!compact_by_host[h].empty() && !HostDown(host_status[h])) {
        std::uint64_t compact_moved = 0;
        Status s = FetchCompactFrom(*c, m.hosts[h], &compact_by_host[h], &compact_moved);
        // Compact copies follow the exact blocks on the host-pool stream.
        t.host_bytes += compact_moved;
        if (compact_moved > 0) t.host_us = MicrosSince(start);
        if (host_status[h].ok()) host_status[h] = std::move(s);
      }
    };
    // A loader thread per further daemon; this thread takes the first.
    TaskGroup others;
    for (std::size_t i = 1; i < hosts.size(); ++i) {
      others.Run(&loaders_, [&fetch, h = hosts[i]] { fetch(h); });
    }
    if (!hosts.empty()) fetch(hosts[0]);
    others.Wait();
    RecordTransfers(*c, m.hosts, tallies);
    // The plan's streams are done; a fallback below fetches and recomputes
    // one after another on this thread.
    MutexLock l(&c->mu);
    c->fetching = false;
  }
  std::vector<bool> dead(m.hosts.size(), false);              // failed Unavailable in this load
  std::map<std::size_t, std::vector<std::uint32_t>> missing;  // run -> blocks
  std::map<std::size_t, std::string> failures;                // run -> first error
  for (std::size_t h = 0; h < by_host.size(); ++h) {
    const Status& s = host_status[h];
    if (!s.ok()) {
      Log().warn("kvfabric client: context {}: {} of its blocks on {} not fetched: {}", c->id,
                 by_host[h].size(), m.hosts[h].host_id, s.ToString());
      dead[h] = HostDown(s);
    }
    for (const auto* list : {&by_host[h], &compact_by_host[h]}) {
      for (std::uint32_t b : *list) {
        missing[run_of[b]].push_back(b);
        if (failures.find(run_of[b]) == failures.end()) failures[run_of[b]] = s.ToString();
      }
    }
  }
  // Then each run's fallback hosts, then recompute, in contiguous pieces.
  Status status;
  {
    // A block whose page could not be replaced after a failed request may
    // still be written by that daemon: nothing else is written into it.
    MutexLock l(&c->mu);
    if (!c->pages_safe.ok()) status = c->pages_safe;
  }
  {
    // Blocks with some layers landed kept their pages after a failed request
    // over shared memory: nothing is written into them until that daemon can
    // no longer write (ReplacePages).
    Clock::time_point quiet;
    {
      MutexLock l(&c->mu);
      quiet = c->writes_quiet_after;
    }
    if (!missing.empty() && quiet > Clock::now()) std::this_thread::sleep_until(quiet);
  }
  // Each missing block is asked of its run's fallback hosts in their order,
  // all runs' blocks for one host in one stream: a cut stream's blocks are
  // spread over many short runs (the planner alternates daemons block by
  // block), and a request per run and host cost each a round trip under the
  // load that made the stream slow. A compact run's fallbacks hold its
  // compact copies (placement lists only those) and are asked per run.
  std::map<std::size_t, std::uint32_t> from_fallback;  // run -> blocks fetched there
  for (auto& [ri, blocks] : missing) std::sort(blocks.begin(), blocks.end());
  for (std::size_t round = 0; status.ok(); ++round) {
    std::map<std::uint32_t, std::vector<std::uint32_t>> ask;  // host -> exact blocks
    for (auto& [ri, blocks] : missing) {
      const std::vector<std::uint32_t>& fallbacks = m.runs[ri].fallback_hosts;
      if (blocks.empty() || round >= fallbacks.size() || dead[fallbacks[round]]) continue;
      const std::uint32_t h = fallbacks[round];
      if (m.runs[ri].compact) {
        std::vector<StreamTally> tallies(m.hosts.size());
        const auto start = Clock::now();
        const std::size_t before = blocks.size();
        const Status s = FetchCompactFrom(*c, m.hosts[h], &blocks, &tallies[h].host_bytes);
        tallies[h].host_us = MicrosSince(start);
        RecordTransfers(*c, m.hosts, tallies);
        from_fallback[ri] += static_cast<std::uint32_t>(before - blocks.size());
        dead[h] = HostDown(s);
        continue;
      }
      ask[h].insert(ask[h].end(), blocks.begin(), blocks.end());
    }
    bool any_left = false;
    for (auto& [ri, blocks] : missing) {
      any_left = any_left || (!blocks.empty() && round + 1 < m.runs[ri].fallback_hosts.size());
    }
    for (auto& [h, blocks] : ask) {
      if (dead[h]) continue;  // went down earlier in this round
      std::sort(blocks.begin(), blocks.end());
      std::vector<StreamTally> tallies(m.hosts.size());
      // The plan does not say where on the fallback a block rests: the host
      // pool first.
      const Status s = FetchFrom(*c, m.hosts[h], &blocks, blocks.size(), &tallies[h]);
      RecordTransfers(*c, m.hosts, tallies);
      dead[h] = HostDown(s);
      // What is left in `blocks` did not land: the rest did.
      for (auto& [ri, run_blocks] : missing) {
        if (run_blocks.empty() || m.runs[ri].compact) continue;
        if (round >= m.runs[ri].fallback_hosts.size() || m.runs[ri].fallback_hosts[round] != h) {
          continue;
        }
        std::vector<std::uint32_t> left;
        std::set_intersection(run_blocks.begin(), run_blocks.end(), blocks.begin(), blocks.end(),
                              std::back_inserter(left));
        from_fallback[ri] += static_cast<std::uint32_t>(run_blocks.size() - left.size());
        run_blocks = std::move(left);
      }
    }
    if (ask.empty() && !any_left) break;
  }
  {
    MutexLock l(&c->mu);
    if (!c->pages_safe.ok()) status = c->pages_safe;
  }
  // Then what is still missing is recomputed, in contiguous pieces in chain
  // order (a prefill attends to the blocks before it: they landed above).
  for (auto& [ri, blocks] : missing) {
    if (!status.ok()) break;
    const auto recomputed = static_cast<std::uint32_t>(blocks.size());
    for (std::size_t i = 0; i < blocks.size() && status.ok();) {
      std::size_t j = i + 1;
      while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
      status = Recompute(*c, blocks[i], static_cast<std::uint32_t>(j - i));
      i = j;
    }
    const std::uint32_t fetched = from_fallback[ri];
    {
      MutexLock l(&c->mu);
      RunOutcome& ro = c->report.runs[ri];
      ro.blocks_from_fallback_host = fetched;
      ro.blocks_recomputed_after_failure = recomputed;
      ro.failure = failures[ri];
      c->fallback_runs.push_back(static_cast<std::uint32_t>(ri));
    }
    MutexLock l(&metrics_mu_);
    if (fetched > 0) ++m_.fallbacks_to_replica;
    if (recomputed > 0) ++m_.fallbacks_to_recompute;
    m_.blocks_fallen_back += recomputed;
  }
  WorkerDone(*c, status);
}

std::vector<std::uint64_t> Client::Impl::PageOffsets(const Context& c,
                                                     std::span<const std::uint32_t> batch,
                                                     std::uint64_t within) const {
  std::vector<std::uint64_t> offsets(batch.size());
  for (std::size_t k = 0; k < batch.size(); ++k) {
    offsets[k] = std::uint64_t{c.pages[batch[k]]} * block_bytes_ + within;
  }
  return offsets;
}

void Client::Impl::ReplacePages(Context& c, std::span<const std::uint32_t> batch) {
  // A daemon answers a request only after every byte of it moved or failed,
  // so only a request left without an answer (deadline, lost connection) can
  // still be writing. Over sockets (kernel TCP, UCX's tcp) the daemon's
  // bytes arrive through the connection, which FetchFrom closes (DropDaemon:
  // the transport stops delivering before Close returns) before anything
  // else is written into these pages. Over shared memory the daemon writes
  // into this process's memory itself, and closing stops nothing: the pages
  // are set aside for the transfer deadline instead.
  if (!shared_memory_) return;
  const auto until = Clock::now() + o_.transfer_timeout;
  // A block with some layers landed keeps its page (the engine may be
  // reading those layers since WaitLayer said so): its fallback waits until
  // the daemon can no longer write instead (writes_quiet_after).
  std::vector<std::uint32_t> swap;
  {
    MutexLock l(&c.mu);
    for (std::uint32_t b : batch) {
      bool any = false;
      for (std::uint32_t w = 0; w < c.layer_words && !any; ++w) {
        any = c.landed_layer_bits[std::size_t{b} * c.layer_words + w] != 0;
      }
      if (any) {
        c.writes_quiet_after = std::max(c.writes_quiet_after, until);
      } else {
        swap.push_back(b);
      }
    }
  }
  if (swap.empty()) return;
  std::vector<std::uint32_t> fresh;
  Status s = history_pool_->Take(
      static_cast<std::uint32_t>(swap.size()), &fresh,
      "context " + std::to_string(c.id) + " (replacing pages a failed fetch may still write)");
  if (!s.ok()) {
    MutexLock l(&c.mu);
    if (c.pages_safe.ok()) {
      c.pages_safe = s.WithContext("client: a failed fetch left pages a daemon may still write");
    }
    return;
  }
  // The request failed as a whole: the daemon may still be pushing into the
  // old pages (until its transfer deadline). They rest in quarantine that
  // long; the blocks fall back into fresh ones.
  for (std::size_t k = 0; k < swap.size(); ++k) {
    history_pool_->Quarantine(c.pages[swap[k]], until);
    c.pages[swap[k]] = fresh[k];
  }
  MutexLock l(&metrics_mu_);
  m_.history_pages_quarantined += swap.size();
}

Status Client::Impl::FetchByKey(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                                LayerGroup group, std::vector<bool>* arrived,
                                std::vector<std::size_t>* on_nvme, std::uint64_t* moved) {
  std::vector<wire::FetchKey> keys;
  keys.reserve(batch.size());
  for (std::uint32_t b : batch) keys.push_back(c.match.chain[b].bytes());
  // One copy: the daemon pushes each block (or its layers `group`) into its
  // page of the history, where the engine will read it.
  const std::vector<std::uint64_t> offsets =
      PageOffsets(c, batch, std::uint64_t{group.first} * layer_bytes_);
  SlotLayout slots(offsets, group.count == 0 ? block_bytes_ : group.count * layer_bytes_,
                   kHistoryRegionId);
  slots.first_layer = group.first;
  slots.layer_count = group.count;
  slots.check_landing = o_.daemon_checks_landing;
  // Admitted by the session's window, shared by every load from this daemon:
  // a daemon that refuses requests for its per-namespace lease bound (other
  // loads' leases in flight) gets fewer at once and the refused one is asked
  // again, rather than its blocks recomputed.
  std::uint64_t throttled = 0;
  auto got = d.FetchWithin(keys, fingerprint_digest_, slots, o_.transfer_timeout, &throttled);
  if (throttled != 0) {
    MutexLock l(&metrics_mu_);
    m_.fetch_requests_throttled += throttled;
  }
  if (!got.ok()) {
    if (HostDown(got.status())) ReplacePages(c, batch);
    return got.status().WithContext("data-plane fetch");
  }
  return LandResults(c, d, batch, group, *got, /*from_lease=*/false, arrived, on_nvme, moved);
}

Status Client::Impl::LeaseAndGet(Context& c, Daemon& d, std::span<const std::uint32_t> batch,
                                 std::vector<bool>* arrived, std::uint64_t* moved) {
  std::vector<std::string> keys;
  keys.reserve(batch.size());
  for (std::uint32_t b : batch) keys.push_back(KeyBytes(c.match.chain[b]));
  const std::vector<std::uint64_t> offsets = PageOffsets(c, batch);
  const SlotLayout slots(offsets, block_bytes_, kHistoryRegionId);
  // Through the session's admission window, as kFetch requests are: a lease
  // refused for the daemon's per-namespace bound waits and is asked again.
  std::uint64_t throttled = 0;
  auto got = d.LeaseGetWithin(keys, fingerprint_digest_, o_.lease_ttl_ms, slots,
                              o_.transfer_timeout, &throttled);
  if (throttled != 0) {
    MutexLock l(&metrics_mu_);
    m_.fetch_requests_throttled += throttled;
  }
  if (!got.ok()) {
    if (HostDown(got.status())) ReplacePages(c, batch);
    return got.status();
  }
  return LandResults(c, d, batch, LayerGroup{}, *got, /*from_lease=*/true, arrived, nullptr, moved);
}

}  // namespace kvfabric::client
