#include "core/bus_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/stream_copy.h"
#include "core/units.h"

namespace kvfabric {
namespace {

using SteadyClock = std::chrono::steady_clock;

double MicrosSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
}

std::string Bytes(uint64_t bytes) { return FormatBytesExact(bytes); }

// Fills `dst` with a xorshift stream: cheap, non-zero, incompressible enough for a device.
void FillPattern(std::span<std::byte> dst, uint64_t seed) {
  uint64_t x = seed | 1;
  const size_t words = dst.size() / sizeof(uint64_t);
  for (size_t w = 0; w < words; ++w) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(dst.data() + w * sizeof(uint64_t), &x, sizeof(x));
  }
}

std::vector<TransferSample> Medians(const ProbeRun& run) {
  std::vector<TransferSample> out;
  out.reserve(run.size());
  for (const SizeTiming& t : run) out.push_back({t.bytes, t.median_us});
  return out;
}

uint64_t RepeatCount(const ProbeRun& run) {
  uint64_t n = 0;
  for (const SizeTiming& t : run) n += t.repeats_us.size();
  return n;
}

class MemcpyProbe final : public PathProbe {
 public:
  MemcpyProbe(AlignedBuffer src, AlignedBuffer dst, AlignedBuffer scrub)
      : src_(std::move(src)), dst_(std::move(dst)), scrub_(std::move(scrub)) {}

  StatusOr<double> Measure(uint64_t bytes) override {
    if (bytes == 0 || bytes > src_.size()) {
      return Status::InvalidArgument("memcpy probe: " + Bytes(bytes) + " outside (0, " +
                                     Bytes(src_.size()) + "]");
    }
    Scrub();
    const auto start = SteadyClock::now();
    StreamingCopy(dst_.data(), src_.data(), bytes);
    const double us = MicrosSince(start);
    // Reading one byte of the copy keeps the compiler from dropping the memcpy.
    sink_ += static_cast<uint64_t>(dst_.data()[bytes - 1]);
    return us;
  }

 private:
  // Reads the scrub buffer so that the copy's buffers leave the caches. Clean lines are
  // evicted for free, so the timed copy pays for no write-backs of the scrub.
  void Scrub() {
    const size_t words = scrub_.size() / sizeof(uint64_t);
    const auto* p = reinterpret_cast<const uint64_t*>(scrub_.data());
    uint64_t sum = 0;
    for (size_t w = 0; w < words; w += 8) sum += p[w];  // one word per 64-byte line
    sink_ += sum;
  }

  AlignedBuffer src_;
  AlignedBuffer dst_;
  AlignedBuffer scrub_;
  uint64_t sink_ = 0;
};

class NvmeReadProbe final : public PathProbe {
 public:
  // `file_bytes` per reader: reader r reads within [r * file_bytes, (r + 1) * file_bytes).
  NvmeReadProbe(Env* env, std::string path, std::unique_ptr<RandomRWFile> file, uint64_t file_bytes,
                std::vector<AlignedBuffer> buffers)
      : env_(env),
        path_(std::move(path)),
        file_(std::move(file)),
        file_bytes_(file_bytes),
        buffers_(std::move(buffers)) {}

  ~NvmeReadProbe() override {
    // Best effort: a scratch file that cannot be closed or deleted is reported by nobody, but
    // its name says what it is.
    file_->Close().IgnoreError();
    env_->DeleteFile(path_).IgnoreError();
  }

  // Fills the file with a pattern (the first read buffer serves as the source) and syncs it.
  Status WriteScratch() {
    AlignedBuffer& b = buffers_.front();
    FillPattern(b.span(), 0x7e57);
    const uint64_t total = file_bytes_ * buffers_.size();
    for (uint64_t off = 0; off < total; off += b.size()) {
      const uint64_t n = std::min<uint64_t>(b.size(), total - off);
      KVF_RETURN_IF_ERROR(file_->Write(off, b.span().subspan(0, n)));
    }
    return file_->Sync();
  }

