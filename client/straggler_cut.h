// When a daemon's stream of a load is cut as a straggler
// (ClientOptions::straggler_factor): the rule on its own, so it can be
// tested without a daemon and explained in one place (docs/client.md).
//
// A stream's own time is its elapsed time counted at its share of the bytes
// the daemon's session moved meanwhile (own / (own + others), at least
// 1 / kMaxSharedShare): loads started together share the daemon and all end
// late where placement priced the first alone, and are not cut for it.
//
// It is cut
//   past its cut-off:   own time > cut_after_us (straggler_factor x its
//                       predicted end + straggler_slack), or
//   projected past it:  it has already used its whole predicted end (and at
//                       least straggler_slack), and at the rate it moved so
//                       far its planned bytes would end past cut_after_us:
//                       own time x total_bytes / own_bytes > cut_after_us.
// The projection lets a stream on a link that became many times slower than
// placement knew stop before its large requests go out: a layered load's
// first requests carry layer 0 only (1/layers of its bytes), and the client
// judges the stream when they are answered, with nothing else in flight.
// Without it the cut came only after straggler_factor x the prediction, and
// the fetch_depth requests of 8 MiB already on the capped link finished
// first (cluster_planner_bench phase 2: 1048 ms for a load that recomputes
// in 301 ms, docs/benchmarks.md). Requiring the whole predicted time to
// have passed means a stall shorter than the stream's own prediction never
// projects a cut.
//
// A stream whose rate projects it past its cut-off before that evidence is in
// is suspect: the client then keeps one request of it in flight, not
// fetch_depth, until the next answer judges it again (cut, or on time and
// back to full depth). On a link capped to a fourteenth of what placement
// knew, layer 0 took 21 ms of a stream predicted to end after 150 ms: too
// little to cut on, and then fetch_depth requests of 8 MiB went out at
// once, sharing the link and all ending after ~900 ms; one at a time, the
// first ends after ~220 ms and cuts the stream.
#ifndef KVFABRIC_CLIENT_STRAGGLER_CUT_H_
#define KVFABRIC_CLIENT_STRAGGLER_CUT_H_

#include <cstdint>
#include <string>

namespace kvfabric::client {

struct StreamProgress {
  double elapsed_us = 0;           // since the stream's session was open
  std::uint64_t own_bytes = 0;     // this stream moved (host pool and NVMe)
  std::uint64_t others_bytes = 0;  // other loads moved through the daemon's session meanwhile
  std::uint64_t total_bytes = 0;   // the stream's planned bytes (0: no projection)
  double predicted_us = 0;         // placement's predicted end for the stream (0: none)
  double cut_after_us = 0;         // its cut-off; 0: never cut
  double min_evidence_us = 0;      // straggler_slack: the least own time a projection needs
};

struct StreamVerdict {
  enum class Kind : std::uint8_t { kOnTime, kPastCutOff, kProjectedPastCutOff };
  Kind kind = Kind::kOnTime;
  // kOnTime only: at its rate so far it would end past its cut-off, but it
  // has not yet run its predicted time (or straggler_slack).
  bool suspect = false;
  double share = 1;         // of the daemon's bytes
  double own_us = 0;        // elapsed_us x share
  double projected_us = 0;  // own time at the end at the rate so far (0: not projected)
  bool cut() const { return kind != Kind::kOnTime; }
};

StreamVerdict JudgeStream(const StreamProgress& p);

// The run's failure text for a cut stream: "stream cut after ..." with the
// figures that decided it.
std::string DescribeCut(const StreamProgress& p, const StreamVerdict& v);

}  // namespace kvfabric::client

#endif  // KVFABRIC_CLIENT_STRAGGLER_CUT_H_
