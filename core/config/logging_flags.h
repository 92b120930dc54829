// Command-line (and YAML) flags for LogOptions.
//
//   --log-level LEVEL   trace, debug, info, warn, error or off (default: the field's value)
//   --log-file PATH     append to PATH instead of stderr
//   --log-json          one JSON object per line
//
// An unknown level is rejected while parsing, as a CLI::ValidationError that names the option
// and lists the valid levels; so is a bad `log-level:` in the YAML file.
//
// Thread safety: like CLI11, use from the thread that builds and parses the App.
#ifndef KVFABRIC_CORE_CONFIG_LOGGING_FLAGS_H_
#define KVFABRIC_CORE_CONFIG_LOGGING_FLAGS_H_

#include <CLI/CLI.hpp>

#include "core/logging.h"

namespace kvfabric {

// Adds the flags above to `app`, in the help group "Logging", writing into `*options`. The
// current contents of `*options` are the defaults.
// REQUIRES: `options` outlives parsing.
void AddLoggingFlags(CLI::App& app, LogOptions* options);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_CONFIG_LOGGING_FLAGS_H_