  StatusOr<double> Measure(uint64_t bytes) override {
    const uint64_t max = buffers_.front().size();
    if (bytes == 0 || bytes > max || bytes % kProbeGranuleBytes != 0) {
      return Status::InvalidArgument("NVMe probe: " + Bytes(bytes) +
                                     " is not a multiple of 4 KiB in (0, " + Bytes(max) + "]");
    }
    // Consecutive reads walk the file, so the next read never starts where the last ended up
    // cached in the drive.
    if (next_offset_ + bytes > file_bytes_) next_offset_ = 0;
    const uint64_t offset = next_offset_;
    next_offset_ += bytes;
    const size_t readers = buffers_.size();
    std::vector<StatusOr<size_t>> got(readers, size_t{0});
    auto read = [&](size_t r) {
      got[r] = file_->Read(r * file_bytes_ + offset, buffers_[r].span().subspan(0, bytes));
    };
    // The other readers start on threads of their own, each spinning (yielding) on `go` once
    // ready, so that thread start-up is not timed and all reads begin together.
    std::atomic<size_t> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> others;
    others.reserve(readers - 1);
    for (size_t r = 1; r < readers; ++r) {
      others.emplace_back([&, r] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        read(r);
      });
    }
    while (ready.load() < readers - 1) std::this_thread::yield();
    const auto start = SteadyClock::now();
    go.store(true, std::memory_order_release);
    read(0);
    for (std::thread& t : others) t.join();
    const double us = MicrosSince(start);
    for (size_t r = 0; r < readers; ++r) {
      if (!got[r].ok()) return got[r].status().WithContext("NVMe probe read of " + path_);
      if (*got[r] != bytes) {
        return Status::DataLoss("NVMe probe: read " + std::to_string(*got[r]) + " of " +
                                std::to_string(bytes) + " bytes at offset " +
                                std::to_string(r * file_bytes_ + offset) + " of " + path_);
      }
    }
    return us;
  }

 private:
  Env* const env_;
  const std::string path_;
  std::unique_ptr<RandomRWFile> file_;
  const uint64_t file_bytes_;
  std::vector<AlignedBuffer> buffers_;  // one per reader, max_bytes each
  uint64_t next_offset_ = 0;
};

}  // namespace

StatusOr<std::vector<uint64_t>> ProbeSizeLadder(uint64_t min_bytes, uint64_t max_bytes) {
  if (min_bytes < kProbeGranuleBytes || min_bytes % kProbeGranuleBytes != 0) {
    return Status::InvalidArgument("--min-bytes " + Bytes(min_bytes) +
                                   ": must be a positive multiple of 4 KiB (the O_DIRECT "
                                   "alignment every probe size keeps)");
  }
  if (max_bytes % kProbeGranuleBytes != 0) {
    return Status::InvalidArgument("--max-bytes " + Bytes(max_bytes) +
                                   ": must be a multiple of 4 KiB (the O_DIRECT alignment)");
  }
  if (max_bytes > kMaxProbeBytes) {
    return Status::InvalidArgument("--max-bytes " + Bytes(max_bytes) + ": above " +
                                   Bytes(kMaxProbeBytes) +
                                   ", the most one Reserve or Lease may carry");
  }
  if (max_bytes <= min_bytes) {
    return Status::InvalidArgument("--max-bytes " + Bytes(max_bytes) +
                                   " must be larger than --min-bytes " + Bytes(min_bytes) +
                                   ": fitting alpha and beta needs at least two sizes");
  }
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes;; s *= 4) {
    sizes.push_back(s);
    if (s > max_bytes / 4) break;
  }
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  return sizes;
}

uint64_t ProbeBytesPerPath(std::span<const uint64_t> sizes, int repeats) {
  uint64_t sum = 0;
  uint64_t largest = 0;
  for (uint64_t s : sizes) {
    sum += s;
    largest = std::max(largest, s);
  }
  return 2 * static_cast<uint64_t>(std::max(repeats, 0)) * sum + largest;
}

