#include "server/cache_host_convert.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "proto/wire_limits.h"

namespace kvfabric {

namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

std::string DigestHex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

std::string BytesOf(std::span<const std::uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

// ---------------------------------------------------------------- checks

Status CheckBatchSize(std::string_view field, std::size_t n, const v1::Limits& limits) {
  if (n == 0) {
    return Status::InvalidArgument(std::string(field) + ": 0, at least 1 required");
  }
  if (n > limits.max_keys_per_batch()) {
    return Status::InvalidArgument(std::string(field) + ": " + Num(n) + " > max_keys_per_batch " +
                                   Num(limits.max_keys_per_batch()));
  }
  return Status::OK();
}

Status CheckNamespace(std::string_view ns, const v1::Limits& limits) {
  if (ns.size() > limits.max_namespace_bytes()) {
    return Status::InvalidArgument("namespace: " + Num(ns.size()) +
                                   " bytes > max_namespace_bytes " +
                                   Num(limits.max_namespace_bytes()));
  }
  return Status::OK();
}

Status CheckTtlMs(std::uint32_t ttl_ms, const v1::Limits& limits) {
  if (ttl_ms > limits.max_ttl_ms()) {
    return Status::InvalidArgument("ttl_ms: " + Num(ttl_ms) + " > max_ttl_ms " +
                                   Num(limits.max_ttl_ms()));
  }
  return Status::OK();
}

Status CheckCallLive(bool cancelled, std::chrono::system_clock::time_point deadline,
                     std::chrono::system_clock::time_point now) {
  if (cancelled) return Status::Cancelled("the client cancelled the call");
  if (deadline <= now) {
    return Status::DeadlineExceeded("the call's deadline passed before the daemon started it");
  }
  return Status::OK();
}

// ---------------------------------------------------------------- keys

StatusOr<BlockKey> BlockKeyFromProto(std::string_view bytes, std::string_view field) {
  if (bytes.size() != BlockKey::kSize) {
    return Status::InvalidArgument(std::string(field) + ": " + Num(bytes.size()) +
                                   " bytes; a block key is exactly " + Num(BlockKey::kSize));
  }
  BlockKey::Bytes raw;
  std::memcpy(raw.data(), bytes.data(), raw.size());
  return BlockKey(raw);
}

std::string BlockKeyToProto(const BlockKey& key) { return BytesOf(key.bytes()); }

Status CheckDistinctKeys(std::span<const BlockKey> keys, std::string_view field,
                         std::string_view member) {
  std::unordered_map<BlockKey, std::size_t, BlockKey::Hash> seen;
  seen.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto [it, inserted] = seen.emplace(keys[i], i);
    if (!inserted) {
      const std::string f(field), m(member);
      return Status::InvalidArgument(f + "[" + Num(i) + "]" + m + " repeats " + f + "[" +
                                     Num(it->second) + "]" + m + " (keys must be distinct)");
    }
  }
  return Status::OK();
}

StatusOr<std::vector<BlockKey>> BlockKeysFromProto(
    const google::protobuf::RepeatedPtrField<std::string>& keys, std::string_view field,
    bool distinct) {
  std::vector<BlockKey> out;
  out.reserve(keys.size());
  for (int i = 0; i < keys.size(); ++i) {
    KVF_ASSIGN_OR_RETURN(BlockKey key,
                         BlockKeyFromProto(keys.Get(i), std::string(field) + "[" + Num(i) + "]"));
    out.push_back(key);
  }
  if (distinct) KVF_RETURN_IF_ERROR(CheckDistinctKeys(out, field));
  return out;
}

StatusOr<std::vector<BlockKey>> ReserveKeysFromProto(
    const google::protobuf::RepeatedPtrField<v1::BlockDescriptor>& blocks,
    const v1::Limits& limits) {
  std::vector<BlockKey> out;
  out.reserve(blocks.size());
  std::uint64_t total = 0;
  for (int i = 0; i < blocks.size(); ++i) {
    const v1::BlockDescriptor& d = blocks.Get(i);
    const std::string field = "blocks[" + Num(i) + "]";
    KVF_ASSIGN_OR_RETURN(BlockKey key, BlockKeyFromProto(d.key(), field + ".key"));
    out.push_back(key);
    if (d.payload_bytes() > limits.max_block_bytes()) {
      return Status::InvalidArgument(field + ".payload_bytes: " + Num(d.payload_bytes()) +
                                     " > max_block_bytes " + Num(limits.max_block_bytes()));
    }
    // Saturating: a sum past 2^64 is over any limit anyway.
    total = d.payload_bytes() > std::numeric_limits<std::uint64_t>::max() - total
                ? std::numeric_limits<std::uint64_t>::max()
                : total + d.payload_bytes();
  }
  if (total > limits.max_batch_payload_bytes()) {
    return Status::InvalidArgument("payload_bytes of all blocks: " + Num(total) +
                                   " > max_batch_payload_bytes " +
                                   Num(limits.max_batch_payload_bytes()));
  }
  KVF_RETURN_IF_ERROR(CheckDistinctKeys(out, "blocks", ".key"));
  return out;
}

// ---------------------------------------------------------------- enums

StatusOr<KvDtype> KvDtypeFromProto(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return KvDtype::kFp16;
    case v1::DTYPE_BF16:
      return KvDtype::kBf16;
    case v1::DTYPE_FP32:
      return KvDtype::kFp32;
    case v1::DTYPE_FP8_E4M3:
      return KvDtype::kFp8E4M3;
    case v1::DTYPE_INT8:
      return KvDtype::kInt8;
    case v1::DTYPE_UNSPECIFIED:
      return Status::InvalidArgument("dtype: unset (DTYPE_UNSPECIFIED); a dtype is required");
  }
  return Status::InvalidArgument("dtype: unknown value " + std::to_string(dtype));
}

