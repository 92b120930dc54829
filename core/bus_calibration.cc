#include "core/bus_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace kvfabric {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kFormat[] = "kvfabric.bus_calibration";

std::string Num(double v) {
  // Enough digits to round-trip a double.
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// Field readers: each returns InvalidArgument naming `where.key` when the field is missing or
// has the wrong type. None of them can throw: types are checked before get<>().
Status Missing(const std::string& where, std::string_view what) {
  return Status::InvalidArgument(where + ": " + std::string(what));
}

StatusOr<double> GetDouble(const Json& obj, const std::string& where, const char* key) {
  const auto it = obj.find(key);
  const std::string field = where.empty() ? key : where + "." + key;
  if (it == obj.end()) return Missing(field, "missing");
  if (!it->is_number()) return Missing(field, "must be a number");
  return it->get<double>();
}

StatusOr<uint64_t> GetUint(const Json& obj, const std::string& where, const char* key) {
  const auto it = obj.find(key);
  const std::string field = where.empty() ? key : where + "." + key;
  if (it == obj.end()) return Missing(field, "missing");
  if (!it->is_number_unsigned()) return Missing(field, "must be a non-negative integer");
  return it->get<uint64_t>();
}

StatusOr<std::string> GetString(const Json& obj, const std::string& where, const char* key) {
  const auto it = obj.find(key);
  const std::string field = where.empty() ? key : where + "." + key;
  if (it == obj.end()) return Missing(field, "missing");
  if (!it->is_string()) return Missing(field, "must be a string");
  return it->get<std::string>();
}

Status CheckNonNegative(double v, const std::string& field) {
  if (!std::isfinite(v) || v < 0) {
    return Status::InvalidArgument(field + ": must be finite and >= 0, got " + Num(v));
  }
  return Status::OK();
}

// A field files written before it existed lack: 0 when absent.
StatusOr<double> GetOptionalDouble(const Json& e, const std::string& where, const char* key) {
  if (!e.contains(key)) return 0.0;
  return GetDouble(e, where, key);
}

Status CheckPositive(double v, const std::string& field) {
  if (!std::isfinite(v) || !(v > 0)) {
    return Status::InvalidArgument(field + ": must be finite and > 0, got " + Num(v));
  }
  return Status::OK();
}

Status Validate(const BusCalibration& c) {
  std::set<std::pair<int, std::string>> seen_paths;
  for (size_t i = 0; i < c.paths.size(); ++i) {
    const PathCalibration& p = c.paths[i];
    const std::string w = "paths[" + std::to_string(i) + "]";
    if (!IsValidBusPath(static_cast<int>(p.path))) {
      return Status::InvalidArgument(w + ".path: unknown path");
    }
    KVF_RETURN_IF_ERROR(CheckNonNegative(p.parameters.alpha_us, w + ".alpha_us"));
    KVF_RETURN_IF_ERROR(CheckPositive(p.parameters.beta_bytes_per_s, w + ".beta_bytes_per_s"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(p.median_error_ratio, w + ".median_error_ratio"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(p.worst_error_ratio, w + ".worst_error_ratio"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(p.noise_floor_ratio, w + ".noise_floor_ratio"));
    for (int k = 0; k < kSizeClasses; ++k) {
      const double f = p.parameters.size_factors[k];
      if (!std::isfinite(f) || f < kMinSizeFactor || f > kMaxSizeFactor) {
        return Status::InvalidArgument(w + ".size_factors[" + std::to_string(k) +
                                       "]: must be in [0.25, 4], got " + Num(f));
      }
    }
    if (!ConcurrencyGainValid(p.parameters)) {
      return Status::InvalidArgument(w + ".concurrency_gain: must be in [1, " +
                                     Num(kMaxConcurrencyGain) + "], got " +
                                     Num(p.parameters.concurrency_gain));
    }
    if (p.min_bytes > p.max_bytes) {
      return Status::InvalidArgument(w + ".min_bytes: " + std::to_string(p.min_bytes) +
                                     " > max_bytes " + std::to_string(p.max_bytes));
    }
    if (!seen_paths.emplace(static_cast<int>(p.path), p.host_id).second) {
      return Status::InvalidArgument(w + ": duplicate entry for path " +
                                     std::string(BusPathName(p.path)) + " host_id \"" + p.host_id +
                                     "\"");
    }
  }
  std::set<std::string> seen_models;
  for (size_t i = 0; i < c.recompute.size(); ++i) {
    const RecomputeCalibration& r = c.recompute[i];
    const std::string w = "recompute[" + std::to_string(i) + "]";
    if (r.model_id.empty()) return Status::InvalidArgument(w + ".model_id: must be non-empty");
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.parameters.c0_us, w + ".c0_us"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.parameters.c1_us_per_token, w + ".c1_us_per_token"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.parameters.c2_us_per_token2, w + ".c2_us_per_token2"));
    KVF_RETURN_IF_ERROR(
        CheckNonNegative(r.parameters.c3_us_per_prefix_token, w + ".c3_us_per_prefix_token"));
    if (!(r.parameters.split_serial_fraction >= 0 && r.parameters.split_serial_fraction <= 1)) {
      return Status::InvalidArgument(w + ".split_serial_fraction: must be in [0, 1], got " +
                                     std::to_string(r.parameters.split_serial_fraction));
    }
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.median_error_ratio, w + ".median_error_ratio"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.worst_error_ratio, w + ".worst_error_ratio"));
    KVF_RETURN_IF_ERROR(CheckNonNegative(r.noise_floor_ratio, w + ".noise_floor_ratio"));
    if (!seen_models.insert(r.model_id).second) {
      return Status::InvalidArgument(w + ".model_id: duplicate \"" + r.model_id + "\"");
    }
  }
  return Status::OK();
}

}  // namespace

