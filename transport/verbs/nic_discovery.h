// NIC discovery: which RDMA devices and ports this machine has, where they sit
// in the PCI hierarchy, and which one each GPU should use.
//
// Three layers, so that the part worth testing does not need hardware:
//   1. DiscoverNics() asks libibverbs for devices and ports (name, node GUID,
//      port state, link layer, link rate) and sysfs for each device's PCI
//      address, PCI bridge chain and NUMA node. On a machine without RDMA it
//      returns an empty list and OK.
//   2. MapGpusToNics() takes GPUs by PCI bus id (the caller gets them from
//      CUDA, e.g. cudaDeviceGetPCIBusId; this module does not depend on CUDA)
//      and a plain vector of NicInfo, and picks the nearest ACTIVE port for
//      each GPU, with the reason, and the exact string to put into UCX's
//      `net_devices` for that GPU's process (e.g. "mlx5_0:1").
//   3. FormatNicReport() renders both for operators (`kvfabric status`).
//
// "Nearest" is decided in this order, first difference wins:
//   a. the deepest common ancestor of the GPU and the NIC in the PCI hierarchy
//      (the realpaths of /sys/bus/pci/devices/<bdf> name the bridge chain:
//      /sys/devices/pci0000:00/0000:00:01.0/0000:3a:00.0/0000:3b:00.0) — a NIC
//      behind the same PCIe switch as the GPU lets GPUDirect RDMA bypass the
//      root complex;
//   b. the same NUMA node (known on both sides);
//   c. the higher link rate;
//   d. the device name, then the port number (so the choice is deterministic).
// There is no load balancing: two GPUs under one switch with one NIC share it.
//
// All sysfs access goes through NicDiscoveryOptions::sysfs_root, so tests build
// a fake tree of directories and relative symlinks in a temporary directory.
// (core/env.h's Env has no realpath, and sysfs is read-only pseudo-files, so
// this module reads it with plain POSIX calls under that root.)
//
// Thread safety: every function here is a pure function of its arguments and
// of the machine's state; any thread may call any of them concurrently.
#ifndef KVFABRIC_TRANSPORT_VERBS_NIC_DISCOVERY_H_
#define KVFABRIC_TRANSPORT_VERBS_NIC_DISCOVERY_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/statusor.h"

namespace kvfabric::verbs {

struct NicDiscoveryOptions {
  // Where sysfs is mounted. Default "/sys". Tests point it at a fake tree; the
  // tree's symlinks must be relative (as the kernel's are) so that they resolve
  // inside this root.
  std::string sysfs_root = "/sys";

  // MapGpusToNics only considers ports in state ACTIVE. Default true: UCX
  // cannot move data over a port that is DOWN or still INIT/ARMED. Set false to
  // precompute a mapping before the links come up.
  bool require_active_port = true;
};

// ibv_port_attr::state. Values equal libibverbs' enum ibv_port_state.
enum class PortState : uint8_t {
  kNop = 0,
  kDown = 1,
  kInit = 2,
  kArmed = 3,
  kActive = 4,
  kActiveDefer = 5,
};
// "NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"; "UNKNOWN" otherwise.
std::string_view PortStateName(PortState state);

// ibv_port_attr::link_layer. Values equal libibverbs' IBV_LINK_LAYER_*.
enum class LinkLayer : uint8_t {
  kUnspecified = 0,
  kInfiniBand = 1,
  kEthernet = 2,  // RoCE
};
// "InfiniBand", "Ethernet", "unspecified".
std::string_view LinkLayerName(LinkLayer layer);

// ibv_port_attr::active_speed: the per-lane speed code defined by the IBTA.
// An enum class over the raw code, so an unknown code survives (and prints as
// "speed code N"). RoCE ports report the IB code nearest their Ethernet speed.
//
//   code  name    per-lane signalling rate, Gb/s
//      1  SDR      2.5
//      2  DDR      5
//      4  QDR     10
//      8  FDR10   10.3125
//     16  FDR     14.0625
//     32  EDR     25.78125
//     64  HDR     53.125
//    128  NDR    106.25
//
// These are signalling rates (what the lane carries, encoding included), so
// EDR 4x is 103.125 Gb/s where marketing says 100. XDR needs
// ibv_port_attr::active_speed_ex, which rdma-core 44 (Debian 12) lacks; such a
// port reads as an unknown code here.
enum class IbSpeed : uint8_t {
  kUnknown = 0,
  kSdr = 1,
  kDdr = 2,
  kQdr = 4,
  kFdr10 = 8,
  kFdr = 16,
  kEdr = 32,
  kHdr = 64,
  kNdr = 128,
};
// "SDR" ... "NDR"; "speed code N" for any other code.
std::string SpeedName(IbSpeed speed);
// Per-lane rate from the table above; 0 for an unknown code.
double LaneRateGbps(IbSpeed speed);

// ibv_port_attr::active_width code -> lane count:
//   1 -> 1x, 16 -> 2x, 2 -> 4x, 4 -> 8x, 8 -> 12x; 0 for any other code.
int LanesFromWidthCode(uint8_t active_width);

// LaneRateGbps(speed) * lanes; 0 when either is unknown.
double LinkRateGbps(IbSpeed speed, int lanes);

// Where a device sits in the PCI hierarchy, read from sysfs.
struct PciLocation {
  // Normalised PCI address ("0000:3b:00.0"); empty when the device has no PCI
  // parent (soft-RoCE, siw) or sysfs does not say.
  std::string address;
  // The path components of the device's realpath below <sysfs_root>/devices,
  // host bridge first, the device itself last:
  //   {"pci0000:00", "0000:00:01.0", "0000:3a:00.0", "0000:3b:00.0"}.
  // Empty when unknown.
  std::vector<std::string> chain;
  // The device's NUMA node; -1 when unknown (sysfs says -1 on single-node
  // machines and where the firmware does not tell).
  int numa_node = -1;
};

struct NicPort {
  int port_number = 0;  // 1-based, as ibv_query_port numbers them
  PortState state = PortState::kNop;
  LinkLayer link_layer = LinkLayer::kUnspecified;
  IbSpeed speed = IbSpeed::kUnknown;
  int lanes = 0;  // LanesFromWidthCode(active_width); 0 when unknown

