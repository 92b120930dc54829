#include "cli/version_info.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>

#ifdef KVF_HAVE_CUDA
#include "gpu/cuda/cuda_probe.h"
#endif
#ifdef KVF_HAVE_UCX
#include "transport/ucx/ucx_probe.h"
#endif
#ifdef KVF_HAVE_VERBS
#include "transport/verbs/verbs_probe.h"
#endif
#ifdef KVF_HAVE_URING
#include "core/io_uring_probe.h"
#endif
#ifdef KVF_HAVE_LEVEL_ZERO
#include "gpu/level_zero/ze_status.h"
#endif

#ifndef KVF_VERSION
#error "KVF_VERSION must be defined by the build (from the VERSION file)"
#endif

namespace kvfabric::cli {

namespace {

PartInfo NotBuilt(const char* name, const char* package) {
  return PartInfo{name, false, false, std::string("not built (install ") + package + ")"};
}

PartInfo CudaPart() {
#ifdef KVF_HAVE_CUDA
  cuda::CudaProbeResult r = cuda::ProbeCuda();
  char runtime[64];
  std::snprintf(runtime, sizeof(runtime), "runtime %d.%d, %s", r.runtime_version / 1000,
                (r.runtime_version % 1000) / 10, r.compiled_archs.c_str());
  std::string detail = runtime;
  if (r.devices.empty()) {
    detail += "; no device: " + r.status.ToString();
  } else {
    for (const cuda::CudaDeviceInfo& d : r.devices) {
      detail += "; " + d.name + " (sm_" + std::to_string(d.compute_capability_major) +
                std::to_string(d.compute_capability_minor) + ", " +
                std::to_string(d.total_memory_bytes >> 20) + " MiB)";
    }
  }
  return PartInfo{"CUDA", true, !r.devices.empty(), detail};
#else
  return NotBuilt("CUDA", "the CUDA toolkit at /usr/local/cuda");
#endif
}

PartInfo UcxPart() {
#ifdef KVF_HAVE_UCX
  ucx::UcxProbeResult r = ucx::ProbeUcx();
  std::string detail = "libucp " + r.version;
  if (!r.status.ok()) detail += "; " + r.status.ToString();
  return PartInfo{"UCX", true, r.status.ok(), detail};
#else
  return NotBuilt("UCX", "libucx-dev");
#endif
}

PartInfo VerbsPart() {
#ifdef KVF_HAVE_VERBS
  verbs::VerbsProbeResult r = verbs::ProbeVerbs();
  std::string detail = std::to_string(r.devices.size()) + " RDMA device(s)";
  for (size_t i = 0; i < r.devices.size(); ++i) detail += (i == 0 ? ": " : ", ") + r.devices[i];
  return PartInfo{"verbs", true, !r.devices.empty(), detail};
#else
  return NotBuilt("verbs", "libibverbs-dev librdmacm-dev");
#endif
}

PartInfo UringPart() {
#ifdef KVF_HAVE_URING
  Status s = ProbeIoUring();
  // liburing 2.3 (Debian 12) has no version macros.
  std::string detail = s.ok() ? "liburing; kernel supports io_uring" : "liburing; " + s.ToString();
  return PartInfo{"io_uring", true, s.ok(), detail};
#else
  return NotBuilt("io_uring", "liburing-dev");
#endif
}

PartInfo LevelZeroPart() {
#ifdef KVF_HAVE_LEVEL_ZERO
  level_zero::ZeProbeResult r = level_zero::ProbeLevelZero();
  std::string detail = std::to_string(r.driver_count) + " driver(s), " +
                       std::to_string(r.device_count) + " device(s)";
  if (!r.status.ok()) detail += "; " + r.status.ToString();
  return PartInfo{"Level Zero", true, r.status.ok() && r.device_count > 0, detail};
#else
  return NotBuilt("Level Zero", "libze-dev");
#endif
}

std::string CompilerName() {
#if defined(__clang__)
  return std::string("Clang ") + __clang_version__;
#elif defined(__GNUC__)
  return "GCC " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) + "." +
         std::to_string(__GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

}  // namespace

VersionInfo CollectVersionInfo() {
  VersionInfo info;
  info.version = KVF_VERSION;
  info.compiler = CompilerName();
  info.cxx_standard = "C++" + std::to_string(__cplusplus / 100 % 100);
  info.parts = {CudaPart(), UcxPart(), VerbsPart(), UringPart(), LevelZeroPart()};
  return info;
}

std::string FormatVersionText(const VersionInfo& info) {
  std::ostringstream os;
  os << "kvfabric " << info.version << " (" << info.compiler << ", " << info.cxx_standard
     << ")\n";
  os << "optional parts (built: compiled in; usable: works on this machine):\n";
  for (const PartInfo& p : info.parts) {
    char head[64];
    std::snprintf(head, sizeof(head), "  %-11s %-10s ", p.name.c_str(),
                  !p.built ? "not built" : (p.usable ? "usable" : "built"));
    os << head << p.detail << "\n";
  }
  return os.str();
}

std::string FormatVersionJson(const VersionInfo& info) {
  nlohmann::json j;
  j["version"] = info.version;
  j["compiler"] = info.compiler;
  j["cxx_standard"] = info.cxx_standard;
  j["parts"] = nlohmann::json::array();
  for (const PartInfo& p : info.parts) {
    j["parts"].push_back(
        {{"name", p.name}, {"built", p.built}, {"usable", p.usable}, {"detail", p.detail}});
  }
  return j.dump(2) + "\n";
}

}  // namespace kvfabric::cli
