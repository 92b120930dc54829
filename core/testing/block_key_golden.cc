#include "core/testing/block_key_golden.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>
#include <system_error>

namespace kvfabric::testing {
namespace {

int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Undoes the doc's %XX escapes (any byte may be escaped; '%' always is).
StatusOr<std::string> PercentDecode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) {
      return Status::InvalidArgument("truncated %-escape in \"" + std::string(s) + "\"");
    }
    int hi = Nibble(s[i + 1]), lo = Nibble(s[i + 2]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument("bad %-escape in \"" + std::string(s) + "\"");
    }
    out.push_back(static_cast<char>(hi << 4 | lo));
    i += 2;
  }
  return out;
}

StatusOr<std::uint32_t> ParseU32(std::string_view s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string_view::npos) {
    return Status::InvalidArgument("not a u32: \"" + std::string(s) + "\"");
  }
  std::uint64_t v = std::stoull(std::string(s));
  if (v > 0xffffffffu) return Status::InvalidArgument("u32 out of range: " + std::string(s));
  return static_cast<std::uint32_t>(v);
}

// Splits "k=v" fields; a key may repeat (extra=...), so the result is a multimap.
StatusOr<std::multimap<std::string, std::string>> ParseFields(std::istringstream& in) {
  std::multimap<std::string, std::string> fields;
  std::string word;
  while (in >> word) {
    std::size_t eq = word.find('=');
    if (eq == std::string::npos) return Status::InvalidArgument("field without '=': " + word);
    KVF_ASSIGN_OR_RETURN(std::string value, PercentDecode(word.substr(eq + 1)));
    fields.emplace(word.substr(0, eq), std::move(value));
  }
  return fields;
}

StatusOr<std::string> One(const std::multimap<std::string, std::string>& fields,
                          const std::string& key) {
  if (fields.count(key) != 1) {
    return Status::InvalidArgument("expected exactly one " + key + "=, found " +
                                   std::to_string(fields.count(key)));
  }
  return fields.find(key)->second;
}

StatusOr<std::uint32_t> OneU32(const std::multimap<std::string, std::string>& fields,
                               const std::string& key) {
  KVF_ASSIGN_OR_RETURN(std::string v, One(fields, key));
  return ParseU32(v);
}

StatusOr<std::vector<float>> ParseFloats(std::string_view list) {
  std::vector<float> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = list.find(',', pos);
    const std::string_view text =
        list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    float v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      return Status::InvalidArgument("not a float: \"" + std::string(text) + "\"");
    }
    out.push_back(v);
    if (comma == std::string_view::npos) return out;
    pos = comma + 1;
  }
}

