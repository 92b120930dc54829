// SecureRandomBytes: bytes from the kernel's CSPRNG (getrandom(2)), for
// values a peer must not guess: access tokens, lease ids.
//
// A non-cryptographic generator (xorshift128+ was used for tokens) gives its
// state away in two outputs, which a client sees as its own tokens or ids;
// from them it could predict every other client's.
#ifndef KVFABRIC_CORE_SECURE_RANDOM_H_
#define KVFABRIC_CORE_SECURE_RANDOM_H_

#include <cstdint>
#include <span>

namespace kvfabric {

// Fills `out`. getrandom does not fail once the kernel's pool is initialised
// (after early boot) for requests of at most 256 bytes; if it does, the
// process aborts with the errno, since nothing it could hand out instead
// would be safe.
void SecureRandomBytes(std::span<std::uint8_t> out);

// A uniformly random 64-bit value from SecureRandomBytes.
std::uint64_t SecureRandomU64();

}  // namespace kvfabric

#endif  // KVFABRIC_CORE_SECURE_RANDOM_H_
