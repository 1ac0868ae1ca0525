// topk_to_slots: the per-row top-K's kernels (topk_per_row_kernel.cuh) with the slot
// conversion (convert_index.h) as their sink, in a translation unit of their own; those
// whose conversion takes shifts and masks (convert_pow2) are in topk_to_slots_pow2.cu.
#include "topk_per_row_kernel.cuh"

namespace dsa {

void topk_to_slots_cuda(const TopkSlotsArgs& a, const Place& place) {
  if (convert_pow2(a.convert)) return topk_to_slots_pow2_cuda(a, place);
  run_selection(a.topk, a.convert, place);
}

}  // namespace dsa
