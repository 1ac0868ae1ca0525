// DCP candidate packing: the CUDA kernel and its launcher.
//
// One thread per candidate: the id load and the key store are coalesced across a warp,
// the score is the one random (gathered) read, and a thread has nothing else to wait
// for. Grid: x covers a row's K candidates in blocks of kThreads, y strides over the
// rows. (Four candidates per thread were slower: the branch of an invalid id put each
// gather behind the previous one's use, so a thread waited for four DRAM round trips.)
// Block size, measured on the H200 (K = 2048, scores not in L2): 256 threads are best
// for 64 rows (1024 threads: +0.4 us), 1024 threads for 1024 rows (256: +0.8 us of 30).
#include "pack_candidates.h"

namespace dsa {
namespace {

//! Candidates per launch from which the large blocks pay off (512 rows of K = 2048).
constexpr int64_t kLargeBlockCandidates = int64_t{1} << 20;

template <int kThreads>
__global__ void __launch_bounds__(kThreads) pack_candidates_kernel(const PackCandidatesArgs a) {
  await_previous_kernel();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= a.topk_indices.cols) return;
  for (int64_t row = blockIdx.y; row < a.topk_indices.rows; row += gridDim.y) {
    const int32_t local = load_read_only(&a.topk_indices(row, c));
    a.out(row, c) = pack_candidate(a, row, pack_row_start(a, row), local);
  }
}

template <int kThreads>
void launch(const PackCandidatesArgs& a, const Place& place) {
  const int64_t rows = a.topk_indices.rows, K = a.topk_indices.cols;
  const dim3 grid(static_cast<unsigned>((K + kThreads - 1) / kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  launch_kernel(pack_candidates_kernel<kThreads>, grid, kThreads, place.cuda_stream(),
                "pack_dcp_topk_candidates kernel launch", a);
}

}  // namespace

void pack_candidates_cuda(const PackCandidatesArgs& a, const Place& place) {
  const int64_t rows = a.topk_indices.rows, K = a.topk_indices.cols;
  if (rows == 0 || K == 0) return;
  DeviceGuard guard(place.device);
  if (rows * K >= kLargeBlockCandidates) {
    launch<1024>(a, place);
  } else {
    launch<256>(a, place);
  }
}

}  // namespace dsa
