// Index conversion: the CUDA kernel and its launcher.
//
// One block per row (grid-stride over rows). A tile of kThreads * kItems columns is
// striped: item j of thread i is column tile + j * kThreads + i, so every load and store
// of a warp touches consecutive columns. With compaction, warp ballots give each valid
// slot its rank inside a 32-column run and one shared-memory scan over the per-warp counts
// places the runs, so a warp's valid slots land contiguously in ascending column order
// (deterministic, unlike the atomics-based reference kernel) and the stores coalesce.
#include "convert_index.h"

namespace dsa {
namespace {

constexpr int kItems = 8;  // columns per thread per tile

// kDense: token_indices, out and block_table rows are contiguous (column stride 1), so
// column offsets need no multiply and loads take immediate offsets.
template <int kThreads, bool kCompact, bool kDense>
__global__ void __launch_bounds__(kThreads, 2048 / kThreads) convert_index_kernel(const ConvertIndexArgs a) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kRuns = kItems * kWarps;  // 32-column runs per tile, in column order
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kItems;
  static_assert(kRuns <= 2 * 32, "one warp scans the run counts, two per lane");
  __shared__ int run_offset[kRuns + 1];  // exclusive prefix of valid slots per run
  await_previous_kernel();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t K = a.token_indices.cols;
  const int64_t in_stride = kDense ? 1 : a.token_indices.col_stride;
  const int64_t out_stride = kDense ? 1 : a.out.col_stride;
  const bool need_count = kCompact || a.valid_counts.present();

  for (int64_t t = blockIdx.x; t < a.token_indices.rows; t += gridDim.x) {
    const int32_t* in = a.token_indices.row(t);
    int32_t* out = a.out.row(t);
    int64_t row_count = 0;

    for (int64_t tile = 0; tile < K; tile += kTile) {
      int32_t slot[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {  // issue every load before the row lookup
        const int64_t c = tile + j * kThreads + threadIdx.x;
        // Token ids are read once: stream them (evict-first) so that L1 keeps the
        // block-table row that every token of the row gathers from.
        slot[j] = c < K ? __ldcs(in + c * in_stride) : -1;
      }
      const ConvertRow row = convert_row(a, t);
#pragma unroll
      for (int j = 0; j < kItems; ++j) slot[j] = convert_token<kDense>(a, row, slot[j]);

      unsigned valid[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        valid[j] = __ballot_sync(0xffffffffu, slot[j] >= 0);
        if (lane == 0) run_offset[j * kWarps + warp] = __popc(valid[j]);
      }
      if (need_count) {
        __syncthreads();
        if (warp == 0) {  // exclusive scan of the kRuns counts, two per lane
          const int n0 = 2 * lane < kRuns ? run_offset[2 * lane] : 0;
          const int n1 = 2 * lane + 1 < kRuns ? run_offset[2 * lane + 1] : 0;
          int incl = n0 + n1;
#pragma unroll
          for (int d = 1; d < 32; d *= 2) {
            const int up = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += up;
          }
          __syncwarp();
          if (2 * lane < kRuns) run_offset[2 * lane] = incl - n0 - n1;
          if (2 * lane + 1 < kRuns) run_offset[2 * lane + 1] = incl - n1;
          if (lane == 31) run_offset[kRuns] = incl;
        }
        __syncthreads();
      }

#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t c = tile + j * kThreads + threadIdx.x;
        if constexpr (kCompact) {
          if (slot[j] >= 0) {
            const int64_t pos = row_count + run_offset[j * kWarps + warp] +
                                __popc(valid[j] & lanes_below);
            out[pos * out_stride] = slot[j];
          }
        } else if (c < K) {
          out[c * out_stride] = slot[j];
        }
      }
      if (need_count) {
        row_count += run_offset[kRuns];
        __syncthreads();  // run_offset is rewritten by the next tile
      }
    }

    if constexpr (kCompact) {
      for (int64_t c = row_count + threadIdx.x; c < K; c += kThreads) {
        out[c * out_stride] = -1;
      }
    }
    if (threadIdx.x == 0 && a.valid_counts.present()) {
      a.valid_counts[t] = static_cast<int32_t>(row_count);
    }
  }
}

template <int kThreads>
void launch_with_threads(const ConvertIndexArgs& a, cudaStream_t stream) {
  const int64_t grid = a.token_indices.rows < kMaxGridX ? a.token_indices.rows : kMaxGridX;
  const bool dense = a.token_indices.col_stride == 1 && a.out.col_stride == 1 &&
                     a.block_table.col_stride == 1;
  auto kernel = a.compact ? (dense ? convert_index_kernel<kThreads, true, true>
                                   : convert_index_kernel<kThreads, true, false>)
                          : (dense ? convert_index_kernel<kThreads, false, true>
                                   : convert_index_kernel<kThreads, false, false>);
  launch_kernel(kernel, static_cast<unsigned>(grid), kThreads, stream,
                "convert_index kernel launch", a);
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
}

}  // namespace dsa
