// The indexer's per-row top-K: logits rows -> the k best column ids of each row
// (docs/ops.md section 9).
//
// The order on scores is the DCP merge's (csrc/dcp/candidate_key.h): ordered_score_bits of
// the raw fp32 bits (a bf16 score is the fp32 value of its bits << 16), compared
// unsigned; among equal keys the lower column wins. The selected set is the k largest
// (key, ~column) pairs of the row, written in ascending column order (then -1), or with
// `sorted` in descending pair order. The row bounds rule (row_window) and the key rule
// (score_key) are shared by the CPU loop and the CUDA kernel.
#pragma once

#include <array>
#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/numeric.h"
#include "../common/strided.h"
#include "../dcp/candidate_key.h"
#include "../dcp/pack_candidates.h"
#include "convert_index.h"

namespace dsa {

//! How a row's column window [start, end) is given (docs/ops.md section 9).
enum class RowBoundsKind : int32_t {
  kFull = 0,     // [0, L)
  kEnds = 1,     // [0, ends[i])                              (lengths)
  kDecode = 2,   // [0, S[i / next_n] - next_n + i % next_n + 1)   (seq_lens [B])
  kDecode2D = 3, // [0, S[i / n, i % n])                      (seq_lens [B, n])
  kRange = 4,    // [starts[i], ends[i])                      (row_starts, row_ends)
};

/*!
 * \brief Everything one per-row top-K needs, prepared on the host.
 *
 * `logits` is read as raw bits (uint32 for fp32, uint16 for bf16); its column stride is 1
 * (checked by the Python layer). All bounds tensors are int32.
 */
struct TopkPerRowArgs {
  const void* logits = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0;
  bool bf16 = false;
  int64_t k = 1;
  Strided2D<int32_t> out;             // [rows, k]
  RowBoundsKind bounds = RowBoundsKind::kFull;
  Strided1D<const int32_t> starts;    // kRange
  Strided1D<const int32_t> ends;      // kEnds, kRange
  Strided2D<const int32_t> seq_lens;  // kDecode ([B, 1]), kDecode2D ([B, n])
  int64_t next_n = 1;
  bool sorted = false;
};

//! The columns [start, start + count) of a row, clamped into [0, L].
struct RowWindow {
  int64_t start = 0, count = 0;
};

/*!
 * \brief Window of row i: bounds past [0, L] are clamped (start into [0, L], end into
 *        [start, L]), so no bound reads out of the row, whatever the data.
 */
DSA_HD RowWindow row_window(const TopkPerRowArgs& a, int64_t i) {
  int64_t start = 0, end = a.cols;
  switch (a.bounds) {
    case RowBoundsKind::kFull: break;
    case RowBoundsKind::kEnds: end = a.ends[i]; break;
    case RowBoundsKind::kDecode:
      end = static_cast<int64_t>(a.seq_lens(i / a.next_n, 0)) - a.next_n + i % a.next_n + 1;
      break;
    case RowBoundsKind::kDecode2D:
      end = a.seq_lens(i / a.seq_lens.cols, i % a.seq_lens.cols);
      break;
    case RowBoundsKind::kRange:
      start = a.starts[i];
      end = a.ends[i];
      break;
  }
  start = start < 0 ? 0 : (start > a.cols ? a.cols : start);
  end = end < start ? start : (end > a.cols ? a.cols : end);
  return RowWindow{start, end - start};
}

//! Order key of a score's raw bits: fp32 bits as they are, bf16 bits << 16 (same value).
DSA_HD uint32_t score_key(uint32_t fp32_bits) { return ordered_score_bits(fp32_bits); }
DSA_HD uint32_t score_key(uint16_t bf16_bits) {
  return ordered_score_bits(static_cast<uint32_t>(bf16_bits) << 16);
}

//! The total order of the selection as one unsigned integer: key, then lower column (the
//! layout of a candidate key, so decode_candidate_gid gives the column back).
DSA_HD uint64_t selection_rank(uint32_t key, int64_t column) {
  return key_then_lower_id(key, static_cast<uint32_t>(column));
}

/*!
 * \brief How the CUDA kernel covers the rows (topk_per_row.cu): each row is one cluster of
 *        `cluster` CTAs, each holding a contiguous slice of at most `slice` columns;
 *        `resident`: the slice's keys stay in shared memory (the row is read from global
 *        memory once), else every pass re-reads it.
 */
struct TopkPlan {
  int cluster = 1;
  int64_t slice = 0;
  bool resident = true;
  //! Rows this short take the short-row kernel instead (one CTA per row, the keys in
  //! registers), for every sink; the cluster plan above serves sorted ids.
  bool short_rows = false;
  //! CTAs a row of the register kernel (the keys in registers), which takes ids and DCP
  //! candidates where this is not 0 (register_kernel_serves): resident slices of at most
  //! kRegisterSlice columns whose clusters run at once at one CTA per SM. The cluster
  //! kernel (`cluster`) serves sorted ids and slots.
  int register_cluster = 0;
};

//! The plan for `rows` rows of at most `cols` columns on CUDA device `device` (keys take 4
//! bytes of shared memory whatever the score type).
TopkPlan topk_plan(int64_t rows, int64_t cols, int64_t device);

//! Clusters of `cluster` CTAs, one per SM, that CUDA device `device` runs at once (a GPC
//! holds whole clusters: can be below the SM count / cluster); -1 where none. Asked once
//! per device and size.
int whole_sm_clusters(int64_t device, int cluster);

//! Whether the short-row kernel runs these arguments under `plan` (sorted ids take the
//! cluster kernel's rewrite).
inline bool short_row_kernel_serves(const TopkPerRowArgs& a, const TopkPlan& plan) {
  return plan.short_rows && !a.sorted;
}

/*!
 * \brief Tests and tuning: code < 0 lets topk_plan choose (the default); 1..16 forces
 *        that many CTAs per row in the cluster kernel (resident where the slices fit, else
 *        streamed); 100 + n forces n CTAs per row, streamed; 200 + n forces n CTAs per row
 *        in the register kernel where the slices fit it (else as n). A forced plan never
 *        takes the short-row kernel. Any other code throws std::invalid_argument.
 */
void set_topk_plan_override(int64_t code);

//! The plan for a shape on CUDA device `device`: (cluster, slice, resident, short_rows,
//! register_cluster).
std::array<int64_t, 5> topk_per_row_plan(int64_t rows, int64_t cols, int64_t device);

void topk_per_row_cpu(const TopkPerRowArgs& args);
void topk_per_row_cuda(const TopkPerRowArgs& args, const Place& place);

/*!
 * \brief topk_to_slots: the selected ids go through the index conversion's element rules
 *        (convert_row, convert_tokens): as the selection kernel writes them (the short-row
 *        kernel; the cluster kernel for plain slots, topk_to_slots_cuda), else in place
 *        on `topk.out` after the ids kernel (convert_ids_in_place sets
 *        `convert.token_indices`, unused otherwise). `convert.out` is `topk.out`;
 *        compaction and valid counts count the slots that convert to a valid slot.
 */
struct TopkSlotsArgs {
  TopkPerRowArgs topk;
  ConvertIndexArgs convert;
};

//! The conversion of the selected ids in place: `convert` reading `topk.out` (the CPU loop
//! and the CUDA kernel both read a column before any write that could land on it).
inline ConvertIndexArgs convert_ids_in_place(const TopkSlotsArgs& a) {
  ConvertIndexArgs convert = a.convert;
  convert.token_indices = a.topk.out;
  // The ids kernel writes only topk.out, and it lets the conversion start only once the
  // kernel before it has finished: the request ids and the table are final by then.
  convert.rows_before_wait = true;
  return convert;
}

void topk_to_slots_cpu(const TopkSlotsArgs& args);
void topk_to_slots_cuda(const TopkSlotsArgs& args, const Place& place);

/*!
 * \brief topk_to_candidates: the selected ids are packed into DCP candidate keys
 *        (pack_candidate, with the raw row_starts as pack_dcp_topk_candidates takes them)
 *        as they are written; `pack.topk_indices` is unused, `pack.out` is the output and
 *        a shortfall gets the invalid key 0. fp32 logits only.
 */
struct TopkCandidatesArgs {
  TopkPerRowArgs topk;
  PackCandidatesArgs pack;
};

void topk_to_candidates_cpu(const TopkCandidatesArgs& args);
void topk_to_candidates_cuda(const TopkCandidatesArgs& args, const Place& place);

/*!
 * \brief Entry point bound to Python, its parameters in the op's order
 *        (python/dsa_ext/_native.py): builds the arguments from the descriptors the
 *        (already validated) Python layer passes and runs on the CPU or the device.
 *        `seq_lens` arrives as 2-D ([B, 1] for a 1-D tensor); `seq_lens_2d` says which
 *        decode rule applies.
 */
void topk_per_row(const Desc2& logits, int64_t k, const Desc1& lengths, const Desc2& seq_lens,
                  int64_t next_n, const Desc1& row_starts, const Desc1& row_ends, bool sorted,
                  const Desc2& out, bool is_bf16, bool seq_lens_2d, int64_t device,
                  int64_t stream);

//! Entry point of topk_to_slots (python/dsa_ext/_native.py), like topk_per_row's.
void topk_to_slots(const Desc2& logits, int64_t k, const Desc1& lengths, const Desc2& seq_lens,
                   int64_t next_n, const Desc1& row_starts, const Desc1& row_ends,
                   const Desc1& req_id, const Desc2& block_table, int64_t block_size,
                   int64_t block_stride, bool compact, const Desc2& out,
                   const Desc1& valid_counts, bool is_bf16, bool seq_lens_2d, int64_t device,
                   int64_t stream);

//! Entry point of topk_to_candidates (python/dsa_ext/_native.py), like topk_per_row's.
void topk_to_candidates(const Desc2& logits, int64_t k, const Desc1& lengths,
                        const Desc2& seq_lens, int64_t next_n, const Desc1& row_starts,
                        const Desc1& row_ends, int64_t rank, int64_t world_size,
                        int64_t interleave, const Desc2& out, bool seq_lens_2d,
                        int64_t device, int64_t stream);

}  // namespace dsa
