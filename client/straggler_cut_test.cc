#include "client/straggler_cut.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace kvfabric::client {
namespace {

using Kind = StreamVerdict::Kind;

// A stream of 128 MiB placement predicted to end after 50 ms: cut-off at
// 4 x 50 + 50 = 250 ms.
StreamProgress Planned() {
  StreamProgress p;
  p.total_bytes = std::uint64_t{128} << 20;
  p.predicted_us = 50e3;
  p.cut_after_us = 250e3;
  p.min_evidence_us = 50e3;
  return p;
}

TEST(StragglerCutTest, WithoutACutOffNothingIsCut) {
  StreamProgress p = Planned();
  p.cut_after_us = 0;
  p.elapsed_us = 1e9;
  p.own_bytes = 1;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
}

TEST(StragglerCutTest, PastItsCutOffAtItsShareOfTheDaemonsBytes) {
  StreamProgress p = Planned();
  p.own_bytes = std::uint64_t{126} << 20;  // projects to 243.8 ms
  p.elapsed_us = 240e3;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
  p.elapsed_us = 260e3;
  const StreamVerdict v = JudgeStream(p);
  EXPECT_EQ(v.kind, Kind::kPastCutOff);
  EXPECT_DOUBLE_EQ(v.own_us, 260e3);
  // Beside as many bytes of other loads the same elapsed time is half its own.
  p.others_bytes = p.own_bytes;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
  EXPECT_DOUBLE_EQ(JudgeStream(p).share, 0.5);
  // The share has a floor: 1/64 of a minute is past any cut-off here.
  p.others_bytes = std::uint64_t{1} << 50;
  p.elapsed_us = 60e6;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kPastCutOff);
}

// Layer 0 of a 32-layer load (4 MiB of 128) answered after 100 ms on a link
// capped to a twentieth of what placement knew: its whole predicted time is
// spent and at that rate it ends after 3.2 s, so it stops before its 8 MiB
// requests go out.
TEST(StragglerCutTest, ASlowStreamIsCutOnceItsRateProjectsItPastTheCutOff) {
  StreamProgress p = Planned();
  p.own_bytes = std::uint64_t{4} << 20;
  p.elapsed_us = 100e3;
  const StreamVerdict v = JudgeStream(p);
  EXPECT_EQ(v.kind, Kind::kProjectedPastCutOff);
  EXPECT_DOUBLE_EQ(v.projected_us, 3.2e6);
  const std::string text = DescribeCut(p, v);
  EXPECT_NE(text.find("stream cut after 100.0 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("4 MiB of 128 MiB moved"), std::string::npos) << text;
  EXPECT_NE(text.find("would end at 3200.0 ms, past 250.0 ms"), std::string::npos) << text;
}

// A projection needs its evidence: the stream's whole predicted time and
// the slack. A stall shorter than that never projects a cut, however little
// moved; the stream is only suspect (one request at a time) until then.
TEST(StragglerCutTest, NoProjectionBeforeThePredictedTimeOrTheSlackPassed) {
  StreamProgress p = Planned();
  p.own_bytes = 1 << 20;
  p.elapsed_us = 49e3;  // before the predicted end
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
  EXPECT_TRUE(JudgeStream(p).suspect);
  p.predicted_us = 10e3;
  p.cut_after_us = 90e3;
  p.elapsed_us = 40e3;  // past the predicted end, not past the slack
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
  EXPECT_TRUE(JudgeStream(p).suspect);
  p.elapsed_us = 51e3;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kProjectedPastCutOff);
  EXPECT_FALSE(JudgeStream(p).suspect);
  // Early and on course: not suspect.
  p.elapsed_us = 1e3;
  p.own_bytes = std::uint64_t{64} << 20;
  EXPECT_FALSE(JudgeStream(p).suspect);
  // Nor without a prediction, without bytes, or with everything moved.
  StreamProgress q = Planned();
  q.elapsed_us = 200e3;
  q.predicted_us = 0;
  q.own_bytes = 1;
  EXPECT_EQ(JudgeStream(q).kind, Kind::kOnTime);
  q = Planned();
  q.elapsed_us = 200e3;
  EXPECT_EQ(JudgeStream(q).kind, Kind::kOnTime);
  q.own_bytes = q.total_bytes;
  EXPECT_EQ(JudgeStream(q).kind, Kind::kOnTime);
}

// A stream late but on course to end within its cut-off goes on.
TEST(StragglerCutTest, ALateStreamThatWouldEndBeforeItsCutOffGoesOn) {
  StreamProgress p = Planned();
  p.elapsed_us = 120e3;                   // 2.4x its prediction
  p.own_bytes = std::uint64_t{64} << 20;  // half: ends at 240 ms
  const StreamVerdict v = JudgeStream(p);
  EXPECT_EQ(v.kind, Kind::kOnTime);
  EXPECT_FALSE(v.suspect);
  EXPECT_DOUBLE_EQ(v.projected_us, 240e3);
  // Counted at its share: beside as many bytes of other loads, it projects
  // to half that.
  p.elapsed_us = 240e3;
  p.own_bytes = std::uint64_t{64} << 20;
  p.others_bytes = std::uint64_t{64} << 20;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kOnTime);
  p.others_bytes = 0;
  EXPECT_EQ(JudgeStream(p).kind, Kind::kProjectedPastCutOff);
}

}  // namespace
}  // namespace kvfabric::client
