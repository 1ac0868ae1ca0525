// topk_to_candidates: the per-row top-K's kernels (topk_per_row_kernel.cuh) with
// the DCP candidate packing (pack_candidates.h) as their sink, in a translation unit of their own.
#include "topk_per_row_kernel.cuh"

namespace dsa {

void topk_to_candidates_cuda(const TopkCandidatesArgs& a, const Place& place) {
  run_selection(a.topk, a.pack, place);
}

}  // namespace dsa