StatusOr<BlockRepresentation> RepresentationFromProto(int representation) {
  switch (representation) {
    case v1::REPRESENTATION_EXACT:
      return BlockRepresentation::kExact;
    case v1::REPRESENTATION_COMPACT_INT8:
      return BlockRepresentation::kCompactInt8;
    case v1::REPRESENTATION_UNSPECIFIED:
      return Status::InvalidArgument(
          "representation: unset (REPRESENTATION_UNSPECIFIED); a representation is required");
  }
  return Status::InvalidArgument("representation: unknown value " + std::to_string(representation));
}

v1::Representation RepresentationToProto(BlockRepresentation representation) {
  switch (representation) {
    case BlockRepresentation::kExact:
      return v1::REPRESENTATION_EXACT;
    case BlockRepresentation::kCompactInt8:
      return v1::REPRESENTATION_COMPACT_INT8;
  }
  return v1::REPRESENTATION_UNSPECIFIED;
}

v1::Tier TierToProto(cache_host::BlockTier tier) {
  return tier == cache_host::BlockTier::kNvme ? v1::TIER_NVME : v1::TIER_HOST;
}

v1::ServingStatus ServingStateToProto(cache_host::ServingState state) {
  switch (state) {
    case cache_host::ServingState::kStarting:
      return v1::SERVING_STATUS_STARTING;
    case cache_host::ServingState::kServing:
      return v1::SERVING_STATUS_SERVING;
    case cache_host::ServingState::kDraining:
      return v1::SERVING_STATUS_DRAINING;
    case cache_host::ServingState::kStopped:
      return v1::SERVING_STATUS_NOT_SERVING;
  }
  return v1::SERVING_STATUS_UNSPECIFIED;
}

v1::EvictionPolicy EvictionPolicyToProto(cache_host::EvictionPolicyKind policy) {
  switch (policy) {
    case cache_host::EvictionPolicyKind::kLru:
      return v1::EVICTION_POLICY_LRU;
    case cache_host::EvictionPolicyKind::kCostAware:
      return v1::EVICTION_POLICY_COST_AWARE;
  }
  return v1::EVICTION_POLICY_UNSPECIFIED;
}

// ---------------------------------------------------------------- fingerprint

