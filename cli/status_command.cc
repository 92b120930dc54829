#include "cli/status_command.h"

#include <grpcpp/grpcpp.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli/json_text.h"
#include "core/statusor.h"
#include "core/units.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
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

// "1.2 GiB/s", from bytes over seconds; "-" when there is no time.
std::string Rate(double bytes, double seconds) {
  if (!(seconds > 0)) return "-";
  return FormatBytes(static_cast<std::uint64_t>(bytes / seconds)) + "/s";
}

const v1::PathTrafficSummary* FindPath(const v1::ListHostsResponse& r, v1::BusPath path) {
  for (const v1::PathTrafficSummary& p : r.summary().paths()) {
    if (p.path() == path) return &p;
  }
  return nullptr;
}

std::uint64_t PlansOf(const v1::ListHostsResponse& r, const std::string& kind) {
  for (const v1::PlanKindCount& c : r.summary().plans()) {
    if (c.kind() == kind) return c.plans();
  }
  return 0;
}

std::string PathName(v1::BusPath p) { return EnumLabel(v1::BusPath_Name(p), "BUS_PATH_"); }

// Seconds since `unix_us` on this machine's clock ("-" when unknown).
std::string Ago(std::uint64_t now_unix_us, std::uint64_t unix_us) {
  if (unix_us == 0 || now_unix_us == 0) return "-";
  if (unix_us > now_unix_us) return "0 s ago";
  return Fixed(static_cast<double>(now_unix_us - unix_us) / 1e6, 0) + " s ago";
}

// "7.0s", "1.2s EXPIRING": the lease left, flagged when more than half of the
// lease has passed since the last heartbeat.
std::string Lease(const v1::HostStatus& m, std::uint64_t now_unix_us) {
  std::string out = Fixed(m.lease_remaining_ms() / 1000.0, 1) + "s";
  if (m.last_heartbeat_unix_us() != 0 && now_unix_us > m.last_heartbeat_unix_us() &&
      (now_unix_us - m.last_heartbeat_unix_us()) / 1000 > m.lease_remaining_ms()) {
    out += " EXPIRING";
  }
  return out;
}

std::string SummaryJson(const ClusterReport& c) {
  const v1::ListHostsResponse& last = *c.last;
  std::string out =
      "\"summary\":{\"plans_in_flight\":" + Num(last.summary().plans_in_flight()) + ",\"plans\":{";
  for (int i = 0; i < last.summary().plans_size(); ++i) {
    const v1::PlanKindCount& k = last.summary().plans(i);
    out += std::string(i ? "," : "") + "\"" + JsonEscape(k.kind()) + "\":" + Num(k.plans());
  }
  out += "},\"paths\":[";
  for (int i = 0; i < last.summary().paths_size(); ++i) {
    const v1::PathTrafficSummary& p = last.summary().paths(i);
    out += std::string(i ? "," : "") + "{\"path\":\"" + PathName(p.path()) +
           "\",\"transfers\":" + Num(p.transfers()) + ",\"bytes\":" + Num(p.bytes()) +
           ",\"observed_seconds\":" + Fixed(p.observed_seconds(), 6);
    if (c.first) {
      const v1::PathTrafficSummary* before = FindPath(*c.first, p.path());
      const double bytes = static_cast<double>(p.bytes() - (before ? before->bytes() : 0));
      out +=
          ",\"interval_bytes_per_second\":" + Fixed(c.interval_s > 0 ? bytes / c.interval_s : 0, 0);
    }
    out += "}";
  }
  out += "]},\"departed\":[";
  for (int i = 0; i < last.departed_size(); ++i) {
    const v1::DepartedHost& d = last.departed(i);
    out += std::string(i ? "," : "") + "{\"host_id\":\"" + JsonEscape(d.host().host_id()) +
           "\",\"grpc_address\":\"" + JsonEscape(d.host().grpc_address()) + "\",\"reason\":\"" +
           JsonEscape(d.reason()) + "\",\"departed_unix_us\":" + Num(d.departed_unix_us()) +
           ",\"directory_blocks_dropped\":" + Num(d.directory_blocks_dropped()) + "}";
  }
  return out + "],";
}

}  // namespace

