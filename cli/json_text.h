// JSON string escaping for the CLI's --json output (the commands build small
// objects by hand; nlohmann is used where documents are parsed).
#ifndef KVFABRIC_CLI_JSON_TEXT_H_
#define KVFABRIC_CLI_JSON_TEXT_H_

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

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_JSON_TEXT_H_
