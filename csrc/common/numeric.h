// Bit-level float helpers shared by CPU implementations and CUDA kernels.
//
// bf16 is handled as raw 16-bit patterns with the same conversion on host and device
// (round to nearest even; NaN -> 0x7FC0 like PyTorch), so a CPU/CUDA pair agrees
// whenever the fp32 value agrees.
#pragma once

#include <cstdint>
#include <cstring>

#include "dcp_math.h"  // DSA_HD

namespace dsa {

//! A bf16 value as its raw bits (no arithmetic: convert to float).
struct BFloat16 {
  uint16_t bits;
};

DSA_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

DSA_HD float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

DSA_HD float to_float(float x) { return x; }
DSA_HD float to_float(BFloat16 x) { return float_from_bits(static_cast<uint32_t>(x.bits) << 16); }

template <typename T>
DSA_HD T from_float(float x);

template <>
DSA_HD float from_float<float>(float x) {
  return x;
}

//! fp32 -> bf16, round to nearest even; NaN becomes the canonical quiet NaN 0x7FC0.
template <>
DSA_HD BFloat16 from_float<BFloat16>(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return BFloat16{0x7FC0};
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

//! A read-only load (the non-coherent data path on the device).
template <typename T>
DSA_HD T load_read_only(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

}  // namespace dsa
