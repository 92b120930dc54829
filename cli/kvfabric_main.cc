// `kvfabric`: the operator's command-line tool.
//
//   kvfabric [--config FILE] [--log-level L] version [--json]
//       this build, and the optional parts it detected
//   kvfabric demo [--max-history-tokens N] [--layers L] ... [--keep-running] [--json]
//       a long-context workload end to end on an embedded local cluster
//   kvfabric explain eviction --cache-host HOST:PORT [--namespace NS] [--key HEX]
//       [--all-namespaces] [--last N] [--json]
//       why a cache host evicted, demoted or dropped a block, with the formula
//   kvfabric status (--placement HOST:PORT | --cache-host HOST:PORT ...) [--json]
//       live cache hosts: state, capacity and use per tier, blocks, leases
//   kvfabric explain plan --placement HOST:PORT [--plan-id N] [--namespace NS] [--last N]
//       [--json]
//       a fetch-or-recompute plan's formula with its numbers
//   kvfabric calibrate --out FILE [--cache-host HOST:PORT]... [--nvme-dir DIR]
//                      [--min-bytes B] [--max-bytes B] [--repeats N] [--json]
//       measure the bus paths, fit the cost model, write the calibration file
//
// Exit status: 0 on success, 1 on a failed command, 2 on a usage error.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/calibrate_command.h"
#ifdef KVF_HAVE_UCX
#include "cli/demo_command.h"
#endif
#include "cli/explain_command.h"
#include "cli/status_command.h"
#include "cli/version_info.h"
#include "core/config/logging_flags.h"
#include "core/config/yaml_config.h"
#include "core/logging.h"
#include "security/security_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"kvfabric: a distributed KV-cache for LLM serving", "kvfabric"};
  app.require_subcommand(1);
  // Every flag may also come from a YAML file (--config); flags win.
  kvfabric::AddYamlConfigOption(&app);
  kvfabric::LogOptions log_options;
  kvfabric::AddLoggingFlags(app, &log_options);

  bool json = false;
  CLI::App* version = app.add_subcommand("version", "print the version and optional parts");
  version->add_flag("--json", json, "machine-readable output");

  kvfabric::cli::StatusArgs status_args;
  CLI::App* status = app.add_subcommand("status", "live cache hosts, capacity and use per tier");
  status->add_option("--placement", status_args.placement, "placement gRPC address HOST:PORT");
  status->add_option("--cache-host", status_args.cache_hosts,
                     "a daemon's gRPC address HOST:PORT (repeatable), without placement");
  status->add_flag("--json", status_args.json, "machine-readable output");
  status
      ->add_option("--interval", status_args.interval_s,
                   "seconds between the two samples rates are computed from (0: averages "
                   "since placement started only)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600.0));

  CLI::App* explain = app.add_subcommand("explain", "explain a decision with its formula");
  explain->require_subcommand(1);
  kvfabric::cli::ExplainEvictionArgs eviction_args;
  CLI::App* eviction =
      explain->add_subcommand("eviction", "why a cache host evicted or demoted a block");
  eviction->add_option("--cache-host", eviction_args.cache_host, "daemon gRPC address HOST:PORT")
      ->required();
  eviction->add_option("--namespace", eviction_args.tenant, "the block's namespace");
  eviction->add_option("--key", eviction_args.key_hex,
                       "the block key, 64 hex characters; without it, the daemon's most recent "
                       "decisions are listed");
  eviction->add_flag("--all-namespaces", eviction_args.all_namespaces,
                     "list every namespace's decisions (--cache-host must be the daemon's "
                     "--admin-address)");
  eviction->add_option("--last", eviction_args.last, "how many recent decisions to list")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  eviction->add_flag("--json", eviction_args.json, "machine-readable output");
  kvfabric::cli::ExplainPlanArgs plan_args;
  CLI::App* plan = explain->add_subcommand("plan", "a placement plan's formula with its numbers");
  plan->add_option("--placement", plan_args.placement, "placement gRPC address HOST:PORT")
      ->required();
  plan->add_option("--plan-id", plan_args.plan_id,
                   "the plan's id (PlanResponse.plan_id); without it, the most recent plans "
                   "are listed");
  plan->add_option("--namespace", plan_args.tenant, "list only this namespace's plans");
  plan->add_option("--last", plan_args.last, "how many recent plans to list")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  plan->add_flag("--json", plan_args.json, "machine-readable output");

  kvfabric::cli::CalibrateArgs calibrate_args;
  CLI::App* calibrate = kvfabric::cli::AddCalibrateSubcommand(app, &calibrate_args);
  kvfabric::AddClientSecurityFlags(*status, &status_args.security);
  kvfabric::AddClientSecurityFlags(*eviction, &eviction_args.security);
  kvfabric::AddClientSecurityFlags(*plan, &plan_args.security);
  kvfabric::AddClientSecurityFlags(*calibrate, &calibrate_args.security);
#ifdef KVF_HAVE_UCX
  kvfabric::cli::DemoArgs demo_args;
  CLI::App* demo = kvfabric::cli::AddDemoSubcommand(app, &demo_args);
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (kvfabric::Status s = kvfabric::InitLogging(log_options); !s.ok()) {
    std::fprintf(stderr, "kvfabric: %s\n", s.ToString().c_str());
    return 2;
  }

  if (version->parsed()) {
    kvfabric::cli::VersionInfo info = kvfabric::cli::CollectVersionInfo();
    const std::string out = json ? kvfabric::cli::FormatVersionJson(info)
                                 : kvfabric::cli::FormatVersionText(info);
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  if (status->parsed()) {
    if (kvfabric::Status s = kvfabric::cli::RunStatus(status_args); !s.ok()) {
      std::fprintf(stderr, "kvfabric status: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (plan->parsed()) {
    if (kvfabric::Status s = kvfabric::cli::RunExplainPlan(plan_args); !s.ok()) {
      std::fprintf(stderr, "kvfabric explain plan: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (eviction->parsed()) {
    if (kvfabric::Status s = kvfabric::cli::RunExplainEviction(eviction_args); !s.ok()) {
      std::fprintf(stderr, "kvfabric explain eviction: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (calibrate->parsed()) {
    if (auto v = kvfabric::cli::ValidateCalibrateArgs(calibrate_args); !v.ok()) {
      std::fprintf(stderr, "kvfabric calibrate: %s\n", v.status().ToString().c_str());
      return 2;
    }
    if (kvfabric::Status s = kvfabric::cli::RunCalibrateCommand(calibrate_args); !s.ok()) {
      std::fprintf(stderr, "kvfabric calibrate: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
#ifdef KVF_HAVE_UCX
  if (demo->parsed()) {
    if (kvfabric::Status s = kvfabric::cli::RunDemo(demo_args); !s.ok()) {
      std::fprintf(stderr, "kvfabric demo: %s\n", s.ToString().c_str());
      return s.code() == kvfabric::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return 0;
  }
#endif
  return 2;
}
