// topk_to_slots: short rows take the short-row kernel with the slot conversion
// (convert_index.h) as its sink, in a translation unit of their own (those whose conversion
// takes shifts and masks, convert_pow2, are in topk_to_slots_pow2.cu). Longer rows take
// two launches: the ids (topk_per_row), then their slots in place (convert_index).
#include "topk_per_row_kernel.cuh"

namespace dsa {

void topk_to_slots_cuda(const TopkSlotsArgs& a, const Place& place) {
  if (a.topk.rows == 0) return;
  DeviceGuard guard(place.device);
  const TopkPlan plan = topk_plan(a.topk.rows, a.topk.cols, sm_count(place.device));
  if (plan.short_rows && !a.topk.sorted) {
    if (convert_pow2(a.convert)) return topk_to_slots_pow2_cuda(a, place);
    return run_short_rows(a.topk, a.convert, place);
  }
  // The cluster kernels with the slot sink lost to these two launches on every long-row
  // shape (MEASURED_PLACEHOLDER): the conversion's own kernel spreads a row's block-table
  // gathers over more CTAs than the row's cluster has.
  topk_per_row_cuda(a.topk, place);
  convert_index_cuda(convert_ids_in_place(a), place);
}

}  // namespace dsa
