// What this kvfabric build is and which optional parts it carries, for
// `kvfabric version` and the daemons' start-up line.
//
// Each optional part (CUDA, UCX, verbs, io_uring, Level Zero) is either not
// built (its toolkit was missing when the binary was built) or built, in which
// case it is probed at run time: a part can be built and still unusable on
// this machine (CUDA without a GPU), and the probe says why.
#ifndef KVFABRIC_CLI_VERSION_INFO_H_
#define KVFABRIC_CLI_VERSION_INFO_H_

#include <string>
#include <vector>

namespace kvfabric::cli {

struct PartInfo {
  std::string name;     // "CUDA", "UCX", "verbs", "io_uring", "Level Zero"
  bool built = false;   // compiled into this binary
  bool usable = false;  // the run-time probe succeeded
  std::string detail;   // versions and devices, or why it is not usable / not built
};

struct VersionInfo {
  std::string version;   // kvfabric's version (the VERSION file)
  std::string compiler;  // e.g. "GCC 12.2.0"
  std::string cxx_standard;
  std::vector<PartInfo> parts;
};

// Probes every optional part this binary was built with. Never fails.
VersionInfo CollectVersionInfo();

// Human-readable table, one line per part.
std::string FormatVersionText(const VersionInfo& info);

// {"version": ..., "compiler": ..., "parts": [{"name", "built", "usable", "detail"}]}
std::string FormatVersionJson(const VersionInfo& info);

}  // namespace kvfabric::cli

#endif  // KVFABRIC_CLI_VERSION_INFO_H_
