// What UCX offers on this machine, asked at run time (for `kvfabric version`).
//
// ProbeUcx() creates and destroys one UCP context with the features the
// transport uses (tag, RMA, active messages); it never fails: a context that
// cannot be created is reported in `status`.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_PROBE_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_PROBE_H_

#include <string>

#include "core/status.h"

namespace kvfabric::ucx {

struct UcxProbeResult {
  std::string version;  // the library loaded at run time, e.g. "1.13.1"
  Status status;        // whether a context with RMA + AM could be created
};

UcxProbeResult ProbeUcx();

}  // namespace kvfabric::ucx

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_PROBE_H_
