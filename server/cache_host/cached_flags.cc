// kvfabric-cached's settings: the security checks, the conversion of the
// flags into CacheHostOptions and --check-config (cached_flags.h). Split from
// cached_main.cc, which parses the flags and runs the daemon.
#include "server/cache_host/cached_flags.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/block_format.h"
#include "core/bus_calibration.h"
#include "core/config/unit_flags.h"
#include "core/env.h"
#include "core/model_fingerprint.h"
#include "core/units.h"
#include "gpu/kernels/compact_int8.h"
#include "metrics/metrics_server.h"
#include "proto/wire_limits.h"
#include "security/grpc_security.h"
#include "security/tenant_policy.h"
#include "server/cache_host/cache_host_node.h"
#include "spdlog/spdlog.h"
#include "transport/data_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace kvfabric::cached {
namespace {

StatusOr<KvDtype> ParseDtype(const std::string& s) {
  if (s == "fp16") return KvDtype::kFp16;
  if (s == "bf16") return KvDtype::kBf16;
  if (s == "fp32") return KvDtype::kFp32;
  if (s == "fp8_e4m3") return KvDtype::kFp8E4M3;
  if (s == "int8") return KvDtype::kInt8;
  return Status::InvalidArgument("--model-dtype \"" + s +
                                 "\": expected fp16, bf16, fp32, fp8_e4m3 or int8");
}

using cache_host::IoEngineKind;

StatusOr<IoEngineKind> ParseEngine(const std::string& s) {
  if (s == "auto") return IoEngineKind::kAuto;
  if (s == "uring") return IoEngineKind::kUring;
  if (s == "threads") return IoEngineKind::kThreads;
  return Status::InvalidArgument("--nvme-io-engine \"" + s + "\": expected auto, uring or threads");
}

}  // namespace

// The admin listener on a Unix socket is plaintext (the socket file's
// permissions decide who is an operator); on TCP it is secured as the public
// listener is.
GrpcSecurityOptions AdminSecurity(const Flags& f) {
  if (f.admin_address.rfind("unix:", 0) != 0) return f.security;
  GrpcSecurityOptions o;
  o.insecure = true;
  return o;
}

GrpcSecurityOptions PlacementSecurity(const Flags& f) {
  GrpcSecurityOptions o = f.security;
  o.client_auth.clear();
  o.token_file = f.placement_token_file;
  o.server_name = f.placement_server_name;
  return o;
}

// Every security setting, checked before anything starts.
Status ValidateSecurity(Flags& f) {
  if (Status s = ValidateServerSecurity(f.security, f.grpc_address); !s.ok()) {
    return s.WithContext("--grpc-address " + f.grpc_address);
  }
  if (!f.admin_address.empty()) {
    if (Status s = ValidateServerSecurity(AdminSecurity(f), f.admin_address); !s.ok()) {
      return s.WithContext("--admin-address " + f.admin_address);
    }
  }
  if (!f.placement_address.empty()) {
    if (Status s = ValidateClientSecurity(PlacementSecurity(f), f.placement_address); !s.ok()) {
      return s.WithContext("--placement-address " + f.placement_address);
    }
  }
  if (f.data_plane_auth != "auto" && f.data_plane_auth != "session" &&
      f.data_plane_auth != "none") {
    return Status::InvalidArgument("--data-plane-auth \"" + f.data_plane_auth +
                                   "\": expected auto, session or none");
  }
  if (f.data_plane_auth == "auto") f.data_plane_auth = f.security.insecure ? "none" : "session";
  if (f.data_plane_tls && f.data_transport != "tcp") {
    return Status::InvalidArgument(
        "--data-plane-tls needs --data-transport=tcp (UCX moves bytes "
        "with RDMA or shared memory, which TLS cannot wrap)");
  }
  if (f.data_plane_tls && f.security.cert_file.empty()) {
    return Status::InvalidArgument(
        "--data-plane-tls needs --tls-cert and --tls-key: the data "
        "plane presents the daemon's certificate");
  }
  if (f.tenants_file.empty()) {
    f.tenants = TenantPolicy::Open();
    return Status::OK();
  }
  StatusOr<std::shared_ptr<const TenantPolicy>> p = TenantPolicy::LoadFile(f.tenants_file);
  if (!p.ok()) return p.status();
  f.tenants = *p;
  return Status::OK();
}

