// deploy/ is what operators install: this test proves it runs as written.
//
//   KubernetesManifestsAreComplete   every document parses, has apiVersion,
//                                    kind, metadata.name and namespace; each
//                                    workload's selector matches its pods,
//                                    every probe, Service and monitor port
//                                    names a container port, and every
//                                    kvfabric container's command (with its
//                                    ConfigMap as the --config file) passes
//                                    the binary's --check-config, so every
//                                    flag and value is one the binary takes.
//   ExampleConfigsPassCheckConfig    deploy/config/*.yaml.
//   SystemdUnitsVerify               systemd-analyze verify on both units
//                                    (their binaries and config paths
//                                    pointed at this tree), and their
//                                    ExecStartPre check passes.
//   ReadmeDeploymentExampleRuns      the README's kvfabric-cached command,
//                                    as written, passes --check-config.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "security/testing/test_pki.h"

namespace kvfabric {
namespace {

namespace fs = std::filesystem;

// Bazel runs the test in its runfiles tree (workspace-relative paths);
// ctest from the source tree (KVF_SOURCE_DIR).
std::string Source(const std::string& path) {
  const char* root = std::getenv("KVF_SOURCE_DIR");
  return root != nullptr && *root != '\0' ? std::string(root) + "/" + path : path;
}

std::string Binary(const char* env, const char* fallback) {
  const char* v = std::getenv(env);
  return v != nullptr && *v != '\0' ? fs::absolute(v).string() : fallback;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Exit status and output (stdout and stderr) of `argv`.
std::pair<int, std::string> RunArgv(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& a : argv) command += Quote(a) + " ";
  FILE* p = popen((command + "2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class DeployTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvf_deploy_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // The certificates the examples name under /etc/kvfabric/tls/, issued
    // here by a throw-away CA, and the example tenants file.
    fs::create_directories(dir_ + "/tls");
    testing::TestPki pki(dir_ + "/tls", "deploy test CA");
    fs::copy_file(pki.ca_file(), dir_ + "/tls/ca.pem");
    for (const char* name : {"cached", "placement"}) {
      const testing::TestPki::Files f =
          pki.Issue(name, {"DNS:" + std::string(name) + ".kvfabric.svc"});
      fs::copy_file(f.cert, dir_ + "/tls/" + name + ".pem");
      fs::copy_file(f.key, dir_ + "/tls/" + name + ".key");
    }
    fs::copy_file(Source("deploy/config/tenants.yaml"), dir_ + "/tenants.yaml");
  }

  // `text` with the examples' /etc/kvfabric/tls/ and tenants file pointed at
  // this test's.
  std::string Localize(const std::string& text) const {
    std::string out = std::regex_replace(text, std::regex("/etc/kvfabric/tls/"), dir_ + "/tls/");
    return std::regex_replace(out, std::regex("/etc/kvfabric/tenants.yaml"),
                              dir_ + "/tenants.yaml");
  }
  // A copy of the example config `source` with Localize applied.
  std::string LocalConfig(const std::string& source) const {
    const std::string path = dir_ + "/" + fs::path(source).filename().string();
    std::ofstream(path) << Localize(Read(Source(source)));
    return path;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string BinaryFor(const std::string& path) const {
    if (path.find("kvfabric-cached") != std::string::npos) return cached_;
    if (path.find("kvfabric-placement") != std::string::npos) return placement_;
    return "";
  }

  std::string dir_;
  const std::string cached_ = Binary("KVF_CACHED", "kvfabric-cached");
  const std::string placement_ = Binary("KVF_PLACEMENT", "kvfabric-placement");
};

std::vector<YAML::Node> Documents(const std::string& path) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& d : YAML::LoadAllFromFile(path)) {
    if (d && !d.IsNull()) out.push_back(d);
  }
  return out;
}

// The pod template's spec of a workload, or a null node.
YAML::Node PodSpec(const YAML::Node& doc) {
  const std::string kind = doc["kind"].as<std::string>();
  if (kind == "DaemonSet" || kind == "Deployment" || kind == "StatefulSet") {
    return doc["spec"]["template"]["spec"];
  }
  return YAML::Node();
}

TEST_F(DeployTest, KubernetesManifestsAreComplete) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(Source("deploy/kubernetes"))) {
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  }
  ASSERT_GE(files.size(), 4u);
  std::map<std::string, std::string> config_maps;  // "name/key" -> content
  std::vector<YAML::Node> docs;
  std::set<std::string> kinds;
  for (const std::string& f : files) {
    for (const YAML::Node& d : Documents(f)) {
      SCOPED_TRACE(f);
      ASSERT_TRUE(d["apiVersion"] && d["kind"] && d["metadata"]["name"]) << f;
      const std::string kind = d["kind"].as<std::string>();
      kinds.insert(kind);
      if (kind != "Namespace") {
        EXPECT_EQ(d["metadata"]["namespace"].as<std::string>(""), "kvfabric")
            << kind << " " << d["metadata"]["name"];
      }
      if (kind == "ConfigMap") {
        for (const auto& kv : d["data"]) {
          config_maps[d["metadata"]["name"].as<std::string>() + "/" + kv.first.as<std::string>()] =
              kv.second.as<std::string>();
        }
      }
      docs.push_back(d);
    }
  }
  for (const char* k : {"Namespace", "ConfigMap", "DaemonSet", "Deployment", "Service",
                        "StatefulSet", "PodMonitor", "ServiceMonitor"}) {
    EXPECT_EQ(kinds.count(k), 1u) << "no " << k << " in deploy/kubernetes";
  }

