// Copy and CRC baselines for the load benchmarks, measured in the same run
// as what they are compared with (STYLE.md): memcpy with one or more
// threads, CRC32C cold and in cache, and the checked copy (copy and CRC,
// core/crc32c.h) each way the CPU offers.
#ifndef KVFABRIC_BENCH_COPY_BASELINES_H_
#define KVFABRIC_BENCH_COPY_BASELINES_H_

#include <cstdint>

namespace kvfabric::bench {

// Best of 3 copies of `bytes` with `threads` threads (each its share), GB/s
// of bytes copied (each byte read once and written once).
double MemcpyGBps(std::uint64_t bytes, int threads);

// Prints the CRC32C lines (cold over `history_bytes`, and a 64 KiB piece in cache)
// and one checked-copy line per one-pass path the CPU has, each as GB/s and
// as a multiple of `mem1` (one thread's memcpy of the same bytes).
void PrintCrcAndCheckedCopy(std::uint64_t history_bytes, double mem1);

}  // namespace kvfabric::bench

#endif  // KVFABRIC_BENCH_COPY_BASELINES_H_
