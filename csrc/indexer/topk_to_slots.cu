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
  if (short_row_kernel_serves(a.topk, plan)) {
    if (convert_pow2(a.convert)) return topk_to_slots_pow2_cuda(a, place);
    return run_short_rows(a.topk, a.convert, place);
  }
  // Longer rows: the ids into out, then their slots there. H100, beside the cluster kernels
  // that converted each id as they wrote it (same call, graph us, k = 2048, compacted with
  // counts / plain): 256 x 32K 38.5 -> 31.6 / 33.7 -> 30.8, 1024 x 32K 141 -> 118 / 129 ->
  // 117, 16 x 128K 24.3 -> 20.8 / 21.3 -> 18.4, 256 x 128K 82.4 -> 76.5 / 78.4 -> 75.7,
  // 1 x 32K 13.0 -> 11.8 / even; launches of one CTA per SM in clusters of 1-2 tied
  // compacted and lost up to 1.3 us plain (64 x 32K 16.3 -> 17.3, 64 x 128K 28.1 -> 29.2).
  topk_per_row_cuda(a.topk, place);
  convert_index_cuda(convert_ids_in_place(a), place);
}

}  // namespace dsa
