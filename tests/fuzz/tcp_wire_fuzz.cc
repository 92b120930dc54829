// libFuzzer target: the kernel-TCP transport's wire decoders (transport/tcp/tcp_wire.h), fed
// what a hostile peer controls: the hello, a frame header, an export token. Each must accept or
// refuse with a Status, never crash; what it accepts must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "transport/tcp/tcp_wire.h"

using namespace kvfabric::tcp::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  (void)DecodeHello(std::span<const std::byte>(bytes, size));
  if (size >= kFrameHeaderBytes) {
    auto h =
        DecodeFrameHeader(std::span<const std::byte, kFrameHeaderBytes>(bytes, kFrameHeaderBytes));
    if (h.ok()) {
      std::byte again[kFrameHeaderBytes];
      EncodeFrameHeader(*h, again);
      if (std::memcmp(again, bytes, kFrameHeaderBytes) != 0) std::abort();
    }
  }
  auto e = DecodeExport(std::string_view(reinterpret_cast<const char*>(data), size));
  if (e.ok() && EncodeExport(*e) != std::string_view(reinterpret_cast<const char*>(data), size)) {
    std::abort();
  }
  return 0;
}
