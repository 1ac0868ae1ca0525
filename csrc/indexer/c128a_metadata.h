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
#include "../common/numeric.h"  // load_read_only
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
  // Unsigned: pos + 1 reaches 2^63 at pos = INT64_MAX, where int64 overflows.
  const uint64_t n = pos < 0 ? 0 : (static_cast<uint64_t>(pos) + 1) /
                                       static_cast<uint64_t>(a.ratio);
  const uint64_t width = static_cast<uint64_t>(a.width);  // < 2^31
  row.n = static_cast<int32_t>(n < width ? n : width);
  row.decode = t < a.num_decode;
  if (row.decode) {
    row.out = a.decode.row(t);
    row.col_stride = a.decode.col_stride;
    if (a.slot_mapping[t] < 0) row.n = 0;
    const int64_t req = a.token_to_req[t];
    if (req >= 0 && req < a.block_table.rows) {
      row.table_row = a.block_table.row(req);
      row.blocks = a.block_table.cols_u32();  // block indices are < 2^31: i < width < 2^31
    }
  } else {
    row.out = a.prefill.row(t - a.num_decode);
    row.col_stride = a.prefill.col_stride;
  }
  return row;
}

/*!
 * \brief Entries sharing one block-table entry in a chunk (c128a_chunk_loads): min(bs, 4)
 *        when the block size bs is a power of two, else 1 (a chunk's entries may then lie
 *        in up to four blocks).
 */
inline int c128a_run(const C128AArgs& a) {
  const uint32_t bs = a.by_block_size.d;
  return !a.by_block_size.pow2() ? 1 : (bs >= 4 ? 4 : static_cast<int>(bs));
}

/*!
 * \brief The entries c0 .. c0 + 3 of a row (c0 a multiple of 4, c0 < width < 2^31; an entry
 *        at or past the width is computed and not stored), in two steps so that a kernel
 *        issues all the block-table loads of its chunks before it uses any:
 *        c128a_chunk_loads loads the 4 / kRun block-table entries, c128a_chunk_values makes
 *        the four entries from them.
 *
 * decode: block_table[req, i // bs] * bs + i % bs, -1 when the block index is past the
 * table or the slot is outside [0, 2^31); prefill: i; both -1 for i >= n_t.
 *
 * kRun = c128a_run(a): with kRun > 1 (bs a power of two) the runs of kRun entries from c0
 * on each lie in one block (kRun divides both c0 and bs), so a run takes one load, and the
 * divisions are shifts and masks. The CPU loop takes the kernel's instantiation, so the CPU
 * tests check the arithmetic the device runs.
 */
template <int kRun>
DSA_HD void c128a_chunk_loads(const C128AArgs& a, const C128ARow& row, int32_t c0,
                              int32_t (&entry)[4 / kRun]) {
  constexpr bool kPow2 = kRun > 1;
  DSA_UNROLL
  for (int r = 0; r < 4 / kRun; ++r) {
    const int32_t c = c0 + r * kRun;
    const uint32_t blk = a.by_block_size.div<kPow2>(static_cast<uint32_t>(c));
    // An invalid request has no blocks (row.blocks 0): no load.
    const bool load = row.decode && c < row.n && blk < row.blocks;
    entry[r] = load ? load_read_only(row.table_row + blk * a.block_table.col_stride) : 0;
  }
}

template <int kRun>
DSA_HD void c128a_chunk_values(const C128AArgs& a, const C128ARow& row, int32_t c0,
                               const int32_t (&entry)[4 / kRun], int32_t (&v)[4]) {
  constexpr bool kPow2 = kRun > 1;
  if (!row.decode) {  // the same for the whole row
    DSA_UNROLL
    for (int e = 0; e < 4; ++e) v[e] = c0 + e < row.n ? c0 + e : -1;
    return;
  }
  DSA_UNROLL
  for (int r = 0; r < 4 / kRun; ++r) {
    const uint32_t c = static_cast<uint32_t>(c0 + r * kRun);
    const uint32_t blk = a.by_block_size.div<kPow2>(c);
    const int64_t base = static_cast<int64_t>(entry[r]) * a.by_block_size.d +
                         a.by_block_size.mod<kPow2>(c);
    DSA_UNROLL
    for (int q = 0; q < kRun; ++q) {
      const int64_t slot = base + q;
      const bool valid = static_cast<int32_t>(c) + q < row.n && blk < row.blocks &&
                         static_cast<uint64_t>(slot) <= static_cast<uint64_t>(INT32_MAX);
      v[r * kRun + q] = valid ? static_cast<int32_t>(slot) : -1;
    }
  }
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
