#include "transport/verbs/nic_discovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "transport/verbs/verbs_probe.h"

namespace kvfabric::verbs {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A fake sysfs in a temporary directory, laid out like the kernel's, with
// relative symlinks:
//   devices/pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3b:00.0/numa_node
//   bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:00/.../0000:3b:00.0
//   devices/.../0000:3c:00.0/infiniband/mlx5_0/device -> ../../../0000:3c:00.0
//   class/infiniband/mlx5_0 -> ../../devices/.../0000:3c:00.0/infiniband/mlx5_0
class FakeSysfs {
 public:
  FakeSysfs() {
    std::string tmpl = ::testing::TempDir() + "kvf_fake_sysfs_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    root_ = tmpl;
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directories(root_ / "class/infiniband");
  }
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::string root() const { return root_.string(); }

  // `pci_path` is the path below devices/, e.g.
  // "pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3b:00.0". numa < -1: no
  // numa_node file.
  void AddPciDevice(const std::string& pci_path, int numa) {
    fs::path dir = root_ / "devices" / pci_path;
    fs::create_directories(dir);
    if (numa >= -1) std::ofstream(dir / "numa_node") << numa << "\n";
    const std::string bdf = dir.filename().string();
    fs::create_symlink(fs::path("../../../devices") / pci_path, root_ / "bus/pci/devices" / bdf);
  }

  void AddRdmaDevice(const std::string& name, const std::string& pci_path, int numa) {
    AddPciDevice(pci_path, numa);
    const std::string bdf = fs::path(pci_path).filename().string();
    fs::path ib_dir = root_ / "devices" / pci_path / "infiniband" / name;
    fs::create_directories(ib_dir);
    fs::create_symlink(fs::path("../../..") / bdf, ib_dir / "device");
    fs::create_symlink(fs::path("../../devices") / pci_path / "infiniband" / name,
                       root_ / "class/infiniband" / name);
  }

  // A software device (soft-RoCE): a class entry without a `device` link.
  void AddSoftRdmaDevice(const std::string& name) {
    fs::path dir = root_ / "devices/virtual/infiniband" / name;
    fs::create_directories(dir);
    fs::create_symlink(fs::path("../../devices/virtual/infiniband") / name,
                       root_ / "class/infiniband" / name);
  }

 private:
  fs::path root_;
};

NicPort Port(int number, IbSpeed speed, int lanes, PortState state = PortState::kActive) {
  NicPort p;
  p.port_number = number;
  p.state = state;
  p.link_layer = LinkLayer::kInfiniBand;
  p.speed = speed;
  p.lanes = lanes;
  return p;
}

// The sysfs half of discovery, with synthetic ports standing in for verbs.
NicInfo Nic(const FakeSysfs& sysfs, const std::string& name, std::vector<NicPort> ports) {
  NicInfo nic;
  nic.name = name;
  nic.node_guid = 0x0c42a10300120000ull;
  nic.ports = std::move(ports);
  NicDiscoveryOptions options;
  options.sysfs_root = sysfs.root();
  StatusOr<PciLocation> loc = LocateRdmaDevice(name, options);
  EXPECT_TRUE(loc.ok()) << loc.status();
  if (loc.ok()) nic.pci = *loc;
  return nic;
}

constexpr char kGpu0[] = "0000:3b:00.0";
constexpr char kGpu1[] = "0000:86:00.0";

// Two sockets. Socket 0 (NUMA 0): GPU0 and mlx5_0 (EDR) behind switch
// 0000:3a:00.0; mlx5_1 (NDR, the fastest) on another root port of the same
// host bridge. Socket 1 (NUMA 1): GPU1 under host bridge pci0000:80, mlx5_2
// (HDR) under host bridge pci0000:d7.
class TwoSocketTopologyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sysfs_.AddPciDevice("pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3b:00.0", 0);
    sysfs_.AddRdmaDevice("mlx5_0", "pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3c:00.0", 0);
    sysfs_.AddRdmaDevice("mlx5_1", "pci0000:00/0000:00:03.0/0000:5e:00.0", 0);
    sysfs_.AddPciDevice("pci0000:80/0000:80:01.0/0000:86:00.0", 1);
    sysfs_.AddRdmaDevice("mlx5_2", "pci0000:d7/0000:d7:01.0/0000:d8:00.0", 1);
    options_.sysfs_root = sysfs_.root();
    nics_ = {Nic(sysfs_, "mlx5_0", {Port(1, IbSpeed::kEdr, 4)}),
             Nic(sysfs_, "mlx5_1", {Port(1, IbSpeed::kNdr, 4)}),
             Nic(sysfs_, "mlx5_2", {Port(1, IbSpeed::kHdr, 4)})};
  }

  std::vector<GpuNicChoice> Map(const std::vector<std::string>& gpus) {
    StatusOr<std::vector<GpuNicChoice>> r = MapGpusToNics(gpus, nics_, options_);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->size(), gpus.size());
    return *r;
  }

  FakeSysfs sysfs_;
  NicDiscoveryOptions options_;
  std::vector<NicInfo> nics_;
};

