// Client::Impl's landing of loaded blocks in the history: a request's
// results checked in place (CRC32C of the bytes where they landed) and
// marked landed layer by layer, the landed prefix the recompute runs wait
// for, and a loader thread's completion. Fetching is client_io.cc.
#include <algorithm>
#include <string>

#include "client/client_impl.h"
#include "core/crc32c.h"

namespace kvfabric::client {

using internal::KeyBytes;
using internal::MicrosSince;

void Client::Impl::WorkerDone(Context& c, const Status& status) {
  MutexLock l(&c.mu);
  if (!status.ok() && c.load_status.ok()) c.load_status = status;
  if (--c.load_workers == 0) {
    c.load_done = true;
    c.report.load_us = MicrosSince(c.load_start);
    prom_->ObserveLoad(c.match.kind, c.match.plan_id != 0 ? c.match.predicted_us : -1.0,
                       c.report.load_us);
    for (RunOutcome& r : c.report.runs) {
      for (std::uint32_t b = r.first_block; b < r.first_block + r.block_count; ++b) {
        r.measured_end_us = std::max(r.measured_end_us, c.landed_us[b]);
      }
    }
  }
  c.cv.NotifyAll();
}

void Client::Impl::AdvanceLandedPrefix(Context& c) {
  const std::uint32_t before = c.landed_prefix;
  while (c.landed_prefix < c.landed_us.size() && c.landed_us[c.landed_prefix] >= 0) {
    ++c.landed_prefix;
  }
  if (c.landed_prefix != before) c.cv.NotifyAll();
}

void Client::Impl::MarkLayersLanded(Context& c, std::uint32_t b, std::uint32_t first,
                                    std::uint32_t count, double now_us) {
  std::uint64_t* bits = &c.landed_layer_bits[std::size_t{b} * c.layer_words];
  bool changed = false;
  for (std::uint32_t l = first; l < first + count; ++l) {
    const std::uint64_t bit = std::uint64_t{1} << (l % 64);
    if ((bits[l / 64] & bit) != 0) continue;
    bits[l / 64] |= bit;
    ++c.layer_ready[l];
    changed = true;
  }
  if (!changed || c.landed_us[b] >= 0) return;
  if (c.layer_ready[0] == c.blocks && c.report.layer0_ready_us < 0) {
    c.report.layer0_ready_us = now_us;
  }
  for (std::uint32_t l = 0; l < o_.model.layer_count; ++l) {
    if ((bits[l / 64] & (std::uint64_t{1} << (l % 64))) == 0) {
      c.cv.NotifyAll();  // a layer became ready
      return;
    }
  }
  c.landed_us[b] = now_us;
  if (++c.landed_blocks == c.blocks) c.report.all_layers_ready_us = now_us;
  AdvanceLandedPrefix(c);
  c.cv.NotifyAll();
}

bool Client::Impl::PartlyLanded(const Context& c, std::uint32_t b) {
  if (c.landed_us[b] >= 0) return false;  // every layer
  for (std::uint32_t w = 0; w < c.layer_words; ++w) {
    if (c.landed_layer_bits[std::size_t{b} * c.layer_words + w] != 0) return true;
  }
  return false;
}

Status Client::Impl::LandResults(Context& c, const Daemon& d, std::span<const std::uint32_t> batch,
                                 LayerGroup group, std::span<const Daemon::ReadResult> results,
                                 bool from_lease, std::vector<bool>* arrived,
                                 std::vector<std::size_t>* on_nvme, std::uint64_t* moved) {
  const std::uint64_t expected = group.count == 0 ? block_bytes_ : group.count * layer_bytes_;
  Status first;
  FetchTally tally;
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const Daemon::ReadResult& r = results[k];
    const std::string what = "block " + std::to_string(batch[k]);
    Status s = r.status;
    if (s.ok() && r.payload_bytes != expected) {
      // Every size from the network is checked before the bytes are used.
      s = Status::DataLoss(what + ": daemon placed " + std::to_string(r.payload_bytes) +
                           " bytes; " +
                           (group.count == 0 ? std::string("blocks of this model are ")
                                             : std::to_string(group.count) + " layers are ") +
                           std::to_string(expected));
    } else if (s.ok()) {
      *moved += expected;
      if (Land(c, batch[k], group, r.crc32c, r.landing_checked,
               from_lease && r.tier == v1::TIER_NVME, &tally, &first)) {
        (*arrived)[k] = true;
      }
    } else if (s.IsUnavailable() && on_nvme != nullptr) {
      // Not in the host pool now (or, for a layer range, no layer CRCs
      // there): the control plane's Lease stages it whole.
      on_nvme->push_back(k);
      s = Status::OK();
    } else if (s.IsNotFound()) {
      v1::StaleEntry e;
      e.set_host_id(d.host_id());
      e.set_key(KeyBytes(c.match.chain[batch[k]]));
      MutexLock l(&c.mu);
      c.stale.push_back(std::move(e));
      s = Status::NotFound(what + ": not cached on " + d.host_id());
    } else {
      s = s.WithContext(what);
    }
    if (first.ok() && !s.ok()) first = s;
  }
  RecordFetch(c, tally);
  return first;
}

