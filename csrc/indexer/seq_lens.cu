// Per-token sequence lengths: the CUDA kernels and their launchers.
//
// All three ops are tiny and latency-bound (a few thousand elements at most per decode
// step): one thread per element, a grid-stride loop, 256 threads per block.
#include "seq_lens.h"

namespace dsa {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxGridX ? blocks : kMaxGridX);
}

template <bool kInt64>
__global__ void __launch_bounds__(kThreads) local_lens_kernel(const LocalLensArgs a) {
  await_previous_kernel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.num;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    if constexpr (kInt64) {
      local_lens_element(a.lens64, a.out64, a, i);
    } else {
      local_lens_element(a.lens32, a.out32, a, i);
    }
  }
}

__global__ void __launch_bounds__(kThreads) decode_lens_kernel(const DecodeLensArgs a) {
  await_previous_kernel();
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       t < a.num_tokens; t += static_cast<int64_t>(gridDim.x) * kThreads) {
    decode_lens_element(a, t);
  }
}

__global__ void __launch_bounds__(kThreads) prefill_bounds_kernel(const PrefillBoundsArgs a) {
  await_previous_kernel();
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       t < a.num_tokens; t += static_cast<int64_t>(gridDim.x) * kThreads) {
    prefill_bounds_element(a, t);
  }
}

}  // namespace

void local_lens_cuda(const LocalLensArgs& a, const Place& place) {
  const int64_t n = a.num;
  if (n == 0) return;
  DeviceGuard guard(place.device);
  launch_kernel(a.is_int64 ? local_lens_kernel<true> : local_lens_kernel<false>, grid_for(n),
                kThreads, place.cuda_stream(), "dcp_local_seq_lens kernel launch", a);
}

void decode_lens_cuda(const DecodeLensArgs& a, const Place& place) {
  if (a.num_tokens == 0) return;
  DeviceGuard guard(place.device);
  launch_kernel(decode_lens_kernel, grid_for(a.num_tokens), kThreads, place.cuda_stream(),
                "expand_decode_seq_lens kernel launch", a);
}

void prefill_bounds_cuda(const PrefillBoundsArgs& a, const Place& place) {
  if (a.num_tokens == 0) return;
  DeviceGuard guard(place.device);
  launch_kernel(prefill_bounds_kernel, grid_for(a.num_tokens), kThreads, place.cuda_stream(),
                "prefill_chunk_bounds kernel launch", a);
}

}  // namespace dsa
