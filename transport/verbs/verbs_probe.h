// Which RDMA devices libibverbs sees on this machine (for `kvfabric version`
// and the transport's NIC discovery). Never fails: no devices is a result.
#ifndef KVFABRIC_TRANSPORT_VERBS_VERBS_PROBE_H_
#define KVFABRIC_TRANSPORT_VERBS_VERBS_PROBE_H_

#include <string>
#include <vector>

namespace kvfabric::verbs {

struct VerbsProbeResult {
  std::vector<std::string> devices;  // e.g. "mlx5_0"; empty without an RDMA NIC
};

VerbsProbeResult ProbeVerbs();

}  // namespace kvfabric::verbs

#endif  // KVFABRIC_TRANSPORT_VERBS_VERBS_PROBE_H_
