// A slot of a paged KV cache, computed in two steps so that a kernel can issue the
// block-table loads of all its elements before it uses any of them (one memory round trip
// per thread instead of one per element). Shared by the CPU loops and the CUDA kernels.
#pragma once

#include <cstdint>

#include "numeric.h"  // DSA_HD

namespace dsa {

/*!
 * \brief Where one slot comes from: entry * stride + offset when `block` >= 0 (entry = the
 *        block table's column `block` of the element's row), else `offset` is the slot
 *        itself, already checked (-1: no slot). Two 32-bit words, so that a thread keeps
 *        eight of them in registers.
 */
struct PagedSlot {
  int32_t offset = -1;
  int32_t block = -1;
};

//! A slot that needs no block-table entry: `slot`, or -1 when it is negative or >= 2^31.
DSA_HD PagedSlot direct_slot(int64_t slot) {
  PagedSlot src;
  src.offset = (slot >= 0 && slot <= INT32_MAX) ? static_cast<int32_t>(slot) : -1;
  return src;
}

/*!
 * \brief The block-table entry `row[index]` when `load`, else `fallback` (no load then), as
 *        one predicated load that asks L2 to keep the line (evict-last).
 * \note  Every token of a row gathers from its request's table row, and a request's rows
 *        come back through the batch, while token ids and slots pass through once
 *        (streamed, evict-first): on large batches they would otherwise push the table out
 *        of L2 between a request's rows and every gather would go to DRAM again.
 */
DSA_HD int32_t load_table_entry(bool load, const int32_t* row, int64_t index,
                                int32_t fallback) {
#if defined(__CUDA_ARCH__)
  uint64_t keep;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  // An integer address: no pointer arithmetic on a row that may be null (then load is false).
  const uint64_t address = __cvta_generic_to_global(row) + index * sizeof(int32_t);
  int32_t v = fallback;
  // volatile: never hoisted above the kernel's wait for the previous kernel (the table may
  // be its output). The predicate is inside: no branch, and no load of an unchecked index.
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q ld.global.nc.L2::cache_hint.b32 %0, "
      "[%1], %3;\n}"
      : "+r"(v)
      : "l"(address), "r"(static_cast<int>(load)), "l"(keep));
  return v;
#else
  return load ? row[index] : fallback;
#endif
}

//! The entry `src` needs from a block-table row with column stride `col_stride` (0 when
//! src.block < 0: no load).
DSA_HD int32_t paged_slot_entry(const PagedSlot& src, const int32_t* table_row,
                                int64_t col_stride) {
  return load_table_entry(src.block >= 0, table_row, src.block * col_stride, 0);
}

/*!
 * \brief The slot from the loaded entry (paged_slot_entry's result), or -1 when
 *        entry * stride + offset is negative or >= 2^31.
 * \note  No branch on src.block: without a block the entry is 0, so the same expression is
 *        src.offset, which is -1 or already in [0, 2^31). One 64-bit multiply-add and one
 *        unsigned compare per slot (the kernels issue-bound on many rows pay per token).
 */
DSA_HD int32_t paged_slot_value(const PagedSlot& src, int32_t entry, int64_t stride) {
  const int64_t slot = static_cast<int64_t>(entry) * stride + src.offset;
  return static_cast<uint64_t>(slot) <= static_cast<uint64_t>(INT32_MAX)
             ? static_cast<int32_t>(slot)
             : -1;
}

}  // namespace dsa
