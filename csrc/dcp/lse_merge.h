// DCP attention-output merge: the per-rank LSE correction (docs/ops.md section 7).
//
// Each rank holds partial attention outputs over its KV shard for all heads. With the
// all-gathered LSEs [W, B, H], every (b, h) gets the global LSE G and this rank's weight
// exp(lse_r - G); the corrected partials are written head-block-major as
// [W, B, H/W, D], the layout a reduce-scatter over ranks takes directly (block w holds
// the heads rank w keeps). The per-(b, h) rule (merge_lse) is shared by the CPU loop and
// the CUDA kernel; the loop over W runs in the same order on both.
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/numeric.h"
#include "../common/strided.h"

namespace dsa {

//! Output element types of the correction.
enum class OutDtype : int64_t { kFloat32 = 0, kBFloat16 = 1 };

template <typename T>
struct CorrectAttnArgs {
  Strided3D<const T> partial;    // [B, H, D] this rank's partial outputs
  Strided3D<const float> lses;   // [W, B, H] all ranks' LSEs (rank-major)
  Strided4D<T> corrected;        // [W, B, H / W, D] weighted partials, head-block-major
  Strided2D<float> global_lse;   // [B, H] or absent
  int32_t rank = 0;
  bool base2 = true;             // LSEs are log2-sum-exp2 (else natural)
};

//! Global LSE of one (b, h) and this rank's weight.
struct LseWeight {
  float lse;
  float factor;
};

DSA_HD float lse_exp(float x, bool base2) { return base2 ? exp2f(x) : expf(x); }
DSA_HD float lse_log(float x, bool base2) { return base2 ? log2f(x) : logf(x); }

//! NaN and +inf LSEs (empty or broken shards) count as -inf.
DSA_HD float sanitize_lse(float x) { return (x != x || x == INFINITY) ? -INFINITY : x; }

/*!
 * \brief G = m + log(sum_w exp(lse_w - m)) with m = max_w lse_w (0 if all are -inf),
 *        and factor = exp(lse_rank - G), 0 when that difference is NaN (all -inf).
 */
DSA_HD LseWeight merge_lse(const Strided3D<const float>& lses, int64_t b, int64_t h,
                           int32_t rank, bool base2) {
  const int64_t W = lses.size[0];
  float m = -INFINITY;
  for (int64_t w = 0; w < W; ++w) m = fmaxf(m, sanitize_lse(lses(w, b, h)));
  if (m == -INFINITY) m = 0.f;
  float sum = 0.f;
  for (int64_t w = 0; w < W; ++w) sum += lse_exp(sanitize_lse(lses(w, b, h)) - m, base2);
  const float g = m + lse_log(sum, base2);
  const float diff = sanitize_lse(lses(rank, b, h)) - g;
  return LseWeight{g, diff != diff ? 0.f : lse_exp(diff, base2)};
}

//! A weight of exactly 0 forces 0 (a NaN partial from an empty shard must not leak).
DSA_HD float weigh_output(float v, float factor) { return factor == 0.f ? 0.f : v * factor; }

template <typename T>
void correct_attn_cpu(const CorrectAttnArgs<T>& args);
template <typename T>
void correct_attn_cuda(const CorrectAttnArgs<T>& args, const Place& place);

/*!
 * \brief Entry point bound to Python: builds the arguments from the descriptors the
 *        (already validated) Python layer passes and runs on the CPU or the device.
 * \param out_dtype an OutDtype value: the element type of partial and corrected
 */
void correct_attention_output(const Desc3& partial, const Desc3& lses, int64_t rank,
                              bool base2, const Desc4& corrected, const Desc2& global_lse,
                              int64_t out_dtype, int64_t device, int64_t stream);

}  // namespace dsa