  double RateGbps() const { return LinkRateGbps(speed, lanes); }
};

struct NicInfo {
  std::string name;        // libibverbs device name, e.g. "mlx5_0"
  uint64_t node_guid = 0;  // host byte order
  // OK, or why the device could not be opened or queried (e.g. /dev/infiniband
  // not mounted into a container); `ports` is then empty.
  Status status;
  std::vector<NicPort> ports;
  PciLocation pci;
};

// How a GPU's chosen NIC relates to it, nearest first.
enum class NicProximity : uint8_t {
  kSamePcieSwitch = 0,      // deepest common ancestor is a bridge below a root port
  kSamePcieRootPort = 1,    // deepest common ancestor is a root port
  kSamePcieHostBridge = 2,  // only the host bridge (root complex) is shared
  kSameNumaNode = 3,        // no PCI ancestor shared, same NUMA node
  kNoCloserNic = 4,         // neither: every candidate was as far as this one
};

struct GpuNicChoice {
  std::string gpu_bus_id;  // normalised, e.g. "0000:3b:00.0"
  std::string nic_name;    // e.g. "mlx5_0"
  int port_number = 0;
  // Exactly what UCX's net_devices wants for this GPU: "<nic_name>:<port>".
  std::string ucx_net_devices;
  NicProximity proximity = NicProximity::kNoCloserNic;
  // For operators: "same PCIe switch 0000:3a:00.0", "same PCIe root port
  // 0000:00:01.0", "same PCIe host bridge pci0000:00", "same NUMA node 1" or
  // "no closer NIC ...", followed by "; tie with <nic:port> broken by ..." when
  // an equally close port lost on NUMA node, link rate, name or port number.
  std::string reason;
};

// "0000:3B:00.0" (CUDA's spelling), "00000000:3b:00.0" (nvidia-smi's) and
// "3b:00.0" (no domain: domain 0) all become "0000:3b:00.0", the spelling of
// /sys/bus/pci/devices. InvalidArgument for anything else.
StatusOr<std::string> NormalizePciBusId(std::string_view bus_id);

// The location of the PCI device `bus_id` (any spelling NormalizePciBusId
// accepts), from <sysfs_root>/bus/pci/devices/<bdf>. NotFound when sysfs has no
// such device; InvalidArgument for a malformed id.
StatusOr<PciLocation> LocatePciDevice(std::string_view bus_id, const NicDiscoveryOptions& options);

// The location of RDMA device `name`, from <sysfs_root>/class/infiniband/<name>/
// device. NotFound when sysfs has no such RDMA device; an empty location when
// it has no `device` link (a software device).
StatusOr<PciLocation> LocateRdmaDevice(std::string_view name, const NicDiscoveryOptions& options);

// Lists every RDMA device libibverbs sees, with its ports and PCI location, in
// libibverbs' order. A machine without RDMA (the kernel has no RDMA subsystem,
// or no device is present) yields an empty list and OK. A device that cannot
// be opened or queried is still listed, with its error in NicInfo::status.
// Errors: whatever ibv_get_device_list or sysfs report otherwise.
StatusOr<std::vector<NicInfo>> DiscoverNics(const NicDiscoveryOptions& options);

// For each GPU (by PCI bus id, any spelling NormalizePciBusId accepts), the
// nearest eligible NIC port (see the file comment for the order), in the order
// of `gpu_bus_ids`. GPU locations are read from options.sysfs_root; NIC
// locations come from `nics` (NicInfo::pci), so synthetic NicInfo works.
// Errors: InvalidArgument for a malformed bus id, NotFound for a GPU sysfs does
// not know, FailedPrecondition when no NIC has an eligible port (the message
// says "no RDMA devices found" when `nics` is empty, else lists the ports and
// their states).
StatusOr<std::vector<GpuNicChoice>> MapGpusToNics(std::span<const std::string> gpu_bus_ids,
                                                  std::span<const NicInfo> nics,
                                                  const NicDiscoveryOptions& options);

// "0c42:a103:0012:3456": the node GUID as ibv_devinfo prints it.
std::string FormatNodeGuid(uint64_t node_guid);

// A human-readable report for `kvfabric status`: one block per device with its
// ports, then one line per GPU choice (omitted when `choices` is empty). With
// no devices it says "no RDMA devices found" and what that means for UCX.
std::string FormatNicReport(std::span<const NicInfo> nics,
                            std::span<const GpuNicChoice> choices = {});

}  // namespace kvfabric::verbs

#endif  // KVFABRIC_TRANSPORT_VERBS_NIC_DISCOVERY_H_
