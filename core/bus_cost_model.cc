#include "core/bus_cost_model.h"

#include <array>
#include <cmath>
#include <cstdio>

#include "core/units.h"

namespace kvfabric {
namespace {

struct PathNames {
  std::string_view arrow;
  std::string_view snake;
};

// Indexed by the enum value.
constexpr std::array<PathNames, kMaxBusPath + 1> kPathNames = {{
    {"unspecified", "unspecified"},
    {"remote→local", "remote_host_to_local_host"},
    {"local→remote", "local_host_to_remote_host"},
    {"host→device", "host_to_device"},
    {"device→host", "device_to_host"},
    {"nvme→host", "nvme_to_host"},
    {"host→nvme", "host_to_nvme"},
    {"memcpy", "local_memcpy"},
    {"daemons→client", "client_ingest"},
}};

// Three significant digits of `v` (>= 0) followed by `unit`.
std::string ThreeDigits(double v, std::string_view unit) {
  char buf[64];
  if (v >= 99.95) {
    std::snprintf(buf, sizeof(buf), "%.0f %.*s", v, static_cast<int>(unit.size()), unit.data());
  } else if (v >= 9.995) {
    std::snprintf(buf, sizeof(buf), "%.1f %.*s", v, static_cast<int>(unit.size()), unit.data());
  } else if (v >= 0.9995 || v == 0) {
    std::snprintf(buf, sizeof(buf), "%.2f %.*s", v, static_cast<int>(unit.size()), unit.data());
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g %.*s", v, static_cast<int>(unit.size()), unit.data());
  }
  return buf;
}

}  // namespace

bool IsValidBusPath(int value) { return value >= 1 && value <= kMaxBusPath; }

bool HasFlatSizeCurve(const PathParameters& p) {
  for (double k : p.size_factors) {
    if (k != 1) return false;
  }
  return true;
}

bool ConcurrencyGainValid(const PathParameters& p) {
  const double g = p.concurrency_gain;
  return std::isfinite(g) && g >= 1 && g <= kMaxConcurrencyGain;
}

bool SizeFactorsValid(const PathParameters& p) {
  for (double k : p.size_factors) {
    if (!std::isfinite(k) || k < kMinSizeFactor || k > kMaxSizeFactor) return false;
  }
  return true;
}

SizeClassWeights SizeClassWeightsFor(double bytes) {
  SizeClassWeights w;
  // Position on the knots: 0 at 64 KiB, 1 at 256 KiB, ... (two doublings per knot).
  const double x = bytes > 0 ? (std::log2(bytes) - 16.0) / 2.0 : 0.0;
  if (!(x > 0)) return w;  // also NaN
  if (x >= kSizeClasses - 1) {
    w.first = kSizeClasses - 1;
    return w;
  }
  w.first = static_cast<int>(x);
  const double frac = x - w.first;
  w.weights[0] = 1 - frac;
  w.weights[1] = frac;
  return w;
}

double SizeFactor(const PathParameters& p, double bytes) {
  const SizeClassWeights w = SizeClassWeightsFor(bytes);
  double k = w.weights[0] * p.size_factors[w.first];
  if (w.weights[1] > 0) k += w.weights[1] * p.size_factors[w.first + 1];
  return k;
}

PathParameters AtSize(const PathParameters& p, double bytes) {
  const double k = SizeFactor(p, bytes);
  PathParameters out;
  out.alpha_us = p.alpha_us * k;
  out.beta_bytes_per_s = p.beta_bytes_per_s / k;
  out.concurrency_gain = p.concurrency_gain;
  return out;
}

std::string_view BusPathArrowName(BusPath path) {
  const int v = static_cast<int>(path);
  return IsValidBusPath(v) ? kPathNames[v].arrow : kPathNames[0].arrow;
}

std::string_view BusPathName(BusPath path) {
  const int v = static_cast<int>(path);
  return IsValidBusPath(v) ? kPathNames[v].snake : kPathNames[0].snake;
}

std::optional<BusPath> BusPathFromName(std::string_view name) {
  for (int v = 1; v <= kMaxBusPath; ++v) {
    if (kPathNames[v].snake == name) return static_cast<BusPath>(v);
  }
  return std::nullopt;
}

std::string FormatMicros(double us) {
  if (std::isnan(us)) return "nan";
  if (std::isinf(us)) return us > 0 ? "inf" : "-inf";
  if (us < 0) return "-" + FormatMicros(-us);
  if (us == 0) return "0 µs";
  // Pick the unit after rounding to three digits, so 999.96 µs prints as "1.00 ms".
  if (us < 0.9995) return ThreeDigits(us * 1e3, "ns");
  if (us < 999.5) return ThreeDigits(us, "µs");
  if (us < 999.5e3) return ThreeDigits(us / 1e3, "ms");
  return ThreeDigits(us / 1e6, "s");
}

std::string FormatRate(double bytes_per_s) {
  if (!std::isfinite(bytes_per_s)) return std::isnan(bytes_per_s) ? "nan" : "inf B/s";
  if (bytes_per_s < 999.5) return ThreeDigits(bytes_per_s, "B/s");
  if (bytes_per_s < 999.5e3) return ThreeDigits(bytes_per_s / 1e3, "kB/s");
  if (bytes_per_s < 999.5e6) return ThreeDigits(bytes_per_s / 1e6, "MB/s");
  if (bytes_per_s < 999.5e9) return ThreeDigits(bytes_per_s / 1e9, "GB/s");
  return ThreeDigits(bytes_per_s / 1e12, "TB/s");
}

std::string ExplainFetch(BusPath path, const PathParameters& p, uint64_t bytes) {
  std::string out = "t_fetch(";
  out += BusPathArrowName(path);
  out += ", ";
  out += FormatBytes(bytes);
  out += ") = " + FormatMicros(p.alpha_us) + " + " + std::to_string(bytes) + " B / " +
         FormatRate(p.beta_bytes_per_s);
  const double k = SizeFactor(p, static_cast<double>(bytes));
  if (k != 1) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.3f", k);
    out += std::string(" × ") + buf + " (size curve at " + FormatBytes(bytes) + ")";
  }
  out += " = " + FormatMicros(FetchMicros(p, static_cast<double>(bytes)));
  return out;
}

