#include "server/cache_host/compact_converter.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>

#include "core/block_key.h"
#include "core/crc32c.h"
#include "core/mutex.h"
#include "gpu/kernels/compact_int8.h"

namespace kvfabric::cache_host {

Status CompactConverterOptions::Validate() const {
  if (threads < 0 || threads > 64) {
    return Status::InvalidArgument("--compact-threads " + std::to_string(threads) +
                                   " must be in [0, 64]");
  }
  if (queue_blocks == 0) {
    return Status::InvalidArgument("--compact-queue-blocks must be at least 1");
  }
  if (max_block_bytes == 0 || max_block_bytes > kMaxBlockPayloadBytes) {
    return Status::InvalidArgument("the compact converter's largest block (" +
                                   std::to_string(max_block_bytes) + " bytes) must be in [1, " +
                                   std::to_string(kMaxBlockPayloadBytes) + "]");
  }
  return Status::OK();
}

struct CompactConverter::Job {
  std::string tenant;
  BlockKey key;
  BlockMeta meta;
};

// Shared with the node's event tap, which holds it weakly: an event that
// arrives while the converter is being destroyed finds it gone.
struct CompactConverter::State {
  std::size_t queue_limit = 0;
  Mutex mu;
  CondVar cv;
  std::deque<Job> queue KVF_GUARDED_BY(mu);
  bool stopping KVF_GUARDED_BY(mu) = false;
  std::size_t busy KVF_GUARDED_BY(mu) = 0;  // workers converting now
  // Workers start nothing before this (a pause).
  std::chrono::steady_clock::time_point resume_at KVF_GUARDED_BY(mu){};
  CompactConversionStats stats KVF_GUARDED_BY(mu);
  // Rate limit of the kError log line.
  std::chrono::steady_clock::time_point next_log KVF_GUARDED_BY(mu){};
  std::uint64_t unlogged KVF_GUARDED_BY(mu) = 0;

  // Queues a job, dropping the oldest when full. REQUIRES: mu held.
  void Push(Job job) KVF_REQUIRES(mu) {
    queue.push_back(std::move(job));
    while (queue.size() > queue_limit) {
      queue.pop_front();
      ++stats.dropped;
    }
  }
};

namespace {

bool Convertible(const BlockMeta& m) {
  return m.representation == BlockRepresentation::kExact &&
         (m.dtype == KvDtype::kFp16 || m.dtype == KvDtype::kBf16 || m.dtype == KvDtype::kFp32) &&
         m.layers > 0 && m.tokens > 0 && m.kv_heads > 0 && m.head_dim > 0;
}

}  // namespace

CompactConverter::CompactConverter(CompactConverterOptions options, CacheHostNode* node)
    : options_(std::move(options)),
      node_(node),
      min_free_bytes_(options_.min_free_bytes.value_or(node->pool_bytes() / 10)),
      state_(std::make_shared<State>()) {
  state_->queue_limit = options_.queue_blocks;
  MutexLock lock(&state_->mu);
  state_->stats.threads = static_cast<std::uint32_t>(options_.threads);
}

StatusOr<std::unique_ptr<CompactConverter>> CompactConverter::Create(
    CompactConverterOptions options, CacheHostNode* node) {
  KVF_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<CompactConverter> c(new CompactConverter(std::move(options), node));
  if (c->options_.threads == 0) return c;
  for (int i = 0; i < 2 * c->options_.threads; ++i) {
    auto b = AlignedBuffer::Allocate(c->options_.max_block_bytes, 64);
    if (!b.ok()) {
      return b.status().WithContext("compact converter buffers (--compact-threads " +
                                    std::to_string(c->options_.threads) + ")");
    }
    c->buffers_.push_back(std::move(*b));
  }
  std::weak_ptr<State> weak = c->state_;
  node->set_block_event_tap([weak](std::vector<BlockEventRecord> events) {
    std::shared_ptr<State> s = weak.lock();
    if (!s) return;
    MutexLock lock(&s->mu);
    bool queued = false;
    for (BlockEventRecord& e : events) {
      if (e.kind != BlockEventKind::kCommitted || !Convertible(e.meta)) continue;
      s->Push(Job{std::move(e.tenant), e.key, e.meta});
      queued = true;
    }
    if (queued) s->cv.NotifyAll();
  });
  for (int i = 0; i < c->options_.threads; ++i) {
    c->workers_.emplace_back([raw = c.get(), i] { raw->Work(static_cast<std::size_t>(i)); });
  }
  spdlog::info(
      "compact converter: {} threads, {} bytes of buffers, queue of {} blocks, pauses under {} "
      "free bytes (--compact-min-free-bytes)",
      c->options_.threads, 2 * c->options_.max_block_bytes * c->options_.threads,
      c->options_.queue_blocks, c->min_free_bytes_);
  return c;
}

CompactConverter::~CompactConverter() {
  if (!workers_.empty()) node_->set_block_event_tap(nullptr);
  {
    MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->queue.clear();
    state_->cv.NotifyAll();
  }
  for (std::thread& t : workers_) t.join();
}

CompactConversionStats CompactConverter::Stats() const {
  MutexLock lock(&state_->mu);
  CompactConversionStats s = state_->stats;
  s.queued = state_->queue.size();
  return s;
}

bool CompactConverter::TEST_WaitIdle(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&state_->mu);
  while (!state_->queue.empty() || state_->busy > 0) {
    if (state_->cv.WaitUntil(&state_->mu, deadline) == std::cv_status::timeout) return false;
  }
  return true;
}

