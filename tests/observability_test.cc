// What an operator sees, proven against real processes: a kvfabric-placement
// and two kvfabric-cached processes on loopback, this test process as the
// engine (libkvfabric with its own /metrics), and Debian's Prometheus.
//
//   CatalogueMatchesEveryProcess   every family each process exports is in
//                                  docs/metrics.md with its type, labels and
//                                  process, and every catalogued family is
//                                  exported by the processes it names; the
//                                  naming conventions hold.
//   PromtoolAcceptsEveryEndpoint   `promtool check metrics` passes on each
//                                  process's /metrics page.
//   PrometheusScrapesTheCluster    a real Prometheus scrapes the cluster with
//                                  deploy/prometheus's rules: transfer bytes
//                                  rise, plans appear by kind, every recording
//                                  rule evaluates to a series, and every panel
//                                  query of deploy/grafana/kvfabric.json
//                                  returns data.
//
// The workload: each round prefills (recomputes) and writes back a new
// 1K-token history, loads it again (fetched), and loads it extended by half
// (fetch the prefix, recompute the rest), so every plan kind the workload can
// produce and both transfer directions appear.
//
// Prometheus and promtool come from Debian's prometheus package
// (tools/setup.sh); without them the cases that need them skip, saying so.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/kvfabric_client.h"
#include "client/synthetic_model.h"
#include "core/testing/test_seed.h"
#include "gpu/cpu/cpu_device.h"
#include "metrics/scrape_config.h"
#include "tests/http_client.h"
#include "tests/server_process.h"
#include "tests/test_engine.h"

extern char** environ;

namespace kvfabric {
namespace {

using client::Client;
using client::ContextId;
using testing::HttpRequest;
using testing::ServerProcess;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

// Bazel runs tests in the runfiles tree (paths from the workspace root);
// ctest from the source tree (KVF_SOURCE_DIR).
std::string SourceFile(const std::string& path) {
  const char* root = std::getenv("KVF_SOURCE_DIR");
  return root != nullptr && *root != '\0' ? std::string(root) + "/" + path : path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelFingerprint TestModel() { return testing::SyntheticTestModel("observability/synthetic@1"); }

// One exported family, as a /metrics page declares it.
struct Family {
  std::string type;                   // counter | gauge | histogram | summary | untyped
  std::set<std::string> label_names;  // of its samples, without le
};

// Families of a Prometheus text page by name.
std::map<std::string, Family> ParsePage(const std::string& text) {
  std::map<std::string, Family> out;
  std::istringstream in(text);
  static const std::regex kLabel(R"(([a-zA-Z_][a-zA-Z0-9_]*)=")");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream w(line.substr(7));
      std::string name, type;
      w >> name >> type;
      out[name].type = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const std::size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    std::string name = line.substr(0, brace);
    // A histogram's samples are name_bucket, name_sum, name_count.
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          out.count(name.substr(0, name.size() - s.size())) != 0) {
        name = name.substr(0, name.size() - s.size());
        break;
      }
    }
    const std::string labels = line.substr(brace, line.find('}') - brace);
    for (std::sregex_iterator it(labels.begin(), labels.end(), kLabel), end; it != end; ++it) {
      if ((*it)[1] != "le") out[name].label_names.insert((*it)[1]);
    }
  }
  return out;
}

// One row of docs/metrics.md's catalogue.
struct CatalogueEntry {
  std::string type;
  std::set<std::string> labels;
  std::set<std::string> processes;
};

std::set<std::string> Words(std::string cell) {
  std::set<std::string> out;
  for (char& c : cell) {
    if (c == ',' || c == '`' || c == '|') c = ' ';
  }
  std::istringstream w(cell);
  for (std::string word; w >> word;) {
    if (word != "-") out.insert(word);
  }
  return out;
}

