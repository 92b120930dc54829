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
// Every field, the block-key v2 ones included. key_version 1 is written as 0
// (what senders that predate v2 send) and an all-zero kv_scales_digest as
// empty, so a v1 fingerprint's wire bytes are those of an older sender.
void FingerprintToProto(const ModelFingerprint& fingerprint, v1::ModelFingerprint* out);

}  // namespace kvfabric

#endif  // KVFABRIC_PROTO_MODEL_PROTO_H_