StatusOr<ModelFingerprint> FingerprintFromProto(const v1::ModelFingerprint& fp,
                                                const v1::Limits& limits) {
  if (fp.model_id().empty()) {
    return Status::InvalidArgument("fingerprint.model_id: empty; a model id is required");
  }
  if (fp.model_id().size() > limits.max_model_id_bytes()) {
    return Status::InvalidArgument("fingerprint.model_id: " + Num(fp.model_id().size()) +
                                   " bytes > max_model_id_bytes " +
                                   Num(limits.max_model_id_bytes()));
  }
  if (fp.tokens_per_block() > limits.max_tokens_per_block()) {
    return Status::InvalidArgument("fingerprint.tokens_per_block: " + Num(fp.tokens_per_block()) +
                                   " > max_tokens_per_block " + Num(limits.max_tokens_per_block()));
  }
  StatusOr<KvDtype> dtype = KvDtypeFromProto(fp.dtype());
  if (!dtype.ok()) return dtype.status().WithContext("fingerprint");
  ModelFingerprint out;
  out.model_id = fp.model_id();
  out.first_layer = fp.first_layer();
  out.layer_count = fp.layer_count();
  out.dtype = *dtype;
  out.kv_heads = fp.kv_heads();
  out.head_dim = fp.head_dim();
  out.tokens_per_block = fp.tokens_per_block();
  out.tp_rank = fp.tp_rank();
  out.tp_size = fp.tp_size();
  out.layout_version = fp.layout_version();
  // Block-key v2 fields. key_version 0 is a sender that predates them: v1.
  if (fp.key_version() > kLatestBlockKeyVersion) {
    return Status::InvalidArgument(
        "fingerprint.key_version: " + Num(fp.key_version()) +
        "; this server computes block-key encodings 1 and 2 (0 means 1)");
  }
  out.key_version = fp.key_version() == 0 ? kBlockKeyVersion1 : fp.key_version();
  out.weights_revision = fp.weights_revision();
  out.quantization = fp.quantization();
  out.kv_scale_scheme = fp.kv_scale_scheme();
  if (!fp.kv_scales_digest().empty()) {
    if (fp.kv_scales_digest().size() != out.kv_scales_digest.size()) {
      return Status::InvalidArgument(
          "fingerprint.kv_scales_digest: " + Num(fp.kv_scales_digest().size()) +
          " bytes; empty or " + Num(out.kv_scales_digest.size()) + " required");
    }
    std::memcpy(out.kv_scales_digest.data(), fp.kv_scales_digest().data(),
                out.kv_scales_digest.size());
  }
  out.rope = fp.rope();
  out.v_head_dim = fp.v_head_dim();
  out.vocab_size = fp.vocab_size();
  Status valid = out.Validate();
  if (!valid.ok()) return Status::InvalidArgument(valid.message()).WithContext("fingerprint");
  return out;
}

StatusOr<ModelFingerprint> StorableFingerprintFromProto(const v1::ModelFingerprint& fingerprint,
                                                        const v1::Limits& limits) {
  KVF_ASSIGN_OR_RETURN(ModelFingerprint fp, FingerprintFromProto(fingerprint, limits));
  KVF_RETURN_IF_ERROR(fp.RequireEqualKvHalves().WithContext("fingerprint"));
  return fp;
}

// ---------------------------------------------------------------- descriptors

StatusOr<cache_host::BlockMeta> BlockMetaFromDescriptor(const v1::BlockDescriptor& d,
                                                        const ModelFingerprint& fp,
                                                        const FingerprintDigest& digest,
                                                        std::string_view field) {
  const std::string f(field);
  if (d.payload_bytes() == 0) {
    return Status::InvalidArgument(f + ".payload_bytes: 0; a block holds at least 1 byte");
  }
  StatusOr<BlockRepresentation> representation = RepresentationFromProto(d.representation());
  if (!representation.ok()) return representation.status().WithContext(f);
  // Versions 1 and 2 lay the payload out alike (version 2 adds the layer
  // CRC table the daemon stores beside it), so a writer may name either.
  if (d.format_version() < kOldestReadableBlockFormatVersion ||
      d.format_version() > kBlockFormatVersion) {
    return Status::InvalidArgument(
        f + ".format_version: " + (d.format_version() == 0 ? "unset" : Num(d.format_version())) +
        "; this daemon accepts " + Num(kOldestReadableBlockFormatVersion) + " to " +
        Num(kBlockFormatVersion));
  }
  if (d.token_count() != fp.tokens_per_block) {
    return Status::InvalidArgument(f + ".token_count: " + Num(d.token_count()) +
                                   " != fingerprint.tokens_per_block " + Num(fp.tokens_per_block) +
                                   " (only full blocks are keyed)");
  }
  // prefix_tokens feeds the cost-aware eviction score (a block's recompute
  // cost grows with its prefix): an absurd value would make a block look
  // priceless and never be evicted. It is a whole number of blocks, within the
  // longest chain a plan can name.
  const std::uint64_t max_prefix = std::uint64_t{kMaxChainBlocks} * fp.tokens_per_block;
  if (fp.tokens_per_block != 0 &&
      (d.prefix_tokens() % fp.tokens_per_block != 0 || d.prefix_tokens() >= max_prefix)) {
    return Status::InvalidArgument(
        f + ".prefix_tokens: " + Num(d.prefix_tokens()) +
        "; must be a multiple of tokens_per_block " + Num(fp.tokens_per_block) + " below " +
        Num(max_prefix) + " (max_chain_blocks " + Num(kMaxChainBlocks) + " blocks)");
  }
  // The block must be one the block format can lay out and later write to
  // NVMe: an exact block's size follows from the shape, a compact one splits
  // evenly into layers and halves.
  BlockHeader header;
  header.format_version = kBlockFormatVersion;
  header.representation = *representation;
  header.dtype = fp.dtype;
  header.layers = fp.layer_count;
  header.tokens = d.token_count();
  header.kv_heads = fp.kv_heads;
  header.head_dim = fp.head_dim;
  header.payload_bytes = d.payload_bytes();
  Status shape = ValidateBlockHeader(header);
  if (!shape.ok()) return Status::InvalidArgument(f + ": " + std::string(shape.message()));
  if (!d.fingerprint_digest().empty()) {
    if (d.fingerprint_digest().size() != kFingerprintDigestSize) {
      return Status::InvalidArgument(
          f + ".fingerprint_digest: " + Num(d.fingerprint_digest().size()) + " bytes; empty or " +
          Num(kFingerprintDigestSize) + " required");
    }
    if (std::memcmp(d.fingerprint_digest().data(), digest.data(), digest.size()) != 0) {
      return Status::InvalidArgument(
          f + ".fingerprint_digest: " + DigestHex(d.fingerprint_digest()) +
          " is not the digest of the request's fingerprint " + FingerprintDigestToHex(digest));
    }
  }
  cache_host::BlockMeta meta;
  meta.bytes = d.payload_bytes();
  meta.representation = *representation;
  meta.fingerprint = digest;
  meta.tokens = d.token_count();
  meta.token_offset = d.prefix_tokens();
  // The shape travels with the block into its NVMe header.
  meta.dtype = fp.dtype;
  meta.layers = fp.layer_count;
  meta.kv_heads = fp.kv_heads;
  meta.head_dim = fp.head_dim;
  return meta;
}