std::string BusCalibrationToJson(const BusCalibration& c) {
  Json j;
  j["format"] = kFormat;
  // The oldest version that holds the file: a reader of version 1 would ignore the size
  // factors and predict with the line alone, one of version 2 the concurrency gain, so a file
  // with them must be refused by such a reader instead.
  int version = 1;
  for (const PathCalibration& p : c.paths) {
    if (!HasFlatSizeCurve(p.parameters)) version = std::max(version, 2);
    if (p.parameters.concurrency_gain != 1) version = std::max(version, 3);
  }
  j["version"] = version;
  j["created_unix_us"] = c.created_unix_us;
  j["machine"] = c.machine;
  j["paths"] = Json::array();
  for (const PathCalibration& p : c.paths) {
    Json e;
    e["path"] = std::string(BusPathName(p.path));
    e["host_id"] = p.host_id;
    e["alpha_us"] = p.parameters.alpha_us;
    e["beta_bytes_per_s"] = p.parameters.beta_bytes_per_s;
    e["samples"] = p.samples;
    e["min_bytes"] = p.min_bytes;
    e["max_bytes"] = p.max_bytes;
    e["median_error_ratio"] = p.median_error_ratio;
    e["worst_error_ratio"] = p.worst_error_ratio;
    e["noise_floor_ratio"] = p.noise_floor_ratio;
    if (!HasFlatSizeCurve(p.parameters)) {
      e["size_factors"] = Json::array();
      for (double f : p.parameters.size_factors) e["size_factors"].push_back(f);
    }
    if (p.parameters.concurrency_gain != 1) e["concurrency_gain"] = p.parameters.concurrency_gain;
    j["paths"].push_back(std::move(e));
  }
  j["recompute"] = Json::array();
  for (const RecomputeCalibration& r : c.recompute) {
    Json e;
    e["model_id"] = r.model_id;
    e["c0_us"] = r.parameters.c0_us;
    e["c1_us_per_token"] = r.parameters.c1_us_per_token;
    e["c2_us_per_token2"] = r.parameters.c2_us_per_token2;
    e["c3_us_per_prefix_token"] = r.parameters.c3_us_per_prefix_token;
    e["split_serial_fraction"] = r.parameters.split_serial_fraction;
    e["samples"] = r.samples;
    e["median_error_ratio"] = r.median_error_ratio;
    e["worst_error_ratio"] = r.worst_error_ratio;
    e["noise_floor_ratio"] = r.noise_floor_ratio;
    j["recompute"].push_back(std::move(e));
  }
  // Non-finite doubles would serialise as null; Save validates first so they never get here.
  return j.dump(2) + "\n";
}

