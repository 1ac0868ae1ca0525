// Index conversion: the CUDA kernel and its launcher.
//
// One block per row (grid-stride over rows). Each thread converts kItems consecutive
// columns of a tile; with compaction a block-wide exclusive scan gives every valid slot
// its position, the tile's slots are staged in shared memory in column order and written
// out coalesced, so the output order is ascending column order (deterministic), unlike
// the atomics-based reference kernel.
#include <cub/block/block_scan.cuh>

#include "convert_index.h"

namespace dsa {
namespace {

constexpr int kItems = 8;  // columns per thread per tile: two 16-byte vectors

template <int kThreads, bool kVector, bool kCompact>
__global__ void __launch_bounds__(kThreads)
    convert_index_kernel(const ConvertIndexArgs a) {
  constexpr int kTile = kThreads * kItems;
  using BlockScan = cub::BlockScan<int, kThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int32_t staged[kCompact ? kTile : 1];

  const int64_t K = a.token_indices.cols;
  const bool need_count = kCompact || a.valid_counts.present();

  for (int64_t t = blockIdx.x; t < a.token_indices.rows; t += gridDim.x) {
    const ConvertRow row = convert_row(a, t);
    const int32_t* in = a.token_indices.row(t);
    int32_t* out = a.out.row(t);
    int64_t row_count = 0;

    for (int64_t tile = 0; tile < K; tile += kTile) {
      const int64_t c0 = tile + static_cast<int64_t>(threadIdx.x) * kItems;
      const bool full = c0 + kItems <= K;
      int32_t slot[kItems];
      if (kVector && full) {
        const int4 v0 = *reinterpret_cast<const int4*>(in + c0);
        const int4 v1 = *reinterpret_cast<const int4*>(in + c0 + 4);
        const int32_t tok[kItems] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int j = 0; j < kItems; ++j) slot[j] = convert_token(a, row, tok[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const int64_t c = c0 + j;
          slot[j] = c < K ? convert_token(a, row, in[c * a.token_indices.col_stride]) : -1;
        }
      }

      int valid = 0;
#pragma unroll
      for (int j = 0; j < kItems; ++j) valid += slot[j] >= 0;

      if constexpr (!kCompact) {
        if (kVector && full) {
          *reinterpret_cast<int4*>(out + c0) = make_int4(slot[0], slot[1], slot[2], slot[3]);
          *reinterpret_cast<int4*>(out + c0 + 4) =
              make_int4(slot[4], slot[5], slot[6], slot[7]);
        } else {
#pragma unroll
          for (int j = 0; j < kItems; ++j) {
            if (c0 + j < K) out[(c0 + j) * a.out.col_stride] = slot[j];
          }
        }
        if (need_count) {
          int offset, tile_count;
          BlockScan(scan_storage).ExclusiveSum(valid, offset, tile_count);
          row_count += tile_count;
          __syncthreads();  // scan_storage is reused by the next tile
        }
      } else {
        int offset, tile_count;
        BlockScan(scan_storage).ExclusiveSum(valid, offset, tile_count);
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          if (slot[j] >= 0) staged[offset++] = slot[j];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < tile_count; i += kThreads) {
          out[(row_count + i) * a.out.col_stride] = staged[i];
        }
        row_count += tile_count;
        __syncthreads();  // staged and scan_storage are reused by the next tile
      }
    }

    if constexpr (kCompact) {
      for (int64_t c = row_count + threadIdx.x; c < K; c += kThreads) {
        out[c * a.out.col_stride] = -1;
      }
    }
    if (need_count && threadIdx.x == 0 && a.valid_counts.present()) {
      a.valid_counts[t] = static_cast<int32_t>(row_count);
    }
  }
}

template <int kThreads>
void launch_with_threads(const ConvertIndexArgs& a, cudaStream_t stream) {
  const bool vector = a.token_indices.rows_vectorizable() && a.out.rows_vectorizable();
  const int64_t grid = a.token_indices.rows < kMaxGridX ? a.token_indices.rows : kMaxGridX;
  auto kernel = a.compact ? (vector ? convert_index_kernel<kThreads, true, true>
                                    : convert_index_kernel<kThreads, false, true>)
                          : (vector ? convert_index_kernel<kThreads, true, false>
                                    : convert_index_kernel<kThreads, false, false>);
  kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a);
}

}  // namespace

void convert_index_cuda(const ConvertIndexArgs& a, const Place& place) {
  if (a.token_indices.rows == 0 || a.token_indices.cols == 0) return;
  DeviceGuard guard(place.device);
  // Short rows would leave most of a 256-thread block idle.
  if (a.token_indices.cols <= 64 * kItems) {
    launch_with_threads<64>(a, place.cuda_stream());
  } else {
    launch_with_threads<256>(a, place.cuda_stream());
  }
  throw_on_cuda_error(cudaGetLastError(), "convert_index kernel launch");
}

}  // namespace dsa
