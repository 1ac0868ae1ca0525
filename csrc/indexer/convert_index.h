// Index conversion: request-local token ids -> physical paged-KV slots
// (docs/ops.md section 2).
//
// The per-element rule (token_slot, then paged_slot_value; convert_tokens applies it to N
// tokens) is shared by the CPU loop and the CUDA kernel.
#pragma once

#include <array>
#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/paged_slot.h"
#include "../common/strided.h"

namespace dsa {

/*!
 * \brief Everything one conversion needs, prepared on the host.
 *
 * Optional tensors have a null data pointer. All tensors are int32.
 */
struct ConvertIndexArgs {
  Strided1D<const int32_t> req_id;              // [T]
  Strided2D<const int32_t> block_table;         // [R, NB]
  Strided2D<const int32_t> token_indices;       // [T, K]
  Strided2D<int32_t> out;                       // [T, K]
  Strided1D<int32_t> valid_counts;              // [T] or absent
  Strided1D<const int32_t> idx_mapping;         // [>= max req_id + 1] or absent
  Strided1D<const int32_t> prefill_request_id;  // [T] or absent
  Strided1D<const int32_t> workspace_starts;    // [P] or absent
  int64_t workspace_rank_stride = 0;
  FastDiv by_block_size;
  int32_t block_stride = 0;
  //! decode_slots' overflow bound: INT32_MAX / block_stride (entry_limit_for; 0 when unset,
  //! which convert_pow2 rejects).
  uint32_t entry_limit = 0;
  DcpLayout dcp;
  int32_t rank = 0;
  bool compact = false;
  //! The kernel before this conversion writes none of the tensors convert_row reads (only
  //! the token ids): the split kernels read their row's request and stage its table before
  //! waiting for it (convert_ids_in_place, where that kernel is the selection).
  bool rows_before_wait = false;
};

/*!
 * \brief Per-row context: which request (or prefill workspace) row t reads.
 * \note  An out-of-range request id (or idx_mapping entry) makes the whole row invalid,
 *        never an out-of-bounds read. A negative mapped request is "no request" (-1 row),
 *        not request 0 as in the reference server.
 */
struct ConvertRow {
  const int32_t* table_row = nullptr;  // null: no valid request
  uint32_t blocks = 0;                 // the table row's columns (0: no valid request)
  int64_t workspace_base = -1;         // >= 0: prefill workspace row
};

DSA_HD ConvertRow convert_row(const ConvertIndexArgs& a, int64_t t) {
  ConvertRow row;
  const int32_t pid = a.prefill_request_id.present() ? a.prefill_request_id[t] : -1;
  if (pid >= 0) {
    if (pid < a.workspace_starts.size) row.workspace_base = a.workspace_starts[pid];
    return row;  // prefill row: the block table is not used
  }
  int64_t req = a.req_id[t];
  if (a.idx_mapping.present()) {
    req = (req >= 0 && req < a.idx_mapping.size) ? a.idx_mapping[req] : -1;
  }
  if (req >= 0 && req < a.block_table.rows) {
    row.table_row = a.block_table.row(req);
    row.blocks = a.block_table.cols_u32();  // block indices are < 2^31: token ids are int32
  }
  return row;
}

/*!
 * \brief Where the slot of token position `tok` of one row comes from (paged_slot.h: the
 *        entry of column `block` times block_stride plus `offset`, or `offset`).
 *
 * Invalid (no slot): tok < 0; another rank owns tok (decode rows); block index past the
 * table; and, in paged_slot_value, a block-table entry or workspace base that makes the
 * slot negative or >= 2^31.
 *
 * kPow2 (convert_pow2(a) holds): the divisions by the block size, interleave and world
 * size are shifts and masks, and one unsigned compare rejects both a negative token and a
 * block past the table (below). The kernels and the CPU loop take the same instantiation
 * (convert_pow2), so the CPU tests check the arithmetic the device runs.
 *
 * kWorldOne: the caller has checked a.dcp.world == 1 (the compiler does not carry that
 * check of a kernel parameter into this code on its own).
 */
template <bool kPow2 = false, bool kWorldOne = false>
DSA_HD PagedSlot token_slot(const ConvertIndexArgs& a, const ConvertRow& row, int32_t tok) {
  // Computed for every token and selected at the end (no branch per token on the device).
  // The general division needs a position below 2^31: a negative token is computed as
  // position 0 and then dropped. Shifts and masks are exact for any 32-bit value.
  const int32_t p = kPow2 || tok >= 0 ? tok : 0;
  const bool one = kWorldOne || a.dcp.world == 1;
  DcpPosition pos{0, p};
  if (!one) pos = a.dcp.locate<kPow2>(p);
  if (row.workspace_base >= 0) {  // the same for the whole row
    if (tok < 0) return PagedSlot{};
    return direct_slot(pos.owner * a.workspace_rank_stride + row.workspace_base + pos.local);
  }
  const uint32_t local = static_cast<uint32_t>(pos.local);
  const uint32_t blk = a.by_block_size.div<kPow2>(local);
  // With a world of 1 every owner is 0: the owner test is then one per row, folded into
  // the block count (no block for a rank other than 0).
  uint32_t blocks = one && a.rank != 0 ? 0u : row.blocks;
  bool valid;
  if constexpr (kPow2) {
    // As an unsigned position a negative token is >= 2^31, and its rank-local position
    // >= 2^31 / W (locate's shifts), so its block is >= 2^31 / (W * BS); the block of a
    // position below 2^31 is below that. With the count clamped to it, blk < blocks also
    // rejects negative tokens (W * BS <= 2^31: convert_pow2).
    const uint32_t reach = 0x80000000u >> ((one ? 0u : a.dcp.by_world.l) + a.by_block_size.l);
    blocks = blocks < reach ? blocks : reach;
    valid = blk < blocks && (one || pos.owner == a.rank);
  } else {
    valid = tok >= 0 && blk < blocks && (one || pos.owner == a.rank);
  }
  const uint32_t within =
      kPow2 ? a.by_block_size.mod<true>(local) : local - blk * a.by_block_size.d;
  PagedSlot src;
  src.block = valid ? static_cast<int32_t>(blk) : -1;
  src.offset = valid ? static_cast<int32_t>(within) : -1;
  return src;
}

//! The largest block-table entry e with e * stride <= INT32_MAX (stride >= 1).
inline uint32_t entry_limit_for(int32_t stride) {
  return stride >= 1 ? static_cast<uint32_t>(INT32_MAX / stride) : 0u;
}

/*!
 * \brief Whether token_slot<true> and decode_slots apply: the block size is a power of two,
 *        and so are the interleave and world size when the world is not 1 (locate is
 *        skipped at 1); W * BS and W * I are at most 2^31, which token_slot<true>'s single
 *        compare and locate<true> need; and BS <= block_stride <= 2^31 + 1 - BS (the op
 *        asks for block_stride >= BS) with entry_limit set, which decode_slots' range check
 *        needs.
 */
inline bool convert_pow2(const ConvertIndexArgs& a) {
  const uint64_t w = static_cast<uint64_t>(a.dcp.world);
  const uint64_t limit = uint64_t{1} << 31;
  return a.by_block_size.pow2() && (a.dcp.world == 1 || a.dcp.pow2()) &&
         w * a.by_block_size.d <= limit && w * static_cast<uint64_t>(a.dcp.interleave) <= limit &&
         static_cast<int64_t>(a.block_stride) >= static_cast<int64_t>(a.by_block_size.d) &&
         static_cast<int64_t>(a.block_stride) + a.by_block_size.d <= (int64_t{1} << 31) + 1 &&
         a.entry_limit == entry_limit_for(a.block_stride);
}

/*!
 * \brief The slots of N token ids of a decode row (no workspace) in place, when
 *        convert_pow2(a) holds: the same slots as token_slot<true> + paged_slot_value, in
 *        fewer instructions per token (the kernels issue-bound on many rows pay per token).
 *
 * - Position: the owner's bits (I * W > p >= I, the field [li, li + lw)) are cut out of
 *   the token with one shift and one bit select, local = (p & (I-1)) | ((p >> lw) &
 *   ~(I-1)), which is locate<true>'s cycle * I + p % I; the owner test is one masked
 *   compare, ((p ^ r << li) & (W-1) << li) == 0. A negative token has local >= 2^(31-lw)
 *   (bit 31 lands at 31 - lw >= li), so its block is past `reach` as in token_slot<true>.
 * - The validity of a token is the block-table load's own predicate (no block / offset
 *   sentinel pair to select and test again): a token without a slot loads nothing and
 *   takes the entry -1, which the range check rejects.
 * - Range check, one unsigned min: with stride >= BS (convert_pow2), a negative entry gives
 *   a negative slot and an entry past entry_limit one >= 2^31. e = min((uint32)entry,
 *   entry_limit + 1) keeps every entry that can give a slot in range, and makes every
 *   other one (the -1 above included: 2^32 - 1) give e * stride + within in [2^31, 2^32):
 *   (entry_limit + 1) * stride > INT32_MAX, and <= INT32_MAX + stride, so with stride + BS
 *   <= 2^31 + 1 (convert_pow2) nothing wraps. The slot is then valid exactly when its
 *   32-bit value is not negative.
 *
 * kExact false: an invalid slot is some negative value, not necessarily -1 (the compacting
 * callers test only slot >= 0); true: exactly -1. kSharedTable: row.table_row is a copy of
 * the row's table in shared memory (convert_index.cu stages it), column stride 1.
 */
template <bool kWorldOne, bool kExact, bool kSharedTable, int N>
DSA_HD void decode_slots(const ConvertIndexArgs& a, const ConvertRow& row, int32_t (&slot)[N],
                         int64_t table_stride) {
  const uint32_t lb = a.by_block_size.l, lw = kWorldOne ? 0u : a.dcp.by_world.l;
  const uint32_t li = kWorldOne ? 0u : a.dcp.by_interleave.l;
  const uint32_t low_mask = kWorldOne ? 0u : (1u << li) - 1u;  // p % I
  const uint32_t owner_mask = kWorldOne ? 0u : (static_cast<uint32_t>(a.dcp.world) - 1u) << li;
  const uint32_t owner_bits = kWorldOne ? 0u : static_cast<uint32_t>(a.rank) << li;
  // With a world of 1 every owner is 0: no block for another rank. A rank outside [0, W)
  // owns nothing (token_slot's owner == rank never holds).
  uint32_t blocks = row.blocks;
  if (kWorldOne ? a.rank != 0 : static_cast<uint32_t>(a.rank) >= static_cast<uint32_t>(a.dcp.world)) {
    blocks = 0;
  }
  const uint32_t reach = 0x80000000u >> (lw + lb);
  blocks = blocks < reach ? blocks : reach;
  const uint32_t bs_mask = a.by_block_size.d - 1u;
  uint32_t within[N];
  int32_t entry[N];
  DSA_UNROLL
  for (int j = 0; j < N; ++j) {
    const uint32_t p = static_cast<uint32_t>(slot[j]);
    const uint32_t local = kWorldOne ? p : (p & low_mask) | ((p >> lw) & ~low_mask);
    const uint32_t blk = local >> lb;
    within[j] = local & bs_mask;
    const bool valid = blk < blocks && (kWorldOne || ((p ^ owner_bits) & owner_mask) == 0u);
    if constexpr (kSharedTable) {
      entry[j] = valid ? row.table_row[blk] : -1;
    } else {
      entry[j] =
          load_table_entry(valid, row.table_row, static_cast<int64_t>(blk) * table_stride, -1);
    }
  }
  const uint32_t stride = static_cast<uint32_t>(a.block_stride);
  const uint32_t past = a.entry_limit + 1u;  // <= 2^31
  DSA_UNROLL
  for (int j = 0; j < N; ++j) {
    const uint32_t e = static_cast<uint32_t>(entry[j]) < past ? static_cast<uint32_t>(entry[j])
                                                                : past;
    const int32_t s = static_cast<int32_t>(e * stride + within[j]);
    slot[j] = kExact ? (s < -1 ? -1 : s) : s;
  }
}

/*!
 * \brief The slots of N token ids in place (-1 stays -1), in its two steps: every
 *        block-table load is issued before the first is used, so N gathers cost one round
 *        trip, not N. `table_stride` is the table's column stride (a constant 1 saves the
 *        multiply).
 *
 * kUnswitch: the common row, a decode row (no workspace), is tested once for the N tokens
 * and converted by a copy of the loop that knows it, without a branch per token:
 * decode_slots when kPow2 (convert_pow2), world 1 or not; token_slot<false, true> at world
 * 1 otherwise. It costs code and, for some callers, registers (the per-row top-K's cluster
 * kernel takes it only where convert_pow2 holds). kExact: as decode_slots (the other paths
 * are always exact).
 * kSharedTable: as decode_slots, for decode rows (a workspace row reads no table). The CPU
 * loop calls this with the kernels' template arguments but kSharedTable, which is the
 * device's alone (the staged gathers are the same arithmetic on a copy of the table).
 */
template <bool kPow2 = false, bool kUnswitch = false, bool kExact = true,
          bool kSharedTable = false, int N>
DSA_HD void convert_tokens(const ConvertIndexArgs& a, const ConvertRow& row, int32_t (&slot)[N],
                           int64_t table_stride) {
  static_assert(!kSharedTable || (kUnswitch && kPow2), "a staged table is read by decode_slots");
  if constexpr (kUnswitch && kPow2) {
    if (row.workspace_base < 0) {
      if (a.dcp.world == 1) {
        decode_slots<true, kExact, kSharedTable>(a, row, slot, table_stride);
      } else {
        decode_slots<false, kExact, kSharedTable>(a, row, slot, table_stride);
      }
      return;
    }
  }
  PagedSlot src[N];
  int32_t entry[N];
  if (kUnswitch && !kPow2 && a.dcp.world == 1 && row.workspace_base < 0) {
    DSA_UNROLL
    for (int j = 0; j < N; ++j) src[j] = token_slot<kPow2, true>(a, row, slot[j]);
  } else {
    DSA_UNROLL
    for (int j = 0; j < N; ++j) src[j] = token_slot<kPow2>(a, row, slot[j]);
  }
  DSA_UNROLL
  for (int j = 0; j < N; ++j) entry[j] = paged_slot_entry(src[j], row.table_row, table_stride);
  DSA_UNROLL
  for (int j = 0; j < N; ++j) slot[j] = paged_slot_value(src[j], entry[j], a.block_stride);
}

/*!
 * \brief How the CUDA kernel covers the rows (convert_index.cu): split rows over
 *        `parts` CTAs of `split_items` columns per thread each, or (split_items == 0)
 *        one CTA of `row_threads` threads per row.
 */
struct ConvertPlan {
  int split_items = 0, parts = 1;
  int row_threads = 0;
  //! The split CTAs copy the row's block table into shared memory and gather from there.
  bool staged = false;
};

//! The plan for `rows` x `cols` token ids on a device of `sms` multiprocessors; `counts`:
//! the rows' valid counts are needed (compaction or valid_counts); `stage_tokens`: the
//! fewest token columns a split CTA needs for its table to be staged (0: never; the CUDA
//! launcher's tokens_to_stage).
ConvertPlan convert_plan(int64_t rows, int64_t cols, int64_t sms, bool counts,
                         int64_t stage_tokens);

/*!
 * \brief Tests and tuning: code < 0 lets convert_plan choose (the default); 0 forces one
 *        CTA per row; n in {1, 2, 4, 8} split rows of about n columns per thread (at least
 *        as many as put the row in one cluster, at most as many as the row needs); any
 *        other code throws std::invalid_argument.
 */
void set_convert_plan_override(int64_t code);

//! The plan for a shape on CUDA device `device`: (split_items, parts, row_threads, staged).
std::array<int64_t, 4> convert_index_plan(int64_t rows, int64_t cols, bool counts,
                                          int64_t stage_tokens, int64_t device);

void convert_index_cpu(const ConvertIndexArgs& args);
void convert_index_cuda(const ConvertIndexArgs& args, const Place& place);

/*!
 * \brief Entry point bound to Python, its parameters in the op's order
 *        (python/dsa_ext/_native.py): builds the arguments from the descriptors the
 *        (already validated) Python layer passes and runs on the CPU or the device.
 */
void convert_req_index_to_global_index(const Desc1& req_id, const Desc2& block_table,
                                       const Desc2& token_indices, int64_t block_size,
                                       int64_t block_stride, int64_t dcp_world_size,
                                       int64_t dcp_rank, int64_t interleave, bool compact,
                                       const Desc1& idx_mapping,
                                       const Desc1& prefill_request_id,
                                       const Desc1& prefill_workspace_starts,
                                       int64_t prefill_workspace_rank_stride,
                                       const Desc2& out, const Desc1& valid_counts,
                                       int64_t device, int64_t stream);

}  // namespace dsa