StatusOr<BusCalibration> BusCalibrationFromJson(std::string_view text) {
  const Json j = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("top level: must be a JSON object");
  KVF_ASSIGN_OR_RETURN(std::string format, GetString(j, "", "format"));
  if (format != kFormat) {
    return Status::InvalidArgument("format: expected \"" + std::string(kFormat) + "\", got \"" +
                                   format + "\"");
  }
  KVF_ASSIGN_OR_RETURN(uint64_t version, GetUint(j, "", "version"));
  if (version < 1 || version > kBusCalibrationVersion) {
    return Status::InvalidArgument("version: " + std::to_string(version) +
                                   " is not supported (this build reads versions 1 to " +
                                   std::to_string(kBusCalibrationVersion) + ")");
  }
  BusCalibration c;
  KVF_ASSIGN_OR_RETURN(c.created_unix_us, GetUint(j, "", "created_unix_us"));
  KVF_ASSIGN_OR_RETURN(c.machine, GetString(j, "", "machine"));
  const auto paths = j.find("paths");
  if (paths == j.end() || !paths->is_array()) {
    return Status::InvalidArgument("paths: missing or not an array");
  }
  for (size_t i = 0; i < paths->size(); ++i) {
    const Json& e = (*paths)[i];
    const std::string w = "paths[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::InvalidArgument(w + ": must be an object");
    PathCalibration p;
    KVF_ASSIGN_OR_RETURN(std::string name, GetString(e, w, "path"));
    const auto bus = BusPathFromName(name);
    if (!bus) return Status::InvalidArgument(w + ".path: unknown path \"" + name + "\"");
    p.path = *bus;
    KVF_ASSIGN_OR_RETURN(p.host_id, GetString(e, w, "host_id"));
    KVF_ASSIGN_OR_RETURN(p.parameters.alpha_us, GetDouble(e, w, "alpha_us"));
    KVF_ASSIGN_OR_RETURN(p.parameters.beta_bytes_per_s, GetDouble(e, w, "beta_bytes_per_s"));
    KVF_ASSIGN_OR_RETURN(p.samples, GetUint(e, w, "samples"));
    KVF_ASSIGN_OR_RETURN(p.min_bytes, GetUint(e, w, "min_bytes"));
    KVF_ASSIGN_OR_RETURN(p.max_bytes, GetUint(e, w, "max_bytes"));
    KVF_ASSIGN_OR_RETURN(p.median_error_ratio, GetDouble(e, w, "median_error_ratio"));
    KVF_ASSIGN_OR_RETURN(p.worst_error_ratio, GetDouble(e, w, "worst_error_ratio"));
    KVF_ASSIGN_OR_RETURN(p.noise_floor_ratio, GetOptionalDouble(e, w, "noise_floor_ratio"));
    if (const auto f = e.find("size_factors"); f != e.end()) {
      if (version < 2) {
        return Status::InvalidArgument(w + ".size_factors: needs version 2, the file says " +
                                       std::to_string(version));
      }
      if (!f->is_array() || f->size() != kSizeClasses) {
        return Status::InvalidArgument(w + ".size_factors: must be an array of " +
                                       std::to_string(kSizeClasses) + " numbers");
      }
      for (int k = 0; k < kSizeClasses; ++k) {
        if (!(*f)[k].is_number()) {
          return Status::InvalidArgument(w + ".size_factors[" + std::to_string(k) +
                                         "]: must be a number");
        }
        p.parameters.size_factors[k] = (*f)[k].get<double>();
      }
    }
    if (e.contains("concurrency_gain")) {
      if (version < 3) {
        return Status::InvalidArgument(w + ".concurrency_gain: needs version 3, the file says " +
                                       std::to_string(version));
      }
      KVF_ASSIGN_OR_RETURN(p.parameters.concurrency_gain, GetDouble(e, w, "concurrency_gain"));
    }
    c.paths.push_back(std::move(p));
  }
  const auto recompute = j.find("recompute");
  if (recompute == j.end() || !recompute->is_array()) {
    return Status::InvalidArgument("recompute: missing or not an array");
  }
  for (size_t i = 0; i < recompute->size(); ++i) {
    const Json& e = (*recompute)[i];
    const std::string w = "recompute[" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::InvalidArgument(w + ": must be an object");
    RecomputeCalibration r;
    KVF_ASSIGN_OR_RETURN(r.model_id, GetString(e, w, "model_id"));
    KVF_ASSIGN_OR_RETURN(r.parameters.c0_us, GetDouble(e, w, "c0_us"));
    KVF_ASSIGN_OR_RETURN(r.parameters.c1_us_per_token, GetDouble(e, w, "c1_us_per_token"));
    KVF_ASSIGN_OR_RETURN(r.parameters.c2_us_per_token2, GetDouble(e, w, "c2_us_per_token2"));
    // Optional: files written before 2026-12-07 fitted three terms.
    KVF_ASSIGN_OR_RETURN(r.parameters.c3_us_per_prefix_token,
                         GetOptionalDouble(e, w, "c3_us_per_prefix_token"));
    KVF_ASSIGN_OR_RETURN(r.parameters.split_serial_fraction,
                         GetOptionalDouble(e, w, "split_serial_fraction"));
    KVF_ASSIGN_OR_RETURN(r.samples, GetUint(e, w, "samples"));
    KVF_ASSIGN_OR_RETURN(r.median_error_ratio, GetOptionalDouble(e, w, "median_error_ratio"));
    KVF_ASSIGN_OR_RETURN(r.worst_error_ratio, GetOptionalDouble(e, w, "worst_error_ratio"));
    KVF_ASSIGN_OR_RETURN(r.noise_floor_ratio, GetOptionalDouble(e, w, "noise_floor_ratio"));
    c.recompute.push_back(std::move(r));
  }
  KVF_RETURN_IF_ERROR(Validate(c));
  return c;
}

Status SaveBusCalibration(Env* env, const BusCalibration& calibration, const std::string& path) {
  KVF_RETURN_IF_ERROR(Validate(calibration).WithContext("calibration for " + path));
  return WriteStringToFileSync(env, BusCalibrationToJson(calibration), path);
}

StatusOr<BusCalibration> LoadBusCalibration(Env* env, const std::string& path) {
  KVF_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  auto parsed = BusCalibrationFromJson(text);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  return parsed;
}

}  // namespace kvfabric
