// UCX's own messages through the process's logger, and the configured UCX
// transport list checked against what UCX finds on this machine.
//
// UCX prints its warnings with its own logger to stdout by default; a daemon
// whose stdout is a pipe or a file buffers them until exit, so an operator
// who wrote --ucx-tls=rc,ud,sm,self,tcp on a machine without RDMA saw
// "transports 'rc','ud' are not available" only when the daemon stopped.
// RouteUcxLogs installs a UCX log handler (ucs_log_push_handler) that passes
// every message UCX would print, as one line "ucx: <message> (<file>:<line>)",
// to a sink: the process's spdlog default logger unless a sink was given
// (libkvfabric gives its own logger, client/client_log.h).
//
// CheckUcxTransports asks UCX's transport layer (uct) which transports this
// machine has and reports the names in a transport list that match none of
// them, resolving UCX's aliases (sm, shm, mm, ib, rc, ud, dc, cuda, rocm...).
// UcxCore calls both before ucp_init and logs one warning naming what is
// missing; UCX's own "are not available" warning is then logged at debug
// level only, so that the operator reads the fact once.
//
// Thread safety: all functions may be called from any thread.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_LOG_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_LOG_H_

#include <spdlog/common.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/statusor.h"

namespace kvfabric::ucx {

// Receives one UCX message: its level and the line, without a newline.
using UcxLogSink = std::function<void(spdlog::level::level_enum level, std::string_view line)>;

// Installs the handler once per process (later calls only change the sink).
// An empty `sink` keeps the one set before, or spdlog's default logger if none
// was. The sink is called on whichever thread UCX logs from; it must not call
// into UCX.
void RouteUcxLogs(UcxLogSink sink = {});

// Writes `line` at `level` to the sink RouteUcxLogs set (spdlog's default
// logger if none): for messages about UCX that kvfabric itself composes.
void LogUcx(spdlog::level::level_enum level, std::string_view line);

struct UcxTransportCheck {
  // Transport names this machine has (uct's tl names, e.g. "posix", "sysv",
  // "cma", "self", "tcp", "rc_verbs"), sorted, without duplicates.
  std::vector<std::string> available;
  // Items of the list that match no available transport, in list order.
  std::vector<std::string> missing;
  // Items that match one: what UCX will use (if the list is not "^...").
  std::vector<std::string> usable;
};

// The transports uct reports on this machine (every component's memory
// domains, their transport resources). An error if uct cannot be queried.
StatusOr<std::vector<std::string>> AvailableUcxTransports();

// Which items of `tls` (UCX's TLS syntax: comma-separated names, "all", or
// "^a,b" to exclude) match none of `available`. Pure; exposed for tests. An
// exclusion list and "all" miss nothing.
UcxTransportCheck CheckUcxTransportList(const std::string& tls,
                                        const std::vector<std::string>& available);

// Both of the above for this machine.
StatusOr<UcxTransportCheck> CheckUcxTransports(const std::string& tls);

// One warning line for a check with missing items, naming them, what this
// machine has and `setting` (the flag or option the list came from); empty
// when nothing is missing.
std::string UcxTransportWarning(const UcxTransportCheck& check, const std::string& tls,
                                const std::string& setting);

// Checks `tls` on this machine and logs UcxTransportWarning through LogUcx,
// once per process for each distinct list (a transport with several UCP
// contexts, one per worker, warns once). Returns the check, or uct's error
// (logged at debug level: UCX's own initialisation reports it better).
StatusOr<UcxTransportCheck> WarnAboutMissingUcxTransports(const std::string& tls,
                                                          const std::string& setting);

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_LOG_H_
