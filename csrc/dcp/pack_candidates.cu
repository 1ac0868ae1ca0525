// DCP candidate packing: the CUDA kernel and its launcher.
//
// One thread per candidate: the id load and the key store are coalesced across a warp,
// the score is the one random (gathered) read, and a thread has nothing else to wait
// for. Grid: x covers a row's K candidates in blocks of kThreads, y strides over the
// rows. (Four candidates per thread were slower: the branch of an invalid id put each
// gather behind the previous one's use, so a thread waited for four DRAM round trips.)
#include "pack_candidates.h"

namespace dsa {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) pack_candidates_kernel(const PackCandidatesArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= a.topk_indices.cols) return;
  for (int64_t row = blockIdx.y; row < a.topk_indices.rows; row += gridDim.y) {
    a.out(row, c) = pack_candidate(a, row, pack_row_start(a, row), a.topk_indices(row, c));
  }
}

}  // namespace

void pack_candidates_cuda(const PackCandidatesArgs& a, const Place& place) {
  const int64_t rows = a.topk_indices.rows, K = a.topk_indices.cols;
  if (rows == 0 || K == 0) return;
  DeviceGuard guard(place.device);
  const dim3 grid(static_cast<unsigned>((K + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  pack_candidates_kernel<<<grid, kThreads, 0, place.cuda_stream()>>>(a);
  throw_on_cuda_error(cudaGetLastError(), "pack_dcp_topk_candidates kernel launch");
}

}  // namespace dsa