  std::map<std::string, std::set<std::string>> ports_of_app;  // app label -> port names
  int kvfabric_containers = 0;
  for (const YAML::Node& d : docs) {
    const YAML::Node pod = PodSpec(d);
    if (!pod.IsMap()) continue;
    const std::string name = d["metadata"]["name"].as<std::string>();
    SCOPED_TRACE(name);
    // The selector picks the template's pods.
    const YAML::Node labels = d["spec"]["template"]["metadata"]["labels"];
    for (const auto& kv : d["spec"]["selector"]["matchLabels"]) {
      EXPECT_EQ(labels[kv.first.as<std::string>()].as<std::string>(""), kv.second.as<std::string>())
          << "selector does not match the pod template";
    }
    const std::string app = labels["app.kubernetes.io/name"].as<std::string>("");
    if (d["kind"].as<std::string>() == "DaemonSet") {
      EXPECT_TRUE(pod["nodeSelector"]["kvfabric.io/cache-host"])
          << "cache hosts run on labelled memory-heavy nodes";
    }
    std::map<std::string, std::string> volumes;  // volume name -> ConfigMap name
    for (const YAML::Node& v : pod["volumes"]) {
      if (v["configMap"]) {
        volumes[v["name"].as<std::string>()] = v["configMap"]["name"].as<std::string>();
      }
    }
    std::vector<YAML::Node> containers;
    for (const YAML::Node& c : pod["containers"]) containers.push_back(c);
    for (const YAML::Node& c : pod["initContainers"]) containers.push_back(c);
    for (const YAML::Node& c : containers) {
      ASSERT_TRUE(c["name"] && c["image"]) << "container without name or image";
      std::set<std::string> ports;
      for (const YAML::Node& p : c["ports"]) {
        ports.insert(p["name"].as<std::string>());
        ports_of_app[app].insert(p["name"].as<std::string>());
      }
      for (const char* probe : {"readinessProbe", "livenessProbe"}) {
        if (!c[probe]) continue;
        const YAML::Node port =
            c[probe]["tcpSocket"] ? c[probe]["tcpSocket"]["port"] : c[probe]["httpGet"]["port"];
        EXPECT_EQ(ports.count(port.as<std::string>()), 1u) << probe << " names no container port";
      }
      // A kvfabric container: its command must pass --check-config, with
      // the ConfigMap it mounts as the --config file.
      std::vector<std::string> argv;
      for (const YAML::Node& a : c["command"]) argv.push_back(a.as<std::string>());
      for (const YAML::Node& a : c["args"]) argv.push_back(a.as<std::string>());
      if (argv.empty() || BinaryFor(argv[0]).empty()) continue;
      ++kvfabric_containers;
      std::map<std::string, std::string> mounts;  // mount path -> ConfigMap name
      for (const YAML::Node& m : c["volumeMounts"]) {
        auto it = volumes.find(m["name"].as<std::string>());
        if (it != volumes.end()) mounts[m["mountPath"].as<std::string>()] = it->second;
      }
      std::vector<std::string> run = {BinaryFor(argv[0])};
      bool check = false;
      for (std::size_t i = 1; i < argv.size(); ++i) {
        std::string a = std::regex_replace(argv[i], std::regex(R"(\$\(NODE_NAME\))"), "node-a");
        if (a.rfind("--config=", 0) == 0) {
          const std::string path = a.substr(9);
          const std::string mount = path.substr(0, path.rfind('/'));
          ASSERT_EQ(mounts.count(mount), 1u) << path << " is not in a mounted ConfigMap";
          const std::string key = mounts[mount] + "/" + path.substr(path.rfind('/') + 1);
          ASSERT_EQ(config_maps.count(key), 1u) << "no ConfigMap key " << key;
          const std::string file = dir_ + "/" + std::to_string(kvfabric_containers) + ".yaml";
          std::ofstream(file) << Localize(config_maps[key]);
          a = "--config=" + file;
        }
        check = check || a == "--check-config";
        run.push_back(Localize(a));
      }
      if (!check) run.push_back("--check-config");
      const auto [rc, out] = RunArgv(run);
      EXPECT_EQ(rc, 0) << c["name"] << ": " << out;
    }
  }
  EXPECT_GE(kvfabric_containers, 4) << "cached and placement, each with its init check";

