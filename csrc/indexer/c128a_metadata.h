// C128A compressed-attention top-K metadata (docs/ops.md section 3).
//
// One row per token: decode rows (t < num_decode) list the physical compressed-KV slots
// of the token's first n_t compressed positions, prefill rows list the positions
// themselves. The per-row and per-element rules below are shared by the CPU loop and the
// CUDA kernel.
#pragma once

#include <cstdint>

#include "../common/dcp_math.h"
#include "../common/launch.h"
#include "../common/paged_slot.h"
#include "../common/strided.h"

namespace dsa {

/*!
 * \brief Everything one C128A metadata build needs, prepared on the host.
 *
 * decode / prefill are views of capacity-sized buffers: `width` columns, row stride
 * = capacity. Only columns [0, width) are written.
 */
struct C128AArgs {
  Strided1D<const int64_t> positions;     // [T]
  Strided1D<const int32_t> token_to_req;  // [>= num_decode]
  Strided2D<const int32_t> block_table;   // [Rd, NB]
  Strided1D<const int64_t> slot_mapping;  // [>= num_decode]
  Strided2D<int32_t> decode;              // [num_decode, width]
  Strided1D<int32_t> decode_lens;         // [num_decode]
  Strided2D<int32_t> prefill;             // [T - num_decode, width]
  int64_t ratio = 1;
  int64_t num_tokens = 0, num_decode = 0, width = 0;
  FastDiv by_block_size;  // block size in compressed units
};

//! What one output row needs: where it goes, its length, its block-table row.
struct C128ARow {
  int32_t* out = nullptr;
  int64_t col_stride = 1;
  int32_t n = 0;                       // entries [0, n) are real, [n, width) are -1
  bool decode = false;
  const int32_t* table_row = nullptr;  // decode rows: null when the request is invalid
  uint32_t blocks = 0;                 // decode rows: the table row's columns (0: invalid)
};

/*!
 * \brief Row context of token t: n_t = min((positions[t] + 1) // ratio, width).
 * \note  A negative position gives n_t = 0 (not a negative length). A decode padding
 *        token (slot_mapping < 0) gets n_t = 0: length 0 and an all -1 row. A request id
 *        outside [0, Rd) keeps n_t but every entry is -1 (never an out-of-bounds read).
 */
DSA_HD C128ARow c128a_row(const C128AArgs& a, int64_t t) {
  C128ARow row;
  const int64_t pos = a.positions[t];
  int64_t n = pos < 0 ? 0 : (pos + 1) / a.ratio;
  row.n = static_cast<int32_t>(n < a.width ? n : a.width);
  row.decode = t < a.num_decode;
  if (row.decode) {
    row.out = a.decode.row(t);
    row.col_stride = a.decode.col_stride;
    if (a.slot_mapping[t] < 0) row.n = 0;
    const int64_t req = a.token_to_req[t];
    if (req >= 0 && req < a.block_table.rows) {
      row.table_row = a.block_table.row(req);
      // Block indices are < 2^31 (i < width < 2^31): a count clamped below 2^32 is exact.
      row.blocks = static_cast<uint32_t>(a.block_table.cols < UINT32_MAX ? a.block_table.cols
                                                                          : UINT32_MAX);
    }
  } else {
    row.out = a.prefill.row(t - a.num_decode);
    row.col_stride = a.prefill.col_stride;
  }
  return row;
}

/*!
 * \brief Where entry i (0 <= i < width < 2^31) of a row comes from (paged_slot.h), in two
 *        steps so that a kernel issues a run of entries' block-table loads at once.
 *
 * decode: block_table[req, i // bs] * bs + i % bs, -1 when the block index is past the
 * table or the slot is outside [0, 2^31); prefill: i; both -1 for i >= n_t. Decode rows
 * compute every entry and select at the end (no branch per entry on the device).
 */
DSA_HD PagedSlot c128a_source(const C128AArgs& a, const C128ARow& row, int64_t i) {
  if (!row.decode) return direct_slot(i < row.n ? i : -1);  // the same for the whole row
  const uint32_t blk = a.by_block_size.div(static_cast<uint32_t>(i));
  const bool valid = i < row.n && blk < row.blocks;
  PagedSlot src;
  src.block = valid ? static_cast<int32_t>(blk) : -1;
  src.offset = valid ? static_cast<int32_t>(i) - static_cast<int32_t>(blk * a.by_block_size.d)
                     : -1;
  return src;
}

//! Entry i of a row (both steps, one after the other).
DSA_HD int32_t c128a_entry(const C128AArgs& a, const C128ARow& row, int64_t i) {
  const PagedSlot src = c128a_source(a, row, i);
  return paged_slot_value(src, paged_slot_entry(src, row.table_row, a.block_table.col_stride),
                          a.by_block_size.d);
}

void c128a_metadata_cpu(const C128AArgs& args);
void c128a_metadata_cuda(const C128AArgs& args, const Place& place);

/*!
 * \brief Entry point bound to Python (arguments validated there), its parameters in the
 *        op's order (python/dsa_ext/_native.py): fills the decode rows, decode lengths
 *        and prefill rows of one batch in one pass (one kernel launch). The buffers'
 *        descriptors cover the rows and columns written.
 */
void build_c128a_topk_metadata(const Desc1& positions, const Desc1& token_to_req,
                               const Desc2& block_table, const Desc1& slot_mapping,
                               const Desc2& decode_buffer, const Desc1& decode_lens_buffer,
                               const Desc2& prefill_buffer, int64_t compress_ratio,
                               int64_t block_size, int64_t num_decode_tokens, int64_t width,
                               int64_t device, int64_t stream);

}  // namespace dsa