StatusOr<cache_host::CacheHostOptions> BuildOptions(Flags& f, cache_host::CacheHostOptions o) {
  if (o.host_id.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    o.host_id = name;
  }
  KVF_ASSIGN_OR_RETURN(o.pool.lock_mode, cache_host::ParseLockMode(f.lock_memory));
  if (f.pool_memory != "transport" && f.pool_memory != "anonymous") {
    return Status::InvalidArgument("--pool-memory \"" + f.pool_memory +
                                   "\": expected transport or anonymous");
  }
  o.transport_allocates_pool = f.pool_memory == "transport";
  KVF_ASSIGN_OR_RETURN(o.policy, cache_host::ParseEvictionPolicyKind(f.eviction_policy));
  KVF_ASSIGN_OR_RETURN(o.nvme.io_engine, ParseEngine(f.nvme_io_engine));
  o.prefault = !f.no_prefault;
  o.leases.max_ttl_us = static_cast<std::uint64_t>(f.max_lease_ttl.count());
  o.default_ttl_us = static_cast<std::uint64_t>(f.default_lease_ttl.count());
  o.reservation_ttl_us = static_cast<std::uint64_t>(f.reservation_ttl.count());
  o.leases.index.max_namespaces = f.max_namespaces;
  o.leases.max_reservations = f.max_reservations;
  o.leases.max_leases = f.max_leases;
  o.leases.max_keys_per_lease = f.max_keys_per_lease;
  o.leases.max_reservations_per_namespace = f.max_reservations_per_namespace;
  o.leases.max_reserved_bytes_per_namespace = f.max_reserved_bytes_per_namespace;
  o.leases.max_leases_per_namespace = f.max_leases_per_namespace;
  o.leases.max_leased_bytes_per_namespace = f.max_leased_bytes_per_namespace;
  o.leases.decision_log_capacity = f.eviction_log_capacity;
  // Compact copies eviction keeps in place of their exact blocks: a quarter
  // of the pool by default while the converter makes copies, none without
  // it. CacheHostNode::CheckOptions refuses a budget above the pool.
  o.leases.compact_keep.budget_bytes = f.compact_keep_bytes != Flags::kCompactKeepDefault
                                           ? f.compact_keep_bytes
                                       : f.compact_threads > 0 ? o.pool.pool_bytes / 4
                                                               : 0;
  o.leases.compact_keep.codec = kCompactInt8Codec;
  o.leases.compact_keep.codec_version = kCompactInt8Version;
  o.data_plane.max_connections = f.max_data_connections;
  o.data_plane.max_connections_per_host = f.max_data_connections_per_host;
  o.data_plane.max_outstanding_per_connection = f.max_requests_per_connection;
  o.data_plane.store_threads = f.store_threads;
  // kStore checks what the gRPC Reserve checks, with the same bounds.
  static_assert(cache_host::kStoreMaxTtlMs == kMaxTtlMs);
  static_assert(cache_host::kStoreMaxChainBlocks == kMaxChainBlocks);
  o.data_plane.idle_timeout_us = static_cast<std::uint64_t>(f.data_idle_timeout.count());
  o.data_plane.transfer_timeout_us = static_cast<std::uint64_t>(f.transfer_timeout.count());
  if (f.data_plane_auth == "session") {
    cache_host::DataSessionOptions so;
    so.max_sessions = f.max_data_sessions;
    so.ttl_us = static_cast<std::uint64_t>(f.data_session_ttl.count());
    o.data_plane.sessions = std::make_shared<cache_host::DataSessions>(so);
    o.data_plane.require_session = true;
  }
  for (const std::string& q : f.quotas) {
    const auto eq = q.rfind('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("--quota \"" + q + "\": expected NAMESPACE=BYTES");
    }
    CLI::App tmp;
    std::uint64_t bytes = 0;
    AddBytesOption(tmp, "--b", &bytes, "");
    try {
      tmp.parse(std::vector<std::string>{q.substr(eq + 1), "--b"});
    } catch (const CLI::ParseError&) {
      return Status::InvalidArgument("--quota \"" + q + "\": bad size");
    }
    o.quotas.emplace_back(q.substr(0, eq), bytes);
  }
  if (f.tenants != nullptr) {
    for (const auto& [ns, bytes] : f.tenants->NamespaceQuotas()) {
      for (const auto& q : o.quotas) {
        if (q.first == ns) {
          return Status::InvalidArgument("namespace \"" + ns +
                                         "\" has a quota in both --quota and --tenants-file");
        }
      }
      o.quotas.emplace_back(ns, bytes);
    }
  }
  if (!f.model_id.empty()) {
    ModelFingerprint fp;
    fp.model_id = f.model_id;
    fp.first_layer = 0;
    fp.layer_count = f.model_layers;
    KVF_ASSIGN_OR_RETURN(fp.dtype, ParseDtype(f.model_dtype));
    fp.kv_heads = f.model_kv_heads;
    fp.head_dim = f.model_head_dim;
    fp.tokens_per_block = f.tokens_per_block;
    fp.tp_rank = 0;
    fp.tp_size = 1;
    fp.layout_version = 1;
    o.models.push_back({fp, f.history_tokens});
  }
  // The cost-aware policy's figures: the calibration file placement reads
  // (this host's entries, else every host's), else core/cost_defaults.h,
  // placement's own placeholders.
  o.cost_aware = cache_host::DefaultCostAwareOptions();
  if (!f.calibration_path.empty()) {
    auto c = LoadBusCalibration(Env::Default(), f.calibration_path);
    if (!c.ok()) return c.status().WithContext("--calibration " + f.calibration_path);
    std::string sources;
    o.cost_aware = cache_host::CostAwareFromCalibration(*c, f.host_id, f.model_id, &sources);
    spdlog::info("calibration {}: {}", f.calibration_path, sources);
  } else {
    spdlog::warn(
        "no --calibration: cost-aware eviction scores with placeholder figures "
        "(core/cost_defaults.h); give it the file `kvfabric calibrate` writes");
  }
  return o;
}

