// DCP candidate packing: the entry point and the CPU implementation.
#include "pack_candidates.h"

#include "../common/overlap.h"

namespace dsa {

void pack_candidates_cpu(const PackCandidatesArgs& a) {
  for (int64_t r = 0; r < a.topk_indices.rows; ++r) {
    const int64_t start = pack_row_start(a, r);
    for (int64_t c = 0; c < a.topk_indices.cols; ++c) {
      a.out(r, c) = pack_candidate(a, r, start, a.topk_indices(r, c));
    }
  }
}

void pack_dcp_topk_candidates(const Desc2& logits, const Desc2& topk_indices, int64_t rank,
                              int64_t world_size, int64_t interleave, const Desc1& row_starts,
                              const Desc2& out, int64_t device, int64_t stream) {
  PackCandidatesArgs a;
  a.logits = Strided2D<const uint32_t>(logits);
  a.topk_indices = Strided2D<const int32_t>(topk_indices);
  a.row_starts = Strided1D<const int32_t>(row_starts);
  a.out = Strided2D<uint64_t>(out);
  a.dcp = DcpLayout(static_cast<int32_t>(world_size), static_cast<int32_t>(interleave));
  a.rank = static_cast<int32_t>(rank);
  require_apart("out", a.out, "logits", a.logits, "topk_indices", a.topk_indices, "row_starts",
                a.row_starts);
  run_on(Place{device, stream}, a, pack_candidates_cpu, pack_candidates_cuda);
}

}  // namespace dsa