void CompactConverter::Work(std::size_t worker) {
  const std::span<std::byte> exact = buffers_[2 * worker].span();
  const std::span<std::byte> compact = buffers_[2 * worker + 1].span();
  State& s = *state_;
  MutexLock lock(&s.mu);
  for (;;) {
    while (!s.stopping && (s.queue.empty() || std::chrono::steady_clock::now() < s.resume_at)) {
      if (s.queue.empty()) {
        s.cv.Wait(&s.mu);
      } else {
        s.cv.WaitUntil(&s.mu, s.resume_at);
      }
    }
    if (s.stopping) return;
    Job job = std::move(s.queue.front());
    s.queue.pop_front();
    ++s.busy;
    lock.Unlock();
    const auto start = std::chrono::steady_clock::now();
    const Outcome outcome = Convert(job, exact, compact);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.Lock();
    --s.busy;
    s.stats.seconds += seconds;
    if (outcome != Outcome::kDone) {
      ++(outcome == Outcome::kPause ? s.stats.paused : s.stats.paused_for_load);
      s.resume_at = std::chrono::steady_clock::now() + options_.retry_interval;
      // Back at the head: the oldest pending block is still the next one
      // tried, and the first dropped if newer commits filled the queue.
      s.queue.push_front(std::move(job));
      while (s.queue.size() > s.queue_limit) {
        s.queue.pop_front();
        ++s.stats.dropped;
      }
    }
    s.cv.NotifyAll();  // TEST_WaitIdle, and workers waiting on resume_at
  }
}

void CompactConverter::Fail(CompactFailure reason, const Status& status) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  ++s.stats.failed[static_cast<std::size_t>(reason)];
  if (reason != CompactFailure::kError) return;
  ++s.unlogged;
  const auto now = std::chrono::steady_clock::now();
  if (now < s.next_log) return;
  spdlog::warn("compact converter: {} conversions failed since the last line; the last: {}",
               s.unlogged, status.ToString());
  s.unlogged = 0;
  s.next_log = now + std::chrono::seconds(10);
}

