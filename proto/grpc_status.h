// The one conversion between kvfabric's Status and grpc::Status, both ways.
//
// StatusCode values are numbered like gRPC's codes (core/status.h), so the
// code maps by value; the message travels unchanged.
#ifndef KVFABRIC_PROTO_GRPC_STATUS_H_
#define KVFABRIC_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "core/status.h"

namespace kvfabric {

grpc::Status ToGrpcStatus(const Status& status);

// A gRPC status from a peer or from the channel (e.g. UNAVAILABLE when the
// daemon is gone). Codes outside kvfabric's range become Unknown, with the
// original number in the message.
Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvfabric

#endif  // KVFABRIC_PROTO_GRPC_STATUS_H_
