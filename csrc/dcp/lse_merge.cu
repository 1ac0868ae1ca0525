// DCP attention-output merge: the LSE correction kernel and its launcher.
//
// One warp per (b, h): every lane evaluates merge_lse (W broadcast loads, the same
// sequential loop as the CPU), then the warp streams the D outputs with 16-byte vectors
// when the head dimension is dense and aligned, scattering the head into its
// head-block-major slot [h / (H/W), b, h % (H/W), :].
#include "lse_merge.h"

namespace dsa {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads) correct_attn_kernel(const CorrectAttnArgs<T> a) {
  await_previous_kernel();
  const int64_t B = a.partial.size[0], H = a.partial.size[1], D = a.partial.size[2];
  const int64_t heads_per_rank = a.corrected.size[2];
  const int lane = threadIdx.x % 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  for (int64_t row = first; row < B * H; row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t b = row / H, h = row - b * H;
    const LseWeight wt = merge_lse(a.lses, b, h, a.rank, a.base2);
    if (lane == 0 && a.global_lse.present()) a.global_lse(b, h) = wt.lse;
    const int64_t w = h / heads_per_rank, j = h - w * heads_per_rank;
    const T* src = a.partial.data + a.partial.offset(b, h);
    T* dst = a.corrected.data + a.corrected.offset(w, b, j);
    if constexpr (kVector) {
      constexpr int kVec = 16 / sizeof(T);
      union Vec {
        int4 raw;
        T e[kVec];
      };
      for (int64_t v = lane; v < D / kVec; v += 32) {
        Vec x;
        x.raw = __ldg(reinterpret_cast<const int4*>(src) + v);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          x.e[i] = from_float<T>(weigh_output(to_float(x.e[i]), wt.factor));
        }
        reinterpret_cast<int4*>(dst)[v] = x.raw;
      }
    } else {
      const int64_t ss = a.partial.stride[2], ds = a.corrected.stride[3];
      for (int64_t d = lane; d < D; d += 32) {
        dst[d * ds] = from_float<T>(weigh_output(to_float(src[d * ss]), wt.factor));
      }
    }
  }
}

}  // namespace

template <typename T>
void correct_attn_cuda(const CorrectAttnArgs<T>& a, const Place& place) {
  const int64_t rows = a.partial.size[0] * a.partial.size[1];
  if (rows == 0) return;
  DeviceGuard guard(place.device);
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxGridX ? blocks : kMaxGridX);
  const bool vector = a.partial.inner_vectorizable() && a.corrected.inner_vectorizable();
  launch_kernel(vector ? correct_attn_kernel<T, true> : correct_attn_kernel<T, false>, grid,
                kThreads, place.cuda_stream(), "merge_attention_outputs correction kernel launch",
                a);
}

template void correct_attn_cuda<float>(const CorrectAttnArgs<float>&, const Place&);
template void correct_attn_cuda<BFloat16>(const CorrectAttnArgs<BFloat16>&, const Place&);

}  // namespace dsa