TEST_F(TwoSocketTopologyTest, ReadsPciLocationAndNumaNodeOfRdmaDevices) {
  EXPECT_EQ(nics_[0].pci.address, "0000:3c:00.0");
  EXPECT_EQ(nics_[0].pci.chain, (std::vector<std::string>{"pci0000:00", "0000:00:01.0",
                                                          "0000:3a:00.0", "0000:3c:00.0"}));
  EXPECT_EQ(nics_[0].pci.numa_node, 0);
  EXPECT_EQ(nics_[2].pci.address, "0000:d8:00.0");
  EXPECT_EQ(nics_[2].pci.numa_node, 1);
}

TEST_F(TwoSocketTopologyTest, GpuPicksNicBehindItsSwitchOverAFasterOne) {
  std::vector<GpuNicChoice> c = Map({kGpu0});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].gpu_bus_id, kGpu0);
  EXPECT_EQ(c[0].nic_name, "mlx5_0");
  EXPECT_EQ(c[0].port_number, 1);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_0:1");
  EXPECT_EQ(c[0].proximity, NicProximity::kSamePcieSwitch);
  EXPECT_EQ(c[0].reason, "same PCIe switch 0000:3a:00.0");
}

TEST_F(TwoSocketTopologyTest, GpuWithoutPciNeighbourPicksSameNumaNodeOverFasterNic) {
  std::vector<GpuNicChoice> c = Map({kGpu1});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_2:1");
  EXPECT_EQ(c[0].proximity, NicProximity::kSameNumaNode);
  EXPECT_EQ(c[0].reason, "same NUMA node 1");
}

TEST_F(TwoSocketTopologyTest, MapsEveryGpuInOrderAndAcceptsCudaSpelling) {
  std::vector<GpuNicChoice> c = Map({"0000:86:00.0", "0000:3B:00.0"});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].gpu_bus_id, kGpu1);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_2:1");
  EXPECT_EQ(c[1].gpu_bus_id, kGpu0);
  EXPECT_EQ(c[1].ucx_net_devices, "mlx5_0:1");
}

TEST_F(TwoSocketTopologyTest, DownPortIsSkippedAndNextNearestIsOnTheSameHostBridge) {
  nics_[0].ports[0].state = PortState::kDown;
  std::vector<GpuNicChoice> c = Map({kGpu0});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_1:1");
  EXPECT_EQ(c[0].proximity, NicProximity::kSamePcieHostBridge);
  EXPECT_EQ(c[0].reason, "same PCIe host bridge pci0000:00");
}

TEST_F(TwoSocketTopologyTest, DownPortIsUsableWhenActivePortsAreNotRequired) {
  nics_[0].ports[0].state = PortState::kDown;
  options_.require_active_port = false;
  std::vector<GpuNicChoice> c = Map({kGpu0});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_0:1");
}

TEST_F(TwoSocketTopologyTest, WithoutCloserNicPicksTheFastest) {
  nics_.pop_back();  // mlx5_2, the only NIC on NUMA node 1
  std::vector<GpuNicChoice> c = Map({kGpu1});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].ucx_net_devices, "mlx5_1:1");  // NDR beats EDR
  EXPECT_EQ(c[0].proximity, NicProximity::kNoCloserNic);
  EXPECT_THAT(c[0].reason, StartsWith("no closer NIC"));
  EXPECT_THAT(c[0].reason, HasSubstr("tie with mlx5_0:1 broken by link rate 425 Gb/s > "
                                     "103.125 Gb/s"));
}

TEST_F(TwoSocketTopologyTest, UnknownGpuIsNotFound) {
  StatusOr<std::vector<GpuNicChoice>> r =
      MapGpusToNics(std::vector<std::string>{kGpu0, "0000:af:00.0"}, nics_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound()) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("0000:af:00.0"));
}

