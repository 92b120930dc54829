// Conversions between fp32 and the 16-bit KV element types (IEEE binary16 and
// bfloat16), for host C++ and CUDA device code alike.
//
// Widening (16 -> 32 bits) is exact. Narrowing rounds to nearest, ties to even,
// like a hardware conversion: values that round past the largest finite
// binary16 (65504) become infinity, subnormals are produced and read, NaN
// stays NaN (a quiet NaN with the sign kept; the payload is not preserved).
// The host and device paths are the same bit code, so a value converts to the
// same bits everywhere.
//
// Thread safety: pure functions.
#ifndef KVFABRIC_GPU_KERNELS_FLOAT_CONVERT_H_
#define KVFABRIC_GPU_KERNELS_FLOAT_CONVERT_H_

#include <cstdint>
#include <cstring>

#include "gpu/kernels/host_device.h"

namespace kvfabric::gpu {

KVF_HOST_DEVICE inline std::uint32_t FloatBits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

KVF_HOST_DEVICE inline float FloatFromBits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

KVF_HOST_DEVICE inline float Fp16BitsToFloat(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    return FloatFromBits(sign | FloatBits(static_cast<float>(mant) * 5.9604644775390625e-8f));
  }
  if (exp == 31) return FloatFromBits(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return FloatFromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

KVF_HOST_DEVICE inline std::uint16_t FloatToFp16Bits(float f) {
  const std::uint32_t x = FloatBits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN -> quiet NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (abs < 0x38800000u) {
    // Below the smallest normal binary16 (2^-14): a subnormal in units of 2^-24.
    const std::uint32_t e = abs >> 23;
    if (e < 102) return sign;  // < 2^-25: rounds to zero
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // in [14, 24]
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<std::uint16_t>(q);
  }
  std::uint32_t h = (abs >> 13) - (112u << 10);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent
  return sign | static_cast<std::uint16_t>(h);
}

KVF_HOST_DEVICE inline float Bf16BitsToFloat(std::uint16_t b) {
  return FloatFromBits(static_cast<std::uint32_t>(b) << 16);
}

KVF_HOST_DEVICE inline std::uint16_t FloatToBf16Bits(float f) {
  const std::uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // NaN -> quiet NaN
  }
  // Round to nearest even; a carry out of the mantissa bumps the exponent
  // (and the largest finite values round to infinity, as they should).
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace kvfabric::gpu

#endif  // KVFABRIC_GPU_KERNELS_FLOAT_CONVERT_H_
