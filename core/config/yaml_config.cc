#include "core/config/yaml_config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kvfabric {

namespace {

// One leaf of the YAML tree: the key path (nesting and dots both split it) and its values.
struct RawEntry {
  std::vector<std::string> path;
  std::vector<std::string> inputs;
  int line = 0;  // 1-based line of the key
};

std::string Join(const std::vector<std::string>& parts, size_t begin, std::string_view sep) {
  std::string out;
  for (size_t i = begin; i < parts.size(); ++i) {
    if (i > begin) out += sep;
    out += parts[i];
  }
  return out;
}

int LineOf(const YAML::Node& node) { return std::max(node.Mark().line, 0) + 1; }

[[noreturn]] void Fail(const std::string& source, int line, const std::string& what) {
  throw CLI::ConfigError(source + ":" + std::to_string(line) + ": " + what);
}

// How much a configuration file may hold. YAML aliases make a small file
// describe an exponentially large (or, through an alias to an enclosing
// anchor, infinite) tree: "a: &a {x: 1, y: 1}", "b: &b {p: *a, q: *a}", ...
// doubles per line. Flatten walks the tree, so it counts what it visits and
// stops at these bounds (a fuzzer found the blow-up: RSS past 1 GiB, then
// no end).
constexpr std::size_t kMaxConfigDepth = 32;
constexpr std::size_t kMaxConfigValues = 65536;  // keys and list elements visited

// Counts documents; ignores their contents.
class DocumentCounter final : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// The first YAML document of `text` (null when there is none), and in
// *documents how many there are, counting at most 2. Not YAML::LoadAll:
// yaml-cpp 0.7's parser answers some malformed input with an endless run of
// empty documents, and LoadAll collects them until memory runs out (a fuzzer
// found "f-ig\n#\n!1111...\xff..."); counting stops at two.
YAML::Node FirstDocument(const std::string& text, int* documents) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  *documents = 0;
  while (*documents < 2 && parser.HandleNextDocument(counter)) ++*documents;
  return *documents == 0 ? YAML::Node() : YAML::Load(text);
}

