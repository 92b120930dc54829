// YAML configuration files for CLI11 applications.
//
// Every kvfabric binary reads its flags (CLI11) and, optionally, one YAML file once, in main,
// and passes plain Options structs down; library code never reads flags, files or the
// environment for configuration. YamlConfig is the CLI11 config formatter that makes every
// configurable flag settable from YAML:
//
//   CLI::App app{"kvfabric-cached"};
//   AddYamlConfigOption(&app);                        // --config FILE
//   AddBytesOption(app, "--host-pool-bytes", &opts.host_pool_bytes, "pinned host pool size");
//   AddLoggingFlags(app, &log_options);
//   bool dump = false;
//   app.add_flag("--dump-config", dump, "print the effective configuration as YAML and exit")
//       ->configurable(false);
//   try {
//     app.parse(argc, argv);
//   } catch (const CLI::ParseError& e) {                  // the one place CLI11's exceptions
//     return app.exit(e);                                 // are caught: they never leave main
//   }
//   if (dump) {
//     std::cout << app.config_to_str(/*default_also=*/true, /*write_description=*/true);
//     return 0;
//   }
//
// How YAML maps to flags:
//   - A key names an option by its long name without dashes: `host-pool-bytes: 64MiB` is
//     `--host-pool-bytes 64MiB`. A one-letter key may name a short option (`v: true` is -v),
//     and a key may name a positional argument by its name.
//   - Scalars (numbers, booleans, strings) are passed to CLI11 as the text written in the file
//     (`yes`, `0x10`, `1.5GiB` arrive as written; the option's own parser judges them).
//   - A sequence gives a multi-value option its values: `peers: [a:1, b:2]` is
//     `--peers a:1 --peers b:2`. Sequence elements must be scalars; an empty sequence, a null
//     value (`key:` with nothing after it) and a mapping inside a sequence are errors.
//   - Nesting. A key path is formed from nested mappings and from dots inside keys, so
//     `pool: {host-bytes: 1G}` and `pool.host-bytes: 1G` are the same path. The path is read
//     from the left: each leading segment that names a subcommand (at that level) selects it;
//     the remaining segments, joined with dots, name an option of the selected (sub)command.
//     So with a subcommand `bench` having `--iterations`, `bench: {iterations: 5}` sets it;
//     with no subcommand `pool`, the path above names the option `--pool.host-bytes`.
//     A subcommand section supplies that subcommand's options; it also invokes the subcommand
//     only if the subcommand was marked `configurable()` (CLI11's rule for INI files).
//   - Command-line flags override the file: an option given on the command line ignores its
//     value in the file (CLI11 fills an option from the file only when it is still empty).
//
// Errors (thrown as CLI::ConfigError, since CLI11 drives this class through exceptions; they
// name the file and the 1-based line):
//   - malformed YAML: "cached.yaml:3:7: malformed YAML: <parser message>";
//   - an unknown key: `cached.yaml:4: unknown key "host-pool-byts"` (unknown keys are always
//     rejected, whatever app.allow_config_extras() says: a typo must not silently fall back to
//     a default);
//   - a key naming an option that is not configurable (--config itself, --help);
//   - the same option set twice (also through two spellings of the same path);
//   - a top level that is not a mapping, or more than one YAML document.
// A value the option rejects (a bad size, a bad level) is reported by CLI11 as a
// CLI::ValidationError naming the option: "--host-pool-bytes: invalid byte size ...".
//
// Thread safety: used by CLI11 from the thread that parses; not for concurrent use.
#ifndef KVFABRIC_CORE_CONFIG_YAML_CONFIG_H_
#define KVFABRIC_CORE_CONFIG_YAML_CONFIG_H_

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <string>
#include <vector>

namespace kvfabric {

// CLI11's config formatter interface, reading and writing YAML. Holds a pointer to the root
// App it is installed on, because resolving a key (subcommand or dotted option name) and
// naming the file in error messages both need the App's definition.
class YamlConfig final : public CLI::Config {
 public:
  // REQUIRES: `app` is the root App this formatter is installed on and outlives it (the App
  // owns the formatter through a shared_ptr, so this holds when installed on `app` itself).
  explicit YamlConfig(const CLI::App* app) : app_(app) {}

  // Emits the options of `app` that have values (and, with `default_also`, those with
  // defaults) as a YAML mapping, subcommands as nested mappings, descriptions as comments
  // when `write_description`. The output read back through from_config sets the same values.
  // `prefix` is prepended to top-level keys (CLI11 passes "").
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;

  // Parses YAML from `input` into CLI11 config items as described in the file comment.
  // Throws CLI::ConfigError on any error listed there.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  // The configuration file name(s) as given to the App, for error messages.
  std::string SourceName() const;

  const CLI::App* app_;  // not owned
};

// Installs YAML configuration on `app`: a YamlConfig formatter, the option `option_name`
// (one file; not required; not itself settable from the file), and unknown-key rejection.
// Returns the option so that a binary may chain ->required(). (No ->envname(): binaries do not
// take configuration from the environment.)
// REQUIRES: `app` is a root App (configuration files are read by the root only).
CLI::Option* AddYamlConfigOption(
    CLI::App* app, const std::string& option_name = "--config",
    const std::string& description = "YAML configuration file; command-line flags override it");

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_CONFIG_YAML_CONFIG_H_
