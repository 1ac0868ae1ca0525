// topk_to_slots' one-kernel launches where convert_pow2 holds (convert_index.h): the
// kernels whose slot conversion takes shifts and masks, in a translation unit of their own
// (topk_to_slots.cu has the others).
#include "topk_per_row_kernel.cuh"

namespace dsa {

void topk_to_slots_pow2_cuda(const TopkSlotsArgs& a, const Place& place) {
  run_selection<ConvertIndexArgs, true>(a.topk, a.convert, place);
}

}  // namespace dsa
