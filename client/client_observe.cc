// Client::Impl's report of what a load's streams measured (RecordTransfers):
// each daemon's host-pool and NVMe parts as their paths' observations, the
// client's ingest where two or more host-pool parts ran together, and which
// of them moved beside a prefill (placement leaves those out of its fits) or
// beside other loads (placement fits those at their share of the time).
#include <algorithm>

#include "client/client_impl.h"

namespace kvfabric::client {

using internal::MicrosSince;
using internal::Observation;

void Client::Impl::RecordTransfers(Context& c, const std::vector<MatchResult::Host>& hosts,
                                   std::span<const StreamTally> tallies) {
  // A stream's time: the longer of its parts that moved bytes.
  const auto StreamMicros = [](const StreamTally& t) {
    return std::max(t.host_bytes > 0 ? t.host_us : 0.0, t.nvme_bytes > 0 ? t.nvme_us : 0.0);
  };
  std::uint64_t total = 0;
  double us = 0;  // the overlapped time: the longest part of any stream
  // The host-pool parts alone, for the ingest (below): their bytes, how many
  // streams had one, the longest and the shortest.
  std::uint64_t host_total = 0;
  std::size_t host_streams = 0;
  double host_longest = 0, host_shortest = 0;
  for (const StreamTally& t : tallies) {
    total += t.host_bytes + t.nvme_bytes;
    if (t.host_bytes + t.nvme_bytes == 0) continue;
    us = std::max(us, StreamMicros(t));
    if (t.host_bytes == 0) continue;
    host_total += t.host_bytes;
    host_shortest = host_streams == 0 ? t.host_us : std::min(host_shortest, t.host_us);
    host_longest = std::max(host_longest, t.host_us);
    ++host_streams;
  }
  if (total == 0) return;
  // The planner's FETCH MODEL: two sources per daemon (its host pool; its
  // NVMe tier, staged by the daemon and then moved like the rest), side by
  // side, through the client's ingest they all share. Each source's bytes
  // are observed with its own part's wall time (what it delivered beside
  // the others): the host pool's as remote_host_to_local_host, the NVMe
  // tier's as nvme_to_host, so a daemon's slow NVMe never makes its host
  // pool look slow and the staged path's cost is learned where the planner
  // prices it. A load from two or more daemons at once whose streams ended
  // within 2x of each other is also an observation of the ingest: their
  // host-pool parts' bytes over the longest of those parts (host_id "":
  // every client's default).
  // A prefill of this load that ran beside the streams (a split's front)
  // slowed them: the observations say so, and placement leaves them out of
  // the paths' fits (the split's overlap term covers it).
  {
    MutexLock l(&c.mu);
    // A stream cut as a straggler missed by far more than a prefill beside
    // it explains: that miss is the path's, and reported as such (a model
    // that plans only splits would otherwise never learn a capped link).
    // Likewise a stream that ended later past its predicted end than this
    // load's prefills ran until now: a prefill beside it can have taken at
    // most all of its own time from the stream, so the rest is the path's.
    const bool beside = c.fetch_beside_prefill;
    const double prefill_us =
        c.prefill_us + (c.prefill_running ? MicrosSince(c.prefill_since) : 0.0);
    for (std::size_t h = 0; h < hosts.size() && h < tallies.size(); ++h) {
      const StreamTally& t = tallies[h];
      const double stream_us = StreamMicros(t);
      // (Only where this client ran the prefill: an engine that computes the
      // front itself, as vLLM's connector does, says nothing of its time.)
      const bool unexplained =
          prefill_us > 0 && t.predicted_us > 0 && stream_us - t.predicted_us > prefill_us;
      const std::size_t first = c.transfers.size();
      if (t.host_bytes > 0) {
        c.transfers.push_back(Observation(v1::BUS_PATH_REMOTE_HOST_TO_LOCAL_HOST, hosts[h].host_id,
                                          t.host_bytes, std::max(t.host_us, 1.0)));
        c.transfers.back().set_shared_bytes(t.host_shared_bytes);
      }
      if (t.nvme_bytes > 0) {
        c.transfers.push_back(Observation(v1::BUS_PATH_NVME_TO_HOST, hosts[h].host_id, t.nvme_bytes,
                                          std::max(t.nvme_us, 1.0)));
      }
      for (std::size_t i = first; i < c.transfers.size(); ++i) {
        c.transfers[i].set_beside_prefill(beside && !t.cut && !unexplained);
      }
    }
    const std::size_t ingest = c.transfers.size();
    // The shared ingest limited the load only if the streams ended about
    // together: one stream far slower than the others (a capped link, a
    // straggler) says nothing about the client's ingest, and reported as
    // its rate it made every later fetch look slow. Only the host-pool parts
    // are counted: an NVMe part runs at its daemon's staging rate (a few
    // hundred MB/s here), so streams that end together because both staged
    // from NVMe measure the disks, not the client. Counted, they taught the
    // ingest 190-500 MB/s on a client that takes 1 GB/s and more, and every
    // later fetch-all looked slower than the split beside it.
    if (host_streams >= 2 && host_shortest >= 0.5 * host_longest) {
      c.transfers.push_back(
          Observation(v1::BUS_PATH_CLIENT_INGEST, "", host_total, std::max(host_longest, 1.0)));
      // Other loads' bytes through any daemon meanwhile (each stream counted
      // its own daemon's).
      std::uint64_t shared = 0;
      for (const StreamTally& t : tallies) shared += t.host_bytes > 0 ? t.host_shared_bytes : 0;
      c.transfers.back().set_shared_bytes(shared);
    }
    for (std::size_t i = ingest; i < c.transfers.size(); ++i) {
      c.transfers[i].set_beside_prefill(beside);
    }
  }
  prom_->ObserveTransfer(/*save=*/false, total, us);
  MutexLock ml(&metrics_mu_);
  m_.fetch_us += static_cast<std::uint64_t>(us);
}

}  // namespace kvfabric::client
