// page_clear_bench: what clearing reused pool pages would cost a PUT, against
// the work the daemon already does for every PUT in the same run.
//
// Issue 17's choice: a reservation must never expose bytes its writer did not
// write. Either the daemon clears every page it hands to a reservation
// (memset), or it records which ranges a transfer wrote and refuses a commit
// that covers others (what the lease table does; O(1) per transfer). This
// prints, per block size, the daemon's own per-PUT work (landing the payload,
// a copy over shared memory, and Commit's CRC32C) and the memset clearing
// would add, walking a pool larger than the caches so every block is cold as
// a reused block is.
//
//   page_clear_bench [--pool-mib 1024] [--repeat 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/crc32c.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t pool_mib = 1024;
  int repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--pool-mib") {
      pool_mib = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--repeat") {
      repeat = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (pool_mib < 64 || repeat < 1) {
    std::fprintf(stderr, "--pool-mib must be >= 64 and --repeat >= 1\n");
    return 2;
  }
  const std::size_t pool_bytes = pool_mib << 20;
  auto pool_or = kvfabric::AlignedBuffer::Allocate(pool_bytes, 4096);
  if (!pool_or.ok()) {
    std::fprintf(stderr, "pool of %zu MiB: %s\n", pool_mib, pool_or.status().ToString().c_str());
    return 1;
  }
  kvfabric::AlignedBuffer pool = *std::move(pool_or);
  std::memset(pool.data(), 1, pool_bytes);  // prefault, as the daemon does
  std::printf("page_clear_bench: pool %zu MiB, median of %d passes over the whole pool\n",
              pool_mib, repeat);
  std::printf("%-10s %12s %12s %12s %14s\n", "block", "copy GB/s", "crc GB/s", "clear GB/s",
              "clear/(copy+crc)");
  for (std::size_t block : {std::size_t{256} << 10, std::size_t{2} << 20}) {
    auto src_or = kvfabric::AlignedBuffer::Allocate(block, 4096);
    if (!src_or.ok()) return 1;
    kvfabric::AlignedBuffer src = *std::move(src_or);
    for (std::size_t i = 0; i < block; ++i) src.data()[i] = static_cast<std::byte>(i * 31);
    const std::size_t blocks = pool_bytes / block;
    std::vector<double> copy, crc, clear;
    std::uint32_t sink = 0;
    for (int r = 0; r < repeat; ++r) {
      auto t0 = Clock::now();
      for (std::size_t b = 0; b < blocks; ++b) std::memcpy(pool.data() + b * block, src.data(), block);
      auto t1 = Clock::now();
      for (std::size_t b = 0; b < blocks; ++b) {
        sink ^= kvfabric::crc32c::Value(pool.data() + b * block, block);
      }
      auto t2 = Clock::now();
      for (std::size_t b = 0; b < blocks; ++b) std::memset(pool.data() + b * block, 0, block);
      auto t3 = Clock::now();
      copy.push_back(Seconds(t0, t1));
      crc.push_back(Seconds(t1, t2));
      clear.push_back(Seconds(t2, t3));
    }
    const double gb = static_cast<double>(pool_bytes) / 1e9;
    const double c = Median(copy), k = Median(crc), z = Median(clear);
    std::printf("%-10s %12.2f %12.2f %12.2f %14.2f\n",
                block == (256u << 10) ? "256 KiB" : "2 MiB", gb / c, gb / k, gb / z, z / (c + k));
    if (sink == 0x12345678) std::printf(" ");
  }
  std::printf("written-range tracking: one interval merge per transfer under the table mutex\n");
  return 0;
}
