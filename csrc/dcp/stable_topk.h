// Stable global top-K of packed DCP candidates (docs/ops.md section 6c).
//
// A candidate is one int64 holding the unsigned 64-bit key
//   key = (ordered(score_bits) << 32) | (~gid & 0xFFFFFFFF),  invalid (gid < 0): key = 0,
// so the total order (score descending, +NaN above +inf, +0 above -0; then gid ascending;
// invalid last) is "key descending, compared unsigned". The CPU implementation lives in
// stable_topk.cpp; the CUDA kernel is a CuTeDSL cubin (cute_dsl_aot/stable_topk.py)
// launched through cubin_loader.h.
#pragma once

#include <cstdint>
#include <string>

#include "../common/launch.h"
#include "../common/strided.h"
#include "candidate_key.h"

namespace dsa {

/*!
 * \brief Candidates of every row, rank-major: row r's candidates are cand(w, r, c) for
 *        w < segments, c < seg_len. A 2-D [rows, N] input is segments = 1, seg_len = N.
 */
struct TopkCandidates {
  const int64_t* data = nullptr;
  int64_t segments = 0, rows = 0, seg_len = 0;
  int64_t seg_stride = 0, row_stride = 0, col_stride = 0;

  explicit TopkCandidates(const Desc3& d)
      : data(reinterpret_cast<const int64_t*>(static_cast<uintptr_t>(d[0]))),
        segments(d[1]), rows(d[2]), seg_len(d[3]), seg_stride(d[4]), row_stride(d[5]),
        col_stride(d[6]) {}

  int64_t per_row() const { return segments * seg_len; }
  uint64_t key(int64_t w, int64_t r, int64_t c) const {
    return static_cast<uint64_t>(data[w * seg_stride + r * row_stride + c * col_stride]);
  }
};

/*!
 * \brief Each row's ids of its min(k, N) largest nonzero keys, then -1: in position order
 *        (p = w * seg_len + c; among copies of the smallest key taken, the lowest
 *        positions), or with `sorted` in descending key order.
 */
void stable_topk_cpu(const TopkCandidates& cand, const Strided2D<int32_t>& out, bool sorted);

/*!
 * \brief Entry point bound to Python: candidates (3-D descriptor), out int32 [rows, k]
 *        (2-D descriptor), the order; runs on the CPU (device < 0) or launches the cubin
 *        on `stream`.
 * \note  The Python layer has validated shapes: rows, W, K and k fit int32, N = W*K >= 1,
 *        k >= 1, and on CUDA N and k <= 2^31 - 4096 (the kernel's 32-bit loop counters
 *        step up to 2,048 past their bound) and, when sorted, min(k, N) fits the largest
 *        sort.
 */
void stable_topk_from_candidates(const Desc3& candidates, const Desc2& out, bool sorted,
                                 int64_t device, int64_t stream);

/*!
 * \brief Name of the exported variant (e.g. "d16_u", "d16_s2048") that CUDA device
 *        `device` runs for `rows` rows of `segments` x `seg_len` candidates and `k` ids
 *        per row, in position order or `sorted`.
 */
std::string stable_topk_variant(int64_t segments, int64_t rows, int64_t seg_len, int64_t k,
                                bool sorted, int64_t device);

/*!
 * \brief Tests and tuning: every CUDA launch runs the variant `name` (std::invalid_argument
 *        at launch if it cannot run the shape); "" lets the launcher choose (the default).
 *        Throws std::invalid_argument for a name the build has no cubin of.
 */
void set_stable_topk_variant_override(const std::string& name);

}  // namespace dsa
