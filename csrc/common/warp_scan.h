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

//! warp_inclusive_sum of 32-bit values, each step a shuffle and an add predicated on the
//! shuffle's own in-range flag: two instructions a step where the generic one takes four.
//! The per-row top-K's find_digit and resident collect use it; its other scans keep the
//! generic one, with which this one made a slot kernel spill more at the 64-register bound.
__device__ __forceinline__ uint32_t warp_inclusive_sum_u32(uint32_t x) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    // volatile: a shuffle must stay where every lane of the warp runs it.
    asm volatile("{\n\t.reg .u32 t;\n\t.reg .pred p;\n\t"
                 "shfl.sync.up.b32 t|p, %0, %1, 0, -1;\n\t"
                 "@p add.u32 %0, %0, t;\n\t}"
                 : "+r"(x)
                 : "r"(d));
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