// Appends every leaf under the mapping `map` (whose key path is `prefix`) to `out`;
// `visited` counts keys and list elements seen so far.
void Flatten(const YAML::Node& map, const std::vector<std::string>& prefix,
             const std::string& source, std::vector<RawEntry>* out, std::size_t* visited) {
  if (prefix.size() > kMaxConfigDepth) {
    Fail(source, LineOf(map),
         "nested deeper than " + std::to_string(kMaxConfigDepth) + " levels (an alias loop?)");
  }
  for (const auto& pair : map) {
    if (++*visited > kMaxConfigValues) {
      Fail(source, LineOf(map),
           "more than " + std::to_string(kMaxConfigValues) +
               " keys and list elements (aliases that multiply?)");
    }
    // Copies: a YAML::Node is a handle, and the iterator's pair is a temporary.
    const YAML::Node key = pair.first;
    const YAML::Node value = pair.second;
    if (!key.IsScalar()) Fail(source, LineOf(key), "a key must be a plain string");
    std::vector<std::string> path = prefix;
    const std::string& text = key.Scalar();
    size_t start = 0;
    while (true) {
      const size_t dot = text.find('.', start);
      const std::string segment = text.substr(start, dot == std::string::npos ? dot : dot - start);
      if (segment.empty()) {
        Fail(source, LineOf(key), "key \"" + text + "\" has an empty segment between dots");
      }
      path.push_back(segment);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    const std::string shown = Join(path, 0, ".");
    if (value.IsMap()) {
      Flatten(value, path, source, out, visited);
      continue;
    }
    RawEntry entry;
    entry.path = std::move(path);
    entry.line = LineOf(key);
    if (value.IsScalar()) {
      entry.inputs.push_back(value.Scalar());
    } else if (value.IsSequence()) {
      if (value.size() == 0) Fail(source, entry.line, "key \"" + shown + "\" has an empty list");
      for (const YAML::Node& element : value) {
        if (++*visited > kMaxConfigValues) {
          Fail(source, entry.line,
               "more than " + std::to_string(kMaxConfigValues) + " keys and list elements");
        }
        if (!element.IsScalar()) {
          Fail(source, LineOf(element),
               "the list under key \"" + shown + "\" may hold only plain values");
        }
        entry.inputs.push_back(element.Scalar());
      }
    } else {
      Fail(source, entry.line, "key \"" + shown + "\" has no value");
    }
    out->push_back(std::move(entry));
  }
}

const CLI::App* FindSubcommand(const CLI::App* app, const std::string& name) {
  try {
    return app->get_subcommand(name);
  } catch (const CLI::OptionNotFound&) {
    return nullptr;
  }
}

// The option CLI11 will find for config item name `name` in `app`, looked up exactly as
// CLI::App::_parse_single_config does: long name, then short name, then positional name.
const CLI::Option* FindOption(const CLI::App* app, const std::string& name) {
  const CLI::Option* op = app->get_option_no_throw("--" + name);
  if (op == nullptr && name.size() == 1) op = app->get_option_no_throw("-" + name);
  if (op == nullptr) op = app->get_option_no_throw(name);
  return op;
}

// ---- Emitting -----------------------------------------------------------------------------

struct OutNode {
  struct Entry {
    std::string key;
    std::string description;
    std::vector<std::string> values;  // when child is null
    std::unique_ptr<OutNode> child;
  };
  std::vector<Entry> entries;
};

// `value` as a YAML scalar that reads back as exactly `value` (plain when that works).
std::string YamlScalar(const std::string& value) {
  YAML::Emitter plain;
  plain << value;
  try {
    const YAML::Node back = YAML::Load(plain.c_str());
    if (back.IsScalar() && back.Scalar() == value) return plain.c_str();
  } catch (const YAML::Exception&) {
    // Fall through to double quotes.
  }
  YAML::Emitter quoted;
  quoted << YAML::DoubleQuoted << value;
  return quoted.c_str();
}

void Collect(const CLI::App* app, bool default_also, const std::string& prefix, OutNode* out) {
  for (const CLI::Option* opt : app->get_options()) {
    if (!opt->get_configurable()) continue;
    std::vector<std::string> values = opt->reduced_results();
    if (values.empty() && default_also) {
      if (!opt->get_default_str().empty()) {
        values = {opt->get_default_str()};
      } else if (opt->get_expected_min() == 0) {
        values = {"false"};  // a flag not given
      }
    }
    if (values.empty()) continue;
    OutNode::Entry entry;
    entry.key = prefix + opt->get_single_name();
    entry.description = opt->get_description();
    entry.values = std::move(values);
    out->entries.push_back(std::move(entry));
  }
  for (const CLI::App* sub : app->get_subcommands({})) {
    if (sub->get_name().empty()) {  // an option group: its options belong to `app`
      Collect(sub, default_also, prefix, out);
      continue;
    }
    auto child = std::make_unique<OutNode>();
    Collect(sub, default_also, "", child.get());
    if (child->entries.empty()) continue;
    OutNode::Entry entry;
    entry.key = prefix + sub->get_name();
    entry.description = sub->get_description();
    entry.child = std::move(child);
    out->entries.push_back(std::move(entry));
  }
}

void Emit(const OutNode& node, int depth, bool write_description, std::string* out) {
  const std::string indent(static_cast<size_t>(depth) * 2, ' ');
  for (const OutNode::Entry& e : node.entries) {
    if (write_description && !e.description.empty()) {
      std::istringstream lines(e.description);
      for (std::string line; std::getline(lines, line);) *out += indent + "# " + line + "\n";
    }
    *out += indent + YamlScalar(e.key) + ":";
    if (e.child != nullptr) {
      *out += "\n";
      Emit(*e.child, depth + 1, write_description, out);
    } else if (e.values.size() == 1) {
      *out += " " + YamlScalar(e.values[0]) + "\n";
    } else {
      *out += "\n";
      for (const std::string& v : e.values) *out += indent + "  - " + YamlScalar(v) + "\n";
    }
  }
}

}  // namespace

std::string YamlConfig::SourceName() const {
  const CLI::Option* opt = app_->get_config_ptr();
  std::vector<std::string> files;
  if (opt != nullptr) {
    try {
      files = opt->as<std::vector<std::string>>();
    } catch (const CLI::Error&) {
      files.clear();
    }
  }
  files.erase(std::remove(files.begin(), files.end(), std::string()), files.end());
  if (files.empty()) return "<configuration>";
  return Join(files, 0, " or ");
}

