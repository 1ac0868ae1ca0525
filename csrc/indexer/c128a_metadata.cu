// C128A metadata: the CUDA kernel and its launcher.
//
// The op is write-bound (T x width x 4 bytes out, a few bytes in per row). Grid: y strides
// over the rows, x splits a row's columns only when there are too few rows to fill the
// device; each block then loops over its row's columns in steps of kThreads x kItems.
// Decode and prefill rows share one launch and a block never diverges on the row kind.
// Few, long-lived blocks pay the dependent loads of a row's setup (position, request,
// table row) once per row instead of once per 4 KB of output. With dense 16-byte-aligned
// rows each thread writes kItems columns as int4 stores, a warp's stores contiguous.
#include "c128a_metadata.h"

namespace dsa {
namespace {

constexpr int kItems = 8;  // columns per thread per step: two 16-byte stores

template <int kThreads, bool kVector>
__global__ void __launch_bounds__(kThreads) c128a_metadata_kernel(const C128AArgs a) {
  constexpr int kChunks = kItems / 4;  // 16-byte chunks per thread per step
  await_previous_kernel();
  const int64_t block_cols = static_cast<int64_t>(kThreads) * kItems;
  const int64_t step = static_cast<int64_t>(gridDim.x) * block_cols;
  for (int64_t t = blockIdx.y; t < a.num_tokens; t += gridDim.y) {
    const C128ARow row = c128a_row(a, t);
    if (row.decode && blockIdx.x == 0 && threadIdx.x == 0) a.decode_lens[t] = row.n;
    for (int64_t first = blockIdx.x * block_cols; first < a.width; first += step) {
      // Chunk j of thread i starts at column first + (j * kThreads + i) * 4: each store
      // instruction of a warp covers 512 contiguous bytes. All kItems block-table loads
      // are issued before the first is used (paged_slot_values).
      PagedSlot src[kItems];
#pragma unroll
      for (int q = 0; q < kItems; ++q) {
        const int64_t c =
            first + (static_cast<int64_t>(q / 4) * kThreads + threadIdx.x) * 4 + q % 4;
        src[q] = c < a.width ? c128a_source(a, row, c) : PagedSlot{};
      }
      int32_t v[kItems];
      paged_slot_values(src, row.table_row, a.block_table.col_stride, a.by_block_size.d, v);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t c0 = first + (static_cast<int64_t>(j) * kThreads + threadIdx.x) * 4;
        if (kVector && c0 + 4 <= a.width) {
          *reinterpret_cast<int4*>(row.out + c0) =
              make_int4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (c0 + e < a.width) row.out[(c0 + e) * row.col_stride] = v[4 * j + e];
          }
        }
      }
    }
  }
}

//! An empty view needs no alignment; a non-empty one must have dense aligned rows.
bool vectorizable(const Strided2D<int32_t>& s) { return s.rows == 0 || s.rows_vectorizable(); }

template <int kThreads>
void launch(const C128AArgs& a, const Place& place) {
  const int64_t rows = a.num_tokens < kMaxGridY ? a.num_tokens : kMaxGridY;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kItems;
  const int64_t max_x = (a.width + per_block - 1) / per_block;  // one step per thread
  const int64_t want_x = (2 * sm_count(place.device) + rows - 1) / rows;  // >= 2 blocks/SM
  const int64_t grid_x = want_x < 1 ? 1 : (want_x > max_x ? max_x : want_x);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(rows));
  const bool vector = vectorizable(a.decode) && vectorizable(a.prefill);
  launch_kernel(vector ? c128a_metadata_kernel<kThreads, true>
                       : c128a_metadata_kernel<kThreads, false>,
                grid, kThreads, place.cuda_stream(), "c128a_metadata kernel launch", a);
}

}  // namespace

void c128a_metadata_cuda(const C128AArgs& a, const Place& place) {
  if (a.num_tokens == 0 || a.width == 0) return;
  DeviceGuard guard(place.device);
  // Narrow rows would leave most of a 256-thread block idle.
  if (a.width >= 256 * kItems) {
    launch<256>(a, place);
  } else {
    launch<128>(a, place);
  }
}

}  // namespace dsa