StatusOr<std::vector<uint64_t>> PlanProbeSizes(uint64_t min_bytes, uint64_t max_bytes,
                                               int repeats) {
  if (repeats < 1 || repeats > 1000) {
    return Status::InvalidArgument("--repeats " + std::to_string(repeats) +
                                   ": must be in [1, 1000] (5 is the default)");
  }
  KVF_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, ProbeSizeLadder(min_bytes, max_bytes));
  const uint64_t per_path = ProbeBytesPerPath(sizes, repeats);
  if (per_path > kMaxProbeBytesPerPath) {
    uint64_t sum = 0;
    for (uint64_t s : sizes) sum += s;
    return Status::InvalidArgument(
        "--max-bytes " + Bytes(max_bytes) + " with --repeats " + std::to_string(repeats) +
        " would move " + FormatBytes(per_path) + " over every path (2 runs x " +
        std::to_string(repeats) + " repeats x " + FormatBytes(sum) + " of sizes + a " +
        FormatBytes(max_bytes) + " warm-up), above the limit of " +
        FormatBytes(kMaxProbeBytesPerPath) + ": lower --max-bytes or --repeats");
  }
  return sizes;
}

StatusOr<BlockSplit> SplitIntoBlocks(uint64_t bytes, uint64_t max_block_bytes, uint64_t granule) {
  if (granule == 0 || granule > max_block_bytes) {
    return Status::InvalidArgument("block split: granule " + std::to_string(granule) +
                                   " not in [1, max block " + std::to_string(max_block_bytes) +
                                   "]");
  }
  if (bytes == 0 || bytes % granule != 0) {
    return Status::InvalidArgument("block split: " + std::to_string(bytes) +
                                   " bytes is not a positive multiple of " +
                                   std::to_string(granule));
  }
  const uint64_t units = bytes / granule;
  // n = units always works (blocks of one granule), so the loop ends.
  for (uint64_t n = (bytes + max_block_bytes - 1) / max_block_bytes; n <= units; ++n) {
    if (units % n == 0) return BlockSplit{bytes / n, n};
  }
  return BlockSplit{granule, units};
}

double MedianOf(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

double NoiseFloorRatio(std::span<const std::vector<double>> groups) {
  std::vector<double> ratios;
  for (const std::vector<double>& g : groups) {
    if (g.size() < 2) continue;
    const double median = MedianOf(g);
    if (!(median > 0)) continue;
    for (double v : g) ratios.push_back(v / median);
  }
  if (ratios.empty()) return 0;
  std::sort(ratios.begin(), ratios.end());
  auto rank = [&](double q) {
    const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(ratios.size())));
    return ratios[std::min(ratios.size() - 1, i == 0 ? 0 : i - 1)];
  };
  return std::max({0.0, 1 - rank(0.10), rank(0.90) - 1});
}

