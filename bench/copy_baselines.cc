#include "bench/copy_baselines.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/crc32c.h"

namespace kvfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Best of three passes of `pass(offset, n)` over `bytes` in 2 MiB blocks,
// each pass cold (the caches filled with other bytes first), GB/s.
template <typename Pass>
double ColdBlocksGBps(std::uint64_t bytes, Pass pass) {
  std::vector<char> evict(bytes, 2);
  double best = 0;
  volatile std::uint32_t sink = 0;
  for (int i = 0; i < 3; ++i) {
    std::memset(evict.data(), i, evict.size());
    const auto t0 = Clock::now();
    for (std::uint64_t o = 0; o < bytes; o += 2 << 20) {
      sink = sink + pass(o, std::min<std::uint64_t>(2 << 20, bytes - o));
    }
    best = std::max(best, bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  return best;
}

// CRC32C of `bytes`, cold (as a landing pass reads what a daemon just
// wrote).
double CrcGBps(std::uint64_t bytes,
               std::uint32_t (*extend)(std::uint32_t, const void*, std::size_t)) {
  std::vector<char> a(bytes, 1);
  return ColdBlocksGBps(
      bytes, [&](std::uint64_t o, std::uint64_t n) { return extend(0, a.data() + o, n); });
}

// A checked copy of `bytes`, cold (the daemon's landing check and kStore's
// pull, core/guarded_copy.h), GB/s of bytes copied. `way`: 0 one pass
// folding, with streaming stores, 1 the same with ordinary stores, 2 memcpy
// then read back 64 KiB at a time, 3 one pass with the `crc32` instruction,
// streaming stores, 4 the same with ordinary stores.
double CheckedCopyGBps(std::uint64_t bytes, int way) {
  namespace ci = crc32c::internal;
  std::vector<char> a(bytes, 1), b(bytes, 3);
  return ColdBlocksGBps(bytes, [&](std::uint64_t o, std::uint64_t n) {
    switch (way) {
      case 0:
      case 1:
        return ci::ExtendCopyFolding(0, b.data() + o, a.data() + o, n, way == 0);
      case 2:
        return ci::ExtendCopyReadBack(0, b.data() + o, a.data() + o, n);
      default:
        return ci::ExtendCopyHardware(0, b.data() + o, a.data() + o, n, way == 3);
    }
  });
}

// CRC32C of one 64 KiB piece, again and again: in cache, as a daemon's
// checked copy reads each piece back (core/guarded_copy.h). GB/s.
double HotCrcGBps(std::uint32_t (*extend)(std::uint32_t, const void*, std::size_t)) {
  std::vector<char> piece(64 << 10, 3);
  volatile std::uint32_t sink = 0;
  const int rounds = 16384;  // 1 GiB
  const auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) sink = sink + extend(0, piece.data(), piece.size());
  return static_cast<double>(piece.size()) * rounds / Seconds(t0, Clock::now()) / 1e9;
}

}  // namespace

double MemcpyGBps(std::uint64_t bytes, int threads) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);  // fault both in
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    const std::uint64_t share = bytes / threads;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] { std::memcpy(b.data() + t * share, a.data() + t * share, share); });
    }
    for (auto& t : ts) t.join();
    best = std::max(best, bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  return best;
}

void PrintCrcAndCheckedCopy(std::uint64_t history_bytes, double mem1) {
  const double hw = crc32c::internal::HardwareAvailable()
                        ? CrcGBps(history_bytes, &crc32c::internal::ExtendHardware)
                        : 0;
  const double fold = crc32c::internal::FoldingAvailable()
                          ? CrcGBps(history_bytes, &crc32c::internal::ExtendFolding)
                          : 0;
  std::printf(
      "CRC32C of one history, cold: crc32 instruction %.2f GB/s (%.2fx memcpy), folding "
      "(VPCLMULQDQ) %.2f GB/s (%.2fx memcpy)%s\n",
      hw, hw / mem1, fold, fold / mem1,
      crc32c::internal::FoldingAvailable() ? "" : " (not on this CPU)");
  const double hot_hw =
      crc32c::internal::HardwareAvailable() ? HotCrcGBps(&crc32c::internal::ExtendHardware) : 0;
  const double hot_fold =
      crc32c::internal::FoldingAvailable() ? HotCrcGBps(&crc32c::internal::ExtendFolding) : 0;
  std::printf(
      "CRC32C of a 64 KiB piece in cache: crc32 instruction %.1f GB/s, folding %.1f GB/s "
      "(%.1fx)\n",
      hot_hw, hot_fold, hot_hw > 0 ? hot_fold / hot_hw : 0.0);
  // What the daemons' landing check and kStore's pull run here
  // (crc32c::ExtendCopy's choice), then the alternatives.
  const double back = CheckedCopyGBps(history_bytes, 2);
  // One line per one-pass path the CPU has: `way` streams, way + 1 stores.
  auto one_pass = [&](const char* how, int way) {
    const double streamed = CheckedCopyGBps(history_bytes, way);
    const double stored = CheckedCopyGBps(history_bytes, way + 1);
    std::printf(
        "checked copy of one history, cold: one pass %s, streaming stores %.2f GB/s (%.2fx "
        "memcpy), ordinary stores %.2f GB/s (%.2fx); memcpy then read back %.2f GB/s (%.2fx)\n",
        how, streamed, streamed / mem1, stored, stored / mem1, back, back / mem1);
  };
  const bool folds = crc32c::internal::FoldingAvailable();
  if (folds) one_pass("folding (VPCLMULQDQ)", 0);
  if (crc32c::internal::HardwareAvailable()) {
    one_pass(
        folds ? "with the crc32 instruction (not used: folding is)" : "with the crc32 instruction",
        3);
  } else if (!folds) {
    std::printf(
        "checked copy of one history, cold: memcpy then read back %.2f GB/s (%.2fx memcpy); "
        "no one-pass copy on this CPU\n",
        back, back / mem1);
  }
}

}  // namespace kvfabric::bench
