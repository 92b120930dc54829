#include "core/status.h"

#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/statusor.h"

namespace kvfabric {
namespace {

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  Status s = Status::NotFound("block 3f2a");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_EQ(s.message(), "block 3f2a");
  EXPECT_EQ(s.ToString(), "NotFound: block 3f2a");
  EXPECT_EQ(Status::DataLoss("x").code(), StatusCode::kDataLoss);
  EXPECT_EQ(Status::ResourceExhausted("x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Status::FailedPrecondition("x").code(), StatusCode::kFailedPrecondition);
}

TEST(StatusTest, CodesFromOutsideAreCheckedAndUnknownOnesBecomeInternal) {
  EXPECT_TRUE(StatusFromCode(0, "ignored").ok());
  EXPECT_EQ(StatusFromCode(5, "gone"), Status::NotFound("gone"));
  EXPECT_EQ(StatusFromCode(15, "crc"), Status::DataLoss("crc"));
  EXPECT_EQ(StatusFromCode(16, "auth"), Status::Internal("unknown status code 16: auth"));
  EXPECT_EQ(StatusFromCode(-3, ""), Status::Internal("unknown status code -3"));
  EXPECT_EQ(StatusFromCode(std::int64_t{1} << 40, "x").code(), StatusCode::kInternal);
  EXPECT_TRUE(IsKnownStatusCode(0));
  EXPECT_TRUE(IsKnownStatusCode(15));
  EXPECT_FALSE(IsKnownStatusCode(16));
}

TEST(StatusTest, OkCodeNeverCarriesAMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, CopiesAreIndependent) {
  Status a = Status::Internal("a");
  Status b = a;
  EXPECT_EQ(a, b);
  b = Status::Unavailable("b");
  EXPECT_EQ(a.message(), "a");
  EXPECT_NE(a, b);
  Status c = std::move(b);
  EXPECT_EQ(c.message(), "b");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsOk) {
  EXPECT_EQ(Status::DataLoss("crc mismatch").WithContext("segment 7").ToString(),
            "DataLoss: segment 7: crc mismatch");
  EXPECT_TRUE(Status::OK().WithContext("anything").ok());
}

TEST(StatusTest, CodeNamesAreDistinct) {
  for (int a = 0; a <= 15; ++a) {
    for (int b = a + 1; b <= 15; ++b) {
      EXPECT_NE(StatusCodeName(static_cast<StatusCode>(a)),
                StatusCodeName(static_cast<StatusCode>(b)));
    }
  }
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "InvalidStatusCode");
}

TEST(StatusTest, StreamsItsString) {
  std::ostringstream os;
  os << Status::Unavailable("peer gone");
  EXPECT_EQ(os.str(), "Unavailable: peer gone");
}

Status FailsWhen(bool fail) {
  if (fail) return Status::Aborted("asked to fail");
  return Status::OK();
}

Status Chain(bool fail, int* reached) {
  KVF_RETURN_IF_ERROR(FailsWhen(fail));
  *reached = 1;
  return Status::OK();
}

TEST(StatusTest, ReturnIfErrorStopsAtFirstFailure) {
  int reached = 0;
  EXPECT_EQ(Chain(true, &reached).code(), StatusCode::kAborted);
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  KVF_ASSIGN_OR_RETURN(int h, Half(x));
  KVF_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusOrTest, HoldsValueOrError) {
  StatusOr<int> v = Half(8);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 4);
  StatusOr<int> e = Half(3);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(), "odd: 3");
}

TEST(StatusOrTest, AssignOrReturnPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd: 3");
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  StatusOr<int> v{Status::OK()};
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MovesOutNonCopyableValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> owned = std::move(p).value();
  EXPECT_EQ(*owned, 7);
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> e = Status::NotFound("nothing");
  EXPECT_DEATH({ (void)e.value(); }, "NotFound: nothing");
}

}  // namespace
}  // namespace kvfabric