StatusOr<TwoProbeRuns> RunTwoProbeRuns(PathProbe& probe, std::span<const uint64_t> sizes,
                                       const ProbeRunOptions& options) {
  if (sizes.empty() || options.repeats < 1) {
    return Status::InvalidArgument("probe runs: need at least one size and one repeat");
  }
  auto measure = [&](uint64_t bytes, const char* what) -> StatusOr<double> {
    StatusOr<double> us = probe.Measure(bytes);
    if (!us.ok()) {
      return us.status().WithContext(options.label + " " + what + " " + FormatBytes(bytes));
    }
    if (!std::isfinite(*us) || *us <= 0) {
      return Status::Internal(options.label + " " + what + " " + FormatBytes(bytes) +
                              ": measured " + std::to_string(*us) + " us (not finite and > 0)");
    }
    return *us;
  };
  KVF_RETURN_IF_ERROR(measure(sizes.back(), "warm-up").status());
  // Interleaved (see the header): round r visits the sizes starting at
  // index r (mod n), and measures each size for both runs back to back, A
  // first in even rounds and B first in odd ones.
  TwoProbeRuns runs;
  const size_t n = sizes.size();
  runs.a.resize(n);
  runs.b.resize(n);
  for (size_t k = 0; k < n; ++k) runs.a[k].bytes = runs.b[k].bytes = sizes[k];
  for (int round = 0; round < options.repeats; ++round) {
    for (size_t j = 0; j < n; ++j) {
      const size_t k = (j + static_cast<size_t>(round)) % n;
      for (int half = 0; half < 2; ++half) {
        const bool a = (half == 0) == (round % 2 == 0);
        KVF_ASSIGN_OR_RETURN(double us, measure(sizes[k], a ? "run A" : "run B"));
        (a ? runs.a : runs.b)[k].repeats_us.push_back(us);
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    for (SizeTiming& t : r == 0 ? runs.a : runs.b) {
      t.median_us = MedianOf(t.repeats_us);
      if (options.progress) {
        options.progress(options.label + (r == 0 ? " run A " : " run B ") +
                         FormatBytes(t.bytes) + ": median " + FormatMicros(t.median_us) + " of " +
                         std::to_string(options.repeats) + " (" +
                         FormatRate(static_cast<double>(t.bytes) / t.median_us * 1e6) + ")");
      }
    }
  }
  return runs;
}

StatusOr<PathFit> FitAndJudge(const ProbeRun& a, const ProbeRun& b, const JudgeOptions& options) {
  if (a.empty() || a.size() != b.size()) {
    return Status::InvalidArgument("fit: runs A and B hold " + std::to_string(a.size()) + " and " +
                                   std::to_string(b.size()) +
                                   " sizes; they must cover the same non-empty set");
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].bytes != b[i].bytes) {
      return Status::InvalidArgument("fit: size " + std::to_string(i) + " is " +
                                     std::to_string(a[i].bytes) + " bytes in run A but " +
                                     std::to_string(b[i].bytes) + " in run B");
    }
  }
  PathFit fit;
  fit.target_error_ratio = options.target_error_ratio;
  const std::vector<TransferSample> medians_a = Medians(a);
  StatusOr<PathParameters> fit_a = FitPathParameters(medians_a, options.fit);
  if (!fit_a.ok()) return fit_a.status().WithContext("fit on run A");
  fit.run_a = *fit_a;

  uint64_t largest = 0;
  uint64_t smallest = UINT64_MAX;
  for (const SizeTiming& t : a) {
    largest = std::max(largest, t.bytes);
    smallest = std::min(smallest, t.bytes);
  }
  const uint64_t judge_from = std::min(options.judge_from_bytes, largest);
  std::vector<double> judged;
  std::vector<double> judged_line;
  fit.judged_min_bytes = UINT64_MAX;
  for (const SizeTiming& t : b) {
    SizeError e;
    e.bytes = t.bytes;
    e.observed_us = t.median_us;
    e.predicted_us = FetchMicros(fit.run_a, static_cast<double>(t.bytes));
    e.error = e.observed_us / e.predicted_us - 1;
    e.judged = t.bytes >= judge_from;
    if (e.judged) {
      judged.push_back(std::fabs(e.error));
      judged_line.push_back(
          std::fabs(e.observed_us / LineMicros(fit.run_a, static_cast<double>(t.bytes)) - 1));
      fit.judged_min_bytes = std::min(fit.judged_min_bytes, t.bytes);
      fit.judged_max_bytes = std::max(fit.judged_max_bytes, t.bytes);
    }
    fit.run_b.push_back(e);
  }
  // judge_from <= largest, so at least the largest size is judged.
  fit.median_abs_error = MedianOf(judged);
  fit.worst_abs_error = *std::max_element(judged.begin(), judged.end());
  fit.line_median_abs_error = MedianOf(judged_line);
  fit.line_worst_abs_error = *std::max_element(judged_line.begin(), judged_line.end());
  // The curve is kept only where it predicted run B at least as well as its line did: per-size
  // structure that does not repeat between the runs is the machine's noise, not the path's, and
  // a curve fitted to it makes every later prediction worse (measured on this VM: NVMe 12% with
  // the line, 46% with run A's curve).
  fit.size_curve_kept = !HasFlatSizeCurve(fit.run_a) &&
                        fit.worst_abs_error <= fit.line_worst_abs_error &&
                        fit.median_abs_error <= fit.line_median_abs_error;
  if (!fit.size_curve_kept) {
    fit.run_a.size_factors = PathParameters().size_factors;
    fit.median_abs_error = fit.line_median_abs_error;
    fit.worst_abs_error = fit.line_worst_abs_error;
    for (SizeError& e : fit.run_b) {
      e.predicted_us = LineMicros(fit.run_a, static_cast<double>(e.bytes));
      e.error = e.observed_us / e.predicted_us - 1;
    }
  }
  std::vector<std::vector<double>> groups;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].bytes < judge_from) continue;
    std::vector<double> g = a[i].repeats_us;
    g.insert(g.end(), b[i].repeats_us.begin(), b[i].repeats_us.end());
    groups.push_back(std::move(g));
  }
  fit.noise_floor_ratio = NoiseFloorRatio(groups);
  fit.target_met =
      fit.worst_abs_error <= std::max(options.target_error_ratio, fit.noise_floor_ratio);

  std::vector<TransferSample> both = medians_a;
  for (const TransferSample& s : Medians(b)) both.push_back(s);
  FitOptions final_options = options.fit;
  final_options.fit_size_curve = fit.size_curve_kept;
  StatusOr<PathParameters> final_fit = FitPathParameters(both, final_options);
  if (!final_fit.ok()) return final_fit.status().WithContext("fit on runs A+B");
  fit.final_parameters = *final_fit;
  fit.samples = RepeatCount(a) + RepeatCount(b);
  fit.min_bytes = smallest;
  fit.max_bytes = largest;
  return fit;
}

