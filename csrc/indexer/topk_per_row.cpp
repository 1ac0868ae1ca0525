// The indexer's per-row top-K: the entry points and the CPU implementations.
#include "topk_per_row.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "../common/overlap.h"

namespace dsa {
namespace {

/*!
 * \brief Selects row i: `ranks` ends up holding the selected (key, ~column) ranks in the
 *        output order (ascending column, or with `sorted` descending rank).
 */
template <typename Bits>
void select_row(const TopkPerRowArgs& a, int64_t i, std::vector<uint64_t>& ranks) {
  const Bits* row = static_cast<const Bits*>(a.logits) + i * a.row_stride;
  const RowWindow w = row_window(a, i);
  ranks.resize(static_cast<size_t>(w.count));
  for (int64_t c = 0; c < w.count; ++c) ranks[c] = selection_rank(score_key(row[w.start + c]), c);
  const int64_t taken = std::min(a.k, w.count);
  if (taken < w.count) {  // the taken largest ranks in front, any order
    std::nth_element(ranks.begin(), ranks.begin() + taken, ranks.end(), std::greater<>());
  }
  ranks.resize(static_cast<size_t>(taken));
  if (a.sorted) {
    std::sort(ranks.begin(), ranks.end(), std::greater<>());
  } else {  // ascending column: descending ~column
    std::sort(ranks.begin(), ranks.end(), [](uint64_t x, uint64_t y) {
      return static_cast<uint32_t>(x) > static_cast<uint32_t>(y);
    });
  }
}

template <typename Bits>
void topk_rows(const TopkPerRowArgs& a) {
  std::vector<uint64_t> ranks;
  for (int64_t i = 0; i < a.rows; ++i) {
    select_row<Bits>(a, i, ranks);
    const int64_t taken = static_cast<int64_t>(ranks.size());
    for (int64_t j = 0; j < taken; ++j) a.out(i, j) = decode_candidate_gid(ranks[j]);
    for (int64_t j = taken; j < a.k; ++j) a.out(i, j) = -1;
  }
}

//! The op's logits and bounds descriptors -> the selection's arguments.
TopkPerRowArgs selection_args(const Desc2& logits, int64_t k, const Desc1& lengths,
                              const Desc2& seq_lens, int64_t next_n, const Desc1& row_starts,
                              const Desc1& row_ends, const Desc2& out, bool is_bf16,
                              bool seq_lens_2d) {
  TopkPerRowArgs a;
  a.logits = reinterpret_cast<const void*>(static_cast<uintptr_t>(logits[0]));
  a.rows = logits[1];
  a.cols = logits[2];
  a.row_stride = logits[3];
  a.bf16 = is_bf16;
  a.k = k;
  a.out = Strided2D<int32_t>(out);
  a.next_n = next_n;
  if (seq_lens[0] != 0) {
    a.seq_lens = Strided2D<const int32_t>(seq_lens);
    a.bounds = seq_lens_2d ? RowBoundsKind::kDecode2D : RowBoundsKind::kDecode;
  } else if (row_starts[0] != 0) {
    a.starts = Strided1D<const int32_t>(row_starts);
    a.ends = Strided1D<const int32_t>(row_ends);
    a.bounds = RowBoundsKind::kRange;
  } else if (lengths[0] != 0) {
    a.ends = Strided1D<const int32_t>(lengths);
    a.bounds = RowBoundsKind::kEnds;
  }
  return a;
}

//! Throws where the output `out` shares memory with the selection's inputs: the logits
//! (`logits`, bf16 or fp32) and the row bounds in `a`, under the op's names for them.
template <typename Out>
void require_apart_from_selection(const char* out_name, const Out& out,
                                  const TopkPerRowArgs& a, const Desc2& logits) {
  if (a.bf16) {
    require_apart(out_name, out, "logits", Strided2D<const uint16_t>(logits));
  } else {
    require_apart(out_name, out, "logits", Strided2D<const uint32_t>(logits));
  }
  const char* ends = a.bounds == RowBoundsKind::kEnds ? "lengths" : "row_ends";
  require_apart(out_name, out, "row_starts", a.starts, ends, a.ends, "seq_lens", a.seq_lens);
}

}  // namespace

void topk_per_row_cpu(const TopkPerRowArgs& a) {
  a.bf16 ? topk_rows<uint16_t>(a) : topk_rows<uint32_t>(a);
}

void topk_to_slots_cpu(const TopkSlotsArgs& a) {
  topk_per_row_cpu(a.topk);
  convert_index_cpu(convert_ids_in_place(a));
}

void topk_to_candidates_cpu(const TopkCandidatesArgs& a) {
  std::vector<uint64_t> ranks;
  for (int64_t i = 0; i < a.topk.rows; ++i) {
    select_row<uint32_t>(a.topk, i, ranks);
    const int64_t start = pack_row_start(a.pack, i);
    const int64_t taken = static_cast<int64_t>(ranks.size());
    for (int64_t j = 0; j < taken; ++j) {
      a.pack.out(i, j) = pack_candidate(a.pack, i, start, decode_candidate_gid(ranks[j]));
    }
    for (int64_t j = taken; j < a.topk.k; ++j) a.pack.out(i, j) = kInvalidCandidateKey;
  }
}

void topk_per_row(const Desc2& logits, int64_t k, const Desc1& lengths, const Desc2& seq_lens,
                  int64_t next_n, const Desc1& row_starts, const Desc1& row_ends, bool sorted,
                  const Desc2& out, bool is_bf16, bool seq_lens_2d, int64_t device,
                  int64_t stream) {
  TopkPerRowArgs a = selection_args(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                                    out, is_bf16, seq_lens_2d);
  a.sorted = sorted;
  require_apart_from_selection("out", a.out, a, logits);
  run_on(Place{device, stream}, a, topk_per_row_cpu, topk_per_row_cuda);
}

void topk_to_slots(const Desc2& logits, int64_t k, const Desc1& lengths, const Desc2& seq_lens,
                   int64_t next_n, const Desc1& row_starts, const Desc1& row_ends,
                   const Desc1& req_id, const Desc2& block_table, int64_t block_size,
                   int64_t block_stride, bool compact, const Desc2& out,
                   const Desc1& valid_counts, bool is_bf16, bool seq_lens_2d, int64_t device,
                   int64_t stream) {
  TopkSlotsArgs a;
  a.topk = selection_args(logits, k, lengths, seq_lens, next_n, row_starts, row_ends, out,
                          is_bf16, seq_lens_2d);
  a.convert.req_id = Strided1D<const int32_t>(req_id);
  a.convert.block_table = Strided2D<const int32_t>(block_table);
  a.convert.out = Strided2D<int32_t>(out);
  a.convert.valid_counts = Strided1D<int32_t>(valid_counts);
  a.convert.by_block_size = FastDiv(static_cast<uint32_t>(block_size));
  a.convert.block_stride = static_cast<int32_t>(block_stride);
  a.convert.entry_limit = entry_limit_for(a.convert.block_stride);
  a.convert.dcp = DcpLayout(1, 1);
  a.convert.compact = compact;
  auto apart_from_inputs = [&](const char* name, const auto& written) {
    require_apart_from_selection(name, written, a.topk, logits);
    require_apart(name, written, "req_id", a.convert.req_id, "block_table",
                  a.convert.block_table);
  };
  apart_from_inputs("out", a.convert.out);
  apart_from_inputs("valid_counts", a.convert.valid_counts);
  require_outputs_apart("out", a.convert.out, "valid_counts", a.convert.valid_counts);
  run_on(Place{device, stream}, a, topk_to_slots_cpu, topk_to_slots_cuda);
}

void topk_to_candidates(const Desc2& logits, int64_t k, const Desc1& lengths,
                        const Desc2& seq_lens, int64_t next_n, const Desc1& row_starts,
                        const Desc1& row_ends, int64_t rank, int64_t world_size,
                        int64_t interleave, const Desc2& out, bool seq_lens_2d,
                        int64_t device, int64_t stream) {
  TopkCandidatesArgs a;
  a.topk = selection_args(logits, k, lengths, seq_lens, next_n, row_starts, row_ends,
                          Desc2{0, 0, 0, 0, 0}, false, seq_lens_2d);
  a.pack.logits = Strided2D<const uint32_t>(logits);
  a.pack.row_starts = Strided1D<const int32_t>(row_starts);
  a.pack.out = Strided2D<uint64_t>(out);
  a.pack.dcp = DcpLayout(static_cast<int32_t>(world_size), static_cast<int32_t>(interleave));
  a.pack.rank = static_cast<int32_t>(rank);
  require_apart_from_selection("out", a.pack.out, a.topk, logits);
  run_on(Place{device, stream}, a, topk_to_candidates_cpu, topk_to_candidates_cuda);
}

}  // namespace dsa
