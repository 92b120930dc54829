// Client::Impl's calls to placement: which replica to try, and the backoff
// of replicas that do not answer (client_impl.h, CallPlacement).
#include <algorithm>
#include <chrono>
#include <string>

#include "client/client_impl.h"

namespace kvfabric::client {

std::optional<std::size_t> Client::Impl::PlacementToTry(std::size_t attempt) {
  MutexLock l(&placement_mu_);
  const std::size_t i = (placement_current_ + attempt) % placement_state_.size();
  const ReplicaState& r = placement_state_[i];
  if (r.backoff.count() != 0 && std::chrono::steady_clock::now() < r.retry_at) return std::nullopt;
  return i;
}

Status Client::Impl::PlacementBackoff() {
  std::string why;
  {
    MutexLock l(&placement_mu_);
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < placement_state_.size(); ++i) {
      const ReplicaState& r = placement_state_[i];
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(r.retry_at - now);
      why += std::string(why.empty() ? "" : "; ") + "placement at " + placement_addresses_[i] +
             " did not answer (" + r.last_error + "), next try in " +
             std::to_string(std::max<std::int64_t>(0, left.count())) + " ms";
    }
  }
  MutexLock m(&metrics_mu_);
  ++m_.placement_calls_skipped;
  return Status::Unavailable(why);
}

void Client::Impl::PlacementCallDone(std::size_t replica, const grpc::Status& g) {
  MutexLock l(&placement_mu_);
  ReplicaState& r = placement_state_[replica];
  if (g.error_code() != grpc::StatusCode::UNAVAILABLE &&
      g.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    r.backoff = std::chrono::milliseconds(0);  // it answered: calls start here
    placement_current_ = replica;
    return;
  }
  r.backoff = r.backoff.count() == 0 ? std::chrono::milliseconds(1000)
                                     : std::min(r.backoff * 2, std::chrono::milliseconds(30000));
  r.last_error = g.error_message();
  // xorshift: +-25% so that clients cut off together do not come back together.
  placement_jitter_ ^= placement_jitter_ << 13;
  placement_jitter_ ^= placement_jitter_ >> 7;
  placement_jitter_ ^= placement_jitter_ << 17;
  const double factor = 0.75 + 0.5 * static_cast<double>(placement_jitter_ % 1000) / 1000.0;
  r.retry_at = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(static_cast<std::int64_t>(r.backoff.count() * factor));
}

}  // namespace kvfabric::client
