// The one conversion between kvfabric's Status and its wire forms, both ways:
// grpc::Status, and the per-entry v1::EntryStatus of batched RPCs.
//
// StatusCode values are numbered like gRPC's codes (core/status.h), so the
// code maps by value; the message travels unchanged. Codes from a peer go
// through StatusFromCode (core/status.h): a value kvfabric does not know
// becomes Internal naming it.
#ifndef KVFABRIC_PROTO_GRPC_STATUS_H_
#define KVFABRIC_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "core/status.h"
#include "kvfabric/v1/common.pb.h"

namespace kvfabric {

grpc::Status ToGrpcStatus(const Status& status);

// A gRPC status from a peer or from the channel (e.g. UNAVAILABLE when the
// daemon is gone). UNAUTHENTICATED (16, no kvfabric twin) becomes
// PermissionDenied saying so; any other code outside kvfabric's range
// becomes Internal with the number in the message.
Status FromGrpcStatus(const grpc::Status& status);

// OK leaves `out` empty (a default EntryStatus is OK).
void StatusToEntry(const Status& status, v1::EntryStatus* out);
// The inverse, for clients: StatusFromCode(entry.code(), entry.message()).
Status StatusFromEntry(const v1::EntryStatus& entry);

}  // namespace kvfabric

#endif  // KVFABRIC_PROTO_GRPC_STATUS_H_
