// DCP top-K candidate keys: one unsigned 64-bit key per candidate (docs/ops.md
// sections 6a and 6c).
//
//   key = (ordered(score_bits) << 32) | (~gid & 0xFFFFFFFF)     valid candidate
//   key = 0                                                     invalid (no token)
//
// ordered() maps the raw fp32 bits to an unsigned integer whose order is the score
// order: negative -> all bits inverted, else the sign bit set (+0 above -0, +NaN above
// +inf, -inf low). The low word is the bitwise NOT of the global id, so a larger key
// means a higher score and, among equal scores, a LOWER global id. Sorting keys
// descending as unsigned integers is the top-K's total order; invalid keys (0) come
// last. A valid gid is in [0, 2^31), so its low word is >= 2^31 and a valid key is
// never 0. Keys are stored in int64 tensors as the same bit pattern; the format
// survives torch.cat along the candidate dimension and all-gathers.
//
// Shared by the packing kernel (csrc/dcp/pack_candidates.*) and the top-K selection.
#pragma once

#include <cstdint>

#include "../common/dcp_math.h"  // DSA_HD

namespace dsa {

//! Key of a candidate that is not a token.
constexpr uint64_t kInvalidCandidateKey = 0;

//! Raw fp32 bits -> an unsigned integer with the same order as the score.
DSA_HD uint32_t ordered_score_bits(uint32_t u) {
  // (u & 0x80000000) ? ~u : u | 0x80000000, without the select: the sign spread over the
  // word (an arithmetic shift), or'ed with the sign bit, flips what the select would flip.
  // Two instructions on the GPU (shift, then one three-input logic op) instead of three.
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

//! An order key and an id as one unsigned integer: larger key first, then the LOWER id
//! (the low word is ~id). A candidate key with the score's key; the per-row top-K's
//! selection rank with the column.
DSA_HD uint64_t key_then_lower_id(uint32_t key, uint32_t id) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(~id);
}

//! Key of one candidate from its score's order key (ordered_score_bits) and global id;
//! outside [0, 2^31) the candidate is invalid (key 0).
DSA_HD uint64_t encode_ordered_candidate_key(uint32_t ordered, int64_t gid) {
  if (gid < 0 || gid > INT32_MAX) return kInvalidCandidateKey;
  return key_then_lower_id(ordered, static_cast<uint32_t>(gid));
}

/*!
 * \brief Key of one candidate.
 * \param score_bits raw bits of the fp32 score
 * \param gid        global token id; outside [0, 2^31) the candidate is invalid (key 0)
 */
DSA_HD uint64_t encode_candidate_key(uint32_t score_bits, int64_t gid) {
  return encode_ordered_candidate_key(ordered_score_bits(score_bits), gid);
}

//! Global id of a key; -1 for the invalid key.
DSA_HD int32_t decode_candidate_gid(uint64_t key) {
  return key == kInvalidCandidateKey ? -1
                                     : static_cast<int32_t>(~static_cast<uint32_t>(key));
}

}  // namespace dsa
