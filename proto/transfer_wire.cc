#include "proto/transfer_wire.h"

#include <cstring>

namespace kvfabric::wire {
namespace {

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

bool ValidStatusCode(std::int64_t code) { return code >= 0 && code <= static_cast<std::int64_t>(StatusCode::kDataLoss); }

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
  const bool reply_or_import = m.op == TransferOpCode::kReply || m.op == TransferOpCode::kImportRegion;
  Put64(&out, reply_or_import ? 0 : m.lease_id);
  for (std::uint8_t b : m.token) Put8(&out, reply_or_import ? 0 : b);
  Put32(&out, m.op == TransferOpCode::kReply ? 0 : m.region_id);
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
  if (op < 1 || op > 4) {
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
      if (!ValidStatusCode(scode) || len > kMaxReplyMessageBytes || r.left() != len) {
        return Status::InvalidArgument("transfer reply: code " + std::to_string(scode) +
                                       " or message length " + std::to_string(len) +
                                       " out of range");
      }
      std::string msg(len, '\0');
      r.Bytes(len, msg.data());
      m.status = scode == 0 ? Status::OK() : Status(static_cast<StatusCode>(scode), msg);
      break;
    }
  }
  return m;
}

}  // namespace kvfabric::wire