TEST_F(TwoSocketTopologyTest, MalformedGpuBusIdIsInvalidArgument) {
  StatusOr<std::vector<GpuNicChoice>> r =
      MapGpusToNics(std::vector<std::string>{"GPU-0"}, nics_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status();
}

TEST_F(TwoSocketTopologyTest, NoNicsIsFailedPreconditionSayingNoneWereFound) {
  StatusOr<std::vector<GpuNicChoice>> r =
      MapGpusToNics(std::vector<std::string>{kGpu0}, std::vector<NicInfo>{}, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no RDMA devices found"));
}

TEST_F(TwoSocketTopologyTest, NoActivePortIsFailedPreconditionListingPortStates) {
  for (NicInfo& nic : nics_) nic.ports[0].state = PortState::kDown;
  nics_[1].ports.clear();
  nics_[1].status = Status::PermissionDenied("ibv_open_device mlx5_1");
  StatusOr<std::vector<GpuNicChoice>> r =
      MapGpusToNics(std::vector<std::string>{kGpu0}, nics_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("no ACTIVE port on any of 3 RDMA devices"));
  EXPECT_THAT(msg, HasSubstr("mlx5_0:1 DOWN"));
  EXPECT_THAT(msg, HasSubstr("mlx5_1: PermissionDenied"));
}

TEST_F(TwoSocketTopologyTest, ReportListsDevicesPortsAndGpuChoices) {
  std::vector<GpuNicChoice> c = Map({kGpu0, kGpu1});
  const std::string report = FormatNicReport(nics_, c);
  EXPECT_THAT(report, HasSubstr("RDMA devices: 3"));
  EXPECT_THAT(report, HasSubstr("mlx5_0  node_guid 0c42:a103:0012:0000  pci 0000:3c:00.0  "
                                "numa_node 0"));
  EXPECT_THAT(report, HasSubstr("port 1  ACTIVE  InfiniBand  4x HDR  212.5 Gb/s"));
  EXPECT_THAT(report, HasSubstr("0000:3b:00.0 -> mlx5_0:1  (same PCIe switch 0000:3a:00.0)"));
  EXPECT_THAT(report, HasSubstr("0000:86:00.0 -> mlx5_2:1  (same NUMA node 1)"));
  EXPECT_THAT(report, ::testing::Not(HasSubstr("no RDMA devices found")));
}

// Ties at the same PCI distance: NUMA node, then rate, then name, then port.
class TieBreakTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sysfs_.AddPciDevice("pci0000:00/0000:00:01.0/0000:3b:00.0", 0);  // the GPU
    sysfs_.AddRdmaDevice("mlx5_a", "pci0000:00/0000:00:01.0/0000:3c:00.0", 0);
    sysfs_.AddRdmaDevice("mlx5_b", "pci0000:00/0000:00:01.0/0000:3d:00.0", 0);
    sysfs_.AddRdmaDevice("mlx5_c", "pci0000:00/0000:00:01.0/0000:3e:00.0", 1);
    options_.sysfs_root = sysfs_.root();
  }

  GpuNicChoice MapOne(const std::vector<NicInfo>& nics) {
    StatusOr<std::vector<GpuNicChoice>> r =
        MapGpusToNics(std::vector<std::string>{kGpu0}, nics, options_);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->size() != 1) return {};
    return (*r)[0];
  }

  FakeSysfs sysfs_;
  NicDiscoveryOptions options_;
};

TEST_F(TieBreakTest, SameRootPortTieIsBrokenByNumaNode) {
  GpuNicChoice c = MapOne({Nic(sysfs_, "mlx5_c", {Port(1, IbSpeed::kNdr, 4)}),
                           Nic(sysfs_, "mlx5_b", {Port(1, IbSpeed::kEdr, 4)})});
  EXPECT_EQ(c.ucx_net_devices, "mlx5_b:1");
  EXPECT_EQ(c.proximity, NicProximity::kSamePcieRootPort);
  EXPECT_EQ(c.reason, "same PCIe root port 0000:00:01.0; tie with mlx5_c:1 broken by NUMA node 0");
}

