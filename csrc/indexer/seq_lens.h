// Per-token sequence lengths for the indexer (docs/ops.md sections 1, 4 and 5):
//   - dcp_local_seq_lens: rank-local lengths of any lengths (one column per rank or one)
//   - expand_decode_seq_lens: per-token context lengths of a decode batch (uniform or
//     ragged), compressed and DCP-localized after expansion, plus the flattened row map
//   - prefill_chunk_bounds: per-token logits column bounds [ks, ke) of a prefill chunk
// The per-element rules are shared by the CPU loops and the CUDA kernels.
#pragma once

#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/strided.h"

namespace dsa {

// ---------------------------------------------------------------------------------------
// Shared rules
// ---------------------------------------------------------------------------------------

/*!
 * \brief Segment of flat index t in a cumulative offset array: the b in [0, B) with
 *        starts[b] <= t < starts[b + 1], or -1 when there is none.
 * \param starts non-decreasing, B + 1 entries (only starts[0..B] is read)
 * \note  With empty segments (equal starts) the non-empty one holding t is found.
 */
DSA_HD int64_t find_segment(const Strided1D<const int32_t>& starts, int64_t B, int64_t t) {
  int64_t lo = 0, hi = B;  // the answer is the last b with starts[b] <= t
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (starts[mid] <= t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int64_t b = lo - 1;
  return (b >= 0 && t < starts[b + 1]) ? b : -1;
}

/*!
 * \brief Writes the rank-local lengths of L to row `row` of `out`: one column per rank
 *        (rank < 0) or the single column of `rank`. Never writes past out.cols.
 */
template <typename T>
DSA_HD void write_local_lengths(const Strided2D<T>& out, int64_t row, int64_t L, int64_t rank,
                                int64_t world, int64_t interleave) {
  if (rank >= 0) {
    out(row, 0) = static_cast<T>(dcp_local_length(L, rank, world, interleave));
    return;
  }
  const int64_t ranks = world < out.cols ? world : out.cols;
  for (int64_t r = 0; r < ranks; ++r) {
    out(row, r) = static_cast<T>(dcp_local_length(L, r, world, interleave));
  }
}

// ---------------------------------------------------------------------------------------
// DCP local lengths
// ---------------------------------------------------------------------------------------

/*!
 * \brief out[i, c] = local length of lens[i] on rank c (rank < 0) or on `rank` (c = 0).
 *        lens and out are both int32 or both int64 (is_int64 picks the pair used).
 */
struct LocalLensArgs {
  Strided1D<const int32_t> lens32;  // [N]
  Strided2D<int32_t> out32;         // [N, W] or [N, 1]
  Strided1D<const int64_t> lens64;
  Strided2D<int64_t> out64;
  bool is_int64 = false;
  int64_t num = 0, rank = -1, world = 1, interleave = 1;
};

template <typename T>
DSA_HD void local_lens_element(const Strided1D<const T>& lens, const Strided2D<T>& out,
                               const LocalLensArgs& a, int64_t i) {
  write_local_lengths(out, i, lens[i], a.rank, a.world, a.interleave);
}

void local_lens_cpu(const LocalLensArgs& args);
void local_lens_cuda(const LocalLensArgs& args, const Place& place);

// ---------------------------------------------------------------------------------------
// Decode per-token context lengths
// ---------------------------------------------------------------------------------------

/*!
 * \brief One decode batch of B requests and num_tokens query tokens.
 *
 * uniform (query_start_loc absent): token t belongs to request t / next_n and its
 * request's tokens end at next_n * (b + 1). ragged: request b owns the flat tokens
 * [qsl[b], qsl[b+1]), found by binary search (no host read of the sizes).
 */
struct DecodeLensArgs {
  Strided1D<const int32_t> seq_lens;         // [B]
  Strided1D<const int32_t> query_start_loc;  // [B + 1] or absent (uniform)
  int64_t next_n = 1, num_tokens = 0, ratio = 1;
  int64_t rank = 0, world = 1, interleave = 1;  // rank < 0: one local column per rank
  Strided1D<int32_t> global_lens;            // [num_tokens] or absent
  Strided2D<int32_t> local_lens;             // [num_tokens, 1 or W] or absent
  Strided1D<int32_t> row_map;                // [num_tokens] or absent
};

struct DecodeToken {
  int64_t req = -1;  // -1: the token belongs to no request (padding)
  int64_t len = 0;   // global context length after compression
};

/*!
 * \brief Token t sees max(S[b] - end_b + t + 1, 0) positions, end_b = one past b's last
 *        token (uniform: max(S[b] - next_n + j + 1, 0), j = t % next_n), then // ratio.
 */
DSA_HD DecodeToken decode_token(const DecodeLensArgs& a, int64_t t) {
  DecodeToken tok;
  const int64_t B = a.seq_lens.size;
  int64_t end;
  if (a.query_start_loc.present()) {
    tok.req = find_segment(a.query_start_loc, B, t);
    if (tok.req < 0) return tok;
    end = a.query_start_loc[tok.req + 1];
  } else {
    tok.req = t / a.next_n;
    if (tok.req >= B) {
      tok.req = -1;
      return tok;
    }
    end = (tok.req + 1) * a.next_n;
  }
  const int64_t len = static_cast<int64_t>(a.seq_lens[tok.req]) - end + t + 1;
  tok.len = (len > 0 ? len : 0) / a.ratio;
  return tok;
}

DSA_HD void decode_lens_element(const DecodeLensArgs& a, int64_t t) {
  const DecodeToken tok = decode_token(a, t);
  if (a.global_lens.present()) a.global_lens[t] = static_cast<int32_t>(tok.len);
  if (a.row_map.present()) a.row_map[t] = static_cast<int32_t>(tok.req);
  if (a.local_lens.present()) {
    write_local_lengths(a.local_lens, t, tok.len, a.rank, a.world, a.interleave);
  }
}

void decode_lens_cpu(const DecodeLensArgs& args);
void decode_lens_cuda(const DecodeLensArgs& args, const Place& place);

// ---------------------------------------------------------------------------------------
// Prefill chunk logits bounds
// ---------------------------------------------------------------------------------------

/*!
 * \brief One prefill chunk: requests [0, R) (views of the chunk's requests), the tokens
 *        [token_start, token_start + num_tokens) of the flat query.
 */
struct PrefillBoundsArgs {
  Strided1D<const int32_t> seq_lens;         // [R]
  Strided1D<const int32_t> query_start_loc;  // [R + 1], flat token numbering
  Strided1D<const int32_t> row_starts;       // [R]: chunk-relative (local) KV start of b
  int64_t token_start = 0, num_tokens = 0, ratio = 1;
  int64_t rank = 0, world = 1, interleave = 1;
  Strided1D<int32_t> ks, ke, token_to_seq;   // [num_tokens]
};

/*!
 * \brief For token o of request b: ks = row_starts[b],
 *        ke = ks + local((S[b] - query_len_b + 1 + o) // ratio); token_to_seq = b.
 *        A token outside every request gets ks = ke = 0 and token_to_seq = -1.
 */
DSA_HD void prefill_bounds_element(const PrefillBoundsArgs& a, int64_t t) {
  const int64_t gt = a.token_start + t;
  const int64_t b = find_segment(a.query_start_loc, a.seq_lens.size, gt);
  int64_t ks = 0, ke = 0;
  if (b >= 0) {
    const int64_t q0 = a.query_start_loc[b], q1 = a.query_start_loc[b + 1];
    const int64_t visible = static_cast<int64_t>(a.seq_lens[b]) - (q1 - q0) + 1 + (gt - q0);
    const int64_t compressed = (visible > 0 ? visible : 0) / a.ratio;
    ks = a.row_starts[b];
    ke = ks + dcp_local_length(compressed, a.rank, a.world, a.interleave);
  }
  a.ks[t] = static_cast<int32_t>(ks);
  a.ke[t] = static_cast<int32_t>(ke);
  if (a.token_to_seq.present()) a.token_to_seq[t] = static_cast<int32_t>(b);
}

void prefill_bounds_cpu(const PrefillBoundsArgs& args);
void prefill_bounds_cuda(const PrefillBoundsArgs& args, const Place& place);

// ---------------------------------------------------------------------------------------
// Entry points bound to Python (arguments validated there), parameters in the ops' order
// (python/dsa_ext/_native.py); rank -1 in dcp_local_seq_lens / expand_decode_seq_lens:
// every rank, one column each
// ---------------------------------------------------------------------------------------

void dcp_local_seq_lens(const Desc1& seq_lens, int64_t rank, int64_t world_size,
                        int64_t interleave, const Desc2& out, bool is_int64, int64_t device,
                        int64_t stream);

void expand_decode_seq_lens(const Desc1& seq_lens, int64_t num_reqs,
                            const Desc1& query_start_loc, int64_t next_n,
                            int64_t num_decode_tokens, int64_t compress_ratio,
                            int64_t dcp_rank, int64_t dcp_world_size, int64_t interleave,
                            const Desc1& global_lens, const Desc2& local_lens,
                            const Desc1& row_map, int64_t device, int64_t stream);

void prefill_chunk_bounds(const Desc1& seq_lens, const Desc1& query_start_loc,
                          const Desc1& row_starts, int64_t token_start, int64_t token_end,
                          int64_t compress_ratio, int64_t dcp_rank, int64_t dcp_world_size,
                          int64_t interleave, const Desc1& ks, const Desc1& ke,
                          const Desc1& token_to_seq, int64_t device, int64_t stream);

}  // namespace dsa