// --check-config: what Create would refuse, and the arithmetic it would
// print, on stdout; nothing is allocated, bound or opened.
// The compact converter's options from --compact-*. Its buffers are sized
// for the largest block of the --model list (64 MiB, the format's largest,
// without one); a larger block is not converted (counted as too_large).
// InvalidArgument naming the flag.
StatusOr<cache_host::CompactConverterOptions> BuildCompactOptions(
    const Flags& f, const cache_host::CacheHostOptions& o) {
  cache_host::CompactConverterOptions c;
  c.threads = f.compact_threads;
  c.queue_blocks = static_cast<std::size_t>(f.compact_queue_blocks);
  c.pause_above_leases = f.compact_pause_leases;
  if (f.compact_min_free_bytes != Flags::kCompactMinFreeDefault) {
    if (f.compact_min_free_bytes > o.pool.pool_bytes) {
      return Status::InvalidArgument(
          "--compact-min-free-bytes " + std::to_string(f.compact_min_free_bytes) +
          " is more than --host-pool-bytes " + std::to_string(o.pool.pool_bytes));
    }
    c.min_free_bytes = f.compact_min_free_bytes;
  }
  if (!o.models.empty()) {
    std::uint64_t largest = 0;
    for (const cache_host::PoolModel& m : o.models) {
      KVF_ASSIGN_OR_RETURN(std::uint64_t bytes, m.fingerprint.BlockBytes());
      largest = std::max(largest, bytes);
    }
    c.max_block_bytes = std::min(largest, kMaxBlockPayloadBytes);
  }
  KVF_RETURN_IF_ERROR(c.Validate());
  return c;
}

int CheckConfig(const Flags& f, const cache_host::CacheHostOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kvfabric-cached: --check-config: %s\n", s.ToString().c_str());
    return 2;
  };
  StatusOr<std::string> arithmetic = cache_host::CacheHostNode::CheckOptions(o);
  if (!arithmetic.ok()) return fail(arithmetic.status());
  if (Status s = transport::ValidateDataTransportKind(f.data_transport, "--data-transport");
      !s.ok()) {
    return fail(s);
  }
  if (!f.metrics_address.empty() && f.metrics_address != "off") {
    if (Status s = metrics::ValidateMetricsAddress(f.metrics_address); !s.ok()) return fail(s);
  }
  std::printf("%s\n", arithmetic->c_str());
  std::printf("grpc %s, admin %s, data plane %s over %s%s, metrics %s\n", f.grpc_address.c_str(),
              f.admin_address.empty() ? "off" : f.admin_address.c_str(),
              o.transport_address.c_str(), f.data_transport.c_str(),
              f.data_transport == "ucx" ? (" (" + f.ucx_tls + ")").c_str() : "",
              f.metrics_address.c_str());
  if (f.data_transport == "ucx") {
    // What UCX finds here against --ucx-tls: the warning the daemon would log.
    StatusOr<ucx::UcxTransportCheck> check = ucx::CheckUcxTransports(f.ucx_tls);
    if (!check.ok()) {
      std::printf("UCX transports: cannot list this machine's (%s)\n",
                  check.status().ToString().c_str());
    } else if (check->missing.empty()) {
      std::string found;
      for (const std::string& t : check->available) found += (found.empty() ? "" : ", ") + t;
      std::printf("UCX transports: every item of --ucx-tls is available (UCX finds: %s)\n",
                  found.c_str());
    } else {
      const std::string warning = ucx::UcxTransportWarning(*check, f.ucx_tls, "--ucx-tls");
      if (check->usable.empty()) return fail(Status::InvalidArgument(warning));
      std::printf("warning: %s\n", warning.c_str());
    }
  }
  if (o.nvme.dir.empty()) {
    std::printf("NVMe tier: none (--nvme-dir)\n");
  } else {
    std::printf("NVMe tier: %s, up to %s\n", o.nvme.dir.c_str(),
                FormatBytes(o.nvme.capacity_bytes).c_str());
  }
  std::printf("placement %s, membership TTL %llds\n",
              f.placement_address.empty() ? "none" : f.placement_address.c_str(),
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::seconds>(f.membership_ttl).count()));
  std::printf("kvfabric-cached: configuration OK (--check-config: nothing was started)\n");
  return 0;
}

}  // namespace kvfabric::cached
