// topk_to_slots: one kernel with the slot conversion (convert_index.h) as its sink on short
// rows and on the launches below, in a translation unit of their own (those whose
// conversion takes shifts and masks, convert_pow2, are in topk_to_slots_pow2.cu); else two
// launches: the ids (topk_per_row), then their slots in place (convert_index).
#include "topk_per_row_kernel.cuh"

namespace dsa {

void topk_to_slots_cuda(const TopkSlotsArgs& a, const Place& place) {
  if (a.topk.rows == 0) return;
  DeviceGuard guard(place.device);
  const int64_t sms = sm_count(place.device);
  const TopkPlan plan = topk_plan(a.topk.rows, a.topk.cols, place.device);
  const bool counted = a.convert.compact || a.convert.valid_counts.present();
  // One kernel: short rows; and plain slots on launches of one CTA per SM in clusters of
  // 1-2, where converting in the selection's tail costs less than a second launch.
  // H100, one kernel / two launches, alternated twice in one call (plain, graph us, k =
  // 2048): 64 x 32K 15.9-16.4 / 17.4-17.5, 64 x 128K 27.7-28.1 / 29.1-29.3, 128 x 64K
  // 25.4-25.9 / 26.3-26.4, 64 x 128K bf16 24.3-24.7 / 25.7-25.8. Compacted or counted, and
  // on every other launch, two launches won or tied (thirty-first session: 256 x 32K
  // compacted 38.5 / 31.6, 1024 x 32K 141 / 118). The register kernel's launches (a few
  // rows of up to 64K) keep two launches too: converting in that kernel, its thread's
  // columns gathered while the keys load, was slower (H100, over the ids alone: plain 1.05-
  // 1.39 against 0.64-1.07 us, compacted with counts 3.2-3.7 against 1.2-1.8).
  const bool fused = short_row_kernel_serves(a.topk, plan) ||
                     (!counted && plan.cluster <= 2 && a.topk.rows * plan.cluster <= sms);
  if (fused) {
    if (convert_pow2(a.convert)) return topk_to_slots_pow2_cuda(a, place);
    return run_selection(a.topk, a.convert, place);
  }
  topk_per_row_cuda(a.topk, place);
  convert_index_cuda(convert_ids_in_place(a), place);
}

}  // namespace dsa
