// C128A metadata: the CUDA kernel and its launcher.
//
// The op is write-bound (T x width x 4 bytes out, a few bytes in per row). Grid: x tiles
// the columns (kThreads x kItems per block), y strides over the rows, so decode and
// prefill rows share one launch and a block never diverges on the row kind. With dense
// 16-byte-aligned rows each thread writes its kItems columns as two int4 stores.
#include "c128a_metadata.h"

namespace dsa {
namespace {

constexpr int kThreads = 128;
constexpr int kItems = 8;  // columns per thread per step: two 16-byte stores
constexpr int64_t kMaxGridY = 65535;

template <bool kVector>
__global__ void __launch_bounds__(kThreads) c128a_metadata_kernel(const C128AArgs a) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kItems;
  for (int64_t t = blockIdx.y; t < a.num_tokens; t += gridDim.y) {
    const C128ARow row = c128a_row(a, t);
    if (row.decode && blockIdx.x == 0 && threadIdx.x == 0) a.decode_lens[t] = row.n;
    for (int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kItems;
         c0 < a.width; c0 += step) {
      if (kVector && c0 + kItems <= a.width) {
        int32_t v[kItems];
#pragma unroll
        for (int j = 0; j < kItems; ++j) v[j] = c128a_entry(a, row, c0 + j);
        *reinterpret_cast<int4*>(row.out + c0) = make_int4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<int4*>(row.out + c0 + 4) = make_int4(v[4], v[5], v[6], v[7]);
      } else {
        for (int64_t c = c0; c < c0 + kItems && c < a.width; ++c) {
          row.out[c * row.col_stride] = c128a_entry(a, row, c);
        }
      }
    }
  }
}

//! An empty view needs no alignment; a non-empty one must have dense aligned rows.
bool vectorizable(const Strided2D<int32_t>& s) { return s.rows == 0 || s.rows_vectorizable(); }

}  // namespace

void c128a_metadata_cuda(const C128AArgs& a, const Place& place) {
  if (a.num_tokens == 0 || a.width == 0) return;
  DeviceGuard guard(place.device);
  const int64_t per_block = static_cast<int64_t>(kThreads) * kItems;
  const dim3 grid(static_cast<unsigned>((a.width + per_block - 1) / per_block),
                  static_cast<unsigned>(a.num_tokens < kMaxGridY ? a.num_tokens : kMaxGridY));
  if (vectorizable(a.decode) && vectorizable(a.prefill)) {
    c128a_metadata_kernel<true><<<grid, kThreads, 0, place.cuda_stream()>>>(a);
  } else {
    c128a_metadata_kernel<false><<<grid, kThreads, 0, place.cuda_stream()>>>(a);
  }
  throw_on_cuda_error(cudaGetLastError(), "c128a_metadata kernel launch");
}

}  // namespace dsa
