// libFuzzer target: the block header parser (core/block_format.h), the first bytes a daemon
// reads back from NVMe and a client reads from a peer. Decode must accept or refuse with a
// Status; for an accepted header the slices it computes must lie inside the payload it states,
// and VerifyPayload over the input's remaining bytes must not read past them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/block_format.h"

using namespace kvfabric;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  auto h = DecodeBlockHeader(in);
  if (!h.ok()) return 0;
  for (std::uint32_t layer = 0; layer < h->layers + 1 && layer < 4096; ++layer) {
    for (auto slice : {LayerSlice(*h, layer), KeySlice(*h, layer), ValueSlice(*h, layer)}) {
      if (!slice.ok()) continue;
      if (slice->offset + slice->bytes < slice->offset ||
          slice->offset + slice->bytes > h->payload_bytes) {
        std::abort();
      }
    }
  }
  if (size > kBlockHeaderBytes) (void)VerifyPayload(*h, in.subspan(kBlockHeaderBytes));
  return 0;
}
