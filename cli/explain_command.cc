#include "cli/explain_command.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "core/block_key.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "cli/json_text.h"
#include "proto/grpc_status.h"

namespace kvfabric::cli {
std::string FormatExplainEviction(const ExplainEvictionArgs& args,
                                  const v1::ExplainEvictionResponse& response) {
  const std::string policy =
      response.eviction_policy() == v1::EVICTION_POLICY_LRU ? "lru" : "cost-aware";
  std::string out;
  if (args.json) {
    out = "{\"cache_host\":\"" + JsonEscape(args.cache_host) + "\",\"namespace\":\"" +
          JsonEscape(args.tenant) + "\",\"key\":\"" + args.key_hex + "\",\"policy\":\"" + policy +
          "\",\"decisions\":[";
    for (int i = 0; i < response.decisions_size(); ++i) {
      const v1::EvictionExplanation& d = response.decisions(i);
      char score[64];
      std::snprintf(score, sizeof(score), "%.9g", d.score());
      out += std::string(i ? "," : "") + "{\"sequence\":" + std::to_string(d.sequence()) +
             ",\"time_us\":" + std::to_string(d.time_us()) + ",\"action\":\"" + d.action() +
             "\",\"step\":" + std::to_string(d.step()) + ",\"rank\":" +
             std::to_string(d.rank()) + ",\"candidates\":" + std::to_string(d.candidates()) +
             ",\"score\":" + score + ",\"explanation\":\"" + JsonEscape(d.explanation()) + "\"}";
    }
    return out + "]}\n";
  }
  out = "block " + args.key_hex + " in namespace \"" + args.tenant + "\" on " + args.cache_host +
        " (policy " + policy + ")\n";
  if (response.decisions_size() == 0) {
    return out + "  no eviction decision about it in the daemon's log (never evicted, or "
                 "older than --eviction-log-capacity decisions)\n";
  }
  for (const v1::EvictionExplanation& d : response.decisions()) {
    out += "  #" + std::to_string(d.sequence()) + " " + d.action() + " (step " +
           std::to_string(d.step()) + ", rank " + std::to_string(d.rank()) + " of " +
           std::to_string(d.candidates()) + "): " + d.explanation() + "\n";
  }
  return out;
}

Status RunExplainEviction(const ExplainEvictionArgs& args) {
  KVF_ASSIGN_OR_RETURN(BlockKey key, BlockKey::FromHex(args.key_hex));
  auto channel = grpc::CreateChannel(args.cache_host, grpc::InsecureChannelCredentials());
  auto stub = v1::CacheHost::NewStub(channel);
  v1::ExplainEvictionRequest req;
  req.set_namespace_(args.tenant);
  req.set_key(std::string(reinterpret_cast<const char*>(key.bytes().data()), key.bytes().size()));
  v1::ExplainEvictionResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(args.timeout_ms));
  grpc::Status g = stub->ExplainEviction(&ctx, req, &resp);
  if (!g.ok()) return FromGrpcStatus(g).WithContext("ExplainEviction on " + args.cache_host);
  std::fputs(FormatExplainEviction(args, resp).c_str(), stdout);
  return Status::OK();
}

std::string FormatExplainPlan(const ExplainPlanArgs& args, const v1::ExplainResponse& response) {
  if (args.json) {
    std::string out = "{\"placement\":\"" + JsonEscape(args.placement) +
                      "\",\"plan_id\":" + std::to_string(args.plan_id) + ",\"formula\":\"" +
                      JsonEscape(response.formula()) + "\",\"terms\":[";
    for (int i = 0; i < response.terms_size(); ++i) {
      const v1::ExplainTerm& t = response.terms(i);
      char value[64];
      std::snprintf(value, sizeof(value), "%.9g", t.value());
      out += std::string(i ? "," : "") + "{\"name\":\"" + JsonEscape(t.name()) +
             "\",\"value\":" + value + ",\"unit\":\"" + JsonEscape(t.unit()) + "\"}";
    }
    return out + "],\"text\":\"" + JsonEscape(response.text()) + "\"}\n";
  }
  std::string out = "plan " + std::to_string(args.plan_id) + " on " + args.placement + "\n";
  if (!response.formula().empty()) out += "  formula: " + response.formula() + "\n";
  for (const v1::ExplainTerm& t : response.terms()) {
    char value[64];
    std::snprintf(value, sizeof(value), "%.6g", t.value());
    out += "  " + t.name() + " = " + value + (t.unit().empty() ? "" : " " + t.unit()) + "\n";
  }
  if (!response.text().empty()) out += response.text() + (response.text().back() == '\n' ? "" : "\n");
  return out;
}

Status RunExplainPlan(const ExplainPlanArgs& args) {
  if (args.plan_id == 0) return Status::InvalidArgument("--plan-id must be a plan's non-zero id");
  auto stub = v1::Placement::NewStub(
      grpc::CreateChannel(args.placement, grpc::InsecureChannelCredentials()));
  v1::ExplainRequest req;
  req.set_plan_id(args.plan_id);
  v1::ExplainResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(args.timeout_ms));
  grpc::Status g = stub->Explain(&ctx, req, &resp);
  if (!g.ok()) return FromGrpcStatus(g).WithContext("Explain on " + args.placement);
  std::fputs(FormatExplainPlan(args, resp).c_str(), stdout);
  return Status::OK();
}

}  // namespace kvfabric::cli
