// Client::Impl::FetchFrom: one daemon's stream of a load, its host-pool
// units (kFetch, layer-major, fetch_depth in flight) and its NVMe leases, the
// straggler cut, and what it moved for placement's fit. The plan's runs and
// their fallbacks are client_io.cc.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "client/client_impl.h"
#include "client/straggler_cut.h"

namespace kvfabric::client {

using internal::HostDown;
using internal::MicrosSince;

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
    std::size_t fetchers KVF_GUARDED_BY(mu) = 0;    // host-pool workers still running
    bool down KVF_GUARDED_BY(mu) = false;
    bool cut KVF_GUARDED_BY(mu) = false;                 // past cut_after_us: no further request
    bool suspect KVF_GUARDED_BY(mu) = false;       // StreamVerdict::suspect: one request at a time
    std::size_t in_flight KVF_GUARDED_BY(mu) = 0;  // host-pool requests
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
  // Whether the stream is cut as a straggler (client/straggler_cut.h; the
  // first time, says so). REQUIRES: p.mu held.
  // Its time is counted at its share of what the daemon moved meanwhile
  // (this client's other loads beside it): placement predicts its end
  // beside the loads planned before it (PathLoad shares the daemon among
  // them), not the ones planned after it, and loads that start together all
  // end late, so uncorrected the first of eight loads at once was cut as a
  // straggler and fell back to recompute (client_load_bench, 8 contexts: 60
  // blocks, 1.0 s for a 0.17 s load). Placement fits the stream's time the
  // same way (TransferObservation.shared_bytes).
  StreamProgress progress;
  progress.total_bytes = std::uint64_t{blocks->size()} * block_bytes_;
  progress.predicted_us = tally->predicted_us;
  progress.cut_after_us = cut_after_us;
  progress.min_evidence_us = static_cast<double>(o_.straggler_slack.count()) * 1e3;
  auto past_cut = [&]() KVF_REQUIRES(p.mu) {
    if (p.cut) return true;
    if (!(cut_after_us > 0)) return false;
    progress.elapsed_us = MicrosSince(start);
    progress.own_bytes = p.host_moved + p.nvme_moved;
    progress.others_bytes = others_moved();
    const StreamVerdict verdict = JudgeStream(progress);
    if (!verdict.cut()) {
      if (p.suspect && !verdict.suspect) p.cv.NotifyAll();  // back to full depth
      p.suspect = verdict.suspect;
      return false;
    }
    p.cut = true;
    {
      MutexLock l(&metrics_mu_);
      ++(verdict.kind == StreamVerdict::Kind::kProjectedPastCutOff ? m_.streams_cut_projected
                                                                   : m_.streams_cut_past_cut_off);
    }
    if (p.first.ok()) {
      p.first = Status::DeadlineExceeded(DescribeCut(progress, verdict))
                    .WithContext("daemon " + host.host_id);
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
          // Judged again with layer 0's bytes in: nothing else of this
          // stream is in flight now, so a cut here costs no request.
          if (past_cut()) {
            --p.fetchers;
            p.cv.NotifyAll();
            return;
          }
        }
        // A suspect stream (client/straggler_cut.h) keeps one request in
        // flight until the next answer judges it again.
        if (p.suspect && p.in_flight > 0) {
          p.cv.Wait(&p.mu, [&]() KVF_REQUIRES(p.mu) {
            return p.down || p.cut || !p.suspect || p.in_flight == 0;
          });
          if (p.down || past_cut()) {
            --p.fetchers;
            p.cv.NotifyAll();
            return;
          }
        }
        ++p.in_flight;  // until its answer is recorded (or it turns out empty)
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
        MutexLock l(&p.mu);
        --p.in_flight;
        if (unit < first_units) first_unit_done();
        p.cv.NotifyAll();
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
      --p.in_flight;
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

}  // namespace kvfabric::client
