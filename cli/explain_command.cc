#include "cli/explain_command.h"

#include <grpcpp/grpcpp.h>

#include <cctype>
#include <chrono>
#include <cstdio>

#include "cli/json_text.h"
#include "core/block_key.h"
#include "kvfabric/v1/cache_host.grpc.pb.h"
#include "kvfabric/v1/placement.grpc.pb.h"
#include "proto/grpc_status.h"

namespace kvfabric::cli {
namespace {

std::string PolicyName(v1::EvictionPolicy policy) {
  return policy == v1::EVICTION_POLICY_LRU ? "lru" : "cost-aware";
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// "fetch_all" for PLAN_KIND_FETCH_ALL: the label /metrics uses.
std::string KindLabel(v1::PlanKind kind) {
  return EnumLabel(v1::PlanKind_Name(kind), "PLAN_KIND_");
}

// "1.25 ms" from microseconds.
std::string Millis(double us) { return Fixed(us / 1000.0, 2) + " ms"; }

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx, int timeout_ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  return ctx;
}

}  // namespace

std::string FormatEvictionList(const ExplainEvictionArgs& args,
                               const v1::ListEvictionsResponse& response) {
  const std::string policy = PolicyName(response.eviction_policy());
  if (args.json) {
    std::string out = "{\"cache_host\":\"" + JsonEscape(args.cache_host) + "\",\"policy\":\"" +
                      policy + "\",\"log_capacity\":" + std::to_string(response.log_capacity()) +
                      ",\"decisions\":[";
    for (int i = 0; i < response.decisions_size(); ++i) {
      const v1::ListedEviction& r = response.decisions(i);
      const v1::EvictionExplanation& d = r.decision();
      out += std::string(i ? "," : "") + "{\"namespace\":\"" + JsonEscape(r.namespace_()) +
             "\",\"key\":\"" + Hex(r.key()) + "\",\"pages\":" + std::to_string(r.pages()) +
             ",\"sequence\":" + std::to_string(d.sequence()) + ",\"action\":\"" +
             JsonEscape(d.action()) + "\",\"step\":" + std::to_string(d.step()) +
             ",\"rank\":" + std::to_string(d.rank()) +
             ",\"candidates\":" + std::to_string(d.candidates()) + ",\"explanation\":\"" +
             JsonEscape(d.explanation()) + "\"}";
    }
    return out + "]}\n";
  }
  std::string out =
      "recent eviction decisions on " + args.cache_host + " (" +
      (args.all_namespaces ? std::string("every namespace") : "namespace \"" + args.tenant + "\"") +
      "), policy " + policy + ", newest first; the log keeps the last " +
      std::to_string(response.log_capacity()) + " of all namespaces (--eviction-log-capacity)\n";
  if (response.decisions_size() == 0) {
    return out +
           "  none in the log (nothing evicted, demoted or dropped from the host pool "
           "lately)\n";
  }
  for (const v1::ListedEviction& r : response.decisions()) {
    const v1::EvictionExplanation& d = r.decision();
    out += "  #" + std::to_string(d.sequence()) + " " + Pad(d.action(), 14) +
           (args.all_namespaces ? "namespace \"" + r.namespace_() + "\" " : std::string()) +
           "key " + Hex(r.key()) + "\n      " + d.explanation() + "\n";
  }
  return out + "(kvfabric explain eviction --key HEX gives every decision about one block)\n";
}

std::string FormatPlanList(const ExplainPlanArgs& args, const v1::ListPlansResponse& response,
                           std::uint64_t now_unix_us) {
  if (args.json) {
    std::string out = "{\"placement\":\"" + JsonEscape(args.placement) +
                      "\",\"history_plans\":" + std::to_string(response.history_plans()) +
                      ",\"plans\":[";
    for (int i = 0; i < response.plans_size(); ++i) {
      const v1::PlanSummary& p = response.plans(i);
      out += std::string(i ? "," : "") + "{\"plan_id\":" + std::to_string(p.plan_id()) +
             ",\"decided_unix_us\":" + std::to_string(p.decided_unix_us()) + ",\"kind\":\"" +
             KindLabel(p.kind()) + "\",\"namespace\":\"" + JsonEscape(p.namespace_()) +
             "\",\"model_id\":\"" + JsonEscape(p.model_id()) +
             "\",\"chain_blocks\":" + std::to_string(p.chain_blocks()) +
             ",\"cached_prefix_blocks\":" + std::to_string(p.cached_prefix_blocks()) +
             ",\"suffix_tokens\":" + std::to_string(p.suffix_tokens()) +
             ",\"predicted_total_us\":" + Fixed(p.predicted_total_us(), 1) +
             ",\"finished\":" + (p.finished() ? "true" : "false") +
             ",\"observed_total_us\":" + Fixed(p.observed_total_us(), 1) +
             ",\"later_plans_delay_us\":" + Fixed(p.later_plans_delay_us(), 1) + "}";
    }
    return out + "]}\n";
  }
  std::string out =
      "recent plans on " + args.placement +
      (args.tenant.empty() ? std::string() : " in namespace \"" + args.tenant + "\"") +
      ", newest first; placement keeps the last " + std::to_string(response.history_plans()) +
      " (--plan-history, --plan-history-bytes)\n";
  if (response.plans_size() == 0) return out + "  none yet\n";
  out += "  " + Pad("plan", 10) + Pad("age", 9) + Pad("kind", 14) + Pad("namespace", 12) +
         Pad("model", 14) + Pad("cached/blocks", 14) + Pad("suffix", 8) + Pad("predicted", 12) +
         Pad("observed", 12) + "observed/predicted\n";
  for (const v1::PlanSummary& p : response.plans()) {
    std::string age = "-";
    if (now_unix_us >= p.decided_unix_us() && p.decided_unix_us() != 0) {
      age = Fixed(static_cast<double>(now_unix_us - p.decided_unix_us()) / 1e6, 1) + " s";
    }
    const bool observed = p.finished() && p.observed_total_us() > 0;
    out +=
        "  " + Pad(std::to_string(p.plan_id()), 10) + Pad(age, 9) + Pad(KindLabel(p.kind()), 14) +
        Pad(p.namespace_().empty() ? "\"\"" : p.namespace_(), 12) +
        Pad(p.model_id().empty() ? "-" : p.model_id(), 14) +
        Pad(std::to_string(p.cached_prefix_blocks()) + "/" + std::to_string(p.chain_blocks()), 14) +
        Pad(std::to_string(p.suffix_tokens()), 8) + Pad(Millis(p.predicted_total_us()), 12) +
        Pad(observed ? Millis(p.observed_total_us()) : (p.finished() ? "?" : "running"), 12) +
        (observed && p.predicted_total_us() > 0
             ? Fixed(p.observed_total_us() / p.predicted_total_us(), 2) + "x"
             : std::string("-")) +
        (observed && p.later_plans_delay_us() > 0
             ? " (" +
                   Fixed(
                       p.observed_total_us() / (p.predicted_total_us() + p.later_plans_delay_us()),
                       2) +
                   "x with the " + Millis(p.later_plans_delay_us()) + " later plans added)"
             : std::string()) +
        "\n";
  }
  return out + "(kvfabric explain plan --plan-id ID gives a plan's formula with its numbers)\n";
}

std::string FormatExplainEviction(const ExplainEvictionArgs& args,
                                  const v1::ExplainEvictionResponse& response) {
  const std::string policy = PolicyName(response.eviction_policy());
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
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                       OpenSecureChannel(args.cache_host, args.security, {}));
  auto stub = v1::CacheHost::NewStub(channel);
  if (args.key_hex.empty()) {
    v1::ListEvictionsRequest req;
    req.set_namespace_(args.tenant);
    req.set_all_namespaces(args.all_namespaces);
    req.set_limit(args.last);
    v1::ListEvictionsResponse resp;
    grpc::ClientContext ctx;
    grpc::Status g = stub->ListEvictions(WithDeadline(&ctx, args.timeout_ms), req, &resp);
    if (!g.ok()) return FromGrpcStatus(g).WithContext("ListEvictions on " + args.cache_host);
    std::fputs(FormatEvictionList(args, resp).c_str(), stdout);
    return Status::OK();
  }
  if (args.all_namespaces) {
    return Status::InvalidArgument(
        "--all-namespaces lists recent decisions: give it without --key");
  }
  KVF_ASSIGN_OR_RETURN(BlockKey key, BlockKey::FromHex(args.key_hex));
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
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                       OpenSecureChannel(args.placement, args.security, {}));
  auto stub = v1::Placement::NewStub(channel);
  if (args.plan_id == 0) {
    v1::ListPlansRequest req;
    req.set_namespace_(args.tenant);
    req.set_limit(args.last);
    v1::ListPlansResponse resp;
    grpc::ClientContext ctx;
    grpc::Status g = stub->ListPlans(WithDeadline(&ctx, args.timeout_ms), req, &resp);
    if (!g.ok()) return FromGrpcStatus(g).WithContext("ListPlans on " + args.placement);
    const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::system_clock::now().time_since_epoch());
    std::fputs(FormatPlanList(args, resp, static_cast<std::uint64_t>(now.count())).c_str(), stdout);
    return Status::OK();
  }
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
