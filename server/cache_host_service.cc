#include "server/cache_host_service.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "proto/grpc_status.h"
#include "proto/wire_limits.h"
#include "server/cache_host_convert.h"

namespace kvfabric {

// Returns the gRPC form of a failed kvfabric Status from a handler.
#define KVF_GRPC_RETURN_IF_ERROR(expr)                                 \
  do {                                                                 \
    ::kvfabric::Status kvf_grpc_status_ = (expr);                      \
    if (!kvf_grpc_status_.ok()) return ToGrpcStatus(kvf_grpc_status_); \
  } while (0)

namespace {

Namespace NamespaceOf(const std::string& ns) { return Namespace{ns}; }

// A node that answers a batch with the wrong number of results broke its
// contract; the call fails rather than misattribute outcomes to keys.
Status CheckResultCount(std::string_view rpc, std::size_t got, std::size_t want) {
  if (got == want) return Status::OK();
  return Status::Internal(std::string(rpc) + ": the node answered " + std::to_string(got) +
                          " results for " + std::to_string(want) + " entries");
}

}  // namespace

CacheHostService::CacheHostService(cache_host::CacheHostNode* node, HealthReporter* health,
                                   CacheHostServiceOptions options)
    : node_(node), health_(health), options_(std::move(options)) {}

Status CacheHostService::Admit(grpc::ServerContext* context) const {
  if (node_ == nullptr) {
    return Status::Unavailable("the cache-host daemon is starting; only Health is served");
  }
  return CheckCallLive(context->IsCancelled(), context->deadline(),
                       std::chrono::system_clock::now());
}

// ---------------------------------------------------------------- Reserve

grpc::Status CacheHostService::Reserve(grpc::ServerContext* context,
                                       const v1::ReserveRequest* request,
                                       v1::ReserveResponse* response) {
  if (grpc::Status a = Authorize(*context, "Reserve", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("blocks", request->blocks_size(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckTtlMs(request->ttl_ms(), limits));
  StatusOr<ModelFingerprint> fingerprint =
      StorableFingerprintFromProto(request->fingerprint(), limits);
  if (!fingerprint.ok()) return ToGrpcStatus(fingerprint.status());
  StatusOr<FingerprintDigest> digest = fingerprint->Digest();
  if (!digest.ok()) return ToGrpcStatus(digest.status());
  StatusOr<std::vector<BlockKey>> keys = ReserveKeysFromProto(request->blocks(), limits);
  if (!keys.ok()) return ToGrpcStatus(keys.status());

  // Per-entry checks: a bad descriptor is answered in its own result and
  // never reaches the node.
  const int n = request->blocks_size();
  std::vector<cache_host::ReserveEntry> entries;
  entries.reserve(n);
  std::vector<int> entry_of(n, -1);  // index into `entries`, or -1 if refused here
  std::vector<Status> refused(n);
  for (int i = 0; i < n; ++i) {
    StatusOr<cache_host::BlockMeta> meta = BlockMetaFromDescriptor(
        request->blocks(i), *fingerprint, *digest, "blocks[" + std::to_string(i) + "]");
    if (!meta.ok()) {
      refused[i] = meta.status();
      continue;
    }
    entry_of[i] = static_cast<int>(entries.size());
    entries.push_back({(*keys)[i], *meta});
  }

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  cache_host::ReserveBatch batch;
  if (!entries.empty()) {
    StatusOr<cache_host::ReserveBatch> reserved = node_->Reserve(
        NamespaceOf(request->namespace_()), entries, TtlUsFromMs(request->ttl_ms(), limits));
    if (!reserved.ok()) return ToGrpcStatus(reserved.status());
    batch = std::move(*reserved);
  }
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Reserve", batch.results.size(), entries.size()));

  if (batch.grant.lease_id != 0) {
    response->set_lease_id(batch.grant.lease_id);
    response->set_ttl_ms(TtlMsFromUs(batch.grant.ttl_us));
    GrantToProto(batch.grant, options_.transport_address, node_->pool_bytes(),
                 response->mutable_grant());
  }
  response->mutable_results()->Reserve(n);
  for (int i = 0; i < n; ++i) {
    v1::ReserveResult* result = response->add_results();
    if (entry_of[i] < 0) {
      StatusToEntry(refused[i], result->mutable_status());
      continue;
    }
    const cache_host::ReserveEntryResult& r = batch.results[entry_of[i]];
    StatusToEntry(r.status, result->mutable_status());
    if (r.status.ok()) ExtentsToProto(r.extents, result->mutable_extents());
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Commit

grpc::Status CacheHostService::Commit(grpc::ServerContext* context,
                                      const v1::CommitRequest* request,
                                      v1::CommitResponse* response) {
  if (grpc::Status a = Authorize(*context, "Commit", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("entries", request->entries_size(), limits));
  std::vector<cache_host::CommitEntry> entries;
  std::vector<BlockKey> keys;
  entries.reserve(request->entries_size());
  keys.reserve(request->entries_size());
  for (int i = 0; i < request->entries_size(); ++i) {
    const v1::CommitEntry& e = request->entries(i);
    StatusOr<BlockKey> key = BlockKeyFromProto(e.key(), "entries[" + std::to_string(i) + "].key");
    if (!key.ok()) return ToGrpcStatus(key.status());
    keys.push_back(*key);
    entries.push_back({*key, e.crc32c()});
  }
  KVF_GRPC_RETURN_IF_ERROR(CheckDistinctKeys(keys, "entries", ".key"));
  StatusOr<cache_host::GrantRef> grant =
      GrantRefFromProto(request->lease_id(), request->access_token(), "access_token");
  if (!grant.ok()) return ToGrpcStatus(grant.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatusOr<std::vector<Status>> results = node_->Commit(
      NamespaceOf(request->namespace_()), *grant, entries, request->release_uncommitted());
  if (!results.ok()) return ToGrpcStatus(results.status());
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Commit", results->size(), entries.size()));
  response->mutable_results()->Reserve(static_cast<int>(results->size()));
  for (const Status& s : *results) StatusToEntry(s, response->add_results()->mutable_status());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Lease

grpc::Status CacheHostService::Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                                     v1::LeaseResponse* response) {
  if (grpc::Status a = Authorize(*context, "Lease", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("keys", request->keys_size(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckTtlMs(request->ttl_ms(), limits));
  StatusOr<std::vector<BlockKey>> keys = BlockKeysFromProto(request->keys(), "keys", true);
  if (!keys.ok()) return ToGrpcStatus(keys.status());
  cache_host::LeaseRequestOptions lease_options;
  lease_options.ttl_us = TtlUsFromMs(request->ttl_ms(), limits);
  lease_options.prefix_only = request->prefix_only();
  const std::string& expected = request->expected_fingerprint_digest();
  if (!expected.empty()) {
    if (expected.size() != kFingerprintDigestSize) {
      return ToGrpcStatus(Status::InvalidArgument(
          "expected_fingerprint_digest: " + std::to_string(expected.size()) + " bytes; empty or " +
          std::to_string(kFingerprintDigestSize) + " required"));
    }
    FingerprintDigest digest;
    std::copy(expected.begin(), expected.end(), digest.begin());
    lease_options.expected_fingerprint = digest;
  }

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const Namespace ns = NamespaceOf(request->namespace_());
  StatusOr<cache_host::LeaseBatch> leased = node_->Lease(ns, *keys, lease_options);
  if (!leased.ok()) return ToGrpcStatus(leased.status());
  const cache_host::LeaseBatch& batch = *leased;

  // What a Lease may pin is bounded by the bytes it leases, which only the
  // node knows: over the limit, the whole grant is given back.
  Status refusal = CheckResultCount("Lease", batch.results.size(), keys->size());
  std::uint64_t leased_bytes = 0;
  for (const cache_host::LeaseEntryResult& r : batch.results) {
    if (r.status.ok()) leased_bytes += r.meta.bytes;
  }
  if (refusal.ok() && leased_bytes > limits.max_batch_payload_bytes()) {
    refusal = Status::InvalidArgument(
        "payload_bytes of the leased blocks: " + std::to_string(leased_bytes) +
        " > max_batch_payload_bytes " + std::to_string(limits.max_batch_payload_bytes()) +
        "; lease fewer keys per call");
  }
  if (!refusal.ok()) {
    if (batch.grant.lease_id != 0) {
      const cache_host::ReleaseEntry whole{batch.grant.lease_id, batch.grant.token, {}};
      // The grant may have expired already; either way it is gone.
      for (const Status& s : node_->Release(ns, {&whole, 1})) s.IgnoreError();
    }
    return ToGrpcStatus(refusal);
  }

  if (batch.grant.lease_id != 0) {
    response->set_lease_id(batch.grant.lease_id);
    response->set_ttl_ms(TtlMsFromUs(batch.grant.ttl_us));
    GrantToProto(batch.grant, options_.transport_address, node_->pool_bytes(),
                 response->mutable_grant());
  }
  response->mutable_results()->Reserve(static_cast<int>(batch.results.size()));
  for (std::size_t i = 0; i < batch.results.size(); ++i) {
    const cache_host::LeaseEntryResult& r = batch.results[i];
    v1::LeaseResult* result = response->add_results();
    StatusToEntry(r.status, result->mutable_status());
    if (!r.status.ok()) continue;
    DescriptorFromMeta((*keys)[i], r.meta, r.crc32c, result->mutable_block());
    result->set_tier(r.staged_from_nvme ? v1::TIER_NVME : v1::TIER_HOST);
    ExtentsToProto(r.extents, result->mutable_extents());
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Renew

grpc::Status CacheHostService::Renew(grpc::ServerContext* context, const v1::RenewRequest* request,
                                     v1::RenewResponse* response) {
  if (grpc::Status a = Authorize(*context, "Renew", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("lease_ids", request->lease_ids_size(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckTtlMs(request->ttl_ms(), limits));
  if (request->access_tokens_size() != request->lease_ids_size()) {
    return ToGrpcStatus(Status::InvalidArgument(
        "access_tokens: " + std::to_string(request->access_tokens_size()) + " for " +
        std::to_string(request->lease_ids_size()) + " lease_ids (one token per lease)"));
  }
  std::vector<cache_host::GrantRef> grants;
  grants.reserve(request->lease_ids_size());
  for (int i = 0; i < request->lease_ids_size(); ++i) {
    StatusOr<cache_host::GrantRef> g = GrantRefFromProto(
        request->lease_ids(i), request->access_tokens(i), "access_tokens[" + std::to_string(i) + "]");
    if (!g.ok()) return ToGrpcStatus(g.status());
    grants.push_back(*g);
  }

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::vector<StatusOr<std::uint64_t>> results = node_->Renew(
      NamespaceOf(request->namespace_()), grants, TtlUsFromMs(request->ttl_ms(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Renew", results.size(), grants.size()));
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (const StatusOr<std::uint64_t>& r : results) {
    v1::RenewResult* result = response->add_results();
    StatusToEntry(r.status(), result->mutable_status());
    if (r.ok()) result->set_ttl_ms(TtlMsFromUs(*r));
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Release

grpc::Status CacheHostService::Release(grpc::ServerContext* context,
                                       const v1::ReleaseRequest* request,
                                       v1::ReleaseResponse* response) {
  if (grpc::Status a = Authorize(*context, "Release", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("entries", request->entries_size(), limits));
  std::uint64_t total_keys = 0;
  for (const v1::ReleaseEntry& e : request->entries()) total_keys += e.keys_size();
  if (total_keys > limits.max_keys_per_batch()) {
    return ToGrpcStatus(Status::InvalidArgument(
        "keys of all entries: " + std::to_string(total_keys) + " > max_keys_per_batch " +
        std::to_string(limits.max_keys_per_batch())));
  }
  std::vector<cache_host::ReleaseEntry> entries;
  entries.reserve(request->entries_size());
  for (int i = 0; i < request->entries_size(); ++i) {
    const v1::ReleaseEntry& e = request->entries(i);
    StatusOr<std::vector<BlockKey>> keys =
        BlockKeysFromProto(e.keys(), "entries[" + std::to_string(i) + "].keys", false);
    if (!keys.ok()) return ToGrpcStatus(keys.status());
    StatusOr<cache_host::GrantRef> g = GrantRefFromProto(
        e.lease_id(), e.access_token(), "entries[" + std::to_string(i) + "].access_token");
    if (!g.ok()) return ToGrpcStatus(g.status());
    entries.push_back({e.lease_id(), g->token, std::move(*keys)});
  }

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::vector<Status> results = node_->Release(NamespaceOf(request->namespace_()), entries);
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Release", results.size(), entries.size()));
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (const Status& s : results) StatusToEntry(s, response->add_results()->mutable_status());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Lookup

grpc::Status CacheHostService::Lookup(grpc::ServerContext* context,
                                      const v1::LookupRequest* request,
                                      v1::LookupResponse* response) {
  if (grpc::Status a = Authorize(*context, "Lookup", request->namespace_()); !a.ok()) return a;
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("keys", request->keys_size(), limits));
  StatusOr<std::vector<BlockKey>> keys = BlockKeysFromProto(request->keys(), "keys", false);
  if (!keys.ok()) return ToGrpcStatus(keys.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::vector<cache_host::LookupEntryResult> results =
      node_->Lookup(NamespaceOf(request->namespace_()), *keys);
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Lookup", results.size(), keys->size()));
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (std::size_t i = 0; i < results.size(); ++i) {
    const cache_host::LookupEntryResult& r = results[i];
    v1::LookupResult* result = response->add_results();
    StatusToEntry(r.status, result->mutable_status());
    if (!r.status.ok()) continue;
    DescriptorFromMeta((*keys)[i], r.meta, r.crc32c, result->mutable_block());
    result->set_tier(TierToProto(r.tier));
    result->set_active_leases(r.active_leases);
    result->set_hit_count(r.hit_count);
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- ExplainEviction

namespace {

v1::EvictionPolicy PolicyToProto(cache_host::EvictionPolicyKind policy) {
  return policy == cache_host::EvictionPolicyKind::kLru ? v1::EVICTION_POLICY_LRU
                                                        : v1::EVICTION_POLICY_COST_AWARE;
}

void ExplanationToProto(const cache_host::EvictionDecision& d, v1::EvictionExplanation* r) {
  r->set_sequence(d.sequence);
  r->set_time_us(d.time_us);
  r->set_action(std::string(cache_host::EvictionActionName(d.action)));
  r->set_step(d.step);
  r->set_rank(d.rank);
  r->set_candidates(d.candidates);
  r->set_score(d.score);
  r->set_explanation(d.explanation);
}

}  // namespace

grpc::Status CacheHostService::ExplainEviction(grpc::ServerContext* context,
                                               const v1::ExplainEvictionRequest* request,
                                               v1::ExplainEvictionResponse* response) {
  if (grpc::Status a = Authorize(*context, "ExplainEviction", request->namespace_()); !a.ok()) {
    return a;
  }
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), options_.limits));
  StatusOr<BlockKey> key = BlockKeyFromProto(request->key(), "key");
  if (!key.ok()) return ToGrpcStatus(key.status());
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  for (const cache_host::EvictionDecision& d :
       node_->ExplainEviction(NamespaceOf(request->namespace_()), *key)) {
    ExplanationToProto(d, response->add_decisions());
  }
  response->set_eviction_policy(PolicyToProto(node_->options().policy));
  return grpc::Status::OK;
}

grpc::Status CacheHostService::ListEvictions(grpc::ServerContext* context,
                                             const v1::ListEvictionsRequest* request,
                                             v1::ListEvictionsResponse* response) {
  if (request->all_namespaces()) {
    KVF_GRPC_RETURN_IF_ERROR(CheckAdmin(*context, "ListEvictions of every namespace"));
  } else {
    if (grpc::Status a = Authorize(*context, "ListEvictions", request->namespace_()); !a.ok()) {
      return a;
    }
    KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), options_.limits));
  }
  if (request->limit() > kMaxListedDecisions) {
    return ToGrpcStatus(Status::InvalidArgument(
        "ListEvictions limit " + std::to_string(request->limit()) +
        " is over kMaxListedDecisions " + std::to_string(kMaxListedDecisions)));
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::size_t limit = request->limit() == 0 ? kDefaultListedDecisions : request->limit();
  const std::vector<cache_host::EvictionDecision> decisions =
      node_->RecentEvictions(limit, request->all_namespaces() ? nullptr : &request->namespace_());
  response->mutable_decisions()->Reserve(static_cast<int>(decisions.size()));
  for (const cache_host::EvictionDecision& d : decisions) {
    v1::ListedEviction* r = response->add_decisions();
    r->set_namespace_(d.tenant);
    r->set_key(
        std::string(reinterpret_cast<const char*>(d.key.bytes().data()), d.key.bytes().size()));
    r->set_pages(d.pages);
    ExplanationToProto(d, r->mutable_decision());
  }
  response->set_eviction_policy(PolicyToProto(node_->options().policy));
  response->set_log_capacity(node_->eviction_log_capacity());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Delete

grpc::Status CacheHostService::Authorize(const grpc::ServerContext& context, const char* method,
                                         const std::string& ns) const {
  if (options_.authorizer == nullptr) return grpc::Status::OK;
  return options_.authorizer->AuthorizeNamespace(context, method, ns);
}

Status CacheHostService::CheckAdmin(const grpc::ServerContext& context, const char* what) const {
  if (options_.admin) return Status::OK();
  if (options_.authorizer != nullptr && !options_.authorizer->policy().open()) {
    return FromGrpcStatus(options_.authorizer->AuthorizeAdmin(context, what));
  }
  return Status::PermissionDenied(
      std::string(what) + " is administrative (it acts on every tenant): it is served only on the "
                          "daemon's admin listener, " +
          (options_.admin_address.empty() ? std::string("which this daemon does not have (start "
                                                        "it with --admin-address)")
                                          : options_.admin_address + " (--admin-address)"));
}

grpc::Status CacheHostService::Delete(grpc::ServerContext* context,
                                      const v1::DeleteRequest* request,
                                      v1::DeleteResponse* response) {
  // With tenants, a tenant deletes its own namespace's keys; without, Delete
  // is administrative (the caller's namespace proves nothing).
  if (!options_.admin && options_.authorizer != nullptr && !options_.authorizer->policy().open()) {
    if (grpc::Status a = Authorize(*context, "Delete", request->namespace_()); !a.ok()) return a;
  } else {
    KVF_GRPC_RETURN_IF_ERROR(CheckAdmin(*context, "Delete"));
  }
  const v1::Limits& limits = options_.limits;
  KVF_GRPC_RETURN_IF_ERROR(CheckNamespace(request->namespace_(), limits));
  KVF_GRPC_RETURN_IF_ERROR(CheckBatchSize("keys", request->keys_size(), limits));
  StatusOr<std::vector<BlockKey>> keys = BlockKeysFromProto(request->keys(), "keys", false);
  if (!keys.ok()) return ToGrpcStatus(keys.status());

  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::vector<Status> results = node_->Delete(NamespaceOf(request->namespace_()), *keys);
  KVF_GRPC_RETURN_IF_ERROR(CheckResultCount("Delete", results.size(), keys->size()));
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (const Status& s : results) StatusToEntry(s, response->add_results()->mutable_status());
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Stats

grpc::Status CacheHostService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                     v1::StatsResponse* response) {
  if (request->include_namespaces()) {
    KVF_GRPC_RETURN_IF_ERROR(CheckAdmin(*context, "Stats with include_namespaces"));
  } else if (options_.authorizer != nullptr && !options_.admin) {
    const TenantSpec* tenant = nullptr;
    if (grpc::Status a = options_.authorizer->Authenticate(*context, "Stats", &tenant); !a.ok()) {
      return a;
    }
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  StatsContext stats;
  stats.host_pool_bytes = node_->pool_bytes();
  const Env* nvme_env = node_->options().nvme.env;
  stats.nvme_unit_bytes =
      nvme_env != nullptr ? nvme_env->DirectIoAlignment() : Env::kDefaultDirectIoAlignment;
  stats.policy = node_->options().policy;
  StatsFromSnapshot(node_->Snapshot(), stats, request->include_namespaces(), response);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Health

grpc::Status CacheHostService::Health(grpc::ServerContext* /*context*/,
                                      const v1::HealthRequest* /*request*/,
                                      v1::HealthResponse* response) {
  health_->Fill(response);
  // The limits in force are this service's, which a daemon may have lowered.
  *response->mutable_limits() = options_.limits;
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- Drain

grpc::Status CacheHostService::Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                                     v1::DrainResponse* response) {
  KVF_GRPC_RETURN_IF_ERROR(CheckAdmin(*context, "Drain"));
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const cache_host::ServingState state = node_->Drain(request->resume());
  health_->SetState(ServingStateToProto(state),
                    state == cache_host::ServingState::kDraining
                        ? "draining: new reservations and leases get UNAVAILABLE"
                        : std::string(cache_host::ServingStateName(state)));
  const cache_host::CacheHostSnapshot snapshot = node_->Snapshot();
  response->set_status(ServingStateToProto(state));
  response->set_active_reservations(snapshot.table.active_reservations);
  response->set_active_read_leases(snapshot.table.active_leases);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- OpenDataSession

grpc::Status CacheHostService::OpenDataSession(grpc::ServerContext* context,
                                               const v1::OpenDataSessionRequest* /*request*/,
                                               v1::OpenDataSessionResponse* response) {
  if (options_.data_sessions == nullptr) {
    return ToGrpcStatus(
        Status::Unimplemented("this daemon binds no data-plane sessions (--data-plane-auth=none)"));
  }
  cache_host::DataSessionTenant tenant{"default", {"*"}};
  if (options_.authorizer != nullptr) {
    const TenantSpec* t = nullptr;
    if (grpc::Status a = options_.authorizer->Authenticate(*context, "OpenDataSession", &t);
        !a.ok()) {
      return a;
    }
    tenant = cache_host::DataSessionTenant{t->name, t->namespaces};
  }
  KVF_GRPC_RETURN_IF_ERROR(Admit(context));
  const std::uint64_t now = Env::Default()->NowMicros();
  StatusOr<cache_host::OpenedDataSession> s = options_.data_sessions->Open(std::move(tenant), now);
  if (!s.ok()) return ToGrpcStatus(s.status());
  response->set_session_id(s->id);
  response->set_secret(
      std::string(reinterpret_cast<const char*>(s->secret.data()), s->secret.size()));
  response->set_expires_in_ms((s->expires_us - now) / 1000);
  response->set_required(options_.data_sessions_required);
  return grpc::Status::OK;
}

#undef KVF_GRPC_RETURN_IF_ERROR

}  // namespace kvfabric
