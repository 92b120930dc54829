#include "proto/grpc_status.h"

#include <string>

namespace kvfabric {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return Status::OK();
  const int code = static_cast<int>(status.error_code());
  if (code < static_cast<int>(StatusCode::kCancelled) ||
      code > static_cast<int>(StatusCode::kDataLoss)) {
    return Status::Unknown("gRPC code " + std::to_string(code) + ": " + status.error_message());
  }
  return Status(static_cast<StatusCode>(code), status.error_message());
}

}  // namespace kvfabric