  // Services and monitors name ports the pods have.
  for (const YAML::Node& d : docs) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind != "Service" && kind != "PodMonitor" && kind != "ServiceMonitor") continue;
    const YAML::Node selector = d["spec"]["selector"];
    const std::string app =
        selector["matchLabels"]
            ? selector["matchLabels"]["app.kubernetes.io/name"].as<std::string>()
            : selector["app.kubernetes.io/name"].as<std::string>();
    if (kind == "Service") {
      for (const YAML::Node& p : d["spec"]["ports"]) {
        EXPECT_EQ(ports_of_app[app].count(p["targetPort"].as<std::string>()), 1u)
            << "Service " << d["metadata"]["name"] << " targets a port its pods lack";
      }
    }
    if (kind == "PodMonitor" || kind == "ServiceMonitor") {
      const YAML::Node endpoints =
          kind == "PodMonitor" ? d["spec"]["podMetricsEndpoints"] : d["spec"]["endpoints"];
      ASSERT_TRUE(endpoints && endpoints.size() > 0) << kind;
      for (const YAML::Node& e : endpoints) {
        EXPECT_EQ(ports_of_app[app].count(e["port"].as<std::string>()), 1u)
            << kind << " scrapes a port " << app << " lacks";
        // The job names deploy/prometheus's rules and dashboard select on.
        EXPECT_EQ(e["relabelings"][0]["replacement"].as<std::string>(""), app);
      }
    }
  }
}

TEST_F(DeployTest, ExampleConfigsPassCheckConfig) {
  for (const auto& [binary, config] : {std::pair{cached_, "deploy/config/cached.yaml"},
                                       std::pair{placement_, "deploy/config/placement.yaml"}}) {
    const auto [rc, out] = RunArgv({binary, "--config=" + LocalConfig(config), "--check-config"});
    EXPECT_EQ(rc, 0) << config << ":\n" << out;
    EXPECT_NE(out.find("configuration OK"), std::string::npos) << out;
  }
}

