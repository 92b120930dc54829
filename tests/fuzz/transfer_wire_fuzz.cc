// libFuzzer target: the data-plane message codec (proto/transfer_wire.h): every message a
// daemon reads from a client's connection goes through DecodeTransferMessage first. Any bytes
// must decode or be refused with a Status; what decodes must encode, and that encoding must
// decode to a message that encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "proto/transfer_wire.h"

using namespace kvfabric::wire;

namespace {
std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto m = DecodeTransferMessage({reinterpret_cast<const std::byte*>(data), size});
  if (!m.ok()) return 0;
  auto encoded = EncodeTransferMessage(*m);
  if (!encoded.ok()) return 0;  // e.g. a reply over its limit: the encoder refuses, not crashes
  auto again = DecodeTransferMessage(Bytes(*encoded));
  if (!again.ok()) std::abort();
  auto twice = EncodeTransferMessage(*again);
  if (!twice.ok() || *twice != *encoded) std::abort();
  return 0;
}
