// DCP candidate packing: a rank's local top-K -> lossless 64-bit candidate keys
// (docs/ops.md section 6a).
//
// The per-candidate rule (pack_candidate) is shared by the CPU loop and the CUDA kernel.
#pragma once

#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/numeric.h"
#include "../common/strided.h"
#include "candidate_key.h"

namespace dsa {

/*!
 * \brief Everything one packing needs, prepared on the host.
 *
 * Logits are read as raw fp32 bits (the key orders the bits, no float math happens).
 */
struct PackCandidatesArgs {
  Strided2D<const uint32_t> logits;       // [rows, cols] fp32 bits
  Strided2D<const int32_t> topk_indices;  // [rows, K] rank-local ids, -1 = none
  Strided1D<const int32_t> row_starts;    // [rows] column offset per row, or absent
  Strided2D<uint64_t> out;                // [rows, K] keys (an int64 tensor)
  DcpLayout dcp;
  int32_t rank = 0;
};

//! Global id of rank-local id `local` (>= 0) on this rank.
DSA_HD int64_t candidate_gid(const PackCandidatesArgs& a, int32_t local) {
  return a.dcp.world == 1 ? local : a.dcp.global(local, a.rank);
}

/*!
 * \brief Key of the candidate with rank-local id `local` in row `row`.
 *
 * valid = local >= 0 and the global id is below 2^31; the score column
 * local + row_start is clamped to [0, cols - 1], so no id reads out of bounds
 * (with cols == 0 nothing can be read and every candidate is invalid).
 */
DSA_HD uint64_t pack_candidate(const PackCandidatesArgs& a, int64_t row, int64_t row_start,
                               int32_t local) {
  // No early return: on the GPU the score load is a predicated instruction, issued as
  // soon as the id arrives, with the id arithmetic behind it.
  const bool token = local >= 0 && a.logits.cols > 0;
  int64_t col = static_cast<int64_t>(local) + row_start;
  col = col < 0 ? 0 : (col >= a.logits.cols ? a.logits.cols - 1 : col);
  const uint32_t bits = token ? load_read_only(&a.logits(row, col)) : 0u;
  const int64_t gid = !token ? -1 : candidate_gid(a, local);
  return encode_candidate_key(bits, gid);  // gid -1: the invalid key
}

DSA_HD int64_t pack_row_start(const PackCandidatesArgs& a, int64_t row) {
  return a.row_starts.present() ? static_cast<int64_t>(a.row_starts[row]) : 0;
}

void pack_candidates_cpu(const PackCandidatesArgs& args);
void pack_candidates_cuda(const PackCandidatesArgs& args, const Place& place);

/*!
 * \brief Entry point bound to Python, its parameters in the op's order
 *        (python/dsa_ext/_native.py): builds the arguments from the descriptors the
 *        (already validated) Python layer passes and runs on the CPU or the device.
 */
void pack_dcp_topk_candidates(const Desc2& logits, const Desc2& topk_indices, int64_t rank,
                              int64_t world_size, int64_t interleave, const Desc1& row_starts,
                              const Desc2& out, int64_t device, int64_t stream);

}  // namespace dsa
