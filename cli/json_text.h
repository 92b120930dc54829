// Text helpers of the CLI's output: JSON string escaping for --json (the
// commands build small objects by hand; nlohmann is used where documents are
// parsed), and the padding and fixed-point numbers of its tables.
#ifndef KVFABRIC_CLI_JSON_TEXT_H_
#define KVFABRIC_CLI_JSON_TEXT_H_

#include <cctype>
#include <cstdio>
#include <string>

namespace kvfabric::cli {

// `s` as the inside of a JSON string: quotes, backslashes and control
// characters escaped; other bytes (UTF-8 included) kept.
inline std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// `s` padded with spaces to `width`, then one space: a table column.
inline std::string Pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s + " ";
}

// `v` with `digits` digits after the point.
inline std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// A protobuf enum value's name as a label: `prefix` dropped, lower case
// ("BUS_PATH_NVME_TO_HOST", "BUS_PATH_" -> "nvme_to_host").
inline std::string EnumLabel(std::string name, const std::string& prefix) {
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_JSON_TEXT_H_
