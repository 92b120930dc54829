#include "transport/ucx/ucx_probe.h"

#include <ucp/api/ucp.h>

#include "transport/ucx/ucx_status.h"

namespace kvfabric::ucx {

UcxProbeResult ProbeUcx() {
  UcxProbeResult r;
  r.version = ucp_get_version_string();
  ucp_config_t* config = nullptr;
  // The probe takes UCX's defaults; the transport proper sets every key it
  // relies on from Options through ucp_config_modify.
  r.status = StatusFromUcs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  if (!r.status.ok()) return r;
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  r.status = StatusFromUcs(ucp_init(&params, config, &context), "ucp_init");
  ucp_config_release(config);
  if (context != nullptr) ucp_cleanup(context);
  return r;
}

}  // namespace kvfabric::ucx