TEST_F(DeployTest, CheckConfigRefusesNamingTheSetting) {
  const auto [rc, out] = RunArgv({cached_, "--config=" + LocalConfig("deploy/config/cached.yaml"),
                                  "--host-page-bytes=3MiB", "--check-config"});
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--host-page-bytes"), std::string::npos) << out;
  // The NVMe tier's own limits are checked too (they used to fail only at start-up).
  const auto [nrc, nout] = RunArgv({cached_, "--config=" + LocalConfig("deploy/config/cached.yaml"),
                                    "--nvme-segment-bytes=8MiB", "--check-config"});
  EXPECT_EQ(nrc, 2) << nout;
  EXPECT_NE(nout.find("--nvme-segment-bytes"), std::string::npos) << nout;
  const auto [prc, pout] =
      RunArgv({placement_, "--config=" + LocalConfig("deploy/config/placement.yaml"),
               "--etcd-prefix=/no-slash", "--check-config"});
  EXPECT_EQ(prc, 2) << pout;
  EXPECT_NE(pout.find("--etcd-prefix"), std::string::npos) << pout;
}

TEST_F(DeployTest, SystemdUnitsVerify) {
  for (const auto& [unit, config] :
       {std::pair{std::string("kvfabric-cached.service"), std::string("cached.yaml")},
        std::pair{std::string("kvfabric-placement.service"), std::string("placement.yaml")}}) {
    SCOPED_TRACE(unit);
    std::string text = Read(Source("deploy/systemd/" + unit));
    ASSERT_FALSE(text.empty());
    for (const char* required :
         {"User=kvfabric", "ProtectSystem=strict", "NoNewPrivileges=yes", "PrivateTmp=yes",
          "StateDirectory=kvfabric", "/etc/kvfabric/", "--check-config"}) {
      EXPECT_NE(text.find(required), std::string::npos) << "no " << required;
    }
    if (unit == "kvfabric-cached.service") {
      EXPECT_NE(text.find("LimitMEMLOCK=infinity"), std::string::npos);
    }
    // The ExecStartPre check, as the unit runs it, with this tree's files.
    const std::string binary = BinaryFor(unit);
    const std::string conf = fs::absolute(LocalConfig("deploy/config/" + config)).string();
    const auto [rc, out] = RunArgv({binary, "--config=" + conf, "--check-config"});
    EXPECT_EQ(rc, 0) << out;
    if (access("/usr/bin/systemd-analyze", X_OK) != 0) {
      std::printf("systemd-analyze not found: %s checked by content only\n", unit.c_str());
      continue;
    }
    text =
        std::regex_replace(text, std::regex("/usr/bin/" + unit.substr(0, unit.find('.'))), binary);
    text = std::regex_replace(text, std::regex("/etc/kvfabric/" + config), conf);
    const std::string path = dir_ + "/" + unit;
    std::ofstream(path) << text;
    const auto [vrc, vout] = RunArgv({"/usr/bin/systemd-analyze", "verify", "--man=no", path});
    // Problems in this unit name it; other units of the machine may warn.
    EXPECT_EQ(vrc, 0) << vout;
    EXPECT_EQ(vout.find(unit + ":"), std::string::npos) << vout;
  }
}

TEST_F(DeployTest, ReadmeDeploymentExampleRuns) {
  const std::string readme = Read(Source("README.md"));
  const std::size_t section = readme.find("## Deploying for real");
  ASSERT_NE(section, std::string::npos);
  for (const std::string name : {"kvfabric-placement", "kvfabric-cached"}) {
    // The command: from its name to the end of its (backslash-continued) line.
    const std::size_t start = readme.find(name + " --", section);
    ASSERT_NE(start, std::string::npos) << "no " << name << " command in the README";
    std::size_t end = start;
    while ((end = readme.find('\n', end)) != std::string::npos && readme[end - 1] == '\\') ++end;
    std::string command = readme.substr(start, end - start);
    command = std::regex_replace(command, std::regex(R"(\\\n)"), " ");
    command = std::regex_replace(command, std::regex(R"(\$\(hostname\))"), "node-a");
    std::vector<std::string> argv = {BinaryFor(name)};
    std::istringstream words(command.substr(name.size()));
    for (std::string w; words >> w;) argv.push_back(Localize(w));
    argv.push_back("--check-config");
    const auto [rc, out] = RunArgv(argv);
    EXPECT_EQ(rc, 0) << command << "\n" << out;
  }
}

}  // namespace
}  // namespace kvfabric
