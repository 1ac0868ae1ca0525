// DCP candidate packing: the CUDA kernel and its launcher.
//
// A block covers a tile of kThreads * kItems columns of one row; each thread packs
// kItems consecutive candidates (one 16-byte load of ids, kItems independent score
// gathers, two 16-byte stores of keys when rows are dense and aligned). The work is
// purely elementwise, so the grid is rows x tiles (grid-stride over that product).
#include "pack_candidates.h"

namespace dsa {
namespace {

constexpr int kThreads = 128;
constexpr int kItems = 4;
constexpr int kTile = kThreads * kItems;

template <bool kVector>
__global__ void __launch_bounds__(kThreads) pack_candidates_kernel(const PackCandidatesArgs a) {
  const int64_t K = a.topk_indices.cols;
  const int64_t tiles = (K + kTile - 1) / kTile;
  const int64_t blocks = a.topk_indices.rows * tiles;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t row = b / tiles;
    const int64_t c0 = (b - row * tiles) * kTile + static_cast<int64_t>(threadIdx.x) * kItems;
    if (c0 >= K) continue;
    const int64_t start = pack_row_start(a, row);
    if (kVector && c0 + kItems <= K) {
      const int4 ids = *reinterpret_cast<const int4*>(a.topk_indices.row(row) + c0);
      const ulonglong2 k01 = make_ulonglong2(pack_candidate(a, row, start, ids.x),
                                             pack_candidate(a, row, start, ids.y));
      const ulonglong2 k23 = make_ulonglong2(pack_candidate(a, row, start, ids.z),
                                             pack_candidate(a, row, start, ids.w));
      uint64_t* out = a.out.row(row) + c0;
      *reinterpret_cast<ulonglong2*>(out) = k01;
      *reinterpret_cast<ulonglong2*>(out + 2) = k23;
    } else {
      int32_t ids[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) ids[j] = c0 + j < K ? a.topk_indices(row, c0 + j) : -1;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (c0 + j < K) a.out(row, c0 + j) = pack_candidate(a, row, start, ids[j]);
      }
    }
  }
}

}  // namespace

void pack_candidates_cuda(const PackCandidatesArgs& a, const Place& place) {
  const int64_t rows = a.topk_indices.rows, K = a.topk_indices.cols;
  if (rows == 0 || K == 0) return;
  DeviceGuard guard(place.device);
  const int64_t blocks = rows * ((K + kTile - 1) / kTile);
  const unsigned grid = static_cast<unsigned>(blocks < kMaxGridX ? blocks : kMaxGridX);
  const bool vector = a.topk_indices.rows_vectorizable() && a.out.rows_vectorizable();
  if (vector) {
    pack_candidates_kernel<true><<<grid, kThreads, 0, place.cuda_stream()>>>(a);
  } else {
    pack_candidates_kernel<false><<<grid, kThreads, 0, place.cuda_stream()>>>(a);
  }
  throw_on_cuda_error(cudaGetLastError(), "pack_dcp_topk_candidates kernel launch");
}

}  // namespace dsa
