// Warp-level sums and prefix sums shared by the CUDA kernels.
#pragma once

#include <cstdint>

#ifdef __CUDACC__

namespace dsa {

//! Sum of x over the lanes up to this one (a full warp calls it).
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T u = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += u;
  }
  return x;
}

//! Sum of x over the warp, in every lane (a full warp calls it).
template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

}  // namespace dsa

#endif
