// What cross-process tests observe of a daemon from outside (Linux /proc),
// and a raw TCP dial for attackers that bypass the client library.
//
// Thread safety: plain functions.
#ifndef KVFABRIC_TESTS_DAEMON_PROBE_H_
#define KVFABRIC_TESTS_DAEMON_PROBE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace kvfabric::testing {

// Resident set size of `pid` in bytes (VmRSS), 0 if unknown.
std::uint64_t RssBytes(pid_t pid);
// CPU seconds (user + system) `pid` has used.
double CpuSeconds(pid_t pid);
// Open file descriptors of `pid`.
int OpenFds(pid_t pid);
// A connected TCP socket to "host:port", or -1.
int Dial(const std::string& address);

}  // namespace kvfabric::testing

#endif  // KVFABRIC_TESTS_DAEMON_PROBE_H_