void DescriptorFromMeta(const BlockKey& key, const cache_host::BlockMeta& meta,
                        std::uint32_t crc32c, v1::BlockDescriptor* out) {
  out->set_key(BlockKeyToProto(key));
  out->set_payload_bytes(meta.bytes);
  out->set_crc32c(crc32c);
  out->set_representation(RepresentationToProto(meta.representation));
  out->set_format_version(kBlockFormatVersion);
  out->set_fingerprint_digest(BytesOf(meta.fingerprint));
  out->set_token_count(meta.tokens);
  out->set_prefix_tokens(meta.token_offset);
}

// ---------------------------------------------------------------- results

void ExtentsToProto(std::span<const cache_host::ByteExtent> extents,
                    google::protobuf::RepeatedPtrField<v1::Extent>* out) {
  out->Reserve(out->size() + static_cast<int>(extents.size()));
  for (const cache_host::ByteExtent& e : extents) {
    v1::Extent* x = out->Add();
    x->set_region_index(0);
    x->set_offset_bytes(e.offset);
    x->set_length_bytes(e.length);
  }
}

void GrantToProto(const cache_host::GrantInfo& grant, std::string_view transport_address,
                  std::uint64_t pool_bytes, v1::TransportGrant* out) {
  out->set_mode(v1::TRANSFER_MODE_OWNER_DRIVEN);
  out->set_transport_address(std::string(transport_address));
  v1::TransportRegion* region = out->add_regions();
  region->set_base_address(0);
  region->set_length_bytes(pool_bytes);
  out->set_access_token(BytesOf(grant.token));
}

StatusOr<cache_host::GrantRef> GrantRefFromProto(std::uint64_t lease_id, const std::string& token,
                                                 const std::string& field) {
  cache_host::GrantRef ref;
  ref.lease_id = lease_id;
  if (token.size() != ref.token.size()) {
    return Status::InvalidArgument(field + ": " + std::to_string(token.size()) +
                                   " bytes; the grant's access token (from the Reserve or Lease "
                                   "answer) is " + std::to_string(ref.token.size()));
  }
  std::memcpy(ref.token.data(), token.data(), ref.token.size());
  return ref;
}

std::uint64_t TtlUsFromMs(std::uint32_t ttl_ms, const v1::Limits& limits) {
  const std::uint32_t ms = ttl_ms == 0 ? limits.default_ttl_ms() : ttl_ms;
  return std::uint64_t{ms} * 1000;
}

