// CLI11 options for byte sizes and durations written with units ("64MiB", "250ms").
//
// The option keeps the text as written (so --dump-config prints "64MiB", not 67108864), checks
// it with ParseBytes / ParseDuration when it is parsed, from the command line or from YAML,
// and stores the parsed value in the caller's Options field. A value that does not parse is a
// CLI::ValidationError that names the option and quotes the text:
//   --host-pool-bytes: invalid byte size "64QB": unknown unit "QB" (expected ...)
// The default shown in --help and written by app.config_to_str(/*default_also=*/true) is the
// field's value when the option is added, formatted with FormatBytes / FormatDuration. An
// option that is not given leaves the field untouched.
//
// Thread safety: like CLI11, use from the thread that builds and parses the App.
#ifndef KVFABRIC_CORE_CONFIG_UNIT_FLAGS_H_
#define KVFABRIC_CORE_CONFIG_UNIT_FLAGS_H_

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <string>

namespace kvfabric {

// Adds option `name` (CLI11 syntax, e.g. "--host-pool-bytes") that sets `*bytes`.
// REQUIRES: `bytes` outlives parsing.
CLI::Option* AddBytesOption(CLI::App& app, const std::string& name, std::uint64_t* bytes,
                            const std::string& description);

// Adds option `name` that sets `*duration`.
// REQUIRES: `duration` outlives parsing.
CLI::Option* AddDurationOption(CLI::App& app, const std::string& name,
                               std::chrono::microseconds* duration, const std::string& description);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_CONFIG_UNIT_FLAGS_H_
