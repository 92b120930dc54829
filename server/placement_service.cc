#include "server/placement_service.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "proto/grpc_status.h"
#include "proto/wire_limits.h"
#include "server/cache_host_convert.h"
#include "server/placement/placement_node.h"
#include "server/placement_convert.h"

namespace kvfabric {

// Returns the gRPC form of a failed kvfabric Status from a handler.
#define KVF_GRPC_RETURN_IF_ERROR(expr)                                 \
  do {                                                                 \
    ::kvfabric::Status kvf_grpc_status_ = (expr);                      \
    if (!kvf_grpc_status_.ok()) return ToGrpcStatus(kvf_grpc_status_); \
  } while (0)

namespace {

// The member holding `lease_id`, if this node knows it (O(members)).
std::optional<placement::HostStatus> MemberOfLease(const placement::PlacementNode& node,
                                                   std::uint64_t lease_id) {
  for (placement::HostStatus& host : node.ListHosts()) {
    if (host.lease_id == lease_id) return std::move(host);
  }
  return std::nullopt;
}

}  // namespace

grpc::Status PlacementService::Authorize(const grpc::ServerContext& context, const char* method,
                                         const std::string& ns) const {
  if (options_.authorizer == nullptr) return grpc::Status::OK;
  return options_.authorizer->AuthorizeNamespace(context, method, ns);
}

grpc::Status PlacementService::AuthorizeDaemon(const grpc::ServerContext& context,
                                               const char* method) const {
  if (options_.authorizer == nullptr) return grpc::Status::OK;
  return options_.authorizer->AuthorizeDaemon(context, method);
}

grpc::Status PlacementService::AuthorizeAdmin(const grpc::ServerContext& context,
                                              const char* method) const {
  // Under the open policy placement has no admin listener: everything is
  // served, as before tenants existed.
  if (options_.authorizer == nullptr || options_.authorizer->policy().open()) {
    return grpc::Status::OK;
  }
  return options_.authorizer->AuthorizeAdmin(context, method);
}

PlacementService::PlacementService(placement::PlacementNode* node, HealthReporter* health,
                                   PlacementServiceOptions options)
    : node_(node), health_(health), options_(std::move(options)) {}

Status PlacementService::Admit(grpc::ServerContext* context) const {
  if (node_ == nullptr) {
    return Status::Unavailable("the placement service is starting; only Health is served");
  }
  return CheckCallLive(context->IsCancelled(), context->deadline(),
                       std::chrono::system_clock::now());
}

// ---------------------------------------------------------------- membership

grpc::Status PlacementService::Register(grpc::ServerContext* context,
                                        const v1::RegisterRequest* request,
                                        v1::RegisterResponse* response) {
  if (grpc::Status a = AuthorizeDaemon(*context, "Register"); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  StatusOr<placement::MemberRecord> record = MemberRecordFromRegister(*request, limits);
  if (!record.ok()) return ToGrpcStatus(record.status());
  KVF_GRPC_RETURN_IF_ERROR(CheckTtlMs(request->ttl_ms(), limits));

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  // ttl_ms 0 is the default of the limits in force, as Health reports it.
  const std::uint32_t ttl_ms = request->ttl_ms() == 0 ? limits.default_ttl_ms() : request->ttl_ms();
  StatusOr<placement::RegisterResult> result =
      node_->Register(*record, ttl_ms, request->previous_membership_token());
  if (!result.ok()) return ToGrpcStatus(result.status());
  RegisterResultToProto(*result, response);
  *response->mutable_limits() = limits;
  return grpc::Status::OK;
}

grpc::Status PlacementService::Heartbeat(grpc::ServerContext* context,
                                         const v1::HeartbeatRequest* request,
                                         v1::HeartbeatResponse* response) {
  if (grpc::Status a = AuthorizeDaemon(*context, "Heartbeat"); !a.ok()) return a;
  StatusOr<MemberUpdate> update = HeartbeatUpdateFromProto(*request, options_.limits);
  if (!update.ok()) return ToGrpcStatus(update.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  // The node replaces the whole record, and a heartbeat carries no addresses: start from the
  // member's current record. A lease this node does not know yet (registered through another
  // replica) is renewed without the update; the node learns the member from the store.
  std::optional<placement::MemberRecord> record;
  if (!update->empty()) {
    std::optional<placement::HostStatus> member =
        MemberOfLease(*node_, request->membership_lease_id());
    if (member) {
      record = std::move(member->record);
      // The node refuses the lease of another host or incarnation when it sees these.
      record->host_id = request->host_id();
      record->incarnation = request->incarnation();
      ApplyMemberUpdate(*update, &*record);
    }
  }
  StatusOr<placement::HeartbeatResult> result = node_->Heartbeat(
      request->membership_lease_id(), request->membership_token(), record ? &*record : nullptr);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_ttl_ms(result->ttl_ms);
  response->set_full_report_requested(result->full_report_requested);
  return grpc::Status::OK;
}

grpc::Status PlacementService::Deregister(grpc::ServerContext* context,
                                          const v1::DeregisterRequest* request,
                                          v1::DeregisterResponse* /*response*/) {
  if (grpc::Status a = AuthorizeDaemon(*context, "Deregister"); !a.ok()) return a;
  KVF_GRPC_RETURN_IF_ERROR(CheckHostId(request->host_id(), "host_id", options_.limits));

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::uint64_t lease_id = request->membership_lease_id();
  if (std::optional<placement::HostStatus> member = MemberOfLease(*node_, lease_id)) {
    if (member->record.host_id != request->host_id()) {
      return ToGrpcStatus(Status::InvalidArgument(
          "membership_lease_id: lease " + std::to_string(lease_id) + " belongs to host_id \"" +
          member->record.host_id + "\", not \"" + request->host_id() + "\""));
    }
    // Another incarnation holds the lease now; the caller's is already gone.
    if (member->record.incarnation != request->incarnation()) return grpc::Status::OK;
  }
  KVF_GRPC_RETURN_IF_ERROR(node_->Deregister(lease_id, request->membership_token()));
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- directory

grpc::Status PlacementService::ReportBlocks(grpc::ServerContext* context,
                                            const v1::ReportBlocksRequest* request,
                                            v1::ReportBlocksResponse* response) {
  if (grpc::Status a = AuthorizeDaemon(*context, "ReportBlocks"); !a.ok()) return a;
  StatusOr<placement::BlockReport> report = BlockReportFromProto(*request, options_.limits);
  if (!report.ok()) return ToGrpcStatus(report.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<placement::ReportResult> result = node_->ReportBlocks(*report);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_acked_sequence(result->acked_sequence);
  response->set_full_report_requested(result->full_report_requested);
  return grpc::Status::OK;
}

grpc::Status PlacementService::Locate(grpc::ServerContext* context,
                                      const v1::LocateRequest* request,
                                      v1::LocateResponse* response) {
  if (grpc::Status a = Authorize(*context, "Locate", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckChainSize(static_cast<std::size_t>(request->keys_size()), limits));
  StatusOr<std::vector<BlockKey>> keys =
      BlockKeysFromProto(request->keys(), "keys", /*distinct=*/false);
  if (!keys.ok()) return ToGrpcStatus(keys.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<placement::ChainLocations> locations = node_->Locate(request->namespace_(), *keys);
  if (!locations.ok()) return ToGrpcStatus(locations.status());
  ChainLocationsToProto(*locations, response->mutable_locations());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- plans

grpc::Status PlacementService::Plan(grpc::ServerContext* context, const v1::PlanRequest* request,
                                    v1::PlanResponse* response) {
  if (grpc::Status a = Authorize(*context, "Plan", request->namespace_()); !a.ok()) return a;
  // The client's host->device link: one per client connection.
  std::string client_id = context->peer();
  if (client_id.empty()) client_id = request->client_node();
  StatusOr<placement::PlanRequest> plan =
      PlanRequestFromProto(*request, std::move(client_id), options_.limits);
  if (!plan.ok()) return ToGrpcStatus(plan.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<placement::PlanResult> result = node_->Plan(*plan);
  if (!result.ok()) return ToGrpcStatus(result.status());
  PlanResultToProto(*result, options_.limits, response);
  return grpc::Status::OK;
}

grpc::Status PlacementService::ReportObservations(grpc::ServerContext* context,
                                                  const v1::ReportObservationsRequest* request,
                                                  v1::ReportObservationsResponse* /*response*/) {
  if (grpc::Status a = Authorize(*context, "ReportObservations", request->namespace_()); !a.ok())
    return a;
  StatusOr<placement::ObservationReport> report =
      ObservationReportFromProto(*request, options_.limits);
  if (!report.ok()) return ToGrpcStatus(report.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  KVF_GRPC_RETURN_IF_ERROR(node_->ReportObservations(*report));
  return grpc::Status::OK;
}

grpc::Status PlacementService::Explain(grpc::ServerContext* context,
                                       const v1::ExplainRequest* request,
                                       v1::ExplainResponse* response) {
  const TenantSpec* tenant = nullptr;
  if (options_.authorizer != nullptr) {
    if (grpc::Status a = options_.authorizer->Authenticate(*context, "Explain", &tenant); !a.ok()) {
      return a;
    }
  }
  switch (request->target_case()) {
    case v1::ExplainRequest::kPlanId:
      break;
    case v1::ExplainRequest::kEviction:
    case v1::ExplainRequest::kBlock:
      return ToGrpcStatus(Status::Unimplemented(
          "placement keeps no eviction or demotion decisions; the daemon that made them explains "
          "them: kvfabric explain eviction --cache-host HOST:PORT --namespace NS --key HEX "
          "(ListHosts gives each daemon's grpc_address)"));
    case v1::ExplainRequest::TARGET_NOT_SET:
      return ToGrpcStatus(Status::InvalidArgument("target: unset; name a plan_id"));
  }
  if (request->plan_id() == 0) {
    return ToGrpcStatus(Status::InvalidArgument("plan_id: 0; plan ids are non-zero"));
  }

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<placement::PlanExplanation> explanation = node_->Explain(request->plan_id());
  if (!explanation.ok()) return ToGrpcStatus(explanation.status());
  // Another tenant's plan reads as one that does not exist, so plan ids
  // tell nothing about other tenants' traffic.
  if (tenant != nullptr && !tenant->HoldsNamespace(explanation->ns) && !tenant->admin) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "plan " + std::to_string(request->plan_id()) +
                                                         " is unknown or aged out of the history");
  }
  PlanExplanationToProto(*explanation, options_.limits, response);
  return grpc::Status::OK;
}

grpc::Status PlacementService::ListPlans(grpc::ServerContext* context,
                                         const v1::ListPlansRequest* request,
                                         v1::ListPlansResponse* response) {
  // An empty namespace lists every namespace's plans.
  if (grpc::Status a = request->namespace_().empty()
                           ? AuthorizeAdmin(*context, "ListPlans of every namespace")
                           : Authorize(*context, "ListPlans", request->namespace_());
      !a.ok()) {
    return a;
  }
  if (!request->namespace_().empty()) {
    KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), options_.limits));
  }
  if (request->limit() > kMaxListedDecisions) {
    return ToGrpcStatus(Status::InvalidArgument(
        "ListPlans limit " + std::to_string(request->limit()) + " is over kMaxListedDecisions " +
        std::to_string(kMaxListedDecisions)));
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::size_t limit = request->limit() == 0 ? kDefaultListedDecisions : request->limit();
  const std::vector<placement::PlanSummary> plans =
      node_->RecentPlans(limit, request->namespace_().empty() ? nullptr : &request->namespace_());
  response->mutable_plans()->Reserve(static_cast<int>(plans.size()));
  for (const placement::PlanSummary& p : plans) {
    v1::PlanSummary* out = response->add_plans();
    out->set_plan_id(p.plan_id);
    out->set_decided_unix_us(p.decided_unix_us);
    out->set_kind(PlanKindToProto(p.kind));
    out->set_namespace_(p.ns);
    out->set_model_id(p.model_id);
    out->set_chain_blocks(p.chain_blocks);
    out->set_cached_prefix_blocks(p.cached_prefix_blocks);
    out->set_suffix_tokens(p.suffix_tokens);
    out->set_predicted_total_us(p.predicted_total_us);
    out->set_finished(p.finished);
    out->set_observed_total_us(p.observed_total_us.value_or(0.0));
    out->set_later_plans_delay_us(p.later_plans_delay_us.value_or(0.0));
  }
  response->set_history_plans(node_->PlanHistorySize());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- place

grpc::Status PlacementService::Place(grpc::ServerContext* context, const v1::PlaceRequest* request,
                                     v1::PlaceResponse* response) {
  if (grpc::Status a = Authorize(*context, "Place", request->namespace_()); !a.ok()) return a;
  StatusOr<placement::PlaceRequest> place = PlaceRequestFromProto(*request, options_.limits);
  if (!place.ok()) return ToGrpcStatus(place.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<placement::PlaceResponse> placed = node_->Place(*place);
  if (!placed.ok()) return ToGrpcStatus(placed.status());
  // One result per key, or the outcomes would be misattributed.
  if (placed->results.size() != place->keys.size()) {
    return ToGrpcStatus(Status::Internal("Place: the node answered " +
                                         std::to_string(placed->results.size()) + " results for " +
                                         std::to_string(place->keys.size()) + " keys"));
  }
  PlaceResponseToProto(*placed, response);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- hosts

grpc::Status PlacementService::ListHosts(grpc::ServerContext* context,
                                         const v1::ListHostsRequest* /*request*/,
                                         v1::ListHostsResponse* response) {
  if (options_.authorizer != nullptr) {
    const TenantSpec* tenant = nullptr;
    if (grpc::Status a = options_.authorizer->Authenticate(*context, "ListHosts", &tenant);
        !a.ok()) {
      return a;
    }
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::vector<placement::HostStatus> hosts = node_->ListHosts();
  response->mutable_hosts()->Reserve(static_cast<int>(hosts.size()));
  for (const placement::HostStatus& host : hosts) HostStatusToProto(host, response->add_hosts());
  for (const placement::DepartedHost& d : node_->RecentlyDeparted()) {
    DepartedHostToProto(d, response->add_departed());
  }
  ClusterSummaryToProto(node_->Snapshot(), response->mutable_summary());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Health

grpc::Status PlacementService::Health(grpc::ServerContext* /*context*/,
                                      const v1::HealthRequest* /*request*/,
                                      v1::HealthResponse* response) {
  health_->Fill(response);
  // The limits in force are this service's.
  *response->mutable_limits() = options_.limits;
  return grpc::Status::OK;
}

grpc::Status PlacementService::ReloadCalibration(grpc::ServerContext* context,
                                                 const v1::ReloadCalibrationRequest* /*request*/,
                                                 v1::ReloadCalibrationResponse* response) {
  if (grpc::Status a = AuthorizeAdmin(*context, "ReloadCalibration"); !a.ok()) return a;
  if (!options_.reload_calibration) {
    return ToGrpcStatus(Status::FailedPrecondition(
        "placement was started without --calibration: there is no file to reload"));
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<v1::ReloadCalibrationResponse> r = options_.reload_calibration();
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

#undef KVF_GRPC_RETURN_IF_ERROR

}  // namespace kvfabric
