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
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return Status::PermissionDenied("unauthenticated: " + status.error_message());
  }
  return StatusFromCode(static_cast<std::int64_t>(status.error_code()), status.error_message());
}

void StatusToEntry(const Status& status, v1::EntryStatus* out) {
  if (status.ok()) {
    out->Clear();
    return;
  }
  out->set_code(static_cast<std::int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

Status StatusFromEntry(const v1::EntryStatus& entry) {
  return StatusFromCode(entry.code(), entry.message());
}

}  // namespace kvfabric
