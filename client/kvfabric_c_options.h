// kvf_options -> ClientOptions for the C API (client/kvfabric_c.cc): the
// checks that belong to the C layer and the conversion. Internal to
// libkvfabric's C API; engines use include/kvfabric/kvfabric.h.
#ifndef KVFABRIC_CLIENT_KVFABRIC_C_OPTIONS_H_
#define KVFABRIC_CLIENT_KVFABRIC_C_OPTIONS_H_

#include "client/kvfabric_client.h"
#include "core/status.h"
#include "kvfabric/kvfabric.h"

namespace kvfabric::client::capi {

// kvf_options -> ClientOptions, with the checks that belong to the C layer
// (null strings, the size stamp, the dtype code, the arena the C layer
// allocates) and the model's own validation, all before anything allocates.
// InvalidArgument naming the kvf_options field. The device is left unset
// (the C layer creates it from options->device_kind).
Status ToClientOptions(const kvf_options& o, ClientOptions* out);

}  // namespace kvfabric::client::capi

#endif  // KVFABRIC_CLIENT_KVFABRIC_C_OPTIONS_H_