// 64 hex characters (parsed here, not by BlockKey::FromHex, so that the fuzz
// target links without block_key.cc).
StatusOr<FingerprintDigest> ParseDigest(const std::string& hex) {
  FingerprintDigest d{};
  if (hex.size() != 2 * d.size()) {
    return Status::InvalidArgument("a digest is 64 hex characters, got " +
                                   std::to_string(hex.size()));
  }
  for (std::size_t i = 0; i < d.size(); ++i) {
    const int hi = Nibble(hex[2 * i]), lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("not hex: \"" + hex + "\"");
    d[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return d;
}

Status ParseRecord(const std::string& line, bool v2, Golden& g) {
  std::istringstream in(line);
  std::string kind, name;
  in >> kind >> name;
  if (name.empty()) return Status::InvalidArgument("record without a name");
  KVF_ASSIGN_OR_RETURN(auto fields, ParseFields(in));
  if (kind == "fingerprint") {
    ModelFingerprint fp;
    KVF_ASSIGN_OR_RETURN(fp.model_id, One(fields, "model"));
    KVF_ASSIGN_OR_RETURN(fp.first_layer, OneU32(fields, "first_layer"));
    KVF_ASSIGN_OR_RETURN(fp.layer_count, OneU32(fields, "layer_count"));
    KVF_ASSIGN_OR_RETURN(std::string dtype, One(fields, "dtype"));
    KVF_ASSIGN_OR_RETURN(fp.dtype, ParseKvDtype(dtype));
    KVF_ASSIGN_OR_RETURN(fp.kv_heads, OneU32(fields, "kv_heads"));
    KVF_ASSIGN_OR_RETURN(fp.head_dim, OneU32(fields, "head_dim"));
    KVF_ASSIGN_OR_RETURN(fp.tokens_per_block, OneU32(fields, "tokens_per_block"));
    KVF_ASSIGN_OR_RETURN(fp.tp_rank, OneU32(fields, "tp_rank"));
    KVF_ASSIGN_OR_RETURN(fp.tp_size, OneU32(fields, "tp_size"));
    KVF_ASSIGN_OR_RETURN(fp.layout_version, OneU32(fields, "layout_version"));
    fp.key_version = v2 ? kBlockKeyVersion2 : kBlockKeyVersion1;
    if (v2) {
      KVF_ASSIGN_OR_RETURN(fp.weights_revision, One(fields, "weights_revision"));
      KVF_ASSIGN_OR_RETURN(fp.quantization, One(fields, "quantization"));
      KVF_ASSIGN_OR_RETURN(fp.kv_scale_scheme, One(fields, "kv_scale_scheme"));
      KVF_ASSIGN_OR_RETURN(std::string digest, One(fields, "kv_scales_digest"));
      KVF_ASSIGN_OR_RETURN(fp.kv_scales_digest, ParseDigest(digest));
      KVF_ASSIGN_OR_RETURN(fp.rope, One(fields, "rope"));
      KVF_ASSIGN_OR_RETURN(fp.v_head_dim, OneU32(fields, "v_head_dim"));
      KVF_ASSIGN_OR_RETURN(fp.vocab_size, OneU32(fields, "vocab_size"));
    }
    if (fields.size() != (v2 ? 17u : 10u)) return Status::InvalidArgument("unexpected fields");
    if (!g.fingerprints.emplace(name, fp).second) return Status::InvalidArgument("duplicate");
  } else if (kind == "scales" && v2) {
    GoldenScales sc;
    sc.name = name;
    KVF_ASSIGN_OR_RETURN(sc.layers, OneU32(fields, "layers"));
    KVF_ASSIGN_OR_RETURN(std::string k, One(fields, "k"));
    KVF_ASSIGN_OR_RETURN(sc.k, ParseFloats(k));
    KVF_ASSIGN_OR_RETURN(std::string v, One(fields, "v"));
    KVF_ASSIGN_OR_RETURN(sc.v, ParseFloats(v));
    KVF_ASSIGN_OR_RETURN(sc.sha256_hex, One(fields, "sha256"));
    if (fields.size() != 4) return Status::InvalidArgument("unexpected fields");
    g.scales.push_back(std::move(sc));
  } else if (kind == "digest") {
    KVF_ASSIGN_OR_RETURN(std::string hex, One(fields, "sha256"));
    g.digests.emplace_back(name, hex);
  } else if (kind == "input") {
    GoldenInput in_rec;
    KVF_ASSIGN_OR_RETURN(in_rec.ns, One(fields, "ns"));
    KVF_ASSIGN_OR_RETURN(in_rec.fp_name, One(fields, "fp"));
    KVF_ASSIGN_OR_RETURN(in_rec.parent, One(fields, "parent"));
    KVF_ASSIGN_OR_RETURN(std::string tokens, One(fields, "tokens"));
    std::istringstream ts(tokens);
    for (std::string t; std::getline(ts, t, ',');) {
      KVF_ASSIGN_OR_RETURN(std::uint32_t v, ParseU32(t));
      in_rec.tokens.push_back(v);
    }
    auto [lo, hi] = fields.equal_range("extra");  // multimap keeps insertion order
    for (auto it = lo; it != hi; ++it) in_rec.extra.push_back(it->second);
    if (fields.size() != 4 + in_rec.extra.size()) {
      return Status::InvalidArgument("unexpected fields");
    }
    if (!g.inputs.emplace(name, std::move(in_rec)).second) {
      return Status::InvalidArgument("duplicate");
    }
  } else if (kind == "vector") {
    KVF_ASSIGN_OR_RETURN(std::string hex, One(fields, "key"));
    if (g.inputs.count(name) == 0) {
      return Status::InvalidArgument("vector has no preceding input line");
    }
    g.vectors.emplace_back(name, hex);
  } else {
    return Status::InvalidArgument("unknown record kind \"" + kind + "\"");
  }
  return Status::OK();
}

}  // namespace

StatusOr<Golden> ParseGolden(std::istream& doc, const std::string& origin,
                             const std::string& block) {
  const bool v2 = block == kGoldenBlockV2;
  if (!v2 && block != kGoldenBlockV1) {
    return Status::InvalidArgument("unknown golden block \"" + block + "\"");
  }
  const std::string fence = "```" + block;
  Golden g;
  bool in_block = false, seen_block = false;
  int line_no = 0;
  for (std::string line; std::getline(doc, line);) {
    ++line_no;
    if (!in_block) {
      if (line == fence) in_block = seen_block = true;
      continue;
    }
    if (line == "```") {
      in_block = false;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    Status s = ParseRecord(line, v2, g);
    if (!s.ok()) return s.WithContext(origin + ":" + std::to_string(line_no));
  }
  if (!seen_block) return Status::NotFound("no " + fence + " block in " + origin);
  return g;
}

StatusOr<GoldenChain> ChainOf(const Golden& golden, const std::string& name) {
  std::vector<const GoldenInput*> chain;  // root first
  for (std::string at = name; at != "root";) {
    auto it = golden.inputs.find(at);
    if (it == golden.inputs.end() || chain.size() > golden.inputs.size()) {
      return Status::InvalidArgument("vector " + name + ": no input " + at + " on its chain");
    }
    chain.insert(chain.begin(), &it->second);
    at = it->second.parent;
  }
  if (chain.empty()) return Status::InvalidArgument("no vector named root");
  GoldenChain out{chain[0]->ns, chain[0]->fp_name, {}, {}};
  for (const GoldenInput* in : chain) {
    if (in->ns != out.ns || in->fp_name != out.fp_name) {
      return Status::InvalidArgument("vector " + name +
                                     ": its chain mixes namespaces or fingerprints");
    }
    out.tokens.insert(out.tokens.end(), in->tokens.begin(), in->tokens.end());
    out.extra.push_back(in->extra);
  }
  return out;
}

ModelFingerprint GoldenLlama8bV2() {
  ModelFingerprint fp;
  fp.model_id = "meta-llama/Llama-3.1-8B-Instruct";
  fp.layer_count = 32;
  fp.dtype = KvDtype::kBf16;
  fp.kv_heads = 8;
  fp.head_dim = 128;
  fp.tokens_per_block = 16;
  fp.weights_revision = "0e9e39f249a16976918f6564b8830bc894c89659";
  fp.rope =
      "factor=8;high_freq_factor=4;low_freq_factor=1;original_max_position_embeddings=8192;"
      "scaling=llama3;theta=500000";
  fp.vocab_size = 128256;
  return fp;
}

StatusOr<Golden> LoadGoldenFromDoc(const std::string& block) {
  namespace fs = std::filesystem;
  fs::path path;
  // Tests may read the environment (library code may not).
  const char* root = std::getenv("KVF_SOURCE_ROOT");  // NOLINT(concurrency-mt-unsafe)
  if (root != nullptr && *root != '\0') {
    path = fs::path(root) / "docs" / "block-key.md";
  } else {
    std::error_code ec;
    for (fs::path dir = fs::current_path(ec); !ec && !dir.empty(); dir = dir.parent_path()) {
      if (fs::exists(dir / "docs" / "block-key.md", ec)) {
        path = dir / "docs" / "block-key.md";
        break;
      }
      if (dir == dir.parent_path()) break;
    }
  }
  if (path.empty()) {
    return Status::NotFound(
        "docs/block-key.md not found above the current directory; set KVF_SOURCE_ROOT to the "
        "repository root");
  }
  std::ifstream file(path);
  if (!file) return Status::NotFound("cannot open " + path.string());
  std::cout << "golden vectors (" << block << ") from " << path << "\n";
  return ParseGolden(file, path.string(), block);
}

}  // namespace kvfabric::testing
