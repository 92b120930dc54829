#include "proto/grpc_status.h"

#include <gtest/gtest.h>

namespace kvfabric {
namespace {

TEST(GrpcStatusTest, EveryCodeRoundTrips) {
  for (int c = 1; c <= 15; ++c) {
    Status s(static_cast<StatusCode>(c), "message " + std::to_string(c));
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "message " + std::to_string(c));
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

TEST(GrpcStatusTest, OkBothWays) {
  EXPECT_TRUE(ToGrpcStatus(Status::OK()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, NamedCodesMatchGrpc) {
  EXPECT_EQ(ToGrpcStatus(Status::Unavailable("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(Status::DataLoss("x")).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(ToGrpcStatus(Status::ResourceExhausted("x")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late")).code(),
            StatusCode::kDeadlineExceeded);
}

// UNAUTHENTICATED (16) has no kvfabric twin. (A value outside grpc::StatusCode
// cannot be tested: loading it is undefined behaviour, as UBSan reports.)
TEST(GrpcStatusTest, UnauthenticatedBecomesPermissionDenied) {
  Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "who are you"));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "unauthenticated: who are you");
}

TEST(GrpcStatusTest, EntryStatusRoundTripsAndUnknownCodesBecomeInternalNamingThem) {
  v1::EntryStatus entry;
  StatusToEntry(Status::OK(), &entry);
  EXPECT_EQ(entry.code(), 0);
  EXPECT_TRUE(StatusFromEntry(entry).ok());
  StatusToEntry(Status::DataLoss("crc 1 != 2"), &entry);
  EXPECT_EQ(entry.code(), 15);
  EXPECT_EQ(StatusFromEntry(entry), Status::DataLoss("crc 1 != 2"));
  entry.set_code(99);
  entry.set_message("from the future");
  EXPECT_EQ(StatusFromEntry(entry), Status::Internal("unknown status code 99: from the future"));
  entry.set_code(-1);
  EXPECT_EQ(StatusFromEntry(entry).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kvfabric