std::uint32_t TtlMsFromUs(std::uint64_t ttl_us) {
  return static_cast<std::uint32_t>(
      std::min<std::uint64_t>(ttl_us / 1000, std::numeric_limits<std::uint32_t>::max()));
}

// ---------------------------------------------------------------- stats

void StatsFromSnapshot(const cache_host::CacheHostSnapshot& s, const StatsContext& context,
                       bool include_namespaces, v1::StatsResponse* out) {
  std::uint64_t blocks = 0, host_blocks = 0, nvme_blocks = 0;
  for (const cache_host::NamespaceUsage& u : s.namespaces) {
    blocks += u.blocks;
    host_blocks += u.host_blocks;
    nvme_blocks += u.nvme_blocks;
  }

  const std::uint64_t page = s.page_bytes;
  v1::TierUsage* host = out->add_tiers();
  host->set_tier(v1::TIER_HOST);
  host->set_capacity_bytes(context.host_pool_bytes);
  host->set_committed_bytes(s.pages.committed * page);
  host->set_reserved_bytes(s.pages.reserved * page);
  host->set_leased_bytes(s.pages.leased * page);
  host->set_staging_bytes(s.pages.staging * page);
  host->set_free_bytes(s.pages.free * page);
  host->set_page_bytes(page);
  host->set_blocks(host_blocks);

  if (s.nvme_enabled) {
    v1::TierUsage* nvme = out->add_tiers();
    nvme->set_tier(v1::TIER_NVME);
    nvme->set_capacity_bytes(s.nvme_capacity_bytes);
    nvme->set_committed_bytes(s.nvme.live_bytes);
    nvme->set_free_bytes(s.nvme_capacity_bytes -
                         std::min(s.nvme.used_bytes, s.nvme_capacity_bytes));
    nvme->set_page_bytes(context.nvme_unit_bytes);
    nvme->set_blocks(nvme_blocks);
  }

  out->set_blocks(blocks);
  out->set_active_reservations(s.table.active_reservations);
  out->set_active_read_leases(s.table.active_leases);
  out->set_reservations_expired_total(s.table.reservations_expired);
  out->set_read_leases_expired_total(s.table.leases_expired);
  out->set_hits_total(s.table.hits);
  out->set_misses_total(s.table.misses);
  out->set_commits_total(s.table.commits);
  // The first reserver of a key wins (lease_table.h): a second writer is
  // refused at Reserve, so no commit ever loses to a concurrent one.
  out->set_commit_conflicts_total(0);
  out->set_crc_failures_total(s.table.crc_failures + s.staging_crc_failures +
                              s.recovery.dropped_corrupt);
  std::uint64_t evictions = 0;
  for (std::uint64_t n : s.evictions_by_action) evictions += n;
  out->set_evictions_total(evictions);
  out->set_demotions_total(s.table.demotions_completed);
  out->set_promotions_total(s.table.promotions_completed);
  out->set_recovered_blocks(s.recovery.recovered);
  out->set_recovery_dropped_blocks(s.recovery.dropped_torn + s.recovery.dropped_corrupt);
  out->set_eviction_policy(EvictionPolicyToProto(context.policy));
  out->set_memory_locked(s.memory_locked);
  out->set_status(ServingStateToProto(s.state));
  out->set_uptime_us(s.uptime_us);

  if (!include_namespaces) return;
  auto committed = [](const cache_host::NamespaceUsage& u) { return u.host_bytes + u.nvme_bytes; };
  std::vector<const cache_host::NamespaceUsage*> order;
  order.reserve(s.namespaces.size());
  for (const cache_host::NamespaceUsage& u : s.namespaces) order.push_back(&u);
  const std::size_t shown = std::min(order.size(), kMaxStatsNamespaces);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [&](const cache_host::NamespaceUsage* a, const cache_host::NamespaceUsage* b) {
                      if (committed(*a) != committed(*b)) return committed(*a) > committed(*b);
                      return a->tenant < b->tenant;
                    });
  for (std::size_t i = 0; i < shown; ++i) {
    const cache_host::NamespaceUsage& u = *order[i];
    v1::NamespaceUsage* n = out->add_namespaces();
    n->set_namespace_(u.tenant);
    n->set_committed_bytes(committed(u));
    n->set_reserved_bytes(u.reserved_bytes);
    n->set_quota_bytes(u.quota_bytes);
    n->set_blocks(u.blocks);
    n->set_hits_total(u.hits);
    n->set_misses_total(u.misses);
  }
}

}  // namespace kvfabric
