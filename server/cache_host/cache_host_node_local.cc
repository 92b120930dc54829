// CacheHostNode's in-process blocks (cache_host_node.h, "In-process
// blocks"): reading a leased block and writing a reserved one without a
// transport, for the compact converter. Split from cache_host_node.cc.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "core/mutex.h"
#include "server/cache_host/cache_host_node.h"

namespace kvfabric::cache_host {

StatusOr<ReserveBatch> CacheHostNode::ReserveWithoutEviction(const Namespace& ns,
                                                             std::span<const ReserveEntry> entries,
                                                             std::uint64_t ttl_us) {
  return ReserveImpl(ns, entries, ttl_us, /*make_room=*/false);
}

std::optional<CacheHostNode::GrantBlock> CacheHostNode::FindGrantBlock(const Namespace& ns,
                                                                       const GrantRef& ref,
                                                                       const BlockKey& key,
                                                                       bool write) {
  MutexLock lock(&mu_);
  auto it = FindOwnedGrant(ns, ref);
  if (it == grants_.end() || it->second.write != write) return std::nullopt;
  for (const GrantBlock& b : it->second.blocks) {
    if (b.key == key && !b.released && !b.committed) return b;
  }
  return std::nullopt;
}

namespace {

Status NotHeld(const BlockKey& key, std::uint64_t lease_id, bool write) {
  return Status::NotFound("block " + key.ToHex() + " is not " + (write ? "reserved" : "leased") +
                          " under lease " + std::to_string(lease_id) +
                          ", or the access token is not its");
}

Status WrongSize(std::uint64_t given, std::uint64_t block) {
  return Status::InvalidArgument(std::to_string(given) + " bytes for a block of " +
                                 std::to_string(block));
}

}  // namespace

Status CacheHostNode::WriteReservedBlock(const Namespace& ns, const GrantRef& grant,
                                         const BlockKey& key, std::span<const std::byte> payload) {
  const std::optional<GrantBlock> b = FindGrantBlock(ns, grant, key, /*write=*/true);
  if (!b.has_value()) return NotHeld(key, grant.lease_id, true);
  if (payload.size() != b->bytes) return WrongSize(payload.size(), b->bytes);
  // The table brackets the copy (expiry cannot recycle the pages under it)
  // and records the bytes as written.
  return table_->CopyIn(b->sub_id, payload);
}

Status CacheHostNode::ReadLeasedBlock(const Namespace& ns, const GrantRef& grant,
                                      const BlockKey& key, std::span<std::byte> out) {
  const std::optional<GrantBlock> b = FindGrantBlock(ns, grant, key, /*write=*/false);
  if (!b.has_value()) return NotHeld(key, grant.lease_id, false);
  if (out.size() != b->bytes) return WrongSize(out.size(), b->bytes);
  // The same bracket as a data-plane read: the grant's table lease must
  // still pin these pages (BeginReadRange refuses a lease that expired).
  const std::vector<ByteExtent> extents = ExtentsOf(b->pages, b->bytes);
  KVF_ASSIGN_OR_RETURN(TransferTicket ticket,
                       BeginTransfer(grant.lease_id, grant.token, /*write=*/false, extents));
  std::uint64_t at = 0;
  for (const PageRun& run : b->pages) {
    const std::span<std::byte> src = pool_->RunBytes(run);
    const std::uint64_t n = std::min<std::uint64_t>(src.size(), out.size() - at);
    std::memcpy(out.data() + at, src.data(), n);
    at += n;
    if (at == out.size()) break;
  }
  EndTransfer(ticket, /*landed=*/true);
  return Status::OK();
}

}  // namespace kvfabric::cache_host
