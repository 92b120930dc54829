#include "core/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvfabric {

void SecureRandomBytes(std::span<std::uint8_t> out) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t got = getrandom(out.data() + filled, out.size() - filled, 0);
    if (got > 0) {
      filled += static_cast<std::size_t>(got);
    } else if (errno != EINTR) {
      std::fprintf(stderr, "kvfabric: getrandom failed (%s): no unguessable value can be made\n",
                   std::strerror(errno));
      std::abort();
    }
  }
}

std::uint64_t SecureRandomU64() {
  std::uint8_t b[8];
  SecureRandomBytes(b);
  std::uint64_t v = 0;
  for (std::uint8_t x : b) v = (v << 8) | x;
  return v;
}

}  // namespace kvfabric
