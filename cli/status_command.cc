#include "cli/status_command.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "core/units.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "cli/json_text.h"
#include "proto/grpc_status.h"

namespace kvfabric::cli {
namespace {

const char* StateName(v1::ServingStatus s) {
  switch (s) {
    case v1::SERVING_STATUS_SERVING:
      return "serving";
    case v1::SERVING_STATUS_STARTING:
      return "starting";
    case v1::SERVING_STATUS_DRAINING:
      return "draining";
    case v1::SERVING_STATUS_NOT_SERVING:
      return "not-serving";
    default:
      return "unknown";
  }
}

const v1::TierUsage* FindTier(const v1::StatsResponse& s, v1::Tier tier) {
  for (const v1::TierUsage& t : s.tiers()) {
    if (t.tier() == tier) return &t;
  }
  return nullptr;
}

// "1.5 GiB / 8 GiB" or "-".
std::string Use(const v1::TierUsage* t) {
  if (t == nullptr) return "-";
  return FormatBytes(t->committed_bytes()) + " / " + FormatBytes(t->capacity_bytes());
}

std::string Pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s + " ";
}

template <typename T>
std::string Num(T v) {
  return std::to_string(v);
}

std::string TierJson(const v1::TierUsage* t) {
  if (t == nullptr) return "null";
  return "{\"capacity_bytes\":" + Num(t->capacity_bytes()) + ",\"committed_bytes\":" +
         Num(t->committed_bytes()) + ",\"reserved_bytes\":" + Num(t->reserved_bytes()) +
         ",\"leased_bytes\":" + Num(t->leased_bytes()) + ",\"free_bytes\":" +
         Num(t->free_bytes()) + ",\"blocks\":" + Num(t->blocks()) + "}";
}

}  // namespace

std::string FormatStatus(const StatusArgs& args, const std::vector<DaemonStatus>& daemons) {
  if (args.json) {
    std::string out = "{\"placement\":\"" + JsonEscape(args.placement) + "\",\"daemons\":[";
    for (std::size_t i = 0; i < daemons.size(); ++i) {
      const DaemonStatus& d = daemons[i];
      out += std::string(i ? "," : "") + "{\"host_id\":\"" + JsonEscape(d.host_id) +
             "\",\"grpc_address\":\"" + JsonEscape(d.grpc_address) + "\"";
      if (d.membership) {
        out += ",\"lease_remaining_ms\":" + Num(d.membership->lease_remaining_ms()) +
               ",\"directory_blocks\":" + Num(d.membership->directory_blocks());
      }
      if (d.stats) {
        const v1::StatsResponse& s = *d.stats;
        out += std::string(",\"state\":\"") + StateName(s.status()) + "\",\"host\":" +
               TierJson(FindTier(s, v1::TIER_HOST)) + ",\"nvme\":" +
               TierJson(FindTier(s, v1::TIER_NVME)) + ",\"blocks\":" + Num(s.blocks()) +
               ",\"active_reservations\":" + Num(s.active_reservations()) +
               ",\"active_read_leases\":" + Num(s.active_read_leases()) + ",\"hits_total\":" +
               Num(s.hits_total()) + ",\"misses_total\":" + Num(s.misses_total()) +
               ",\"uptime_us\":" + Num(s.uptime_us());
      } else {
        out += ",\"error\":\"" + JsonEscape(d.error) + "\"";
      }
      out += "}";
    }
    return out + "]}\n";
  }
  std::string out = args.placement.empty()
                        ? std::to_string(daemons.size()) + " cache hosts\n"
                        : std::to_string(daemons.size()) + " live cache hosts (placement " +
                              args.placement + ")\n";
  out += Pad("host", 16) + Pad("state", 11) + Pad("host tier used / cap", 24) +
         Pad("nvme used / cap", 24) + Pad("blocks", 8) + Pad("leases r/w", 11) +
         Pad("hits/misses", 16) + "directory\n";
  for (const DaemonStatus& d : daemons) {
    out += Pad(d.host_id, 16);
    if (!d.stats) {
      out += "unreachable: " + d.error + "\n";
      continue;
    }
    const v1::StatsResponse& s = *d.stats;
    out += Pad(StateName(s.status()), 11) + Pad(Use(FindTier(s, v1::TIER_HOST)), 24) +
           Pad(Use(FindTier(s, v1::TIER_NVME)), 24) + Pad(Num(s.blocks()), 8) +
           Pad(Num(s.active_read_leases()) + "/" + Num(s.active_reservations()), 11) +
           Pad(Num(s.hits_total()) + "/" + Num(s.misses_total()), 16) +
           (d.membership ? Num(d.membership->directory_blocks()) : std::string("-")) + "\n";
  }
  return out;
}

Status RunStatus(const StatusArgs& args) {
  if (args.placement.empty() && args.cache_hosts.empty()) {
    return Status::InvalidArgument("give --placement HOST:PORT or at least one --cache-host");
  }
  const auto deadline = [&] {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(args.timeout_ms);
  };
  std::vector<DaemonStatus> daemons;
  if (!args.placement.empty()) {
    auto stub = v1::Placement::NewStub(
        grpc::CreateChannel(args.placement, grpc::InsecureChannelCredentials()));
    v1::ListHostsResponse hosts;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Status g = stub->ListHosts(&ctx, v1::ListHostsRequest(), &hosts);
    if (!g.ok()) return FromGrpcStatus(g).WithContext("ListHosts on " + args.placement);
    for (const v1::HostStatus& h : hosts.hosts()) {
      DaemonStatus d;
      d.host_id = h.host().host_id();
      d.grpc_address = h.host().grpc_address();
      d.membership = h;
      daemons.push_back(std::move(d));
    }
  }
  for (const std::string& addr : args.cache_hosts) {
    DaemonStatus d;
    d.host_id = addr;
    d.grpc_address = addr;
    daemons.push_back(std::move(d));
  }
  for (DaemonStatus& d : daemons) {
    auto stub = v1::CacheHost::NewStub(
        grpc::CreateChannel(d.grpc_address, grpc::InsecureChannelCredentials()));
    v1::StatsResponse stats;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Status g = stub->Stats(&ctx, v1::StatsRequest(), &stats);
    if (!g.ok()) {
      d.error = FromGrpcStatus(g).ToString();
      continue;
    }
    d.stats = stats;
    if (!d.membership) {
      v1::HealthResponse health;
      grpc::ClientContext hctx;
      hctx.set_deadline(deadline());
      if (stub->Health(&hctx, v1::HealthRequest(), &health).ok()) d.host_id = health.server_id();
    }
  }
  std::fputs(FormatStatus(args, daemons).c_str(), stdout);
  return Status::OK();
}

}  // namespace kvfabric::cli
