// kvfabric-cached's settings (cached_main.cc): the flags Run parses into,
// the checks made of them before anything starts, and their conversion into
// CacheHostOptions; --check-config's report. Each function is documented at
// its definition in cached_flags.cc. Part of the kvfabric-cached binary only.
#ifndef KVFABRIC_SERVER_CACHE_HOST_CACHED_FLAGS_H_
#define KVFABRIC_SERVER_CACHE_HOST_CACHED_FLAGS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"
#include "security/grpc_security.h"
#include "security/tenant_policy.h"
#include "server/cache_host/cache_host_node.h"
#include "server/cache_host/compact_converter.h"
#include "server/grpc_server_limits.h"

namespace kvfabric::cached {

struct Flags {
  std::string host_id;
  std::string calibration_path;
  std::string grpc_address = "127.0.0.1:7440";
  std::string admin_address;
  std::string metrics_address = "127.0.0.1:0";
  std::string ready_file;
  std::string data_transport = "ucx";
  std::string ucx_tls = "sm,self,tcp";
  std::string shared_memory_peers = "same-user";
  GrpcServerLimits grpc_limits;
  std::string tcp_send_buffer = "auto";
  std::uint64_t tcp_receive_buffer_bytes = 0;
  std::uint64_t tcp_max_pacing_rate = 0;
  int copy_threads = 1;
  std::uint64_t streaming_copy_min_bytes = std::uint64_t{8} << 20;
  std::chrono::microseconds max_rank_deferral{20'000};
  int data_workers = 1;
  std::string lock_memory = "required";
  std::string pool_memory = "transport";
  std::string eviction_policy = "cost-aware";
  std::string nvme_io_engine = "auto";
  std::vector<std::string> quotas;
  std::string model_id;
  std::uint32_t model_layers = 32, model_kv_heads = 8, model_head_dim = 128;
  std::uint32_t tokens_per_block = 16;
  std::string model_dtype = "fp16";
  std::uint64_t history_tokens = 32768;
  std::chrono::microseconds max_lease_ttl{60'000'000};
  std::chrono::microseconds default_lease_ttl{30'000'000};
  std::chrono::microseconds reservation_ttl{10'000'000};
  std::uint32_t max_namespaces = 4096;
  std::uint32_t max_reservations = 65536;
  std::uint32_t max_leases = 65536;
  std::uint32_t max_keys_per_lease = 4096;
  std::uint32_t max_reservations_per_namespace = 4096;
  std::uint64_t max_reserved_bytes_per_namespace = 0;
  std::uint32_t max_leases_per_namespace = 16384;
  std::uint64_t max_leased_bytes_per_namespace = 0;
  std::uint32_t eviction_log_capacity = 4096;
  std::uint32_t metrics_namespace_series = 0;
  std::uint32_t max_data_connections = 4096;
  std::uint32_t max_data_connections_per_host = 1024;
  std::uint32_t max_requests_per_connection = 256;
  std::uint32_t store_threads = 2;
  std::chrono::microseconds data_idle_timeout{300'000'000};
  std::chrono::microseconds transfer_timeout{30'000'000};
  std::chrono::microseconds shutdown_grace{5'000'000};
  bool no_prefault = false;
  bool no_populate_imports = false;
  std::string placement_address;
  std::string node_name;
  std::chrono::microseconds membership_ttl{10'000'000};
  GrpcSecurityOptions security;
  std::string tenants_file;
  std::string placement_token_file;
  std::string placement_server_name;
  std::shared_ptr<const TenantPolicy> tenants;  // loaded from tenants_file
  std::string data_plane_auth = "auto";
  std::uint32_t max_data_sessions = 65536;
  std::uint32_t max_data_handshakes = 1024;
  bool data_plane_tls = false;
  std::chrono::microseconds data_session_ttl{3'600'000'000};
  // The background compact converter (compact_converter.h, docs/cache-host.md).
  int compact_threads = 0;
  std::uint64_t compact_queue_blocks = 1024;
  std::uint64_t compact_pause_leases = 32;
  // kCompactMinFreeDefault: 10% of --host-pool-bytes.
  std::uint64_t compact_min_free_bytes = kCompactMinFreeDefault;
  static constexpr std::uint64_t kCompactMinFreeDefault = ~std::uint64_t{0};
  // kCompactKeepDefault: 25% of --host-pool-bytes with --compact-threads > 0,
  // else 0 (eviction_policy.h, "Compact copies").
  std::uint64_t compact_keep_bytes = kCompactKeepDefault;
  static constexpr std::uint64_t kCompactKeepDefault = ~std::uint64_t{0};
};

GrpcSecurityOptions AdminSecurity(const Flags& f);
GrpcSecurityOptions PlacementSecurity(const Flags& f);
Status ValidateSecurity(Flags& f);
StatusOr<cache_host::CacheHostOptions> BuildOptions(Flags& f, cache_host::CacheHostOptions o);
StatusOr<cache_host::CompactConverterOptions> BuildCompactOptions(
    const Flags& f, const cache_host::CacheHostOptions& o);
int CheckConfig(const Flags& f, const cache_host::CacheHostOptions& o);

}  // namespace kvfabric::cached

#endif  // KVFABRIC_SERVER_CACHE_HOST_CACHED_FLAGS_H_
