#include "server/health_reporter.h"

#include <random>
#include <utility>

#include "core/mutex.h"
#include "core/process_identity.h"
#include "proto/wire_limits.h"

namespace kvfabric {

namespace {

std::uint64_t NewIncarnation() {
  std::random_device rd;
  std::uint64_t v = 0;
  while (v == 0) v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return v;
}

}  // namespace

HealthReporter::HealthReporter(Env* env, std::string server_id, std::string version)
    : env_(env),
      server_id_(std::move(server_id)),
      version_(std::move(version)),
      start_micros_(env->NowMicros()),
      incarnation_(NewIncarnation()) {}

void HealthReporter::SetState(v1::ServingStatus state, std::string detail) {
  MutexLock lock(&mu_);
  state_ = state;
  detail_ = state == v1::SERVING_STATUS_SERVING ? "" : std::move(detail);
}

void HealthReporter::SetUcxSameUserOnly(bool same_user_only) {
  MutexLock lock(&mu_);
  ucx_same_user_only_ = same_user_only;
}

void HealthReporter::SetMaxRequestBytes(std::uint64_t bytes) {
  MutexLock lock(&mu_);
  max_request_bytes_ = bytes;
}

void HealthReporter::Fill(v1::HealthResponse* response) const {
  {
    MutexLock lock(&mu_);
    response->set_status(state_);
    response->set_detail(detail_);
    response->mutable_process()->set_ucx_same_user_only(ucx_same_user_only_);
  }
  response->set_version(version_);
  response->set_uptime_us(env_->NowMicros() - start_micros_);
  response->set_server_id(server_id_);
  response->set_incarnation(incarnation_);
  *response->mutable_limits() = DefaultLimits();
  {
    MutexLock lock(&mu_);
    if (max_request_bytes_ != 0)
      response->mutable_limits()->set_max_request_bytes(max_request_bytes_);
  }
  const ProcessIdentity self = LocalProcessIdentity();
  v1::ProcessIdentity* p = response->mutable_process();
  p->set_boot_id(self.boot_id);
  p->set_uid(self.uid);
  p->set_gid(self.gid);
  p->set_ipc_namespace(self.ipc_namespace);
}

}  // namespace kvfabric
