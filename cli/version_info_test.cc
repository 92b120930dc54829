#include "cli/version_info.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

namespace kvfabric::cli {
namespace {

TEST(VersionInfoTest, ListsEveryOptionalPartOnce) {
  VersionInfo info = CollectVersionInfo();
  EXPECT_EQ(info.version, KVF_VERSION);
  ASSERT_EQ(info.parts.size(), 5u);
  EXPECT_EQ(info.parts[0].name, "CUDA");
  EXPECT_EQ(info.parts[1].name, "UCX");
  EXPECT_EQ(info.parts[2].name, "verbs");
  EXPECT_EQ(info.parts[3].name, "io_uring");
  EXPECT_EQ(info.parts[4].name, "Level Zero");
  for (const PartInfo& p : info.parts) {
    EXPECT_FALSE(p.detail.empty()) << p.name;
    if (!p.built) EXPECT_FALSE(p.usable) << p.name;
  }
}

TEST(VersionInfoTest, BuiltFlagsFollowTheBuildConfiguration) {
  VersionInfo info = CollectVersionInfo();
#ifdef KVF_HAVE_CUDA
  EXPECT_TRUE(info.parts[0].built);
#else
  EXPECT_FALSE(info.parts[0].built);
#endif
#ifdef KVF_HAVE_UCX
  EXPECT_TRUE(info.parts[1].built);
  EXPECT_TRUE(info.parts[1].usable) << info.parts[1].detail;
#else
  EXPECT_FALSE(info.parts[1].built);
#endif
}

TEST(VersionInfoTest, TextAndJsonCarryTheSameFacts) {
  VersionInfo info = CollectVersionInfo();
  std::string text = FormatVersionText(info);
  EXPECT_NE(text.find("kvfabric " + info.version), std::string::npos) << text;
  nlohmann::json j = nlohmann::json::parse(FormatVersionJson(info));
  EXPECT_EQ(j["version"], info.version);
  ASSERT_EQ(j["parts"].size(), info.parts.size());
  for (size_t i = 0; i < info.parts.size(); ++i) {
    EXPECT_EQ(j["parts"][i]["name"], info.parts[i].name);
    EXPECT_EQ(j["parts"][i]["built"], info.parts[i].built);
    EXPECT_NE(text.find(info.parts[i].detail), std::string::npos) << info.parts[i].name;
  }
}

}  // namespace
}  // namespace kvfabric::cli
