#include "core/testing/block_key_golden.h"

#include <sstream>
#include <string_view>

namespace kvfabric::testing {
namespace {

// Undoes the doc's %XX escapes (any byte may be escaped; '%' always is).
StatusOr<std::string> PercentDecode(std::string_view s) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) {
      return Status::InvalidArgument("truncated %-escape in \"" + std::string(s) + "\"");
    }
    int hi = nibble(s[i + 1]), lo = nibble(s[i + 2]);
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

Status ParseRecord(const std::string& line, Golden& g) {
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
    if (fields.size() != 10) return Status::InvalidArgument("unexpected fields");
    if (!g.fingerprints.emplace(name, fp).second) return Status::InvalidArgument("duplicate");
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

StatusOr<Golden> ParseGolden(std::istream& doc, const std::string& origin) {
  Golden g;
  bool in_block = false, seen_block = false;
  int line_no = 0;
  for (std::string line; std::getline(doc, line);) {
    ++line_no;
    if (!in_block) {
      if (line == "```kvfabric-golden") in_block = seen_block = true;
      continue;
    }
    if (line == "```") {
      in_block = false;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    Status s = ParseRecord(line, g);
    if (!s.ok()) return s.WithContext(origin + ":" + std::to_string(line_no));
  }
  if (!seen_block) return Status::NotFound("no ```kvfabric-golden block in " + origin);
  return g;
}

}  // namespace kvfabric::testing