StatusOr<PathFit> MeasureAndFit(PathProbe& probe, std::span<const uint64_t> sizes,
                                const ProbeRunOptions& options, const JudgeOptions& judge,
                                int attempts, int* attempts_used) {
  Status last;
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    if (attempts_used != nullptr) *attempts_used = attempt;
    KVF_ASSIGN_OR_RETURN(TwoProbeRuns runs, RunTwoProbeRuns(probe, sizes, options));
    StatusOr<PathFit> fit = FitAndJudge(runs.a, runs.b, judge);
    if (fit.ok() || fit.status().code() != StatusCode::kFailedPrecondition) return fit;
    last = fit.status();
    if (attempt < attempts && options.progress) {
      options.progress(options.label + ": " + std::string(last.message()) + "; measuring again (" +
                       std::to_string(attempt + 1) + " of " + std::to_string(attempts) + ")");
    }
  }
  return last;
}

StatusOr<ConcurrencyGainReport> ProbeConcurrencyGain(
    const PathParameters& fitted, uint64_t bytes, int streams, int repeats,
    const std::function<StatusOr<double>()>& alone,
    const std::function<StatusOr<double>()>& together) {
  if (streams < 2 || repeats < 1 || bytes == 0) {
    return Status::InvalidArgument(
        "concurrency gain probe: needs streams >= 2, repeats >= 1 and "
        "bytes > 0");
  }
  std::vector<double> one, all;
  for (int r = 0; r < repeats; ++r) {
    KVF_ASSIGN_OR_RETURN(double a, alone());
    KVF_ASSIGN_OR_RETURN(double t, together());
    if (!(a > 0) || !(t > 0) || !std::isfinite(a) || !std::isfinite(t)) {
      return Status::Internal("concurrency gain probe: a time that is not finite and > 0");
    }
    one.push_back(a);
    all.push_back(t);
  }
  ConcurrencyGainReport out;
  out.streams = streams;
  out.bytes = bytes;
  out.repeats = repeats;
  out.alone_us = MedianOf(std::move(one));
  out.together_us = MedianOf(std::move(all));
  out.line_us = FetchMicros(fitted, static_cast<double>(bytes) * streams);
  out.gain = std::clamp(out.line_us / out.together_us, 1.0, kMaxConcurrencyGain);
  return out;
}

std::string FormatConcurrencyGain(const ConcurrencyGainReport& r) {
  char b[200];
  std::snprintf(b, sizeof(b),
                "%d at once of %s: %.1f ms (one alone %.1f ms; the line at gain 1: "
                "%.1f ms): gain %.2f",
                r.streams, FormatBytes(r.bytes).c_str(), r.together_us / 1e3, r.alone_us / 1e3,
                r.line_us / 1e3, r.gain);
  return b;
}

PathCalibration ToPathCalibration(BusPath path, std::string host_id, const PathFit& fit) {
  PathCalibration c;
  c.path = path;
  c.host_id = std::move(host_id);
  c.parameters = fit.final_parameters;
  c.samples = fit.samples;
  c.noise_floor_ratio = fit.noise_floor_ratio;
  c.min_bytes = fit.min_bytes;
  c.max_bytes = fit.max_bytes;
  c.median_error_ratio = fit.median_abs_error;
  c.worst_error_ratio = fit.worst_abs_error;
  return c;
}

