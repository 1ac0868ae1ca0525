// C128A metadata: the CUDA kernel and its launcher.
//
// The op is write-bound (T x width x 4 bytes out, a few bytes in per row). Grid: y strides
// over the rows, x splits a row's columns only when there are too few rows to fill the
// device; each block then loops over its row's columns in steps of kThreads x kItems.
// Decode and prefill rows share one launch and a warp never diverges on the row kind.
// Few, long-lived blocks pay the dependent loads of a row's setup (position, request,
// table row) once per row instead of once per 4 KB of output; a block of kRows x kThreads
// threads covers kRows rows side by side (threadIdx.y picks the row). A thread's
// block-table loads of a step are issued together (c128a_chunk_loads), one per run of
// entries in one block (c128a_run). With dense 16-byte-aligned rows each thread writes
// kItems columns as int4 stores, a warp's stores contiguous.
#include "c128a_metadata.h"

namespace dsa {
namespace {

template <int kThreads, int kItems, int kRows, bool kVector, int kRun>
__global__ void __launch_bounds__(kThreads * kRows) c128a_metadata_kernel(const C128AArgs a) {
  constexpr int kChunks = kItems / 4;  // 16-byte chunks per thread per step
  await_previous_kernel();
  const int64_t block_cols = static_cast<int64_t>(kThreads) * kItems;
  const int64_t step = static_cast<int64_t>(gridDim.x) * block_cols;
  const int32_t width = static_cast<int32_t>(a.width);  // < 2^31
  // One row a block: the row index stays block-uniform (its setup runs on the uniform
  // datapath; with threadIdx.y in it, width 8192 took 13.6-13.9 us against 12.9).
  const int64_t first_row = kRows == 1 ? static_cast<int64_t>(blockIdx.y)
                                       : static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y;
  for (int64_t t = first_row; t < a.num_tokens; t += static_cast<int64_t>(gridDim.y) * kRows) {
    const C128ARow row = c128a_row(a, t);
    if (row.decode && blockIdx.x == 0 && threadIdx.x == 0) a.decode_lens[t] = row.n;
    for (int64_t first = blockIdx.x * block_cols; first < a.width; first += step) {
      // Chunk j of thread i starts at column first + (j * kThreads + i) * 4: each store
      // instruction of a warp covers 512 contiguous bytes. Every block-table load of the
      // step is issued before the first is used.
      const int32_t c_thread = static_cast<int32_t>(first) + static_cast<int32_t>(threadIdx.x) * 4;
      int32_t entry[kChunks][4 / kRun];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        c128a_chunk_loads<kRun>(a, row, c_thread + j * kThreads * 4, entry[j]);
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int32_t c0 = c_thread + j * kThreads * 4;
        int32_t v[4];
        c128a_chunk_values<kRun>(a, row, c0, entry[j], v);
        if (kVector && c0 <= width - 4) {  // c0 + 4 overflows at c0 = 2^31 - 4
          *reinterpret_cast<int4*>(row.out + c0) = make_int4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (c0 + e < width) row.out[(c0 + e) * row.col_stride] = v[e];
          }
        }
      }
    }
  }
}

//! An empty view needs no alignment; a non-empty one must have dense aligned rows.
bool vectorizable(const Strided2D<int32_t>& s) { return s.rows == 0 || s.rows_vectorizable(); }

template <int kThreads, int kItems, int kRows, bool kVector, int kRun>
void launch_kernel_for(const C128AArgs& a, const Place& place) {
  const int64_t row_blocks = (a.num_tokens + kRows - 1) / kRows;
  const int64_t rows = row_blocks < kMaxGridY ? row_blocks : kMaxGridY;
  const int64_t per_block = static_cast<int64_t>(kThreads) * kItems;
  const int64_t max_x = (a.width + per_block - 1) / per_block;  // one step per thread
  const int64_t want_x = (2 * sm_count(place.device) + rows - 1) / rows;  // >= 2 blocks/SM
  const int64_t grid_x = want_x < 1 ? 1 : (want_x > max_x ? max_x : want_x);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(rows));
  launch_kernel(c128a_metadata_kernel<kThreads, kItems, kRows, kVector, kRun>, grid,
                dim3(kThreads, kRows), place.cuda_stream(), "c128a_metadata kernel launch", a);
}

template <int kThreads, int kItems, int kRows, bool kVector>
void launch_run(const C128AArgs& a, const Place& place) {
  switch (c128a_run(a)) {
    case 4: launch_kernel_for<kThreads, kItems, kRows, kVector, 4>(a, place); break;
    case 2: launch_kernel_for<kThreads, kItems, kRows, kVector, 2>(a, place); break;
    default: launch_kernel_for<kThreads, kItems, kRows, kVector, 1>(a, place);
  }
}

template <int kThreads, int kItems, int kRows = 1>
void launch(const C128AArgs& a, const Place& place) {
  if (vectorizable(a.decode) && vectorizable(a.prefill)) {
    launch_run<kThreads, kItems, kRows, true>(a, place);
  } else {
    launch_run<kThreads, kItems, kRows, false>(a, place);
  }
}

}  // namespace

void c128a_metadata_cuda(const C128AArgs& a, const Place& place) {
  if (a.num_tokens == 0 || a.width == 0) return;
  DeviceGuard guard(place.device);
  // Columns per thread per step (kItems, stored 4 at a time) and threads per row, by the
  // row width: a block as wide as the row where the row is narrow, so that fewer of its
  // threads idle; two rows a block where many rows of one step each would make many small
  // blocks. Measured on the H200 beside vLLM: 8 columns a thread beat 16 (T = 4096,
  // Td = 64, width 1024: 5.53 against 6.54 us; equal at width 8192) and 4 columns on 256
  // threads (5.6 against 6.8 us); two rows a block there: 5.42-5.53 against 5.56-5.58 us;
  // 4 columns beat 8 at width 256 (T = 64: 1.78 against 1.90 us).
  const int64_t many_rows = 16 * static_cast<int64_t>(sm_count(place.device));
  if (a.width >= 256 * 8) {
    launch<256, 8>(a, place);
  } else if (a.width >= 128 * 8) {
    if (a.num_tokens >= many_rows) {
      launch<128, 8, 2>(a, place);
    } else {
      launch<128, 8>(a, place);
    }
  } else {
    launch<128, 4>(a, place);
  }
}

}  // namespace dsa
