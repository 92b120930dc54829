#include "transport/ucx/ucx_log.h"

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <string>
#include <utility>
#include <vector>

namespace kvfabric::ucx {
namespace {

// What this VM's UCX 1.13 reports: shared memory, CMA, TCP, no RDMA.
const std::vector<std::string> kNoRdma = {"cma", "posix", "self", "sysv", "tcp"};

TEST(UcxLogTest, AliasesResolveToTheMachinesTransports) {
  const UcxTransportCheck c = CheckUcxTransportList("rc,ud,sm,self,tcp", kNoRdma);
  EXPECT_EQ(c.missing, (std::vector<std::string>{"rc", "ud"}));
  EXPECT_EQ(c.usable, (std::vector<std::string>{"sm", "self", "tcp"}));

  const std::vector<std::string> rdma = {"rc_mlx5", "self", "tcp", "ud_verbs"};
  EXPECT_TRUE(CheckUcxTransportList("rc,ud,ib,self,tcp", rdma).missing.empty());
  EXPECT_EQ(CheckUcxTransportList("rc_v,dc,sm,tcp", rdma).missing,
            (std::vector<std::string>{"rc_v", "dc", "sm"}));
  EXPECT_EQ(CheckUcxTransportList("cuda,cuda_copy", kNoRdma).missing,
            (std::vector<std::string>{"cuda", "cuda_copy"}));
  EXPECT_TRUE(CheckUcxTransportList("mm,shm,posix,cma", kNoRdma).missing.empty());
  EXPECT_TRUE(CheckUcxTransportList("rc_verbs:aux,tcp", {"rc_verbs", "tcp"}).missing.empty());
}

TEST(UcxLogTest, ExclusionListsAndAllMissNothing) {
  EXPECT_TRUE(CheckUcxTransportList("^rc,ud", kNoRdma).missing.empty());
  EXPECT_TRUE(CheckUcxTransportList("all", kNoRdma).missing.empty());
  EXPECT_TRUE(CheckUcxTransportList("tcp,,self", kNoRdma).missing.empty());
}

TEST(UcxLogTest, TheWarningNamesTheSettingWhatIsMissingAndWhatTheMachineHas) {
  const UcxTransportCheck c = CheckUcxTransportList("rc,ud,sm,self,tcp", kNoRdma);
  EXPECT_EQ(UcxTransportWarning(c, "rc,ud,sm,self,tcp", "--ucx-tls"),
            "--ucx-tls \"rc,ud,sm,self,tcp\": rc, ud are not available on this machine (UCX finds: "
            "cma, posix, self, sysv, tcp); using sm, self, tcp only");
  const UcxTransportCheck none = CheckUcxTransportList("rc", kNoRdma);
  EXPECT_NE(UcxTransportWarning(none, "rc", "ucx_tls").find("rc is not available"),
            std::string::npos);
  EXPECT_NE(UcxTransportWarning(none, "rc", "ucx_tls").find("UCX cannot start"), std::string::npos);
  EXPECT_EQ(UcxTransportWarning(CheckUcxTransportList("tcp", kNoRdma), "tcp", "x"), "");
}

TEST(UcxLogTest, TheMachineHasSelfAndTcp) {
  StatusOr<std::vector<std::string>> available = AvailableUcxTransports();
  ASSERT_TRUE(available.ok()) << available.status().ToString();
  EXPECT_TRUE(CheckUcxTransportList("self,tcp", *available).missing.empty())
      << "uct lists none of self, tcp";
}

// UCX's own warning about the list arrives through the sink, demoted to debug
// since the check's warning (which comes once) already names the same.
TEST(UcxLogTest, UcxMessagesReachTheSinkAndTheCheckWarnsOnce) {
  StatusOr<std::vector<std::string>> available = AvailableUcxTransports();
  ASSERT_TRUE(available.ok()) << available.status().ToString();
  if (CheckUcxTransportList("rc_mlx5", *available).missing.empty()) {
    GTEST_SKIP() << "this machine has mlx5 transports: nothing is missing";
  }
  std::vector<std::pair<spdlog::level::level_enum, std::string>> lines;
  RouteUcxLogs([&](spdlog::level::level_enum level, std::string_view line) {
    lines.emplace_back(level, std::string(line));
  });
  const std::string tls = "rc_mlx5,ud_mlx5,self,tcp";  // no mlx5 device on a test machine
  ASSERT_TRUE(WarnAboutMissingUcxTransports(tls, "--ucx-tls").ok());
  ASSERT_TRUE(WarnAboutMissingUcxTransports(tls, "--ucx-tls").ok());
  int warnings = 0;
  for (const auto& [level, line] : lines) {
    if (level == spdlog::level::warn && line.find("--ucx-tls \"" + tls + "\"") == 0) ++warnings;
  }
  EXPECT_EQ(warnings, 1);

  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  ASSERT_EQ(ucp_config_modify(config, "TLS", tls.c_str()), UCS_OK);
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s == UCS_OK) ucp_cleanup(context);
  bool ucx_said_it = false;
  for (const auto& [level, line] : lines) {
    if (line.rfind("ucx: ", 0) == 0 && line.find("not available") != std::string::npos) {
      ucx_said_it = true;
      EXPECT_EQ(level, spdlog::level::debug) << line;
    }
  }
  EXPECT_TRUE(ucx_said_it) << "UCX's own warning did not come through the handler";
  RouteUcxLogs([](spdlog::level::level_enum, std::string_view) {});
}

}  // namespace
}  // namespace kvfabric::ucx
