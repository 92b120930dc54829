// Small statistics the benchmarks print: header only, no dependencies.
#ifndef KVFABRIC_BENCH_BENCH_STATS_H_
#define KVFABRIC_BENCH_BENCH_STATS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvfabric::bench {

// The q-quantile (0 <= q <= 1) of `v` by nearest rank on the sorted values; 0 for an empty `v`.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = q * static_cast<double>(v.size() - 1) + 0.5;
  const std::size_t i = rank <= 0 ? 0 : static_cast<std::size_t>(rank);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace kvfabric::bench

#endif  // KVFABRIC_BENCH_BENCH_STATS_H_