CompactConverter::Outcome CompactConverter::Convert(const Job& job, std::span<std::byte> exact,
                                                    std::span<std::byte> compact) {
  const BlockMeta& m = job.meta;
  const Namespace ns{job.tenant};
  const gpu::CompactShape shape{m.dtype, m.layers, m.tokens, m.kv_heads, m.head_dim};
  const std::uint64_t compact_bytes =
      gpu::CompactPayloadBytes(m.layers, m.tokens, m.kv_heads, m.head_dim);
  if (m.bytes > exact.size()) {
    Fail(CompactFailure::kTooLarge, Status::OK());
    return Outcome::kDone;
  }
  if (compact_bytes >= m.bytes) {
    Fail(CompactFailure::kNoSaving, Status::OK());
    return Outcome::kDone;
  }
  const BlockKey key = CompactInt8BlockKey(job.key);
  // Already converted (a block committed again after a restart, say).
  if (node_->Lookup(ns, std::span<const BlockKey>(&key, 1))[0].status.ok()) {
    return Outcome::kDone;
  }

  // Never below the floor with the copy placed: min_free_bytes, and the
  // high watermark's reserve, above which the maintenance thread evicts.
  const std::uint64_t pool = node_->pool_bytes();
  const std::uint64_t page = node_->page_bytes();
  const std::uint64_t pages = pool / page;
  const double high = node_->options().watermarks.high;
  const std::uint64_t reserve =
      (pages - static_cast<std::uint64_t>(static_cast<double>(pages) * high)) * page;
  const std::uint64_t copy = (compact_bytes + page - 1) / page * page;
  if (node_->host_free_bytes() < std::max(min_free_bytes_, reserve) + copy) return Outcome::kPause;
  // Loads in flight come first: their leases pin pages and their transfers
  // want the memory bus this copy would use.
  if (options_.pause_above_leases != 0 && node_->active_leases() > options_.pause_above_leases) {
    return Outcome::kPauseForLoad;
  }

  // Read the exact block under a host-only lease: no staging I/O, and its
  // pages stay put while they are copied.
  LeaseRequestOptions lease_options;
  lease_options.ttl_us = options_.ttl_us;
  lease_options.host_only = true;
  lease_options.count_access = false;  // converting a block is no use of it
  auto leased = node_->Lease(ns, std::span<const BlockKey>(&job.key, 1), lease_options);
  if (!leased.ok()) {
    Fail(CompactFailure::kError, leased.status());
    return Outcome::kDone;
  }
  const LeaseEntryResult& r = leased->results[0];
  if (!r.status.ok()) {
    const bool gone = r.status.IsNotFound() || r.status.IsUnavailable();
    Fail(gone ? CompactFailure::kEvicted : CompactFailure::kError, r.status);
    return Outcome::kDone;
  }
  const GrantRef read{leased->grant.lease_id, leased->grant.token};
  const std::span<std::byte> in = exact.first(r.meta.bytes);
  Status s = r.meta.bytes == m.bytes ? node_->ReadLeasedBlock(ns, read, job.key, in)
                                     : Status::Internal("block size changed since its commit");
  ReleaseEntry release{read.lease_id, read.token, {}};
  node_->Release(ns, std::span<const ReleaseEntry>(&release, 1));
  if (s.ok() && crc32c::Value(in) != r.crc32c) {
    s = Status::DataLoss("block " + job.key.ToHex() + " read back with another CRC32C");
  }
  if (!s.ok()) {
    Fail(CompactFailure::kError, s);
    return Outcome::kDone;
  }

  const std::span<std::byte> out = compact.first(compact_bytes);
  if (Status e = gpu::EncodeCompactInt8(shape, in, out); !e.ok()) {
    Fail(CompactFailure::kEncode, e);
    return Outcome::kDone;
  }
  // The copy's CRC, folded from its layer slices' (docs/block-format.md,
  // "Layer CRC table"); the node computes the same table again at commit
  // and checks it folds to this.
  const std::uint64_t slice = compact_bytes / m.layers;
  std::uint32_t crc = 0;
  for (std::uint32_t l = 0; l < m.layers; ++l) {
    const std::uint32_t c = crc32c::Value(out.subspan(l * slice, slice));
    crc = l == 0 ? c : crc32c::Combine(crc, c, slice);
  }

  ReserveEntry entry{key, m};
  entry.meta.bytes = compact_bytes;
  entry.meta.representation = BlockRepresentation::kCompactInt8;
  auto reserved =
      node_->ReserveWithoutEviction(ns, std::span<const ReserveEntry>(&entry, 1), options_.ttl_us);
  if (!reserved.ok()) {
    Fail(CompactFailure::kError, reserved.status());
    return Outcome::kDone;
  }
  const Status& rs = reserved->results[0].status;
  if (rs.code() == StatusCode::kResourceExhausted) return Outcome::kPause;  // no room: later
  if (rs.code() == StatusCode::kAlreadyExists) return Outcome::kDone;       // another made it
  if (!rs.ok()) {
    Fail(CompactFailure::kError, rs);
    return Outcome::kDone;
  }
  const GrantRef write{reserved->grant.lease_id, reserved->grant.token};
  s = node_->WriteReservedBlock(ns, write, key, out);
  if (s.ok()) {
    CommitEntry commit{key, crc};
    auto committed = node_->Commit(ns, write, std::span<const CommitEntry>(&commit, 1),
                                   /*release_uncommitted=*/true);
    s = committed.ok() ? (*committed)[0] : committed.status();
  } else {
    ReleaseEntry abort{write.lease_id, write.token, {}};
    node_->Release(ns, std::span<const ReleaseEntry>(&abort, 1));
  }
  if (!s.ok()) {
    Fail(CompactFailure::kError, s);
    return Outcome::kDone;
  }
  MutexLock lock(&state_->mu);
  ++state_->stats.converted;
  state_->stats.bytes_written += compact_bytes;
  state_->stats.exact_bytes_converted += m.bytes;
  return Outcome::kDone;
}

}  // namespace kvfabric::cache_host