std::string ExplainRecompute(const RecomputeParameters& r, uint64_t n, uint64_t prefix) {
  // Nothing to prefill costs nothing, not c0 (nor c3 p): say so rather than list terms that
  // do not add up to the result.
  if (n == 0) {
    return "t_recompute(n=0, p=" + std::to_string(prefix) + ") = 0 µs (nothing to prefill)";
  }
  const double nd = static_cast<double>(n);
  const double pd = static_cast<double>(prefix);
  char half[32];
  // n/2 is a whole number or ends in .5.
  if (n % 2 == 0) {
    std::snprintf(half, sizeof(half), "%llu", static_cast<unsigned long long>(n / 2));
  } else {
    std::snprintf(half, sizeof(half), "%llu.5", static_cast<unsigned long long>(n / 2));
  }
  std::string out = "t_recompute(n=" + std::to_string(n) + ", p=" + std::to_string(prefix) +
                    ") = " + FormatMicros(r.c0_us) + " + " + std::to_string(n) + " × " +
                    FormatMicros(r.c1_us_per_token) + " + " + std::to_string(n) + " × (" +
                    std::to_string(prefix) + " + " + half + ") × " +
                    FormatMicros(r.c2_us_per_token2);
  if (r.c3_us_per_prefix_token != 0) {
    out += " + " + std::to_string(prefix) + " × " + FormatMicros(r.c3_us_per_prefix_token);
  }
  out += " = " + FormatMicros(RecomputeMicros(r, nd, pd));
  return out;
}

std::string FormatRecomputeModel(const RecomputeParameters& r) {
  char b[192];
  int n = std::snprintf(b, sizeof(b), "t = %.1f us + %.3f us * n + %.5f us * n * (p + n/2)",
                        r.c0_us, r.c1_us_per_token, r.c2_us_per_token2);
  if (r.c3_us_per_prefix_token != 0 && n > 0 && static_cast<std::size_t>(n) < sizeof(b)) {
    std::snprintf(b + n, sizeof(b) - static_cast<std::size_t>(n), " + %.3f us * p",
                  r.c3_us_per_prefix_token);
  }
  return b;
}

}  // namespace kvfabric
