// The calibration file: the fitted bus cost model as `kvfabric calibrate` writes it and the
// services load it. JSON, versioned, every number's unit in its name:
//
//   {
//     "format": "kvfabric.bus_calibration",
//     "version": 3,                                // 2 when no path has a concurrency gain,
//                                                  // 1 when none has a size curve either
//     "created_unix_us": 1764460800000000,        // when it was measured (informational)
//     "machine": "node-17",                        // where (informational, may be empty)
//     "paths": [
//       { "path": "nvme_to_host",                  // BusPathName
//         "host_id": "cache-0",                    // "" = default for every host
//         "alpha_us": 85.0,                        // >= 0, finite
//         "beta_bytes_per_s": 1.95e9,              // > 0, finite
//         "size_factors": [1.08, 1.02, 1, 0.99, 1, 1.01, 1.04, 1.04],   // optional, version 2:
//                                                  // the size curve (bus_cost_model.h), each in
//                                                  // [0.25, 4]; absent = all 1
//         "concurrency_gain": 1.6,                 // optional, version 3: what several
//                                                  // transfers at once carry over one
//                                                  // (bus_cost_model.h), in [1, 16]; absent = 1
//         "samples": 40,                           // probes the fit used (>= 0)
//         "min_bytes": 65536, "max_bytes": 268435456,   // probe size range fitted
//         "median_error_ratio": 0.004,             // out-of-sample |observed/predicted - 1|
//         "worst_error_ratio": 0.021 }             // (>= 0, finite; 0 = unknown)
//     ],
//     "recompute": [
//       { "model_id": "meta-llama/Llama-3.1-8B@5206a32",
//         "c0_us": 2000, "c1_us_per_token": 10.0, "c2_us_per_token2": 0.001,   // >= 0, finite
//         "c3_us_per_prefix_token": 0.7,           // optional, >= 0, finite (absent = 0)
//         "split_serial_fraction": 0.0,            // optional, in [0, 1] (bus_cost_model.h)
//         "samples": 30 }
//     ]
//   }
//
// Load rejects (InvalidArgument, naming the field, e.g.
// "paths[2].beta_bytes_per_s: must be finite and > 0, got -3") any missing or mistyped field, an
// unknown path name, a version other than 1 to 3, size_factors in a version-1 file or not 8
// factors in [0.25, 4], a concurrency_gain in a file before version 3 or outside [1, 16], a
// duplicate (path, host_id) or model_id. Unknown extra fields are ignored,
// so a newer writer can add informational fields without a version bump; anything that changes
// meaning bumps the version.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_CORE_BUS_CALIBRATION_H_
#define KVFABRIC_CORE_BUS_CALIBRATION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/bus_cost_model.h"
#include "core/env.h"
#include "core/statusor.h"

namespace kvfabric {

// The newest version this build reads and writes. A file is written at the oldest version that
// holds what it says (no concurrency gain: 2; no size curve either: 1), so older builds keep
// reading it; a newer field in an older version is refused rather than ignored.
inline constexpr int kBusCalibrationVersion = 3;

struct PathCalibration {
  BusPath path = BusPath::kUnspecified;
  // Daemon the path leads to or from; empty = the default for every host.
  std::string host_id;
  PathParameters parameters;
  uint64_t samples = 0;
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  double median_error_ratio = 0;
  double worst_error_ratio = 0;
  // How far identical interleaved repeats spread (core/bus_probe.h, NoiseFloorRatio): the
  // finest error a model of this path can be judged at. 0 if not measured (optional in files).
  double noise_floor_ratio = 0;
};

struct RecomputeCalibration {
  std::string model_id;
  RecomputeParameters parameters;
  uint64_t samples = 0;
  // Out-of-sample errors and noise floor of a probe fit (core/recompute_probe.h); 0 if not
  // measured (optional in files).
  double median_error_ratio = 0;
  double worst_error_ratio = 0;
  double noise_floor_ratio = 0;
};

struct BusCalibration {
  uint64_t created_unix_us = 0;
  std::string machine;
  std::vector<PathCalibration> paths;
  std::vector<RecomputeCalibration> recompute;
};

// JSON text of `calibration` (pretty-printed, stable field order).
std::string BusCalibrationToJson(const BusCalibration& calibration);
// Parses and validates as described above.
StatusOr<BusCalibration> BusCalibrationFromJson(std::string_view json);

// Writes atomically and durably (WriteStringToFileSync). InvalidArgument if `calibration` would
// not load back (e.g. beta <= 0), naming the field.
Status SaveBusCalibration(Env* env, const BusCalibration& calibration, const std::string& path);
// Reads and validates; errors carry the file path as context.
StatusOr<BusCalibration> LoadBusCalibration(Env* env, const std::string& path);

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_BUS_CALIBRATION_H_
