// Owner-placed kRead/kWrite over UCX active messages: the wire format.
//
// Why: UCX 1.13.1 emulates ucp_get_nbx/ucp_put_nbx with active messages over
// TCP and over shared memory on user memory. The emulation does not
// bounds-check, and it aborts the memory *owner* ("Fatal: unexpected error:
// Endpoint timeout" in ucp_put_handler / ucp_get_req_handler) when the peer
// dies or force-closes while such operations are in flight. So wherever UCX's
// get/put would not be truly one-sided (see ucx_transport.h, "How each
// transfer maps onto UCX"), the UCX transport moves kRead/kWrite bytes with
// its own active messages, which the owner's progress thread checks and
// places:
//
//   kWrite  requester --kRmaWriteAmId{RmaRequest} + payload--> owner
//           owner: look up the grant, check [offset, offset + length) against
//           the granted range, place the payload (copy an eager payload, or
//           ucp_am_recv_data_nbx a rendezvous one straight into the region),
//           then --kRmaReplyAmId{RmaReply}--> requester, which completes the
//           entry with the reply's status (OK = placed in the owner's memory).
//   kRead   requester --kRmaReadAmId{RmaRequest}--> owner
//           owner: check as above, then --kRmaReplyAmId{RmaReply} + the bytes
//           from its region--> requester, which receives them straight into
//           the local destination and completes the entry.
//   An owner that refuses replies without payload and with the refusal's
//   code. Every message is sent with UCP_AM_SEND_FLAG_REPLY; a receiver
//   accepts a reply only from the endpoint its request went out on.
//
// Encoding: fixed-size headers, integers little-endian (the build refuses a
// big-endian host), exact sizes; anything else is ignored by the receiver.
// Pure functions; thread-safe.
#ifndef KVFABRIC_TRANSPORT_UCX_UCX_AM_RMA_H_
#define KVFABRIC_TRANSPORT_UCX_UCX_AM_RMA_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "core/status.h"

namespace kvfabric::ucx::internal {

static_assert(std::endian::native == std::endian::little,
              "the owner-placed RMA headers are encoded in host order on little-endian hosts");

// Active-message ids. kAmId carries user kSend messages; the others are the
// transport's own and never reach a MessageHandler.
inline constexpr unsigned kAmId = 0x4b56;
inline constexpr unsigned kRmaWriteAmId = 0x4b57;
inline constexpr unsigned kRmaReadAmId = 0x4b58;
inline constexpr unsigned kRmaReplyAmId = 0x4b59;

inline constexpr std::uint32_t kRmaMagic = 0x524d564b;  // "KVMR"
inline constexpr std::uint32_t kRmaVersion = 1;

// Requester -> owner (kRmaWriteAmId, kRmaReadAmId).
struct RmaRequest {
  std::uint32_t magic = kRmaMagic;
  std::uint32_t version = kRmaVersion;
  std::uint64_t grant_id = 0;    // from the export (transport/ucx/ucx_export.h)
  std::uint64_t offset = 0;      // within the granted range
  std::uint64_t length = 0;      // bytes; for kWrite also the payload's length
  std::uint64_t request_id = 0;  // echoed in the reply; unique per requester
};
static_assert(sizeof(RmaRequest) == 40);

// Owner -> requester (kRmaReplyAmId).
struct RmaReply {
  std::uint32_t magic = kRmaMagic;
  std::uint32_t version = kRmaVersion;
  std::uint64_t request_id = 0;
  std::uint32_t code = 0;  // a StatusCode; kOk when placed / when the bytes follow
  std::uint32_t reserved = 0;
};
static_assert(sizeof(RmaReply) == 24);

// Nothing unless `bytes` is exactly one well-formed T.
template <typename T>
std::optional<T> DecodeRma(const void* bytes, std::size_t length) {
  if (length != sizeof(T)) return std::nullopt;
  T v;
  std::memcpy(&v, bytes, sizeof(T));
  if (v.magic != kRmaMagic || v.version != kRmaVersion) return std::nullopt;
  return v;
}

// The Status a requester reports for an owner's refusal code.
inline Status RmaReplyStatus(std::uint32_t code, const char* what) {
  return StatusFromCode(code, std::string(what) + ": refused by the owner");
}

}  // namespace kvfabric::ucx::internal

#endif  // KVFABRIC_TRANSPORT_UCX_UCX_AM_RMA_H_
