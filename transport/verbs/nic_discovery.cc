#include "transport/verbs/nic_discovery.h"

#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "core/errno_status.h"

namespace kvfabric::verbs {

// Our enums mirror libibverbs' values so that conversion is a cast.
static_assert(static_cast<int>(PortState::kActive) == IBV_PORT_ACTIVE);
static_assert(static_cast<int>(PortState::kDown) == IBV_PORT_DOWN);
static_assert(static_cast<int>(PortState::kActiveDefer) == IBV_PORT_ACTIVE_DEFER);
static_assert(static_cast<int>(LinkLayer::kInfiniBand) == IBV_LINK_LAYER_INFINIBAND);
static_assert(static_cast<int>(LinkLayer::kEthernet) == IBV_LINK_LAYER_ETHERNET);

namespace {

// ---------------------------------------------------------------------------
// RAII for libibverbs handles.

struct DeviceListDeleter {
  void operator()(ibv_device** list) const { ibv_free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*, DeviceListDeleter>;

struct ContextDeleter {
  // ibv_close_device's result is dropped: nothing useful can be done about a
  // failed close of a context used only for queries.
  void operator()(ibv_context* ctx) const { ibv_close_device(ctx); }
};
using DeviceContext = std::unique_ptr<ibv_context, ContextDeleter>;

// ---------------------------------------------------------------------------
// sysfs helpers. Every path is under the canonical sysfs root.

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

StatusOr<std::string> RealPath(const std::string& path) {
  std::unique_ptr<char, FreeDeleter> resolved(::realpath(path.c_str(), nullptr));
  if (resolved == nullptr) return StatusFromErrno(errno, "realpath " + path);
  return std::string(resolved.get());
}

// Reads a small sysfs attribute (at most 4 KiB, sysfs's page), without the
// trailing newline.
StatusOr<std::string> ReadAttribute(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return StatusFromErrno(errno, "open " + path);
  std::string out(4096, '\0');
  ssize_t n;
  do {
    n = ::read(fd, out.data(), out.size());
  } while (n < 0 && errno == EINTR);
  int read_errno = errno;
  ::close(fd);
  if (n < 0) return StatusFromErrno(read_errno, "read " + path);
  out.resize(static_cast<size_t>(n));
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// -1 when the attribute is missing or not a number.
int ReadNumaNode(const std::string& device_dir) {
  StatusOr<std::string> text = ReadAttribute(device_dir + "/numa_node");
  if (!text.ok()) return -1;
  char* end = nullptr;
  long v = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || v < -1 || v > 1 << 20) return -1;
  return static_cast<int>(v);
}

// Resolves `link` (a path under the root that leads, through symlinks, into
// <root>/devices/...) into a PciLocation.
StatusOr<PciLocation> LocateResolved(const std::string& link, const NicDiscoveryOptions& options) {
  KVF_ASSIGN_OR_RETURN(std::string root, RealPath(options.sysfs_root));
  KVF_ASSIGN_OR_RETURN(std::string resolved, RealPath(link));
  const std::string devices = root == "/" ? "/devices/" : root + "/devices/";
  if (resolved.compare(0, devices.size(), devices) != 0) {
    return Status::InvalidArgument(link + " resolves to " + resolved + ", outside " + devices);
  }
  PciLocation loc;
  std::string_view rest = std::string_view(resolved).substr(devices.size());
  while (!rest.empty()) {
    size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    if (!part.empty()) loc.chain.emplace_back(part);
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  if (!loc.chain.empty()) {
    StatusOr<std::string> bdf = NormalizePciBusId(loc.chain.back());
    if (bdf.ok()) loc.address = *std::move(bdf);
  }
  loc.numa_node = ReadNumaNode(resolved);
  return loc;
}

bool IsHexDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

uint64_t ParseHex(std::string_view s) {
  uint64_t v = 0;
  for (char c : s) {
    int d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
    v = v * 16 + static_cast<uint64_t>(d);
  }
  return v;
}

std::string FormatRate(double gbps) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g Gb/s", gbps);
  return buf;
}

std::string PortId(const NicInfo& nic, const NicPort& port) {
  return nic.name + ":" + std::to_string(port.port_number);
}

// ---------------------------------------------------------------------------
// Mapping.

struct Candidate {
  const NicInfo* nic;
  const NicPort* port;
  size_t common_depth;  // leading chain components shared with the GPU
  bool same_numa;
  double rate_gbps;
};

// Nearest first: deeper common ancestor, then same NUMA node, then higher
// rate, then name, then port number.
bool Nearer(const Candidate& a, const Candidate& b) {
  if (a.common_depth != b.common_depth) return a.common_depth > b.common_depth;
  if (a.same_numa != b.same_numa) return a.same_numa;
  if (a.rate_gbps != b.rate_gbps) return a.rate_gbps > b.rate_gbps;
  if (a.nic->name != b.nic->name) return a.nic->name < b.nic->name;
  return a.port->port_number < b.port->port_number;
}

size_t CommonDepth(const std::vector<std::string>& gpu, const std::vector<std::string>& nic) {
  // The device itself is never its own ancestor: compare at most all but the
  // last component of the shorter chain.
  size_t limit = std::min(gpu.size(), nic.size());
  if (limit > 0) --limit;
  size_t k = 0;
  while (k < limit && gpu[k] == nic[k]) ++k;
  return k;
}

std::string DescribeTie(const Candidate& best, const Candidate& runner_up, int gpu_numa) {
  if (runner_up.common_depth != best.common_depth) return "";
  std::string tie = "; tie with " + PortId(*runner_up.nic, *runner_up.port) + " broken by ";
  if (best.same_numa != runner_up.same_numa) {
    // With nothing shared in PCI, the NUMA node is the reason itself.
    if (best.common_depth == 0) return "";
    return tie + "NUMA node " + std::to_string(gpu_numa);
  }
  if (best.rate_gbps != runner_up.rate_gbps) {
    return tie + "link rate " + FormatRate(best.rate_gbps) + " > " +
           FormatRate(runner_up.rate_gbps);
  }
  if (best.nic->name != runner_up.nic->name) return tie + "name";
  return tie + "port number";
}

std::string NoEligiblePortMessage(std::span<const NicInfo> nics,
                                  const NicDiscoveryOptions& options) {
  if (nics.empty()) return "no RDMA devices found; UCX net_devices cannot be pinned per GPU";
  std::string msg = "no " + std::string(options.require_active_port ? "ACTIVE " : "") +
                    "port on any of " + std::to_string(nics.size()) + " RDMA devices (";
  bool first = true;
  for (const NicInfo& nic : nics) {
    auto add = [&](const std::string& s) {
      if (!first) msg += ", ";
      msg += s;
      first = false;
    };
    if (!nic.status.ok()) {
      add(nic.name + ": " + nic.status.ToString());
    } else if (nic.ports.empty()) {
      add(nic.name + ": no ports");
    }
    for (const NicPort& port : nic.ports) {
      add(PortId(nic, port) + " " + std::string(PortStateName(port.state)));
    }
  }
  return msg + ")";
}

}  // namespace

std::string_view PortStateName(PortState state) {
  switch (state) {
    case PortState::kNop:
      return "NOP";
    case PortState::kDown:
      return "DOWN";
    case PortState::kInit:
      return "INIT";
    case PortState::kArmed:
      return "ARMED";
    case PortState::kActive:
      return "ACTIVE";
    case PortState::kActiveDefer:
      return "ACTIVE_DEFER";
  }
  return "UNKNOWN";
}

std::string_view LinkLayerName(LinkLayer layer) {
  switch (layer) {
    case LinkLayer::kInfiniBand:
      return "InfiniBand";
    case LinkLayer::kEthernet:
      return "Ethernet";
    case LinkLayer::kUnspecified:
      break;
  }
  return "unspecified";
}

std::string SpeedName(IbSpeed speed) {
  switch (speed) {
    case IbSpeed::kSdr:
      return "SDR";
    case IbSpeed::kDdr:
      return "DDR";
    case IbSpeed::kQdr:
      return "QDR";
    case IbSpeed::kFdr10:
      return "FDR10";
    case IbSpeed::kFdr:
      return "FDR";
    case IbSpeed::kEdr:
      return "EDR";
    case IbSpeed::kHdr:
      return "HDR";
    case IbSpeed::kNdr:
      return "NDR";
    case IbSpeed::kUnknown:
      break;
  }
  return "speed code " + std::to_string(static_cast<int>(speed));
}

double LaneRateGbps(IbSpeed speed) {
  switch (speed) {
    case IbSpeed::kSdr:
      return 2.5;
    case IbSpeed::kDdr:
      return 5.0;
    case IbSpeed::kQdr:
      return 10.0;
    case IbSpeed::kFdr10:
      return 10.3125;
    case IbSpeed::kFdr:
      return 14.0625;
    case IbSpeed::kEdr:
      return 25.78125;
    case IbSpeed::kHdr:
      return 53.125;
    case IbSpeed::kNdr:
      return 106.25;
    case IbSpeed::kUnknown:
      break;
  }
  return 0.0;
}

int LanesFromWidthCode(uint8_t active_width) {
  switch (active_width) {
    case 1:
      return 1;
    case 16:
      return 2;
    case 2:
      return 4;
    case 4:
      return 8;
    case 8:
      return 12;
    default:
      return 0;
  }
}

double LinkRateGbps(IbSpeed speed, int lanes) {
  if (lanes <= 0) return 0.0;
  return LaneRateGbps(speed) * lanes;
}

StatusOr<std::string> NormalizePciBusId(std::string_view bus_id) {
  auto invalid = [&] {
    return Status::InvalidArgument("PCI bus id '" + std::string(bus_id) +
                                   "' is not [DOMAIN:]BUS:DEVICE.FUNCTION in hex");
  };
  size_t dot = bus_id.rfind('.');
  if (dot == std::string_view::npos) return invalid();
  std::string_view function = bus_id.substr(dot + 1);
  std::string_view head = bus_id.substr(0, dot);
  size_t colon2 = head.rfind(':');
  if (colon2 == std::string_view::npos) return invalid();
  std::string_view device = head.substr(colon2 + 1);
  head = head.substr(0, colon2);
  size_t colon1 = head.rfind(':');
  std::string_view bus = colon1 == std::string_view::npos ? head : head.substr(colon1 + 1);
  std::string_view domain =
      colon1 == std::string_view::npos ? std::string_view("0") : head.substr(0, colon1);
  if (!IsHexDigits(domain) || !IsHexDigits(bus) || !IsHexDigits(device) || !IsHexDigits(function) ||
      domain.size() > 8 || bus.size() > 2 || device.size() > 2 || function.size() > 1) {
    return invalid();
  }
  uint64_t d = ParseHex(domain), b = ParseHex(bus), dev = ParseHex(device), f = ParseHex(function);
  if (dev > 0x1f || f > 7) return invalid();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04" PRIx64 ":%02" PRIx64 ":%02" PRIx64 ".%" PRIx64, d, b, dev,
                f);
  return std::string(buf);
}

StatusOr<PciLocation> LocatePciDevice(std::string_view bus_id, const NicDiscoveryOptions& options) {
  KVF_ASSIGN_OR_RETURN(std::string bdf, NormalizePciBusId(bus_id));
  StatusOr<PciLocation> loc =
      LocateResolved(options.sysfs_root + "/bus/pci/devices/" + bdf, options);
  if (!loc.ok()) {
    if (loc.status().IsNotFound()) {
      return Status::NotFound("PCI device " + bdf + " is not in " + options.sysfs_root +
                              "/bus/pci/devices");
    }
    return loc.status();
  }
  return loc;
}

StatusOr<PciLocation> LocateRdmaDevice(std::string_view name, const NicDiscoveryOptions& options) {
  const std::string dir = options.sysfs_root + "/class/infiniband/" + std::string(name);
  if (::access(dir.c_str(), F_OK) != 0) {
    return StatusFromErrno(errno, "RDMA device " + std::string(name) + ": access " + dir);
  }
  StatusOr<PciLocation> loc = LocateResolved(dir + "/device", options);
  if (!loc.ok() && loc.status().IsNotFound()) return PciLocation{};  // a software device
  return loc;
}

StatusOr<std::vector<NicInfo>> DiscoverNics(const NicDiscoveryOptions& options) {
  std::vector<NicInfo> nics;
  int count = 0;
  errno = 0;
  DeviceList list(ibv_get_device_list(&count));
  if (list == nullptr) {
    const int err = errno;
    // ENOSYS: the kernel has no RDMA subsystem (no /sys/class/infiniband).
    if (err == ENOSYS || err == 0) return nics;
    return StatusFromErrno(err, "ibv_get_device_list");
  }
  for (int i = 0; i < count; ++i) {
    ibv_device* dev = list.get()[i];
    NicInfo nic;
    nic.name = ibv_get_device_name(dev);
    nic.node_guid = be64toh(ibv_get_device_guid(dev));
    StatusOr<PciLocation> loc = LocateRdmaDevice(nic.name, options);
    if (loc.ok()) {
      nic.pci = *std::move(loc);
    } else if (!loc.status().IsNotFound()) {
      return loc.status();
    }

    errno = 0;  // providers do not all set errno on failure
    DeviceContext ctx(ibv_open_device(dev));
    if (ctx == nullptr) {
      nic.status = StatusFromErrno(errno, "ibv_open_device " + nic.name);
      nics.push_back(std::move(nic));
      continue;
    }
    ibv_device_attr attr{};
    if (int rc = ibv_query_device(ctx.get(), &attr); rc != 0) {
      nic.status = StatusFromErrno(rc, "ibv_query_device " + nic.name);
      nics.push_back(std::move(nic));
      continue;
    }
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      ibv_port_attr pattr{};
      if (int rc = ibv_query_port(ctx.get(), static_cast<uint8_t>(p), &pattr); rc != 0) {
        nic.status = StatusFromErrno(rc, "ibv_query_port " + nic.name + ":" + std::to_string(p));
        break;
      }
      NicPort port;
      port.port_number = p;
      port.state = static_cast<PortState>(pattr.state);
      port.link_layer = static_cast<LinkLayer>(pattr.link_layer);
      port.speed = static_cast<IbSpeed>(pattr.active_speed);
      port.lanes = LanesFromWidthCode(pattr.active_width);
      nic.ports.push_back(port);
    }
    nics.push_back(std::move(nic));
  }
  return nics;
}

StatusOr<std::vector<GpuNicChoice>> MapGpusToNics(std::span<const std::string> gpu_bus_ids,
                                                  std::span<const NicInfo> nics,
                                                  const NicDiscoveryOptions& options) {
  std::vector<GpuNicChoice> choices;
  choices.reserve(gpu_bus_ids.size());
  for (const std::string& bus_id : gpu_bus_ids) {
    KVF_ASSIGN_OR_RETURN(PciLocation gpu, LocatePciDevice(bus_id, options));

    std::vector<Candidate> candidates;
    for (const NicInfo& nic : nics) {
      for (const NicPort& port : nic.ports) {
        if (options.require_active_port && port.state != PortState::kActive) continue;
        candidates.push_back(Candidate{
            .nic = &nic,
            .port = &port,
            .common_depth = CommonDepth(gpu.chain, nic.pci.chain),
            .same_numa = gpu.numa_node >= 0 && gpu.numa_node == nic.pci.numa_node,
            .rate_gbps = port.RateGbps(),
        });
      }
    }
    if (candidates.empty()) {
      return Status::FailedPrecondition("GPU " + gpu.address + ": " +
                                        NoEligiblePortMessage(nics, options));
    }
    std::sort(candidates.begin(), candidates.end(), Nearer);
    const Candidate& best = candidates.front();

    GpuNicChoice choice;
    choice.gpu_bus_id = gpu.address;
    choice.nic_name = best.nic->name;
    choice.port_number = best.port->port_number;
    choice.ucx_net_devices = PortId(*best.nic, *best.port);
    const size_t k = best.common_depth;
    if (k >= 3) {
      choice.proximity = NicProximity::kSamePcieSwitch;
      choice.reason = "same PCIe switch " + gpu.chain[k - 1];
    } else if (k == 2) {
      choice.proximity = NicProximity::kSamePcieRootPort;
      choice.reason = "same PCIe root port " + gpu.chain[1];
    } else if (k == 1) {
      choice.proximity = NicProximity::kSamePcieHostBridge;
      choice.reason = "same PCIe host bridge " + gpu.chain[0];
    } else if (best.same_numa) {
      choice.proximity = NicProximity::kSameNumaNode;
      choice.reason = "same NUMA node " + std::to_string(gpu.numa_node);
    } else {
      choice.proximity = NicProximity::kNoCloserNic;
      choice.reason = "no closer NIC: none shares a PCIe host bridge or NUMA node with the GPU";
    }
    if (candidates.size() > 1) choice.reason += DescribeTie(best, candidates[1], gpu.numa_node);
    choices.push_back(std::move(choice));
  }
  return choices;
}

std::string FormatNodeGuid(uint64_t node_guid) {
  char buf[32];
  std::snprintf(
      buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>((node_guid >> 48) & 0xffff),
      static_cast<unsigned>((node_guid >> 32) & 0xffff),
      static_cast<unsigned>((node_guid >> 16) & 0xffff), static_cast<unsigned>(node_guid & 0xffff));
  return buf;
}

std::string FormatNicReport(std::span<const NicInfo> nics, std::span<const GpuNicChoice> choices) {
  std::string out;
  if (nics.empty()) {
    out +=
        "no RDMA devices found (libibverbs lists none): UCX will use TCP or shared memory, and "
        "net_devices cannot be pinned per GPU\n";
  } else {
    out += "RDMA devices: " + std::to_string(nics.size()) + "\n";
  }
  for (const NicInfo& nic : nics) {
    out += "  " + nic.name + "  node_guid " + FormatNodeGuid(nic.node_guid) + "  pci " +
           (nic.pci.address.empty() ? std::string("none") : nic.pci.address) + "  numa_node " +
           (nic.pci.numa_node < 0 ? std::string("unknown") : std::to_string(nic.pci.numa_node)) +
           "\n";
    if (!nic.status.ok()) out += "    error: " + nic.status.ToString() + "\n";
    for (const NicPort& port : nic.ports) {
      out += "    port " + std::to_string(port.port_number) + "  " +
             std::string(PortStateName(port.state)) + "  " +
             std::string(LinkLayerName(port.link_layer)) + "  " +
             (port.lanes > 0 ? std::to_string(port.lanes) + "x " : std::string("?x ")) +
             SpeedName(port.speed) + "  " +
             (port.RateGbps() > 0 ? FormatRate(port.RateGbps()) : std::string("rate unknown")) +
             "\n";
    }
  }
  if (!choices.empty()) {
    out += "GPU -> NIC (UCX net_devices):\n";
    for (const GpuNicChoice& c : choices) {
      out += "  " + c.gpu_bus_id + " -> " + c.ucx_net_devices + "  (" + c.reason + ")\n";
    }
  }
  return out;
}

}  // namespace kvfabric::verbs