TEST_F(TieBreakTest, TieIsBrokenByLinkRateThenName) {
  GpuNicChoice by_rate = MapOne({Nic(sysfs_, "mlx5_a", {Port(1, IbSpeed::kEdr, 4)}),
                                 Nic(sysfs_, "mlx5_b", {Port(1, IbSpeed::kHdr, 4)})});
  EXPECT_EQ(by_rate.ucx_net_devices, "mlx5_b:1");
  EXPECT_THAT(by_rate.reason, HasSubstr("tie with mlx5_a:1 broken by link rate 212.5 Gb/s"));

  GpuNicChoice by_name = MapOne({Nic(sysfs_, "mlx5_b", {Port(1, IbSpeed::kHdr, 4)}),
                                 Nic(sysfs_, "mlx5_a", {Port(1, IbSpeed::kHdr, 4)})});
  EXPECT_EQ(by_name.ucx_net_devices, "mlx5_a:1");
  EXPECT_THAT(by_name.reason, HasSubstr("tie with mlx5_b:1 broken by name"));
}

TEST_F(TieBreakTest, TwoPortsOfOneDeviceAreBrokenByPortNumber) {
  GpuNicChoice c =
      MapOne({Nic(sysfs_, "mlx5_a", {Port(2, IbSpeed::kHdr, 4), Port(1, IbSpeed::kHdr, 4)})});
  EXPECT_EQ(c.ucx_net_devices, "mlx5_a:1");
  EXPECT_THAT(c.reason, HasSubstr("tie with mlx5_a:2 broken by port number"));
}

TEST_F(TieBreakTest, UnknownNumaNodesDoNotCountAsTheSame) {
  FakeSysfs sysfs;
  sysfs.AddPciDevice("pci0000:00/0000:00:01.0/0000:3b:00.0", -1);
  sysfs.AddRdmaDevice("mlx5_x", "pci0000:80/0000:80:01.0/0000:81:00.0", -1);
  options_.sysfs_root = sysfs.root();
  GpuNicChoice c = MapOne({Nic(sysfs, "mlx5_x", {Port(1, IbSpeed::kHdr, 4)})});
  EXPECT_EQ(c.ucx_net_devices, "mlx5_x:1");
  EXPECT_EQ(c.proximity, NicProximity::kNoCloserNic);
}

TEST(LocateTest, SoftwareRdmaDeviceHasNoPciLocation) {
  FakeSysfs sysfs;
  sysfs.AddSoftRdmaDevice("rxe0");
  NicDiscoveryOptions options;
  options.sysfs_root = sysfs.root();
  StatusOr<PciLocation> loc = LocateRdmaDevice("rxe0", options);
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_TRUE(loc->address.empty());
  EXPECT_TRUE(loc->chain.empty());
  EXPECT_EQ(loc->numa_node, -1);
}

TEST(LocateTest, MissingRdmaDeviceIsNotFound) {
  FakeSysfs sysfs;
  NicDiscoveryOptions options;
  options.sysfs_root = sysfs.root();
  StatusOr<PciLocation> loc = LocateRdmaDevice("mlx5_9", options);
  ASSERT_FALSE(loc.ok());
  EXPECT_TRUE(loc.status().IsNotFound()) << loc.status();
}

TEST(LocateTest, MissingNumaNodeFileReadsAsUnknown) {
  FakeSysfs sysfs;
  sysfs.AddPciDevice("pci0000:00/0000:00:02.0", /*numa=*/-2);  // no numa_node file
  NicDiscoveryOptions options;
  options.sysfs_root = sysfs.root();
  StatusOr<PciLocation> loc = LocatePciDevice("00:02.0", options);
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->address, "0000:00:02.0");
  EXPECT_EQ(loc->numa_node, -1);
}

TEST(LocateTest, ResolvesThroughASymlinkedSysfsRoot) {
  FakeSysfs sysfs;
  sysfs.AddPciDevice("pci0000:00/0000:00:01.0/0000:3b:00.0", 3);
  const fs::path alias = fs::path(sysfs.root()) / "alias";
  fs::create_symlink(sysfs.root(), alias);
  NicDiscoveryOptions options;
  options.sysfs_root = alias.string();
  StatusOr<PciLocation> loc = LocatePciDevice(kGpu0, options);
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->chain.size(), 3u);
  EXPECT_EQ(loc->numa_node, 3);
}