// Rows "| `name` | type | unit | labels | processes | meaning |".
std::map<std::string, CatalogueEntry> ParseCatalogue(const std::string& markdown) {
  std::map<std::string, CatalogueEntry> out;
  std::istringstream in(markdown);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `kvfabric_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::size_t start = 1;
    for (std::size_t bar; (bar = line.find('|', start)) != std::string::npos; start = bar + 1) {
      cells.push_back(line.substr(start, bar - start));
    }
    if (cells.size() < 6) continue;
    const std::set<std::string> name = Words(cells[0]);
    if (name.size() != 1) continue;
    CatalogueEntry e;
    e.type = *Words(cells[1]).begin();
    e.labels = Words(cells[3]);
    e.processes = Words(cells[4]);
    out[*name.begin()] = e;
  }
  return out;
}

std::string Join(const std::set<std::string>& s) {
  std::string out;
  for (const std::string& x : s) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "-" : out;
}

// The exit status and output of `command` (run by /bin/sh).
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A Prometheus server on loopback, killed and reaped when destroyed.
class PrometheusProcess {
 public:
  static StatusOr<std::unique_ptr<PrometheusProcess>> Start(const std::string& config,
                                                            const std::string& dir) {
    auto p = std::unique_ptr<PrometheusProcess>(new PrometheusProcess);
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int port = testing::PickFreePort();
      p->address_ = "127.0.0.1:" + std::to_string(port);
      std::vector<std::string> args = {kPrometheus, "--config.file=" + config,
                                       "--storage.tsdb.path=" + dir + "/tsdb",
                                       "--web.listen-address=" + p->address_, "--log.level=warn"};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      const std::string log = dir + "/prometheus.log";
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      const int rc = posix_spawn(&p->pid_, kPrometheus, &actions, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      if (rc != 0) return Status::Unavailable("cannot start " + std::string(kPrometheus));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
          p->pid_ = -1;
          break;  // exited (the port was taken?): try another
        }
        auto r = HttpRequest(p->address_, "GET", "/-/ready", "", std::chrono::seconds(2));
        if (r.ok() && r->status == 200) return p;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      p->Stop();
    }
    return Status::Unavailable("prometheus did not become ready; its log:\n" +
                               ReadFile(dir + "/prometheus.log"));
  }

  ~PrometheusProcess() { Stop(); }

  // The JSON answer of an instant query; its "status" is "success" or "error".
  nlohmann::json Query(const std::string& promql) const {
    auto r = HttpRequest(address_, "POST", "/api/v1/query", "query=" + testing::UrlEncode(promql),
                         std::chrono::seconds(10));
    if (!r.ok()) return {{"status", "error"}, {"error", r.status().ToString()}};
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return {{"status", "error"}, {"error", "not JSON: " + r->body}};
    return j;
  }

  // Series an instant query returns (0 for an error or a scalar).
  static std::size_t Series(const nlohmann::json& answer) {
    if (answer.value("status", "") != "success") return 0;
    const nlohmann::json& result = answer["data"]["result"];
    return result.is_array() ? result.size() : 0;
  }

 private:
  PrometheusProcess() = default;
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
  std::string address_;
};

class ObservabilityTest : public ::testing::Test {
 protected:
  // The cluster and client are shared by the cases (starting them is the
  // slow part); a case that finds them broken fails with the reason.
  static void SetUpTestSuite() {
    s_ = new Shared;
    s_->error = s_->Start();
  }
  static void TearDownTestSuite() {
    delete s_;
    s_ = nullptr;
  }

  void SetUp() override { ASSERT_EQ(s_->error, "") << "cluster did not start"; }

  struct Endpoint {
    std::string process;  // "placement", "cached", "client"
    std::string url;
  };

  struct Shared {
    std::string dir;
    std::uint64_t seed = 0;
    std::string error;
    ModelFingerprint model = TestModel();
    std::unique_ptr<ServerProcess> placement;
    std::vector<std::unique_ptr<ServerProcess>> daemons;
    std::unique_ptr<gpu::Device> device;
    std::unique_ptr<Client> client;
    std::mutex mu;
    std::map<ContextId, std::vector<BlockKey>> chains;
    std::mt19937_64 rng;
    int rounds = 0;

    ~Shared() {
      client.reset();
      device.reset();
      daemons.clear();
      placement.reset();
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }

    std::vector<Endpoint> Endpoints() const {
      std::vector<Endpoint> out = {{"placement", placement->metrics()}};
      for (const auto& d : daemons) out.push_back({"cached", d->metrics()});
      out.push_back({"client", client->metrics_url()});
      return out;
    }

    std::string Start() {
      seed = TestSeed("ObservabilityTest");
      rng.seed(seed);
      char tmpl[] = "/tmp/kvf_observability_XXXXXX";
      if (mkdtemp(tmpl) == nullptr) return "mkdtemp failed";
      dir = tmpl;
      auto p = ServerProcess::Start(testing::ServerBinary("KVF_PLACEMENT", "kvfabric-placement"),
                                    "placement", dir,
                                    {"--insecure", "--grpc-address=127.0.0.1:0",
                                     "--metrics-address=127.0.0.1:0", "--log-level=warn"});
      if (!p.ok()) return p.status().ToString();
      placement = std::move(*p);
      for (int i = 0; i < 2; ++i) {
        // Daemon 0 has an NVMe tier and small host pool (so blocks demote and
        // the NVMe families have data); daemon 1 gives per-namespace series.
        std::vector<std::string> flags = {"--host-id=cache-" + std::to_string(i),
                                          "--insecure",
                                          "--grpc-address=127.0.0.1:0",
                                          "--transport-address=127.0.0.1:0",
                                          "--metrics-address=127.0.0.1:0",
                                          "--lock-memory=off",
                                          "--log-level=warn",
                                          "--host-page-bytes=32KiB",
                                          "--placement-address=" + placement->grpc(),
                                          "--membership-ttl=120s"};
        if (i == 0) {
          flags.push_back("--host-pool-bytes=4MiB");
          flags.push_back("--nvme-dir=" + dir + "/nvme-0");
          flags.push_back("--nvme-capacity-bytes=256MiB");
        } else {
          flags.push_back("--host-pool-bytes=64MiB");
          flags.push_back("--metrics-namespace-series=4");
        }
        auto d = ServerProcess::Start(testing::ServerBinary("KVF_CACHED", "kvfabric-cached"),
                                      "cache-" + std::to_string(i), dir, flags);
        if (!d.ok()) return d.status().ToString();
        daemons.push_back(std::move(*d));
      }
      gpu::DeviceOptions dopts;
      dopts.arena_bytes = 16 << 20;
      auto dev = gpu::CreateCpuDevice(dopts);
      if (!dev.ok()) return dev.status().ToString();
      device = std::move(*dev);
      client::ClientOptions o;
      o.placement_address = placement->grpc();
      o.security.insecure = true;
      o.model = model;
      o.device = device.get();
      o.num_q_heads = 4;
      o.tile_tokens = 256;
      o.staging_bytes = 4 << 20;
      o.history_pool_bytes = 16 << 20;
      o.max_context_tokens = 2048;
      o.metrics_address = "127.0.0.1:0";
      // A prefill this costly makes fetching the cached prefix, or most of
      // it beside the prefill of a few front blocks (a split), the plan.
      o.prefill = RecomputeParameters{0.0, 2.0, 0.0};
      o.recompute = [this](const client::RecomputeRequest& r, std::span<std::byte> out) {
        return Prefill(r, out);
      };
      // Placement lists both daemons before the first plan.
      for (int attempt = 0;; ++attempt) {
        auto c = Client::Open(o);
        if (c.ok()) {
          client = std::move(*c);
          break;
        }
        if (attempt == 50) return c.status().ToString();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return "";
    }

    Status Prefill(const client::RecomputeRequest& r, std::span<std::byte> out) {
      std::vector<BlockKey> chain;
      {
        std::lock_guard<std::mutex> l(mu);
        chain = chains[r.context];
      }
      const std::uint64_t bytes = *model.BlockBytes();
      for (std::uint32_t i = 0; i < r.block_count; ++i) {
        const std::uint32_t b = r.first_block + i;
        if (b >= chain.size()) return Status::Internal("block past the chain");
        KVF_RETURN_IF_ERROR(client::SyntheticKv(model, client::SeedFromKey(chain[b], seed), 16,
                                                out.subspan(i * bytes, bytes)));
      }
      return Status::OK();
    }

    // Match, load, wait every layer; save layers when `save`; finish.
    Status Serve(const std::vector<BlockKey>& chain, bool save) {
      KVF_ASSIGN_OR_RETURN(client::MatchResult match, client->Match(chain, 0));
      KVF_ASSIGN_OR_RETURN(ContextId ctx, client->NewContext(chain.size() * 16));
      {
        std::lock_guard<std::mutex> l(mu);
        chains[ctx] = chain;
      }
      KVF_RETURN_IF_ERROR(client->Load(match, ctx));
      for (std::uint32_t l = 0; l < model.layer_count; ++l) {
        KVF_RETURN_IF_ERROR(client->WaitLayer(ctx, l));
        if (save) KVF_RETURN_IF_ERROR(client->Save(ctx, l, 0, chain));
      }
      KVF_ASSIGN_OR_RETURN(client::ContextReport report, client->Finish(ctx));
      std::lock_guard<std::mutex> l(mu);
      chains.erase(ctx);
      return Status::OK();
    }

    // One round of the workload (see the file comment).
    Status Round() {
      std::vector<std::uint32_t> tokens(1536);
      for (std::uint32_t& t : tokens) t = static_cast<std::uint32_t>(rng() % 32000);
      KVF_ASSIGN_OR_RETURN(std::vector<BlockKey> full, client->KeyTokens(tokens));
      const std::vector<BlockKey> head(full.begin(), full.begin() + 64);
      KVF_RETURN_IF_ERROR(Serve(head, /*save=*/true).WithContext("prefill"));
      KVF_RETURN_IF_ERROR(Serve(head, /*save=*/false).WithContext("reload"));
      KVF_RETURN_IF_ERROR(Serve(full, /*save=*/true).WithContext("extend"));
      ++rounds;
      return Status::OK();
    }
  };

  static Shared* s_;
};

ObservabilityTest::Shared* ObservabilityTest::s_ = nullptr;

std::string Scrape(const std::string& url) {
  auto r = HttpRequest(testing::HostPort(url), "GET", "/metrics");
  if (!r.ok() || r->status != 200) return "";
  return r->body;
}

TEST_F(ObservabilityTest, CatalogueMatchesEveryProcess) {
  std::printf("seed %llu (KVF_TEST_SEED)\n", static_cast<unsigned long long>(s_->seed));
  const std::map<std::string, CatalogueEntry> catalogue =
      ParseCatalogue(ReadFile(SourceFile("docs/metrics.md")));
  ASSERT_GT(catalogue.size(), 50u) << "docs/metrics.md has no catalogue table";
  // Some families exist only once their event happened (a finished split
  // plan for kvfabric_placement_model_split_error_ratio; which plans
  // placement chooses depends on what it has measured): workload rounds
  // until every catalogued family is exported, at most 8.
  for (int round = 0; round < 8; ++round) {
    ASSERT_TRUE(s_->Round().ok());
    std::map<std::string, std::set<std::string>> seen;
    for (const Endpoint& e : s_->Endpoints()) {
      for (const auto& [name, family] : ParsePage(Scrape(e.url))) seen[name].insert(e.process);
    }
    bool all = true;
    for (const auto& [name, entry] : catalogue) {
      for (const std::string& process : entry.processes) all = all && seen[name].count(process);
    }
    if (all) break;
  }

  // Label names a scraper must never see: unbounded per-request values.
  const std::set<std::string> forbidden = {"key",     "block_key",  "context", "context_id",
                                           "request", "request_id", "plan_id", "lease_id",
                                           "token",   "seq"};
  std::map<std::string, std::set<std::string>> exported_by;  // name -> processes
  std::vector<std::string> problems;
  for (const Endpoint& e : s_->Endpoints()) {
    const std::string page = Scrape(e.url);
    ASSERT_FALSE(page.empty()) << e.process << ": nothing at " << e.url;
    for (const auto& [name, family] : ParsePage(page)) {
      exported_by[name].insert(e.process);
      auto it = catalogue.find(name);
      const std::string row = "| `" + name + "` | " + family.type + " | ? | " +
                              Join(family.label_names) + " | " + e.process + " | ? |";
      if (it == catalogue.end()) {
        problems.push_back(e.process + " exports " + name + ", not in docs/metrics.md: " + row);
        continue;
      }
      if (it->second.type != family.type) {
        problems.push_back(name + ": type " + family.type + ", catalogued " + it->second.type);
      }
      if (it->second.labels != family.label_names) {
        problems.push_back(name + " (" + e.process + "): labels " + Join(family.label_names) +
                           ", catalogued " + Join(it->second.labels));
      }
      if (it->second.processes.count(e.process) == 0) {
        problems.push_back(name + ": exported by " + e.process + ", catalogued for " +
                           Join(it->second.processes));
      }
      // Conventions.
      if (name.rfind("kvfabric_", 0) != 0) problems.push_back(name + ": no kvfabric_ prefix");
      const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
      if ((family.type == "counter") != total) {
        problems.push_back(name + ": counters, and only counters, end in _total");
      }
      for (const char* unit : {"_ms", "_us", "_micros", "_millis", "_kb", "_mb", "_gb"}) {
        if (name.find(std::string(unit) + "_") != std::string::npos ||
            name.size() >= std::strlen(unit) &&
                name.compare(name.size() - std::strlen(unit), std::strlen(unit), unit) == 0) {
          problems.push_back(name + ": not in base units (seconds, bytes)");
        }
      }
      for (const std::string& l : family.label_names) {
        if (forbidden.count(l) != 0) problems.push_back(name + ": unbounded label " + l);
      }
    }
  }
  for (const auto& [name, entry] : catalogue) {
    for (const std::string& process : entry.processes) {
      if (exported_by[name].count(process) == 0) {
        problems.push_back("docs/metrics.md lists " + name + " for " + process +
                           ", which does not export it");
      }
    }
  }
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

TEST_F(ObservabilityTest, PromtoolAcceptsEveryEndpoint) {
  if (access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << kPromtool << " not found: apt-get install prometheus (tools/setup.sh does)";
  }
  ASSERT_TRUE(s_->Round().ok());
  for (const Endpoint& e : s_->Endpoints()) {
    const std::string page = Scrape(e.url);
    ASSERT_FALSE(page.empty()) << e.url;
    const std::string file = s_->dir + "/" + e.process + ".prom";
    std::ofstream(file) << page;
    const auto [rc, out] = RunCommand(std::string(kPromtool) + " check metrics < " + file);
    EXPECT_EQ(rc, 0) << e.process << " (" << e.url << "): promtool check metrics:\n" << out;
  }
}

// Every `expr` of the dashboard's panels, with Grafana's variables replaced
// by what Prometheus accepts.
std::vector<std::pair<std::string, std::string>> PanelQueries(const nlohmann::json& dashboard) {
  std::vector<std::pair<std::string, std::string>> out;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& panels) {
    for (const nlohmann::json& p : panels) {
      if (p.contains("panels")) walk(p["panels"]);
      if (!p.contains("targets")) continue;
      for (const nlohmann::json& t : p["targets"]) {
        if (!t.contains("expr")) continue;
        std::string expr = t["expr"].get<std::string>();
        expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "30s");
        expr = std::regex_replace(expr, std::regex(R"(\$__range)"), "5m");
        expr = std::regex_replace(expr, std::regex(R"(\$__interval)"), "5s");
        expr = std::regex_replace(expr, std::regex(R"(\$(job|instance|host|path)\b)"), ".*");
        out.emplace_back(p.value("title", "?") + " / " + t.value("refId", "?"), expr);
      }
    }
  };
  walk(dashboard["panels"]);
  return out;
}

// Record names of a rules file.
std::vector<std::string> RecordingRules(const std::string& path) {
  std::vector<std::string> out;
  YAML::Node root = YAML::LoadFile(path);
  for (const YAML::Node& group : root["groups"]) {
    for (const YAML::Node& rule : group["rules"]) {
      if (rule["record"]) out.push_back(rule["record"].as<std::string>());
    }
  }
  return out;
}

TEST_F(ObservabilityTest, PrometheusScrapesTheCluster) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " not found: apt-get install prometheus (tools/setup.sh does)";
  }
  const std::string rules =
      std::filesystem::absolute(SourceFile("deploy/prometheus/kvfabric-rules.yml")).string();
  const std::string alerts =
      std::filesystem::absolute(SourceFile("deploy/prometheus/kvfabric-alerts.yml")).string();
  // The generator `kvfabric demo --keep-running` prints with (the jobs of
  // deploy/prometheus/prometheus.yml); every second, so a short test sees
  // rates.
  std::map<std::string, std::vector<std::string>> jobs;
  for (const Endpoint& e : s_->Endpoints()) {
    jobs["kvfabric-" + e.process].push_back(metrics::HostPortOfUrl(e.url));
  }
  std::vector<metrics::ScrapeJob> scrape;
  for (const auto& [job, targets] : jobs) scrape.push_back({job, targets});
  metrics::ScrapeConfigOptions scrape_options;
  scrape_options.interval_s = 1;
  scrape_options.rule_files = {rules, alerts};
  const std::string config_file = s_->dir + "/prometheus.yml";
  std::ofstream(config_file) << metrics::PrometheusScrapeConfig(scrape, scrape_options);
  auto prom = PrometheusProcess::Start(config_file, s_->dir);
  ASSERT_TRUE(prom.ok()) << prom.status().ToString();

  const nlohmann::json dashboard =
      nlohmann::json::parse(ReadFile(SourceFile("deploy/grafana/kvfabric.json")));
  const auto panels = PanelQueries(dashboard);
  ASSERT_GT(panels.size(), 10u);
  const std::vector<std::string> records = RecordingRules(rules);
  ASSERT_GT(records.size(), 3u);

  // Runs the workload until every check holds or 120 s pass; the checks
  // that still fail are reported.
  std::map<std::string, std::string> failing;
  double first_bytes = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(s_->Round().ok());
    failing.clear();
    const nlohmann::json up = (*prom)->Query("up == 1");
    if (PrometheusProcess::Series(up) != 4) failing["up"] = up.dump();
    const nlohmann::json bytes = (*prom)->Query(
        "sum(kvfabric_client_transfer_bytes_total) + "
        "sum(kvfabric_cache_host_transfer_bytes_total)");
    double now_bytes = -1;
    if (PrometheusProcess::Series(bytes) == 1) {
      now_bytes = std::stod(bytes["data"]["result"][0]["value"][1].get<std::string>());
    }
    if (first_bytes < 0) first_bytes = now_bytes;
    if (!(now_bytes > first_bytes && first_bytes >= 0)) {
      failing["transfer bytes rise"] =
          std::to_string(first_bytes) + " -> " + std::to_string(now_bytes);
    }
    const nlohmann::json kinds =
        (*prom)->Query("sum by (kind) (kvfabric_placement_plans_total) > 0");
    std::set<std::string> seen;
    if (kinds.value("status", "") == "success") {
      for (const auto& r : kinds["data"]["result"]) seen.insert(r["metric"].value("kind", ""));
    }
    // Prefill and reload: recompute_all, then fetch (all, or a split when the
    // refitted prefill is cheap enough to recompute a head).
    if (seen.count("recompute_all") == 0 ||
        (seen.count("fetch_all") == 0 && seen.count("split") == 0)) {
      failing["plans by kind"] = kinds.dump();
    }
    for (const std::string& record : records) {
      const nlohmann::json r = (*prom)->Query(record);
      if (PrometheusProcess::Series(r) == 0) failing["recording rule " + record] = r.dump();
    }
    for (const auto& [what, expr] : panels) {
      const nlohmann::json r = (*prom)->Query(expr);
      if (PrometheusProcess::Series(r) == 0) {
        failing["panel " + what] = expr + " -> " + r.dump().substr(0, 300);
      }
    }
    if (failing.empty()) break;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  std::printf("%d workload rounds; %zu panel queries, %zu recording rules checked\n", s_->rounds,
              panels.size(), records.size());
  for (const auto& [what, why] : failing) ADD_FAILURE() << what << ": " << why;
}

}  // namespace
}  // namespace kvfabric
