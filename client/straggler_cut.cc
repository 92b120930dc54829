#include "client/straggler_cut.h"

#include <algorithm>
#include <cstdio>

#include "core/bus_cost_model.h"
#include "core/units.h"

namespace kvfabric::client {

StreamVerdict JudgeStream(const StreamProgress& p) {
  StreamVerdict v;
  if (!(p.cut_after_us > 0)) return v;
  const double own = static_cast<double>(p.own_bytes);
  const double all = own + static_cast<double>(p.others_bytes);
  v.share = all == 0 ? 1.0 : std::max(own / all, 1.0 / kMaxSharedShare);
  v.own_us = std::max(0.0, p.elapsed_us) * v.share;
  if (v.own_us > p.cut_after_us) {
    v.kind = StreamVerdict::Kind::kPastCutOff;
    return v;
  }
  if (p.own_bytes == 0 || p.total_bytes <= p.own_bytes || !(p.predicted_us > 0)) return v;
  v.projected_us = v.own_us * static_cast<double>(p.total_bytes) / own;
  if (!(v.projected_us > p.cut_after_us)) return v;
  if (v.own_us < std::max(p.predicted_us, p.min_evidence_us)) {
    v.suspect = true;
  } else {
    v.kind = StreamVerdict::Kind::kProjectedPastCutOff;
  }
  return v;
}

std::string DescribeCut(const StreamProgress& p, const StreamVerdict& v) {
  char b[320];
  if (v.kind == StreamVerdict::Kind::kProjectedPastCutOff) {
    std::snprintf(b, sizeof(b),
                  "stream cut after %.1f ms at %.0f%% of the daemon's bytes: %s of %s moved, at "
                  "that rate it would end at %.1f ms, past %.1f ms (straggler_factor x its "
                  "predicted end %.1f ms + straggler_slack)",
                  p.elapsed_us / 1e3, 100 * v.share, FormatBytes(p.own_bytes).c_str(),
                  FormatBytes(p.total_bytes).c_str(), v.projected_us / 1e3, p.cut_after_us / 1e3,
                  p.predicted_us / 1e3);
  } else {
    std::snprintf(b, sizeof(b),
                  "stream cut after %.1f ms at %.0f%% of the daemon's bytes, past %.1f ms "
                  "(straggler_factor x its predicted end + straggler_slack)",
                  p.elapsed_us / 1e3, 100 * v.share, p.cut_after_us / 1e3);
  }
  return b;
}

}  // namespace kvfabric::client