bool Client::Impl::Land(Context& c, std::uint32_t block, LayerGroup group, std::uint32_t crc,
                        bool checked, bool from_nvme, FetchTally* tally, Status* first) {
  // The bytes checked are the bytes landed: the block's page (its layers
  // `group`), where the daemon wrote them and Attend will read them, by the
  // daemon right after writing them (`checked`) or here. Bytes that fail are
  // not marked present; their fallback overwrites them.
  const std::uint32_t first_layer = group.first;
  const std::uint32_t count = group.count == 0 ? o_.model.layer_count : group.count;
  const std::span<std::byte> bytes = BlockBytes(c, block).subspan(
      std::uint64_t{first_layer} * layer_bytes_, std::uint64_t{count} * layer_bytes_);
  if (!checked && crc32c::Value(bytes) != crc) {
    ++tally->crc_failures;
    if (first->ok()) {
      *first =
          Status::DataLoss("block " + std::to_string(block) +
                           (group.count == 0 ? std::string()
                                             : " layers [" + std::to_string(first_layer) + ", " +
                                                   std::to_string(first_layer + count) + ")") +
                           ": bytes received do not match the committed CRC32C");
    }
    return false;
  }
  tally->landed.push_back({block, first_layer, count});
  tally->bytes += bytes.size();
  if (checked) tally->checked_by_daemon += bytes.size();
  (from_nvme ? tally->nvme_tier : tally->host_tier) += bytes.size();
  return true;
}

void Client::Impl::RecordFetch(Context& c, const FetchTally& tally) {
  if (tally.bytes == 0 && tally.crc_failures == 0) return;
  std::uint32_t completed = 0;
  {
    MutexLock l(&c.mu);
    c.report.bytes_fetched += tally.bytes;
    c.report.fetch_from_host_tier_bytes += tally.host_tier;
    c.report.fetch_from_nvme_tier_bytes += tally.nvme_tier;
    const double now_us = MicrosSince(c.load_start);
    for (const FetchTally::Landed& x : tally.landed) {
      const bool was = c.landed_us[x.block] >= 0;
      MarkLayersLanded(c, x.block, x.first_layer, x.layer_count, now_us);
      if (!was && c.landed_us[x.block] >= 0) ++completed;
    }
    c.report.blocks_fetched += completed;
  }
  MutexLock l(&metrics_mu_);
  m_.blocks_fetched += completed;
  m_.bytes_fetched += tally.bytes;
  m_.bytes_checked_by_daemon += tally.checked_by_daemon;
  m_.crc_failures += tally.crc_failures;
}

}  // namespace kvfabric::client