std::vector<CLI::ConfigItem> YamlConfig::from_config(std::istream& input) const {
  const std::string source = SourceName();
  std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
  YAML::Node document;
  int documents = 0;
  try {
    document = FirstDocument(text, &documents);
  } catch (const YAML::Exception& e) {
    throw CLI::ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg);
  }
  if (documents > 1) {
    // The second document's line is not known without building it: name the first's end.
    Fail(source, LineOf(document), "more than one YAML document (a second \"---\")");
  }
  std::vector<RawEntry> entries;
  if (documents == 1 && !document.IsNull()) {
    if (!document.IsMap()) {
      Fail(source, LineOf(document), "the top level must be a mapping of option names");
    }
    std::size_t visited = 0;
    Flatten(document, {}, source, &entries, &visited);
  }

  std::vector<CLI::ConfigItem> items;
  std::vector<std::vector<std::string>> opened;  // subcommand sections, in opening order
  std::map<const CLI::Option*, int> first_line;  // duplicate detection
  for (RawEntry& entry : entries) {
    // Leading segments that name subcommands select them; the rest names an option.
    const CLI::App* app = app_;
    std::vector<std::string> parents;
    size_t i = 0;
    for (; i + 1 < entry.path.size(); ++i) {
      const CLI::App* sub = FindSubcommand(app, entry.path[i]);
      if (sub == nullptr) break;
      app = sub;
      parents.push_back(entry.path[i]);
    }
    const std::string name = Join(entry.path, i, ".");
    const std::string shown = Join(entry.path, 0, ".");
    const CLI::Option* op = FindOption(app, name);
    if (op == nullptr) {
      std::string where = parents.empty() ? "" : " in subcommand \"" + Join(parents, 0, " ") + "\"";
      Fail(source, entry.line,
           "unknown key \"" + shown + "\" (no option --" + name + where + "; --help lists them)");
    }
    if (!op->get_configurable()) {
      Fail(source, entry.line,
           "key \"" + shown + "\": option " + op->get_name() +
               " cannot be set in a configuration file");
    }
    if (auto [it, inserted] = first_line.emplace(op, entry.line); !inserted) {
      Fail(source, entry.line,
           "key \"" + shown + "\" sets option " + op->get_name() + " again (first set on line " +
               std::to_string(it->second) + ")");
    }
    // Open each enclosing subcommand section once, before its first item, as CLI11's INI
    // reader does, so that a configurable() subcommand is invoked by its section.
    for (size_t depth = 1; depth <= parents.size(); ++depth) {
      std::vector<std::string> section(parents.begin(),
                                       parents.begin() + static_cast<std::ptrdiff_t>(depth));
      if (std::find(opened.begin(), opened.end(), section) != opened.end()) continue;
      CLI::ConfigItem open;
      open.parents = section;
      open.name = "++";
      items.push_back(std::move(open));
      opened.push_back(std::move(section));
    }
    CLI::ConfigItem item;
    item.parents = std::move(parents);
    item.name = name;
    item.inputs = std::move(entry.inputs);
    items.push_back(std::move(item));
  }
  // Close sections innermost first: a child section was always opened after its parent.
  for (auto it = opened.rbegin(); it != opened.rend(); ++it) {
    CLI::ConfigItem close;
    close.parents = *it;
    close.name = "--";
    items.push_back(std::move(close));
  }
  return items;
}

std::string YamlConfig::to_config(const CLI::App* app, bool default_also, bool write_description,
                                  std::string prefix) const {
  OutNode root;
  Collect(app, default_also, prefix, &root);
  std::string out;
  if (write_description && !app->get_description().empty()) {
    std::istringstream lines(app->get_description());
    for (std::string line; std::getline(lines, line);) out += "# " + line + "\n";
  }
  Emit(root, 0, write_description, &out);
  if (root.entries.empty()) out += "{}\n";  // an empty mapping, not an empty (null) document
  return out;
}

CLI::Option* AddYamlConfigOption(CLI::App* app, const std::string& option_name,
                                 const std::string& description) {
  app->config_formatter(std::make_shared<YamlConfig>(app));
  // YamlConfig rejects unknown keys itself (with file and line); this makes CLI11 agree should
  // a future formatter let one through.
  app->allow_config_extras(CLI::config_extras_mode::error);
  CLI::Option* opt = app->set_config(option_name, "", description);
  opt->type_name("FILE");
  return opt;
}

}  // namespace kvfabric
