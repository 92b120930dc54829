#include "transport/verbs/verbs_probe.h"

#include <infiniband/verbs.h>

namespace kvfabric::verbs {

VerbsProbeResult ProbeVerbs() {
  VerbsProbeResult r;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return r;  // no verbs providers at all
  for (int i = 0; i < n; ++i) r.devices.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return r;
}

}  // namespace kvfabric::verbs
