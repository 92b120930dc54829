#include "security/tenant_policy.h"

#include <openssl/crypto.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/sha256.h"
#include "core/units.h"

namespace kvfabric {
namespace {

constexpr std::size_t kMaxNamespaceBytes = 256;
constexpr std::size_t kMaxTenants = 4096;
constexpr std::size_t kMaxTokenBytes = 4096;

std::string Trim(std::string s) {
  const std::size_t last = s.find_last_not_of(" \t\r\n");
  s.resize(last == std::string::npos ? 0 : last + 1);
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  return s;
}

Status Bad(const std::string& origin, const YAML::Node& node, const std::string& what) {
  return Status::InvalidArgument(origin + ":" + std::to_string(node.Mark().line + 1) + ": " + what);
}

Status ReadStrings(const std::string& origin, const YAML::Node& node, const std::string& key,
                   std::vector<std::string>* out, bool allow_empty = false) {
  if (!node.IsSequence()) return Bad(origin, node, key + ": expected a list of strings");
  for (const YAML::Node& item : node) {
    if (!item.IsScalar() || (item.Scalar().empty() && !allow_empty)) {
      return Bad(origin, item, key + ": expected a non-empty string");
    }
    out->push_back(item.Scalar());
  }
  return Status::OK();
}

Status ReadBool(const std::string& origin, const YAML::Node& node, const std::string& key,
                bool* out) {
  if (!node.IsScalar()) return Bad(origin, node, key + ": expected true or false");
  const std::string& v = node.Scalar();
  if (v == "true") {
    *out = true;
  } else if (v == "false") {
    *out = false;
  } else {
    return Bad(origin, node, key + ": expected true or false, got \"" + v + "\"");
  }
  return Status::OK();
}

bool DigestEquals(const std::array<std::uint8_t, 32>& a, const std::array<std::uint8_t, 32>& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

std::string PeerIdentity::Describe() const {
  if (!names.empty()) return "certificate " + names.front();
  if (!token.empty() && secure) return "a bearer token";
  return secure ? "a TLS peer without a certificate or token" : "a plaintext peer";
}

bool TenantSpec::HoldsNamespace(std::string_view ns) const {
  for (const std::string& n : namespaces) {
    if (n == "*" || n == ns) return true;
  }
  return false;
}

std::shared_ptr<const TenantPolicy> TenantPolicy::Open() {
  auto p = std::make_shared<TenantPolicy>();
  p->open_ = true;
  p->default_tenant_.name = "default";
  p->default_tenant_.namespaces = {"*"};
  p->default_tenant_.daemon = true;
  return p;
}

StatusOr<std::shared_ptr<const TenantPolicy>> TenantPolicy::LoadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument("--tenants-file: cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  return Parse(ss.str(), dir, path);
}

StatusOr<std::shared_ptr<const TenantPolicy>> TenantPolicy::Parse(std::string_view yaml,
                                                                  const std::string& base_dir,
                                                                  const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(origin + ":" + std::to_string(e.mark.line + 1) +
                                   ": malformed YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::InvalidArgument(origin + ": expected a mapping `tenants:`");
  for (const auto& kv : root) {
    if (kv.first.Scalar() != "tenants") {
      return Bad(origin, kv.first, "unknown key \"" + kv.first.Scalar() + "\" (expected tenants)");
    }
  }
  const YAML::Node list = root["tenants"];
  if (!list || !list.IsSequence() || list.size() == 0) {
    return Status::InvalidArgument(origin + ": `tenants:` must be a non-empty list");
  }
  if (list.size() > kMaxTenants) {
    return Status::InvalidArgument(origin + ": " + std::to_string(list.size()) +
                                   " tenants > the limit " + std::to_string(kMaxTenants));
  }
  auto policy = std::make_shared<TenantPolicy>();
  std::set<std::string> names;
  std::set<std::string> identities;
  std::set<std::string> namespaces;
  for (const YAML::Node& t : list) {
    if (!t.IsMap()) return Bad(origin, t, "each tenant is a mapping with a name");
    TenantSpec spec;
    std::vector<std::string> token_files;
    for (const auto& kv : t) {
      const std::string key = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      Status s;
      if (key == "name") {
        if (!v.IsScalar() || v.Scalar().empty()) return Bad(origin, v, "name: expected a string");
        spec.name = v.Scalar();
      } else if (key == "identities") {
        s = ReadStrings(origin, v, key, &spec.identities);
      } else if (key == "token-files") {
        s = ReadStrings(origin, v, key, &token_files);
      } else if (key == "namespaces") {
        // "" is the default namespace, which clients use when they name none.
        s = ReadStrings(origin, v, key, &spec.namespaces, /*allow_empty=*/true);
        for (const std::string& n : spec.namespaces) {
          if (n.size() > kMaxNamespaceBytes) {
            return Bad(origin, v,
                       "namespaces: \"" + n.substr(0, 32) + "...\" is longer than " +
                           std::to_string(kMaxNamespaceBytes) + " bytes");
          }
        }
      } else if (key == "quota") {
        if (!v.IsScalar()) return Bad(origin, v, "quota: expected a size such as 64GiB");
        StatusOr<std::uint64_t> q = ParseBytes(v.Scalar());
        if (!q.ok()) return Bad(origin, v, "quota: " + std::string(q.status().message()));
        spec.quota_bytes = *q;
      } else if (key == "admin") {
        s = ReadBool(origin, v, key, &spec.admin);
      } else if (key == "daemon") {
        s = ReadBool(origin, v, key, &spec.daemon);
      } else {
        return Bad(origin, kv.first,
                   "unknown key \"" + key +
                       "\" (expected name, identities, token-files, namespaces, quota, admin, "
                       "daemon)");
      }
      if (!s.ok()) return s;
    }
    if (spec.name.empty()) return Bad(origin, t, "a tenant without a name");
    if (!names.insert(spec.name).second) {
      return Bad(origin, t, "tenant \"" + spec.name + "\" is named twice");
    }
    if (spec.identities.empty() && token_files.empty()) {
      return Bad(origin, t,
                 "tenant \"" + spec.name +
                     "\" has neither identities nor token-files: nobody could authenticate as it");
    }
    for (const std::string& n : spec.namespaces) {
      if (n != "*" && !namespaces.insert(n).second) {
        return Bad(origin, t, "namespace \"" + n + "\" belongs to two tenants");
      }
    }
    for (const std::string& id : spec.identities) {
      if (!identities.insert(id).second) {
        return Bad(origin, t, "identity \"" + id + "\" belongs to two tenants");
      }
    }
    for (const std::string& f : token_files) {
      const std::string path = f.front() == '/' ? f : base_dir + "/" + f;
      std::ifstream in(path, std::ios::binary);
      if (!in)
        return Bad(origin, t, "tenant \"" + spec.name + "\": cannot read token file " + path);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string token = Trim(ss.str());
      if (token.empty() || token.size() > kMaxTokenBytes) {
        return Bad(origin, t,
                   "tenant \"" + spec.name + "\": token file " + path +
                       " is empty or longer than 4096 bytes");
      }
      StatusOr<Sha256Digest> d = Sha256Of(token);
      if (!d.ok()) return d.status();
      for (const TenantSpec& other : policy->tenants_) {
        for (const auto& od : other.token_digests) {
          if (DigestEquals(od, *d)) {
            return Bad(origin, t,
                       "tenant \"" + spec.name + "\": its token " + path + " is also tenant \"" +
                           other.name + "\"'s");
          }
        }
      }
      spec.token_digests.push_back(*d);
    }
    policy->tenants_.push_back(std::move(spec));
  }
  return std::shared_ptr<const TenantPolicy>(std::move(policy));
}

const TenantSpec* TenantPolicy::Resolve(const PeerIdentity& peer) const {
  if (open_) return &default_tenant_;
  // A token counts only over TLS: on plaintext anyone on the path could
  // replay it.
  if (peer.secure && !peer.token.empty() && peer.token.size() <= kMaxTokenBytes) {
    StatusOr<Sha256Digest> d = Sha256Of(peer.token);
    if (d.ok()) {
      // Every digest is compared, so the time taken does not say which
      // tenant (or how many) were tried.
      const TenantSpec* found = nullptr;
      for (const TenantSpec& t : tenants_) {
        for (const auto& td : t.token_digests) {
          if (DigestEquals(td, *d) && found == nullptr) found = &t;
        }
      }
      if (found != nullptr) return found;
    }
  }
  for (const std::string& name : peer.names) {
    for (const TenantSpec& t : tenants_) {
      for (const std::string& id : t.identities) {
        if (id == name) return &t;
      }
    }
  }
  return nullptr;
}

std::vector<std::pair<std::string, std::uint64_t>> TenantPolicy::NamespaceQuotas() const {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  for (const TenantSpec& t : tenants_) {
    if (t.quota_bytes == 0) continue;
    for (const std::string& n : t.namespaces) {
      if (n != "*") out.emplace_back(n, t.quota_bytes);
    }
  }
  return out;
}

std::string TenantPolicy::Summary() const {
  if (open_) return "open: one default tenant with every namespace (no --tenants-file)";
  std::string out =
      std::to_string(tenants_.size()) + " tenant" + (tenants_.size() == 1 ? "" : "s") + " (";
  for (std::size_t i = 0; i < tenants_.size(); ++i) {
    const TenantSpec& t = tenants_[i];
    if (i > 0) out += "; ";
    out += t.name + ":";
    if (!t.namespaces.empty()) out += " " + std::to_string(t.namespaces.size()) + " namespaces";
    if (t.admin) out += " admin";
    if (t.daemon) out += " daemon";
  }
  return out + ")";
}

}  // namespace kvfabric
