#include "proto/transfer_wire.h"

#include <cstring>

namespace kvfabric::wire {
namespace {

// Bit 63 of a fetch result's payload_bytes: the daemon checked the landing.
constexpr std::uint64_t kLandingCheckedBit = std::uint64_t{1} << 63;

void Put8(std::string* out, std::uint8_t v) { out->push_back(static_cast<char>(v)); }
void Put16(std::string* out, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void Put32(std::string* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void Put64(std::string* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// Reads little-endian integers from a bounded span; every read is checked.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  bool Read(std::size_t n, std::uint64_t* v) {
    if (in_.size() - pos_ < n) return false;
    *v = 0;
    for (std::size_t i = 0; i < n; ++i) {
      *v |= std::uint64_t{std::to_integer<std::uint8_t>(in_[pos_ + i])} << (8 * i);
    }
    pos_ += n;
    return true;
  }
  bool Bytes(std::size_t n, void* dst) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(dst, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

// Whether `count` slots of `slot` bytes from `offset` are non-empty and end
// at or before 2^64 - 1 (no wrap).
bool SlotsFit(std::uint64_t offset, std::uint64_t slot, std::uint64_t count) {
  return slot != 0 && count != 0 && slot <= (~std::uint64_t{0} - offset) / count;
}

std::string StoreRangeError(const StoreEntry& e) {
  return "store request: " + std::to_string(e.payload_bytes) + " bytes at offset " +
         std::to_string(e.region_offset) + " are empty or wrap";
}

std::string SlotsError(std::uint64_t offset, std::uint64_t slot, std::uint64_t count) {
  return "fetch request: " + std::to_string(count) + " slots of " + std::to_string(slot) +
         " bytes from offset " + std::to_string(offset) + " are empty or wrap";
}


}  // namespace

StatusOr<std::string> EncodeTransferMessage(const TransferMessage& m) {
  std::uint32_t count = 0;
  switch (m.op) {
    case TransferOpCode::kPut:
    case TransferOpCode::kGet:
      if (m.ranges.empty() || m.ranges.size() > kMaxRangesPerRequest) {
        return Status::InvalidArgument("transfer request with " + std::to_string(m.ranges.size()) +
                                       " ranges: must be 1.." +
                                       std::to_string(kMaxRangesPerRequest));
      }
      count = static_cast<std::uint32_t>(m.ranges.size());
      break;
    case TransferOpCode::kImportRegion:
      if (m.import_chunk.empty() || m.import_chunk.size() > kMaxImportChunkBytes ||
          m.import_total_bytes > kMaxExportBytes ||
          m.import_chunk_offset > m.import_total_bytes ||
          m.import_chunk.size() > m.import_total_bytes - m.import_chunk_offset) {
        return Status::InvalidArgument(
            "import chunk of " + std::to_string(m.import_chunk.size()) + " bytes at " +
            std::to_string(m.import_chunk_offset) + " of " + std::to_string(m.import_total_bytes) +
            ": chunks are 1.." + std::to_string(kMaxImportChunkBytes) + " bytes of an export of at most " +
            std::to_string(kMaxExportBytes));
      }
      count = static_cast<std::uint32_t>(m.import_chunk.size());
      break;
    case TransferOpCode::kReply:
      break;
    case TransferOpCode::kFetch: {
      const std::size_t n = m.fetch_keys.size();
      if (n == 0 || n > kMaxFetchKeys) {
        return Status::InvalidArgument("fetch request with " + std::to_string(n) +
                                       " keys: must be 1.." + std::to_string(kMaxFetchKeys));
      }
      if (m.fetch_namespace.size() > kMaxFetchNamespaceBytes) {
        return Status::InvalidArgument("fetch request: namespace of " +
                                       std::to_string(m.fetch_namespace.size()) +
                                       " bytes, at most " +
                                       std::to_string(kMaxFetchNamespaceBytes));
      }
      if (!m.fetch_slot_offsets.empty()) {
        if (m.fetch_slot_offsets.size() != n || m.fetch_region_offset != 0) {
          return Status::InvalidArgument(
              "fetch request: " + std::to_string(m.fetch_slot_offsets.size()) +
              " scattered slot offsets for " + std::to_string(n) +
              " keys (one per key, with region_offset 0)");
        }
        for (std::uint64_t o : m.fetch_slot_offsets) {
          if (!SlotsFit(o, m.fetch_slot_bytes, 1)) {
            return Status::InvalidArgument(SlotsError(o, m.fetch_slot_bytes, 1));
          }
        }
      } else if (!SlotsFit(m.fetch_region_offset, m.fetch_slot_bytes, n)) {
        return Status::InvalidArgument(SlotsError(m.fetch_region_offset, m.fetch_slot_bytes, n));
      }
      if (m.fetch_layer_count == 0 && m.fetch_first_layer != 0) {
        return Status::InvalidArgument("fetch request: first_layer " +
                                       std::to_string(m.fetch_first_layer) +
                                       " without a layer count");
      }
      count = static_cast<std::uint32_t>(n);
      break;
    }
    case TransferOpCode::kChallenge:
    case TransferOpCode::kHello:
      count = kHelloBytes;
      break;
    case TransferOpCode::kStore: {
      const std::size_t n = m.store_entries.size();
      if (n == 0 || n > kMaxStoreKeys) {
        return Status::InvalidArgument("store request with " + std::to_string(n) +
                                       " keys: must be 1.." + std::to_string(kMaxStoreKeys));
      }
      if (m.fetch_namespace.size() > kMaxFetchNamespaceBytes) {
        return Status::InvalidArgument(
            "store request: namespace of " + std::to_string(m.fetch_namespace.size()) +
            " bytes, at most " + std::to_string(kMaxFetchNamespaceBytes));
      }
      for (const StoreEntry& e : m.store_entries) {
        if (!SlotsFit(e.region_offset, e.payload_bytes, 1)) {
          return Status::InvalidArgument(StoreRangeError(e));
        }
      }
      count = static_cast<std::uint32_t>(n);
      break;
    }
    case TransferOpCode::kFetchReply:
    case TransferOpCode::kStoreReply:
      if (m.fetch_results.size() > kMaxFetchKeys) {
        return Status::InvalidArgument("fetch reply with " +
                                       std::to_string(m.fetch_results.size()) +
                                       " results: at most " + std::to_string(kMaxFetchKeys));
      }
      count = static_cast<std::uint32_t>(m.fetch_results.size());
      break;
    default:
      return Status::InvalidArgument("unknown transfer op " +
                                     std::to_string(static_cast<int>(m.op)));
  }
  std::string out;
  out.reserve(kMaxTransferMessageBytes);
  Put32(&out, kTransferMagic);
  Put8(&out, kTransferVersion);
  Put8(&out, static_cast<std::uint8_t>(m.op));
  Put16(&out, 0);
  Put64(&out, m.request_id);
  // Only kPut and kGet present a grant; replies name no region.
  const bool granted = m.op == TransferOpCode::kPut || m.op == TransferOpCode::kGet;
  const bool hello = m.op == TransferOpCode::kChallenge || m.op == TransferOpCode::kHello;
  const bool reply = m.op == TransferOpCode::kReply || m.op == TransferOpCode::kFetchReply ||
                     m.op == TransferOpCode::kStoreReply;
  Put64(&out, granted || m.op == TransferOpCode::kHello ? m.lease_id : 0);
  for (std::uint8_t b : m.token) Put8(&out, granted ? b : 0);
  Put32(&out, reply || hello ? 0 : m.region_id);
  Put32(&out, count);
  switch (m.op) {
    case TransferOpCode::kPut:
    case TransferOpCode::kGet:
      for (const TransferRange& r : m.ranges) {
        Put64(&out, r.pool_offset);
        Put64(&out, r.length);
        Put64(&out, r.region_offset);
      }
      break;
    case TransferOpCode::kImportRegion:
      Put32(&out, m.import_total_bytes);
      Put32(&out, m.import_chunk_offset);
      out += m.import_chunk;
      break;
    case TransferOpCode::kReply: {
      Put32(&out, static_cast<std::uint32_t>(static_cast<std::int32_t>(m.status.code())));
      Put64(&out, m.bytes_moved);
      std::string_view msg = m.status.message();
      if (msg.size() > kMaxReplyMessageBytes) msg = msg.substr(0, kMaxReplyMessageBytes);
      Put16(&out, static_cast<std::uint16_t>(msg.size()));
      out += msg;
      break;
    }
    case TransferOpCode::kChallenge:
    case TransferOpCode::kHello:
      for (std::uint8_t b : m.hello) Put8(&out, b);
      break;
    case TransferOpCode::kFetch:
      Put64(&out, m.fetch_region_offset);
      Put64(&out, m.fetch_slot_bytes);
      Put16(&out, static_cast<std::uint16_t>(m.fetch_namespace.size()));
      Put8(&out, static_cast<std::uint8_t>((m.fetch_fingerprint.has_value() ? 1 : 0) |
                                           (m.fetch_slot_offsets.empty() ? 0 : 2) |
                                           (m.fetch_layer_count == 0 ? 0 : 4) |
                                           (m.fetch_check_landing ? 8 : 0)));
      Put8(&out, 0);
      if (m.fetch_layer_count != 0) {
        Put32(&out, m.fetch_first_layer);
        Put32(&out, m.fetch_layer_count);
      }
      if (m.fetch_fingerprint.has_value()) {
        for (std::uint8_t b : *m.fetch_fingerprint) Put8(&out, b);
      }
      out += m.fetch_namespace;
      for (const FetchKey& k : m.fetch_keys) {
        for (std::uint8_t b : k) Put8(&out, b);
      }
      for (std::uint64_t o : m.fetch_slot_offsets) Put64(&out, o);
      break;
    case TransferOpCode::kStore: {
      const StoreShape& sh = m.store_shape;
      Put32(&out, m.store_ttl_ms);
      Put16(&out, static_cast<std::uint16_t>(m.fetch_namespace.size()));
      Put8(&out, 0);  // flags
      Put8(&out, sh.representation);
      Put8(&out, sh.dtype);
      Put8(&out, sh.format_version);
      Put16(&out, 0);
      Put32(&out, sh.tokens_per_block);
      Put32(&out, sh.layers);
      Put32(&out, sh.kv_heads);
      Put32(&out, sh.head_dim);
      for (std::uint8_t b : sh.fingerprint) Put8(&out, b);
      out += m.fetch_namespace;
      for (const StoreEntry& e : m.store_entries) {
        for (std::uint8_t b : e.key) Put8(&out, b);
        Put64(&out, e.region_offset);
        Put64(&out, e.payload_bytes);
        Put64(&out, e.prefix_tokens);
        Put32(&out, e.crc32c);
        Put32(&out, 0);
      }
      break;
    }
    case TransferOpCode::kFetchReply:
    case TransferOpCode::kStoreReply: {
      Put32(&out, static_cast<std::uint32_t>(static_cast<std::int32_t>(m.status.code())));
      Put64(&out, m.bytes_moved);
      std::string_view msg = m.status.message();
      if (msg.size() > kMaxFetchReplyMessageBytes) msg = msg.substr(0, kMaxFetchReplyMessageBytes);
      Put16(&out, static_cast<std::uint16_t>(msg.size()));
      for (const FetchKeyResult& r : m.fetch_results) {
        Put32(&out, static_cast<std::uint32_t>(static_cast<std::int32_t>(r.code)));
        Put32(&out, r.crc32c);
        Put64(&out, (r.payload_bytes & ~kLandingCheckedBit) |
                        (r.landing_checked ? kLandingCheckedBit : 0));
      }
      out += msg;
      break;
    }
  }
  return out;
}

StatusOr<TransferMessage> DecodeTransferMessage(std::span<const std::byte> bytes) {
  if (bytes.size() < kTransferHeaderBytes || bytes.size() > kMaxTransferMessageBytes) {
    return Status::InvalidArgument("transfer message of " + std::to_string(bytes.size()) +
                                   " bytes: must be " + std::to_string(kTransferHeaderBytes) +
                                   ".." + std::to_string(kMaxTransferMessageBytes));
  }
  Reader r(bytes);
  std::uint64_t magic = 0, version = 0, op = 0, reserved = 0, region = 0, count = 0;
  TransferMessage m;
  r.Read(4, &magic);
  r.Read(1, &version);
  r.Read(1, &op);
  r.Read(2, &reserved);
  r.Read(8, &m.request_id);
  r.Read(8, &m.lease_id);
  r.Bytes(16, m.token.data());
  r.Read(4, &region);
  r.Read(4, &count);
  if (magic != kTransferMagic) return Status::InvalidArgument("transfer message: bad magic");
  if (version != kTransferVersion) {
    return Status::InvalidArgument("transfer message: version " + std::to_string(version) +
                                   ", this build reads " + std::to_string(kTransferVersion));
  }
  if (reserved != 0) return Status::InvalidArgument("transfer message: reserved bits set");
  if (op < 1 || op > 10) {
    return Status::InvalidArgument("transfer message: unknown op " + std::to_string(op));
  }
  m.op = static_cast<TransferOpCode>(op);
  m.region_id = static_cast<std::uint32_t>(region);
  switch (m.op) {
    case TransferOpCode::kPut:
    case TransferOpCode::kGet: {
      if (count == 0 || count > kMaxRangesPerRequest || r.left() != count * kRangeBytes) {
        return Status::InvalidArgument("transfer request: " + std::to_string(count) +
                                       " ranges in " + std::to_string(r.left()) +
                                       " bytes (1.." + std::to_string(kMaxRangesPerRequest) +
                                       " ranges of 24 bytes)");
      }
      m.ranges.resize(count);
      for (TransferRange& t : m.ranges) {
        r.Read(8, &t.pool_offset);
        r.Read(8, &t.length);
        r.Read(8, &t.region_offset);
        if (t.length == 0) return Status::InvalidArgument("transfer request: empty range");
      }
      break;
    }
    case TransferOpCode::kImportRegion: {
      std::uint64_t total = 0, offset = 0;
      if (!r.Read(4, &total) || !r.Read(4, &offset)) {
        return Status::InvalidArgument("import chunk: short header");
      }
      if (count == 0 || count > kMaxImportChunkBytes || r.left() != count ||
          total > kMaxExportBytes || offset > total || count > total - offset) {
        return Status::InvalidArgument("import chunk of " + std::to_string(count) + " bytes at " +
                                       std::to_string(offset) + " of " + std::to_string(total) +
                                       " (export at most " + std::to_string(kMaxExportBytes) +
                                       " bytes, chunks at most " +
                                       std::to_string(kMaxImportChunkBytes) + ")");
      }
      m.import_total_bytes = static_cast<std::uint32_t>(total);
      m.import_chunk_offset = static_cast<std::uint32_t>(offset);
      m.import_chunk.resize(count);
      r.Bytes(count, m.import_chunk.data());
      break;
    }
    case TransferOpCode::kReply: {
      std::uint64_t code = 0, len = 0;
      if (count != 0 || region != 0 || !r.Read(4, &code) || !r.Read(8, &m.bytes_moved) ||
          !r.Read(2, &len)) {
        return Status::InvalidArgument("transfer reply: malformed header");
      }
      const auto scode = static_cast<std::int32_t>(static_cast<std::uint32_t>(code));
      if (!IsKnownStatusCode(scode) || len > kMaxReplyMessageBytes || r.left() != len) {
        return Status::InvalidArgument("transfer reply: code " + std::to_string(scode) +
                                       " or message length " + std::to_string(len) +
                                       " out of range");
      }
      std::string msg(len, '\0');
      r.Bytes(len, msg.data());
      m.status = StatusFromCode(scode, msg);
      break;
    }
    case TransferOpCode::kFetch: {
      std::uint64_t ns_len = 0, flags = 0, reserved2 = 0;
      if (m.lease_id != 0 || m.token != std::array<std::uint8_t, 16>{} ||
          !r.Read(8, &m.fetch_region_offset) || !r.Read(8, &m.fetch_slot_bytes) ||
          !r.Read(2, &ns_len) || !r.Read(1, &flags) || !r.Read(1, &reserved2)) {
        return Status::InvalidArgument("fetch request: malformed header");
      }
      if ((flags & ~std::uint64_t{15}) != 0 || reserved2 != 0) {
        return Status::InvalidArgument("fetch request: reserved bits set");
      }
      m.fetch_check_landing = (flags & 8) != 0;
      if ((flags & 4) != 0) {
        std::uint64_t first = 0, layers = 0;
        if (!r.Read(4, &first) || !r.Read(4, &layers) || layers == 0) {
          return Status::InvalidArgument("fetch request: a layer range of no layers");
        }
        m.fetch_first_layer = static_cast<std::uint32_t>(first);
        m.fetch_layer_count = static_cast<std::uint32_t>(layers);
      }
      const std::size_t digest = (flags & 1) != 0 ? kFetchDigestBytes : 0;
      const bool scattered = (flags & 2) != 0;
      if (count == 0 || count > kMaxFetchKeys || ns_len > kMaxFetchNamespaceBytes ||
          r.left() != digest + ns_len + count * (kFetchKeyBytes + (scattered ? 8 : 0))) {
        return Status::InvalidArgument(
            "fetch request: " + std::to_string(count) + " keys and a namespace of " +
            std::to_string(ns_len) + " bytes in " + std::to_string(r.left()) + " bytes (1.." +
            std::to_string(kMaxFetchKeys) + " keys of 32 bytes, a namespace of at most " +
            std::to_string(kMaxFetchNamespaceBytes) + ")");
      }
      if (scattered ? m.fetch_region_offset != 0 || m.fetch_slot_bytes == 0
                    : !SlotsFit(m.fetch_region_offset, m.fetch_slot_bytes, count)) {
        return Status::InvalidArgument(SlotsError(m.fetch_region_offset, m.fetch_slot_bytes, count));
      }
      if (digest != 0) {
        m.fetch_fingerprint.emplace();
        r.Bytes(digest, m.fetch_fingerprint->data());
      }
      m.fetch_namespace.resize(ns_len);
      r.Bytes(ns_len, m.fetch_namespace.data());
      m.fetch_keys.resize(count);
      for (FetchKey& k : m.fetch_keys) r.Bytes(kFetchKeyBytes, k.data());
      if (scattered) {
        m.fetch_slot_offsets.resize(count);
        for (std::uint64_t& o : m.fetch_slot_offsets) {
          r.Read(8, &o);
          if (!SlotsFit(o, m.fetch_slot_bytes, 1)) {
            return Status::InvalidArgument(SlotsError(o, m.fetch_slot_bytes, 1));
          }
        }
      }
      break;
    }
    case TransferOpCode::kChallenge:
    case TransferOpCode::kHello: {
      const bool challenge = m.op == TransferOpCode::kChallenge;
      if (region != 0 || (challenge && m.lease_id != 0) ||
          m.token != std::array<std::uint8_t, 16>{} || count != kHelloBytes ||
          r.left() != kHelloBytes) {
        return Status::InvalidArgument(challenge ? "challenge: malformed" : "hello: malformed");
      }
      r.Bytes(kHelloBytes, m.hello.data());
      break;
    }
    case TransferOpCode::kStore: {
      std::uint64_t ttl = 0, ns_len = 0, flags = 0, representation = 0, dtype = 0, version = 0,
                    reserved2 = 0, tpb = 0, layers = 0, heads = 0, dim = 0;
      if (m.lease_id != 0 || m.token != std::array<std::uint8_t, 16>{} || !r.Read(4, &ttl) ||
          !r.Read(2, &ns_len) || !r.Read(1, &flags) || !r.Read(1, &representation) ||
          !r.Read(1, &dtype) || !r.Read(1, &version) || !r.Read(2, &reserved2) ||
          !r.Read(4, &tpb) || !r.Read(4, &layers) || !r.Read(4, &heads) || !r.Read(4, &dim)) {
        return Status::InvalidArgument("store request: malformed header");
      }
      if (flags != 0 || reserved2 != 0) {
        return Status::InvalidArgument("store request: reserved bits set");
      }
      if (count == 0 || count > kMaxStoreKeys || ns_len > kMaxFetchNamespaceBytes ||
          r.left() != kFetchDigestBytes + ns_len + count * kStoreEntryBytes) {
        return Status::InvalidArgument(
            "store request: " + std::to_string(count) + " keys and a namespace of " +
            std::to_string(ns_len) + " bytes in " + std::to_string(r.left()) + " bytes (1.." +
            std::to_string(kMaxStoreKeys) + " entries of 64 bytes, a namespace of at most " +
            std::to_string(kMaxFetchNamespaceBytes) + ")");
      }
      m.store_ttl_ms = static_cast<std::uint32_t>(ttl);
      StoreShape& sh = m.store_shape;
      sh.representation = static_cast<std::uint8_t>(representation);
      sh.dtype = static_cast<std::uint8_t>(dtype);
      sh.format_version = static_cast<std::uint8_t>(version);
      sh.tokens_per_block = static_cast<std::uint32_t>(tpb);
      sh.layers = static_cast<std::uint32_t>(layers);
      sh.kv_heads = static_cast<std::uint32_t>(heads);
      sh.head_dim = static_cast<std::uint32_t>(dim);
      r.Bytes(kFetchDigestBytes, sh.fingerprint.data());
      m.fetch_namespace.resize(ns_len);
      r.Bytes(ns_len, m.fetch_namespace.data());
      m.store_entries.resize(count);
      for (StoreEntry& e : m.store_entries) {
        std::uint64_t crc = 0, reserved3 = 0;
        r.Bytes(kFetchKeyBytes, e.key.data());
        r.Read(8, &e.region_offset);
        r.Read(8, &e.payload_bytes);
        r.Read(8, &e.prefix_tokens);
        r.Read(4, &crc);
        r.Read(4, &reserved3);
        e.crc32c = static_cast<std::uint32_t>(crc);
        if (reserved3 != 0) return Status::InvalidArgument("store request: reserved bits set");
        if (!SlotsFit(e.region_offset, e.payload_bytes, 1)) {
          return Status::InvalidArgument(StoreRangeError(e));
        }
      }
      break;
    }
    case TransferOpCode::kFetchReply:
    case TransferOpCode::kStoreReply: {
      const char* what = m.op == TransferOpCode::kFetchReply ? "fetch reply" : "store reply";
      std::uint64_t code = 0, len = 0;
      if (region != 0 || m.lease_id != 0 || m.token != std::array<std::uint8_t, 16>{} ||
          !r.Read(4, &code) || !r.Read(8, &m.bytes_moved) || !r.Read(2, &len)) {
        return Status::InvalidArgument(std::string(what) + ": malformed header");
      }
      const auto scode = static_cast<std::int32_t>(static_cast<std::uint32_t>(code));
      if (!IsKnownStatusCode(scode) || count > kMaxFetchKeys ||
          len > kMaxFetchReplyMessageBytes || r.left() != count * kFetchResultBytes + len) {
        return Status::InvalidArgument(
            std::string(what) + ": code " + std::to_string(scode) + ", " + std::to_string(count) +
            " results or message length " + std::to_string(len) + " out of range");
      }
      m.fetch_results.resize(count);
      for (FetchKeyResult& x : m.fetch_results) {
        std::uint64_t kcode = 0, crc = 0;
        r.Read(4, &kcode);
        r.Read(4, &crc);
        r.Read(8, &x.payload_bytes);
        const auto k = static_cast<std::int32_t>(static_cast<std::uint32_t>(kcode));
        if (!IsKnownStatusCode(k)) {
          return Status::InvalidArgument(std::string(what) + ": result code " + std::to_string(k) +
                                         " out of range");
        }
        x.code = static_cast<StatusCode>(k);
        x.crc32c = static_cast<std::uint32_t>(crc);
        x.landing_checked = (x.payload_bytes & kLandingCheckedBit) != 0;
        x.payload_bytes &= ~kLandingCheckedBit;
      }
      std::string msg(len, '\0');
      r.Bytes(len, msg.data());
      m.status = StatusFromCode(scode, msg);
      break;
    }
  }
  return m;
}

std::string HelloProofInput(const std::array<std::uint8_t, kHelloBytes>& nonce,
                            std::uint64_t session_id) {
  std::string out = "kvfabric data-plane hello v1";
  out.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  Put64(&out, session_id);
  return out;
}

}  // namespace kvfabric::wire
