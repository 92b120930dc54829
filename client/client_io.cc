// Client::Impl's data movement in: the data-plane sessions to daemons and
// plan execution (fetch with fallbacks) on loader threads. Recompute runs are
// client_recompute.cc, write-back client_save.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <optional>

#include "client/client_impl.h"
#include "client/client_log.h"
#include "core/block_format.h"
#include "core/bus_cost_model.h"
#include "core/crc32c.h"
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

Status Client::Impl::FetchFrom(Context& c, const MatchResult::Host& host,
                               std::vector<std::uint32_t>* blocks, std::size_t nvme_from,
                               StreamTally* tally, double cut_after_us, Layer0Gate* gate) {
  // Signals the gate once: when this stream's layer-0 units are answered,
  // at the latest on return (an early error included).
  struct GateSignal {
    Layer0Gate* gate;
    std::atomic<bool> sent{false};
    void Send() {
      if (gate != nullptr && !sent.exchange(true)) gate->Done();
    }
    ~GateSignal() { Send(); }
  } gate_signal{gate};
  nvme_from = std::min(nvme_from, blocks->size());
  auto daemon = GetDaemon(host);
  if (!daemon.ok()) return daemon.status();
  // The stream's time (what placement learns the path from, and what its
  // cut-off is measured against) starts once the session is open: opening
  // one (gRPC, the transport's connection, the daemon mapping the history
  // pool) is paid once per client and daemon, not per load.
  const auto start = Clock::now();
  // The session stays valid while this thread holds it, even if another
  // thread drops the daemon: its calls then fail Unavailable.
  const std::shared_ptr<Daemon> d = std::move(*daemon);
  // The session's bytes so far (all loads'): what others move beside this
  // stream is the difference, less this stream's own.
  const std::uint64_t session_bytes_at_start = d->bytes_moved();
  // Work units, layer-major: every batch of layer group 0, then of group 1,
  // ... (fetch_groups_; one whole-block group for a one-layer model), so each
  // layer is ready for WaitLayer before the next group's bytes are moving.
  // fetch_depth workers take units in that order (kFetch: blocks in the
  // daemon's host pool), each landing (CRC check in place) while the others
  // move. Blocks the daemon holds on NVMe only (or without layer CRCs) go to
  // one more worker, which leases them whole through the control plane (the
  // daemon stages them) while the host-pool units go on; a block that missed
  // a unit is left out of the later ones (it falls back whole). Blocks the
  // plan has on NVMe only ([nvme_from, end)) go to the lease worker from the
  // start, without a kFetch first. One lease at a time: a second in flight
  // overlapped staging with moving but ran into daemons' per-namespace lease
  // bound (--max-leased-bytes-per-namespace) beside the kFetch requests,
  // whose refusals fell back to recompute (cluster_planner_bench, 48 MiB).
  //
  // Layer 0 (the first group of a layered model) goes in at most
  // fetch_depth units, all in flight at once: a fifth unit of 64 KiB slices
  // waiting behind four would start only after one of them, beside the
  // next group's 8 MiB requests, and hold WaitLayer(0) back (the plan's
  // blocks need not split evenly between daemons: 76 and 52 of 128, say).
  // Such a unit may name more than 16 blocks: it goes as several kFetch
  // messages at once, each pinning at most 16 blocks of the daemon's pages.
  // The next group's units go only once this daemon answered every layer-0
  // unit: the daemon copies a connection's requests one after another on its
  // progress thread, and an 8 MiB request of later layers started beside
  // them delayed layer 0 (32 layers, two daemons: layer 0 ready after 0.08-
  // 0.20 of the load, mean 0.14; waiting, 0.07-0.14, mean 0.11, at the same
  // load rate). Another daemon's layer 0 is not waited for, so no daemon
  // idles for a slower one.
  const bool layered = fetch_groups_.front().count != 0;
  const std::size_t per_batch = layered ? layered_batch_ : fetch_batch_;
  const std::size_t batches = (nvme_from + per_batch - 1) / per_batch;
  const std::size_t first_units =
      layered ? std::min<std::size_t>(batches, std::max<std::uint32_t>(1, o_.fetch_depth))
              : batches;
  const std::size_t first_per =
      !layered || first_units == 0 ? per_batch : (nvme_from + first_units - 1) / first_units;
  const std::size_t units = first_units + batches * (fetch_groups_.size() - 1);
  // Unit u's layer group and its positions [from, to) in `blocks`.
  struct UnitSpan {
    std::size_t group = 0, from = 0, to = 0;
  };
  auto span_of = [&](std::size_t unit) {
    if (unit < first_units) {
      return UnitSpan{0, unit * first_per, std::min(unit * first_per + first_per, nvme_from)};
    }
    const std::size_t later = unit - first_units;
    const std::size_t from = (later % batches) * per_batch;
    return UnitSpan{1 + later / batches, from, std::min(from + per_batch, nvme_from)};
  };
  struct Progress {
    Mutex mu;
    CondVar cv;
    std::size_t next KVF_GUARDED_BY(mu) = 0;
    std::size_t first_done KVF_GUARDED_BY(mu) = 0;  // layer-0 units answered
    double first_done_us KVF_GUARDED_BY(mu) = 0;    // when the last of them was
    std::size_t fetchers KVF_GUARDED_BY(mu) = 0;  // host-pool workers still running
    bool down KVF_GUARDED_BY(mu) = false;
    bool cut KVF_GUARDED_BY(mu) = false;                 // past cut_after_us: no further request
    std::vector<bool> out KVF_GUARDED_BY(mu);            // per position: left the units
    std::vector<std::uint32_t> nvme KVF_GUARDED_BY(mu);  // to lease
    std::size_t planned_nvme KVF_GUARDED_BY(mu) = 0;     // of them, the plan's (at the front)
    std::vector<std::uint32_t> left KVF_GUARDED_BY(mu);
    Status first KVF_GUARDED_BY(mu);
    std::uint64_t host_moved KVF_GUARDED_BY(mu) = 0;
    std::uint64_t nvme_moved KVF_GUARDED_BY(mu) = 0;
    double host_end_us KVF_GUARDED_BY(mu) = 0;
    std::uint64_t host_shared KVF_GUARDED_BY(mu) = 0;  // others' bytes until host_end_us
    double nvme_end_us KVF_GUARDED_BY(mu) = 0;
  } p;
  // Bytes other loads moved through this daemon's session since the stream
  // began (its own, host pool and NVMe, taken out). REQUIRES: p.mu held.
  auto others_moved = [&]() KVF_REQUIRES(p.mu) {
    const std::uint64_t all = d->bytes_moved() - session_bytes_at_start;
    const std::uint64_t own = p.host_moved + p.nvme_moved;
    return all > own ? all - own : std::uint64_t{0};
  };
  {
    MutexLock l(&p.mu);
    p.out.assign(blocks->size(), false);
    for (std::size_t k = nvme_from; k < blocks->size(); ++k) {
      p.out[k] = true;
      p.nvme.push_back((*blocks)[k]);
    }
    p.planned_nvme = p.nvme.size();
  }
  // Records one request's outcome. REQUIRES: p.mu held.
  auto record = [&](std::span<const std::size_t> positions, const std::vector<bool>& arrived,
                    const std::vector<bool>& to_nvme, const Status& s, std::uint64_t moved)
                    KVF_REQUIRES(p.mu) {
                      if (moved > 0) {
                        p.host_moved += moved;
                        p.host_end_us = MicrosSince(start);
                        p.host_shared = others_moved();
                      }
                      for (std::size_t k = 0; k < positions.size(); ++k) {
                        if (arrived[k] || p.out[positions[k]]) continue;
                        p.out[positions[k]] = true;
                        (to_nvme[k] ? p.nvme : p.left).push_back((*blocks)[positions[k]]);
                      }
                      if (!s.ok() && p.first.ok())
                        p.first = s.WithContext("daemon " + host.host_id);
                      // The daemon is gone or stuck: the rest of the run goes elsewhere.
                      if (HostDown(s)) p.down = true;
                      p.cv.NotifyAll();
                    };
  // One more layer-0 unit answered; the last one signals the gate.
  // REQUIRES: p.mu held.
  auto first_unit_done = [&]() KVF_REQUIRES(p.mu) {
    if (++p.first_done < first_units) return;
    p.first_done_us = MicrosSince(start);
    gate_signal.Send();
  };
  if (first_units == 0) gate_signal.Send();
  // Whether the stream is past its cut-off (and, the first time, says so).
  // REQUIRES: p.mu held.
  // Its time is counted at its share of what the daemon moved meanwhile
  // (this client's other loads beside it): placement predicts its end
  // beside the loads planned before it (PathLoad shares the daemon among
  // them), not the ones planned after it, and loads that start together all
  // end late, so uncorrected the first of eight loads at once was cut as a
  // straggler and fell back to recompute (client_load_bench, 8 contexts: 60
  // blocks, 1.0 s for a 0.17 s load). Placement fits the stream's time the
  // same way (TransferObservation.shared_bytes).
  auto past_cut = [&]() KVF_REQUIRES(p.mu) {
    if (p.cut) return true;
    if (!(cut_after_us > 0)) return false;
    const double elapsed = MicrosSince(start);
    if (elapsed <= cut_after_us) return false;
    const double own = static_cast<double>(p.host_moved + p.nvme_moved);
    const double all = own + static_cast<double>(others_moved());
    const double share = all == 0 ? 1.0 : std::max(own / all, 1.0 / kMaxSharedShare);
    if (elapsed * share <= cut_after_us) return false;
    p.cut = true;
    if (p.first.ok()) {
      char b[200];
      std::snprintf(b, sizeof(b),
                    "stream cut after %.1f ms at %.0f%% of the daemon's bytes, past %.1f ms "
                    "(straggler_factor x its predicted end + straggler_slack)",
                    elapsed / 1e3, 100 * share, cut_after_us / 1e3);
      p.first = Status::DeadlineExceeded(std::string(b)).WithContext("daemon " + host.host_id);
    }
    p.cv.NotifyAll();
    return true;
  };
  auto fetch_host_pool = [&] {
    std::vector<bool> arrived, to_nvme;
    std::vector<std::size_t> on_nvme, positions;
    std::vector<std::uint32_t> batch;
    for (;;) {
      std::size_t unit = 0;
      double own_layer0_us = 0;
      {
        MutexLock l(&p.mu);
        if (p.down || p.next >= units || past_cut()) {
          --p.fetchers;
          p.cv.NotifyAll();
          return;
        }
        unit = p.next++;
        // A layered model's later groups wait until this daemon answered
        // every layer-0 unit, then for the other streams' layer 0 (the gate)
        // at most as long again.
        if (layered && unit >= first_units) {
          p.cv.Wait(&p.mu,
                    [&]() KVF_REQUIRES(p.mu) { return p.down || p.first_done >= first_units; });
          own_layer0_us = p.down ? 0 : p.first_done_us;
        }
      }
      if (own_layer0_us > 0 && gate != nullptr) {
        gate->AwaitUntil(start +
                         std::chrono::microseconds(static_cast<std::int64_t>(2 * own_layer0_us)));
      }
      {
        MutexLock l(&p.mu);
        // This unit's blocks that are still in play.
        positions.clear();
        const UnitSpan us = span_of(unit);
        for (std::size_t k = us.from; k < us.to; ++k) {
          if (!p.out[k]) positions.push_back(k);
        }
      }
      const LayerGroup group = fetch_groups_[span_of(unit).group];
      batch.clear();
      if (group.count != 0) {
        // A fallback from another daemon skips the layers that landed.
        MutexLock l(&c.mu);
        std::size_t kept = 0;
        for (std::size_t k : positions) {
          const std::uint32_t b = (*blocks)[k];
          const std::uint64_t word =
              c.landed_layer_bits[std::size_t{b} * c.layer_words + group.first / 64];
          if ((word & (std::uint64_t{1} << (group.first % 64))) != 0) continue;
          positions[kept++] = k;
        }
        positions.resize(kept);
      }
      if (positions.empty()) {
        if (unit < first_units) {
          MutexLock l(&p.mu);
          first_unit_done();
          p.cv.NotifyAll();
        }
        continue;
      }
      for (std::size_t k : positions) batch.push_back((*blocks)[k]);
      arrived.assign(batch.size(), false);
      to_nvme.assign(batch.size(), false);
      on_nvme.clear();
      std::uint64_t moved = 0;
      const Status s = FetchByKey(c, *d, batch, group, &arrived, &on_nvme, &moved);
      if (!HostDown(s)) {
        for (std::size_t k : on_nvme) to_nvme[k] = true;
      }
      MutexLock l(&p.mu);
      if (unit < first_units) first_unit_done();
      record(positions, arrived, to_nvme, s, moved);
    }
  };
  auto lease_nvme = [&] {
    std::vector<std::uint32_t> batch;
    std::vector<bool> arrived, none;
    for (;;) {
      {
        MutexLock l(&p.mu);
        // A lease of fewer than fetch_batch_ blocks goes only when no more
        // can come (or it holds the plan's NVMe blocks, known from the start).
        p.cv.Wait(&p.mu, [&]() KVF_REQUIRES(p.mu) {
          return p.down || p.cut || p.nvme.size() >= fetch_batch_ || p.planned_nvme > 0 ||
                 p.fetchers == 0;
        });
        if (p.down || p.nvme.empty() || past_cut()) {
          p.left.insert(p.left.end(), p.nvme.begin(), p.nvme.end());
          p.nvme.clear();
          return;
        }
        const std::size_t n = std::min(fetch_batch_, p.nvme.size());
        batch.assign(p.nvme.begin(), p.nvme.begin() + static_cast<std::ptrdiff_t>(n));
        p.nvme.erase(p.nvme.begin(), p.nvme.begin() + static_cast<std::ptrdiff_t>(n));
        p.planned_nvme -= std::min(p.planned_nvme, n);
      }
      arrived.assign(batch.size(), false);
      none.assign(batch.size(), false);
      std::uint64_t moved = 0;
      const Status s = LeaseAndGet(c, *d, batch, &arrived, &moved);
      MutexLock l(&p.mu);
      if (moved > 0) {
        p.nvme_moved += moved;
        p.nvme_end_us = MicrosSince(start);
      }
      for (std::size_t k = 0; k < batch.size(); ++k) {
        if (!arrived[k]) p.left.push_back(batch[k]);
      }
      if (!s.ok() && p.first.ok()) p.first = s.WithContext("daemon " + host.host_id);
      if (HostDown(s)) p.down = true;
      p.cv.NotifyAll();
    }
  };
  const std::size_t workers =
      std::max<std::size_t>(1, std::min<std::size_t>(o_.fetch_depth, units));
  {
    MutexLock l(&p.mu);
    p.fetchers = workers;
  }
  TaskGroup threads;
  threads.Run(&loaders_, lease_nvme);
  for (std::size_t w = 1; w < workers; ++w) threads.Run(&loaders_, fetch_host_pool);
  fetch_host_pool();
  threads.Wait();
  MutexLock l(&p.mu);
  // Blocks a request answered as on NVMe after the lease worker had stopped
  // (the stream was cut or the daemon went down while it was in flight) were
  // never leased: they fall back too. Without this a cut stream lost them,
  // and a fallback recompute of a later block waited for them for ever.
  p.left.insert(p.left.end(), p.nvme.begin(), p.nvme.end());
  p.nvme.clear();
  if (p.down || p.cut) {
    // The daemon is gone (its session too) or its stream was cut (the
    // daemon stays): whatever it did not land in full falls back.
    if (p.down) DropDaemon(d);
    MutexLock cl(&c.mu);
    for (std::size_t k = 0; k < blocks->size(); ++k) {
      if (!p.out[k] && c.landed_us[(*blocks)[k]] < 0) p.left.push_back((*blocks)[k]);
    }
  }
  tally->cut = tally->cut || p.cut;
  tally->host_bytes += p.host_moved;
  tally->nvme_bytes += p.nvme_moved;
  if (p.host_moved > 0 && p.host_end_us >= tally->host_us) {
    tally->host_us = p.host_end_us;
    tally->host_shared_bytes = p.host_shared;
  }
  if (p.nvme_moved > 0) tally->nvme_us = std::max(tally->nvme_us, p.nvme_end_us);
  std::sort(p.left.begin(), p.left.end());
  p.left.erase(std::unique(p.left.begin(), p.left.end()), p.left.end());
  *blocks = std::move(p.left);
  return p.first;
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
