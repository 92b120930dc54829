// Core model types to their kvfabric.v1 wire form, shared by the services
// (server/) and the client library (client/). The reverse direction, which
// validates what arrives, lives with the services (server/cache_host_convert.h).
//
// Thread safety: pure functions.
#ifndef KVFABRIC_PROTO_MODEL_PROTO_H_
#define KVFABRIC_PROTO_MODEL_PROTO_H_

#include "core/model_fingerprint.h"
#include "kvfabric/v1/common.pb.h"

namespace kvfabric {

v1::DType KvDtypeToProto(KvDtype dtype);
void FingerprintToProto(const ModelFingerprint& fingerprint, v1::ModelFingerprint* out);

}  // namespace kvfabric

#endif  // KVFABRIC_PROTO_MODEL_PROTO_H_