TEST(NormalizePciBusIdTest, AcceptsCudaNvidiaSmiAndShortSpellings) {
  for (const char* id : {"0000:3b:00.0", "0000:3B:00.0", "00000000:3b:00.0", "3b:00.0"}) {
    StatusOr<std::string> n = NormalizePciBusId(id);
    ASSERT_TRUE(n.ok()) << id << ": " << n.status();
    EXPECT_EQ(*n, "0000:3b:00.0") << id;
  }
  StatusOr<std::string> big = NormalizePciBusId("10000:01:1f.7");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(*big, "10000:01:1f.7");
}

TEST(NormalizePciBusIdTest, RejectsMalformedIds) {
  for (const char* id : {"", "3b:00", "0000:3b:00.8", "0000:3b:20.0", "0000:3bb:00.0",
                         "0000:3g:00.0", "0000:3b:00.0\n", "pci0000:00", "GPU-0", ":00.0"}) {
    StatusOr<std::string> n = NormalizePciBusId(id);
    EXPECT_FALSE(n.ok()) << "'" << id << "' normalised to " << (n.ok() ? *n : "");
    if (!n.ok()) {
      EXPECT_TRUE(n.status().IsInvalidArgument()) << n.status();
    }
  }
}

TEST(LinkRateTest, MultipliesPerLaneRateByLaneCount) {
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kSdr, 4), 10.0);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kQdr, 4), 40.0);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kFdr10, 4), 41.25);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kFdr, 4), 56.25);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kEdr, 4), 103.125);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kHdr, 2), 106.25);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kNdr, 8), 850.0);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kDdr, 12), 60.0);
  EXPECT_DOUBLE_EQ(LinkRateGbps(static_cast<IbSpeed>(3), 4), 0.0);
  EXPECT_DOUBLE_EQ(LinkRateGbps(IbSpeed::kHdr, 0), 0.0);
}

TEST(LinkRateTest, WidthCodesMapToLanes) {
  EXPECT_EQ(LanesFromWidthCode(1), 1);
  EXPECT_EQ(LanesFromWidthCode(16), 2);
  EXPECT_EQ(LanesFromWidthCode(2), 4);
  EXPECT_EQ(LanesFromWidthCode(4), 8);
  EXPECT_EQ(LanesFromWidthCode(8), 12);
  EXPECT_EQ(LanesFromWidthCode(3), 0);
  EXPECT_EQ(SpeedName(IbSpeed::kFdr10), "FDR10");
  EXPECT_EQ(SpeedName(static_cast<IbSpeed>(3)), "speed code 3");
}

TEST(FormatTest, NodeGuidPrintsLikeIbvDevinfo) {
  EXPECT_EQ(FormatNodeGuid(0x0c42a10300123456ull), "0c42:a103:0012:3456");
}

TEST(FormatTest, EmptyReportSaysNoRdmaDevicesFound) {
  const std::string report = FormatNicReport({});
  EXPECT_THAT(report, StartsWith("no RDMA devices found"));
  EXPECT_THAT(report, HasSubstr("net_devices cannot be pinned"));
}

TEST(FormatTest, UnopenableDeviceShowsItsError) {
  NicInfo nic;
  nic.name = "mlx5_7";
  nic.status = Status::PermissionDenied("ibv_open_device mlx5_7: Permission denied (errno 13)");
  const std::string report = FormatNicReport(std::vector<NicInfo>{nic});
  EXPECT_THAT(report, HasSubstr("mlx5_7  node_guid 0000:0000:0000:0000  pci none  numa_node "
                                "unknown"));
  EXPECT_THAT(report, HasSubstr("error: PermissionDenied: ibv_open_device mlx5_7"));
}

// On the real machine: agrees with the probe, and with no RDMA device (as on
// the project's development machines) returns an empty list, OK, and a report
// that says so.
TEST(DiscoverNicsTest, ListsWhatLibibverbsSeesAndNothingWithoutRdma) {
  StatusOr<std::vector<NicInfo>> nics = DiscoverNics(NicDiscoveryOptions{});
  ASSERT_TRUE(nics.ok()) << nics.status();
  std::vector<std::string> names;
  for (const NicInfo& nic : *nics) names.push_back(nic.name);
  EXPECT_EQ(names, ProbeVerbs().devices);
  if (nics->empty()) {
    EXPECT_THAT(FormatNicReport(*nics), StartsWith("no RDMA devices found"));
  } else {
    for (const NicInfo& nic : *nics) {
      if (nic.status.ok()) {
        EXPECT_FALSE(nic.ports.empty()) << nic.name;
      }
    }
  }
}

}  // namespace
}  // namespace kvfabric::verbs
