// The tiny message protocol between transport_two_process_test and its peer
// program (tests/transport_peer_main.cc), carried in kSend headers.
//
// What it is
//   Every message is one kSend header: a fixed 28-byte prefix (magic, type,
//   the request type a reply answers, an ok flag, round, index, count, value)
//   followed by a variable tail (CRC32C values, export bytes or an error
//   text). Only kBlock messages carry a payload: one block of random bytes
//   whose CRC32C is in the tail. Both ends run on one host and one build, so
//   fields are in host byte order; the magic catches a stray message.
//
//   The test drives; the peer answers every request with one kReply (ok, or
//   not ok with an error text in the tail) on the endpoint the request came
//   in on. Requests, in the peer's terms:
//     kSetup{count, value=block_size}  allocate an inbox (AllocateMemory) and
//                                      an outbox (RegisterMemory) of `count`
//                                      blocks; idempotent for equal sizes.
//     kGetExport{index}                reply tail = export of the inbox (0) or
//                                      the outbox (1).
//     kImport{index, tail=export}      import the test's inbox (0) or outbox
//                                      (1) on this endpoint.
//     kVerify{round, count, crcs}      check the CRC32C of inbox blocks.
//     kPull{round, count, crcs}        kRead the test's outbox blocks into the
//                                      inbox, then verify them.
//     kPush{round, count, value=seed}  fill the outbox, kWrite it into the
//                                      test's inbox; reply tail = CRCs.
//     kFill{round, count, value=seed}  fill the outbox; reply tail = CRCs (the
//                                      test then reads it with kRead).
//     kSendMe{round, count, value=seed}  fill the outbox and kSend each block
//                                      as a kBlock; reply when sent.
//     kPullLoop / kPushLoop{count, value=batches}  reply kStarted, then kRead
//                                      from / kWrite into the test's memory,
//                                      `value` batches, without verifying (the
//                                      test kills the peer meanwhile).
//     kQuit                            reply, close endpoints, exit 0.
//   kBlock{round, index, count, tail=crc} + payload, in either direction, is
//   accepted into the receiver's inbox at index * block_size; the peer
//   replies (request kBlock) once `count` blocks of the round were placed and
//   verified.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_TESTS_TRANSPORT_PEER_PROTOCOL_H_
#define KVFABRIC_TESTS_TRANSPORT_PEER_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/crc32c.h"
#include "transport/transport.h"

namespace kvfabric::transport_test {

inline constexpr std::uint32_t kProtocolMagic = 0x5054564b;  // "KVTP"

// The peer's stdout line that carries its listen address (UCX may print log
// lines to stdout before it).
inline constexpr char kListeningPrefix[] = "listening on ";

// Numbered explicitly: the values travel between processes.
enum class MessageType : std::uint8_t {
  kNone = 0,
  kSetup = 1,
  kGetExport = 2,
  kImport = 3,
  kVerify = 4,
  kPull = 5,
  kPush = 6,
  kFill = 7,
  kSendMe = 8,
  kPullLoop = 9,
  kPushLoop = 10,
  kQuit = 11,
  kReply = 20,
  kBlock = 21,
  kStarted = 22,
};

struct Message {
  MessageType type = MessageType::kNone;
  MessageType request = MessageType::kNone;  // kReply: what it answers
  bool ok = true;                            // kReply: did the request succeed
  std::uint32_t round = 0;
  std::uint32_t index = 0;
  std::uint32_t count = 0;
  std::uint64_t value = 0;
  std::string tail;
};

inline constexpr std::size_t kMessagePrefixBytes = 28;
inline constexpr std::size_t kMaxTailBytes =
    transport::kMaxMessageHeaderBytes - kMessagePrefixBytes;

inline std::string Encode(const Message& m) {
  std::string out(kMessagePrefixBytes, '\0');
  char* p = out.data();
  std::memcpy(p, &kProtocolMagic, 4);
  p[4] = static_cast<char>(m.type);
  p[5] = static_cast<char>(m.request);
  p[6] = m.ok ? 1 : 0;
  std::memcpy(p + 8, &m.round, 4);
  std::memcpy(p + 12, &m.index, 4);
  std::memcpy(p + 16, &m.count, 4);
  std::memcpy(p + 20, &m.value, 8);
  out += m.tail;
  return out;
}

// Nothing if `header` is not a message of this protocol.
inline std::optional<Message> Decode(std::span<const std::byte> header) {
  if (header.size() < kMessagePrefixBytes) return std::nullopt;
  const char* p = reinterpret_cast<const char*>(header.data());
  std::uint32_t magic = 0;
  std::memcpy(&magic, p, 4);
  if (magic != kProtocolMagic) return std::nullopt;
  Message m;
  m.type = static_cast<MessageType>(p[4]);
  m.request = static_cast<MessageType>(p[5]);
  m.ok = p[6] != 0;
  std::memcpy(&m.round, p + 8, 4);
  std::memcpy(&m.index, p + 12, 4);
  std::memcpy(&m.count, p + 16, 4);
  std::memcpy(&m.value, p + 20, 8);
  m.tail.assign(p + kMessagePrefixBytes, header.size() - kMessagePrefixBytes);
  return m;
}

inline std::string EncodeCrcs(std::span<const std::uint32_t> crcs) {
  return std::string(reinterpret_cast<const char*>(crcs.data()), crcs.size() * 4);
}

inline std::vector<std::uint32_t> DecodeCrcs(std::string_view tail) {
  std::vector<std::uint32_t> crcs(tail.size() / 4);
  std::memcpy(crcs.data(), tail.data(), crcs.size() * 4);
  return crcs;
}

// Fills `bytes` with pseudo-random bytes from `seed` (splitmix64: fast
// enough that generating a GiB does not dominate the exchange).
inline void FillRandom(std::span<std::byte> bytes, std::uint64_t seed) {
  std::uint64_t x = seed;
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(bytes.data() + i, &z, 8);
  }
  for (; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(seed >> (i % 8));
}

// Seed of block `index` of `round` from a run's seed (both sides agree).
inline std::uint64_t BlockSeed(std::uint64_t run_seed, std::uint32_t round, std::uint32_t index) {
  return run_seed ^ (std::uint64_t{round} << 32) ^ (std::uint64_t{index} * 0x100000001b3ull);
}

// Fills blocks [0, count) of `region_bytes` for `round` and returns their CRCs.
inline std::vector<std::uint32_t> FillBlocks(std::span<std::byte> region_bytes,
                                             std::uint64_t block_size, std::uint32_t count,
                                             std::uint64_t run_seed, std::uint32_t round) {
  std::vector<std::uint32_t> crcs(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    std::span<std::byte> block = region_bytes.subspan(i * block_size, block_size);
    FillRandom(block, BlockSeed(run_seed, round, i));
    crcs[i] = crc32c::Value(block);
  }
  return crcs;
}

// Empty if blocks [0, crcs.size()) of `region_bytes` match `crcs`, else a
// description of the first mismatch.
inline std::string CheckBlocks(std::span<const std::byte> region_bytes, std::uint64_t block_size,
                               std::span<const std::uint32_t> crcs) {
  for (std::size_t i = 0; i < crcs.size(); ++i) {
    const std::uint32_t got = crc32c::Value(region_bytes.subspan(i * block_size, block_size));
    if (got != crcs[i]) {
      return "block " + std::to_string(i) + ": crc32c " + std::to_string(got) + ", expected " +
             std::to_string(crcs[i]);
    }
  }
  return "";
}

}  // namespace kvfabric::transport_test

#endif  // KVFABRIC_TESTS_TRANSPORT_PEER_PROTOCOL_H_
