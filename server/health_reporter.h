// HealthReporter answers the Health RPC that both services expose: serving
// state, version, uptime, identity, incarnation and limits.
//
// Thread safety: Fill() and SetState() may be called from any thread.
#ifndef KVFABRIC_SERVER_HEALTH_REPORTER_H_
#define KVFABRIC_SERVER_HEALTH_REPORTER_H_

#include <cstdint>
#include <string>

#include "core/env.h"
#include "core/mutex.h"
#include "kvfabric/v1/common.pb.h"

namespace kvfabric {

class HealthReporter {
 public:
  // `env` is borrowed and must outlive this object (it supplies the clock).
  HealthReporter(Env* env, std::string server_id, std::string version);

  HealthReporter(const HealthReporter&) = delete;
  HealthReporter& operator=(const HealthReporter&) = delete;

  // `detail` says why, in one line, when `state` is not SERVING.
  void SetState(v1::ServingStatus state, std::string detail);

  void Fill(v1::HealthResponse* response) const;

  // Reported as process.ucx_same_user_only (a daemon whose UCX listener
  // admits only its own user from its host). Default false.
  void SetUcxSameUserOnly(bool same_user_only);

  // Reported as limits.max_request_bytes (the gRPC receive limit the server
  // was started with). Default kMaxRequestBytes.
  void SetMaxRequestBytes(std::uint64_t bytes);

  // A random id of this process start, never 0.
  std::uint64_t incarnation() const { return incarnation_; }

 private:
  Env* const env_;
  const std::string server_id_;
  const std::string version_;
  const std::uint64_t start_micros_;
  const std::uint64_t incarnation_;
  mutable Mutex mu_;
  v1::ServingStatus state_ KVF_GUARDED_BY(mu_) = v1::SERVING_STATUS_STARTING;
  std::string detail_ KVF_GUARDED_BY(mu_) = "starting";
  bool ucx_same_user_only_ KVF_GUARDED_BY(mu_) = false;
  std::uint64_t max_request_bytes_ KVF_GUARDED_BY(mu_) = 0;  // 0: the default
};

}  // namespace kvfabric

#endif  // KVFABRIC_SERVER_HEALTH_REPORTER_H_