StatusOr<std::unique_ptr<PathProbe>> CreateMemcpyProbe(const MemcpyProbeOptions& options) {
  if (options.max_bytes == 0) {
    return Status::InvalidArgument("memcpy probe: max_bytes must be > 0");
  }
  constexpr size_t kAlign = 4096;
  KVF_ASSIGN_OR_RETURN(AlignedBuffer src, AlignedBuffer::Allocate(options.max_bytes, kAlign));
  KVF_ASSIGN_OR_RETURN(AlignedBuffer dst, AlignedBuffer::Allocate(options.max_bytes, kAlign));
  AlignedBuffer scrub;
  if (options.cache_scrub_bytes > 0) {
    KVF_ASSIGN_OR_RETURN(scrub, AlignedBuffer::Allocate(options.cache_scrub_bytes, kAlign));
    FillPattern(scrub.span(), 0x5c5c);
  }
  // Allocate() zero-filled (and so faulted in) both buffers; a pattern in the source keeps the
  // copy from meeting shared zero pages anywhere.
  FillPattern(src.span(), 0x1234);
  return std::unique_ptr<PathProbe>(
      new MemcpyProbe(std::move(src), std::move(dst), std::move(scrub)));
}

StatusOr<std::unique_ptr<PathProbe>> CreateNvmeReadProbe(Env* env,
                                                         const NvmeReadProbeOptions& options) {
  const size_t align = env->DirectIoAlignment();
  if (options.max_bytes == 0 || options.max_bytes % align != 0) {
    return Status::InvalidArgument("NVMe probe: max_bytes " + std::to_string(options.max_bytes) +
                                   " is not a positive multiple of " + std::to_string(align));
  }
  if (options.readers < 1 || options.readers > kMaxNvmeProbeReaders) {
    return Status::InvalidArgument("--nvme-readers " + std::to_string(options.readers) +
                                   ": must be in [1, " + std::to_string(kMaxNvmeProbeReaders) +
                                   "] (the daemons that share the device)");
  }
  const uint64_t file_bytes =
      options.scratch_bytes != 0 ? options.scratch_bytes : 4 * options.max_bytes;
  if (file_bytes < options.max_bytes || file_bytes % align != 0) {
    return Status::InvalidArgument("NVMe probe: scratch file of " + Bytes(file_bytes) +
                                   " must be a multiple of " + std::to_string(align) +
                                   " and hold the largest read, " + Bytes(options.max_bytes));
  }
  // The buffers first: nothing may fail between creating the file and handing it to the probe.
  std::vector<AlignedBuffer> buffers;
  for (uint32_t r = 0; r < options.readers; ++r) {
    KVF_ASSIGN_OR_RETURN(AlignedBuffer buffer, AlignedBuffer::Allocate(options.max_bytes, align));
    buffers.push_back(std::move(buffer));
  }
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof(name), "/kvfabric-calibrate-%08x%08x.scratch", rd(), rd());
  const std::string path = options.dir + name;
  FileOptions fo;
  fo.direct_io = true;
  fo.create = true;
  fo.exclusive = true;
  StatusOr<std::unique_ptr<RandomRWFile>> file = env->NewRandomRWFile(path, fo);
  if (!file.ok()) {
    return file.status().WithContext("--nvme-dir " + options.dir +
                                     ": cannot create an O_DIRECT scratch file");
  }
  // From here on the probe owns the file and deletes it, also when the set-up below fails.
  auto probe =
      std::make_unique<NvmeReadProbe>(env, path, std::move(*file), file_bytes, std::move(buffers));
  Status s = probe->WriteScratch();
  if (!s.ok()) {
    return s.WithContext("--nvme-dir " + options.dir + ": writing the " +
                         Bytes(file_bytes * options.readers) +
                         " scratch file (it needs that much free space)");
  }
  return std::unique_ptr<PathProbe>(std::move(probe));
}

}  // namespace kvfabric