std::string FormatStatus(const StatusArgs& args, const std::vector<DaemonStatus>& daemons,
                         const ClusterReport& cluster) {
  if (args.json) {
    std::string out = "{\"placement\":\"" + JsonEscape(args.placement) + "\",";
    if (cluster.last) out += SummaryJson(cluster);
    out += "\"daemons\":[";
    for (std::size_t i = 0; i < daemons.size(); ++i) {
      const DaemonStatus& d = daemons[i];
      out += std::string(i ? "," : "") + "{\"host_id\":\"" + JsonEscape(d.host_id) +
             "\",\"grpc_address\":\"" + JsonEscape(d.grpc_address) + "\"";
      if (d.membership) {
        out += ",\"lease_remaining_ms\":" + Num(d.membership->lease_remaining_ms()) +
               ",\"directory_blocks\":" + Num(d.membership->directory_blocks()) +
               ",\"placement_state\":\"" + StateName(d.membership->status()) + "\"";
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
  std::string out;
  if (cluster.last) {
    const v1::ListHostsResponse& last = *cluster.last;
    const double up_s = last.summary().uptime_us() / 1e6;
    const bool rates = cluster.first.has_value() && cluster.interval_s > 0;
    out += "placement " + args.placement + ", up " + Fixed(up_s, 0) + " s; plans in flight " +
           Num(last.summary().plans_in_flight()) + "\n";
    out += "plans by kind (total" + std::string(rates ? ", per second now" : "") + "):";
    for (const v1::PlanKindCount& k : last.summary().plans()) {
      out += "  " + k.kind() + " " + Num(k.plans());
      if (rates) {
        const double d = static_cast<double>(k.plans() - PlansOf(*cluster.first, k.kind()));
        out += " (" + Fixed(d / cluster.interval_s, 1) + "/s)";
      }
    }
    out += "\n";
    if (last.summary().paths_size() == 0) {
      out += "bandwidth per path: no transfers reported yet\n";
    } else {
      out += "bandwidth per path, as clients reported it:\n";
      out += "  " + Pad("path", 28) + Pad(rates ? "now" : "", 14) + Pad("average", 14) +
             Pad("transfers", 11) + "bytes\n";
      for (const v1::PathTrafficSummary& p : last.summary().paths()) {
        std::string now;
        if (rates) {
          const v1::PathTrafficSummary* before = FindPath(*cluster.first, p.path());
          now = Rate(static_cast<double>(p.bytes() - (before ? before->bytes() : 0)),
                     cluster.interval_s);
        }
        out += "  " + Pad(PathName(p.path()), 28) + Pad(now, 14) +
               Pad(Rate(static_cast<double>(p.bytes()), p.observed_seconds()), 14) +
               Pad(Num(p.transfers()), 11) + FormatBytes(p.bytes()) + "\n";
      }
    }
  }
  out += args.placement.empty() ? std::to_string(daemons.size()) + " cache hosts\n"
                                : std::to_string(daemons.size()) + " live cache hosts (placement " +
                                      args.placement + ")\n";
  out += Pad("host", 16) + Pad("state", 11) + Pad("lease", 16) + Pad("host tier used / cap", 24) +
         Pad("nvme used / cap", 24) + Pad("blocks", 8) + Pad("leases r/w", 11) +
         Pad("hits/misses", 16) + "directory\n";
  for (const DaemonStatus& d : daemons) {
    out += Pad(d.host_id, 16);
    const std::string lease = d.membership ? Lease(*d.membership, cluster.now_unix_us) : "-";
    if (!d.stats) {
      // Placement's view of a daemon that does not answer.
      out += Pad(d.membership ? StateName(d.membership->status()) : "-", 11) + Pad(lease, 16) +
             "unreachable: " + d.error + "\n";
      continue;
    }
    const v1::StatsResponse& s = *d.stats;
    out += Pad(StateName(s.status()), 11) + Pad(lease, 16) +
           Pad(Use(FindTier(s, v1::TIER_HOST)), 24) + Pad(Use(FindTier(s, v1::TIER_NVME)), 24) +
           Pad(Num(s.blocks()), 8) +
           Pad(Num(s.active_read_leases()) + "/" + Num(s.active_reservations()), 11) +
           Pad(Num(s.hits_total()) + "/" + Num(s.misses_total()), 16) +
           (d.membership ? Num(d.membership->directory_blocks()) : std::string("-")) + "\n";
  }
  if (cluster.last && cluster.last->departed_size() > 0) {
    out += "departed lately (newest first):\n";
    for (const v1::DepartedHost& d : cluster.last->departed()) {
      out += "  " + Pad(d.host().host_id(), 16) + Pad(d.host().grpc_address(), 22) +
             Pad(d.reason(), 14) + Pad(Ago(cluster.now_unix_us, d.departed_unix_us()), 10) +
             Num(d.directory_blocks_dropped()) + " directory entries dropped\n";
    }
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
  ClusterReport cluster;
  std::unique_ptr<v1::Placement::Stub> placement;
  auto list_hosts = [&]() -> StatusOr<v1::ListHostsResponse> {
    v1::ListHostsResponse hosts;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Status g = placement->ListHosts(&ctx, v1::ListHostsRequest(), &hosts);
    if (!g.ok()) return FromGrpcStatus(g).WithContext("ListHosts on " + args.placement);
    return hosts;
  };
  const auto first_at = std::chrono::steady_clock::now();
  if (!args.placement.empty()) {
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         OpenSecureChannel(args.placement, args.security, {}));
    placement = v1::Placement::NewStub(channel);
    KVF_ASSIGN_OR_RETURN(v1::ListHostsResponse hosts, list_hosts());
    cluster.last = hosts;
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
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         OpenSecureChannel(d.grpc_address, args.security, {}));
    auto stub = v1::CacheHost::NewStub(channel);
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
  if (placement && args.interval_s > 0) {
    // The second sample, for rates over the interval.
    std::this_thread::sleep_until(
        first_at + std::chrono::microseconds(static_cast<std::int64_t>(args.interval_s * 1e6)));
    KVF_ASSIGN_OR_RETURN(v1::ListHostsResponse again, list_hosts());
    cluster.interval_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - first_at).count();
    cluster.first = std::move(cluster.last);
    cluster.last = std::move(again);
  }
  cluster.now_unix_us =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
  std::fputs(FormatStatus(args, daemons, cluster).c_str(), stdout);
  return Status::OK();
}

}  // namespace kvfabric::cli
