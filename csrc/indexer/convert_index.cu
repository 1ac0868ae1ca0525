// Index conversion: the CUDA kernel and its launcher.
//
// A tile is kThreads * kItems columns of one row, striped: item j of thread i is column
// tile + j * kThreads + i, so every load and store of a warp touches consecutive columns.
// With compaction, warp ballots give each valid slot its rank inside a 32-column run and
// one shared-memory scan over the run counts places the runs, so a warp's valid slots
// land contiguously in ascending column order (deterministic, unlike the atomics-based
// kernel of vLLM) and the stores coalesce.
//
// Two ways to cover a row (ConvertPlan):
// - split: the row's tiles go to `parts` CTAs (one tile each) that run side by side, so a
//   few rows still spread their loads and block-table gathers over many SMs (the decode
//   shapes, where one CTA per row leaves the chip idle and waits on one SM's gathers).
//   When counts are needed the parts form a thread block cluster: each part pushes its
//   valid count into the others' shared memory, which gives each its compaction offset
//   and the row total.
// - per row: one CTA loops over the row's tiles (grid-stride over rows), carrying the
//   running count from tile to tile: rows longer than one cluster's tiles, and many
//   counted rows of several tiles, where a cluster exchange costs more than it spreads.
#include <atomic>
#include <stdexcept>
#include <string>

#include "../common/cluster_push.h"
#include "../common/warp_scan.h"
#include "convert_index.h"

namespace dsa {
namespace {

//! Thread counts and items per thread the kernels are built for (see convert_plan).
constexpr int kSplitThreads = 256;
constexpr int kRowThreads = 256;
constexpr int kRowItems = 8;
constexpr int kRowMinBlocks = 3;  // CTAs per SM the row kernels keep registers for
//! CTAs per SM the 8-column split kernel keeps registers for (convert_split_wide_kernel).
constexpr int kWideSplitMinBlocks = 6;
//! Largest portable cluster: a split row has at most this many parts.
constexpr int kMaxParts = 8;
//! Longest block-table row the split kernels copy into shared memory (8 KB: 128K tokens a
//! DCP rank in 64-token blocks); a longer table is gathered from global memory.
constexpr int kStagedBlocks = 2048;

/*!
 * \brief One tile of one row in registers: the slots, and (when counting) the ballots of
 *        valid slots and the exclusive offset of each 32-column run.
 */
template <int kThreads, int kItems>
struct Tile {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRuns = kItems * kWarps;  // 32-column runs per tile, column order
  static_assert(kRuns <= 2 * 32, "one warp scans the run counts, two per lane");
  int32_t slot[kItems];
  unsigned valid[kItems];
};

// Column arithmetic is tile-relative: a tile's first column is applied once, in 64 bits, to
// its row pointers, and a column inside a tile (< kThreads * kItems) is a 32-bit offset, so
// that a dense tile's loads and stores are one base register plus immediates.

/*!
 * \brief `p`, opaque to the compiler's address arithmetic. Without it the 64-bit row and
 *        tile offsets that made `p` are re-associated with each access's 32-bit offset into
 *        one 64-bit index per access (add, sign extension, shift-add: four instructions per
 *        token) instead of one base register and an immediate or one wide multiply-add.
 */
template <typename T>
__device__ __forceinline__ T* address_base(T* p) {
  asm("" : "+l"(p));
  __builtin_assume(__isGlobal(p));  // still a global pointer: STG, not a generic ST
  return p;
}

/*!
 * \brief Issues the token loads of a tile whose first column is `in` (columns [0, live)
 *        exist): thread i loads columns j * kThreads + i.
 */
template <int kThreads, int kItems, bool kDense>
__device__ __forceinline__ void load_tile(const int32_t* in, int32_t live, int64_t in_stride,
                                          Tile<kThreads, kItems>& tile) {
  const int32_t i = static_cast<int32_t>(threadIdx.x);
  const int32_t left = live - i;  // item j exists when j * kThreads < left
  const int32_t* mine = address_base(in + (kDense ? i : i * in_stride));
  // Token ids are read once: stream them (evict-first) so that L1 keeps the block-table
  // row that every token of the row gathers from. A full tile (the same for the whole CTA)
  // loads without a predicate and a -1 per column.
  if (live >= kThreads * kItems) {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      tile.slot[j] = __ldcs(mine + (kDense ? j * kThreads : j * kThreads * in_stride));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      tile.slot[j] = j * kThreads < left
                         ? __ldcs(mine + (kDense ? j * kThreads : j * kThreads * in_stride))
                         : -1;
    }
  }
}

//! Token ids -> slots (convert_tokens). kDenseTable: the table's column stride is known to
//! be 1. kExact: an invalid slot is -1 (written in place), else any negative value (the
//! compacting stores test slot >= 0 only). kStaged: a decode row's table is in shared
//! memory (stage_table_row).
template <int kThreads, int kItems, bool kDenseTable, bool kPow2, bool kExact,
          bool kStaged = false>
__device__ __forceinline__ void convert_loaded(const ConvertIndexArgs& a, const ConvertRow& row,
                                               Tile<kThreads, kItems>& tile) {
  convert_tokens<kPow2, true, kExact, kStaged>(a, row, tile.slot,
                                               kDenseTable ? 1 : a.block_table.col_stride);
}

/*!
 * \brief Copies a decode row's block-table row (dense, at most kStagedBlocks entries) into
 *        `staged` and points the row at the copy. Block-wide: every thread calls it, and the
 *        copy is readable when it returns.
 * \note  Every token of a row gathers one entry of its table row: 32 scattered addresses
 *        a warp, which L1 serves one cache line at a time (about 25 lines for a 2048-entry
 *        row), so on large batches the gathers, not DRAM, set the pace. The copy is
 *        coalesced, and a warp's 32 gathers from shared memory cost a few bank conflicts.
 *        Its loads depend on the request id only, not on the token ids, so they overlap the
 *        tile's loads.
 */
template <int kThreads>
__device__ __forceinline__ void stage_table_row(ConvertRow& row, int32_t* staged) {
  constexpr int kPer = kStagedBlocks / kThreads;
  // A workspace row or an invalid request has no blocks (ConvertRow's defaults).
  const uint32_t n = row.blocks;
  const uint32_t i = threadIdx.x;
  int32_t entry[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const uint32_t c = i + j * kThreads;
    entry[j] = load_table_entry(c < n, row.table_row, c, 0);
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const uint32_t c = i + j * kThreads;
    if (c < n) staged[c] = entry[j];
  }
  __syncthreads();
  // Unconditionally, so that the compiler sees a shared-memory pointer (LDS, not generic
  // loads): a row without blocks reads no entry, and a workspace row none either (its
  // slots need no block: direct_slot's block is -1, so paged_slot_entry never loads).
  // n <= kStagedBlocks: the launcher stages only tables that narrow (tokens_to_stage).
  row.table_row = staged;
}

/*!
 * \brief The run counts of one warp: run j (columns j * kThreads + warp * 32 + [0, 32)) of
 *        warp w lives at run_offset[w * kItems + j] (run_slot), so that a warp writes and
 *        reads its kItems counts with vector accesses (16 bytes per 4 runs, not one each).
 */
template <int kItems>
__device__ __forceinline__ void store_runs(int* dst, const int (&n)[kItems]) {
  if constexpr (kItems % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kItems; j += 4) {
      *reinterpret_cast<int4*>(dst + j) = make_int4(n[j], n[j + 1], n[j + 2], n[j + 3]);
    }
  } else if constexpr (kItems % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kItems; j += 2) {
      *reinterpret_cast<int2*>(dst + j) = make_int2(n[j], n[j + 1]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kItems; ++j) dst[j] = n[j];
  }
}
template <int kItems>
__device__ __forceinline__ void load_runs(const int* src, int (&n)[kItems]) {
  if constexpr (kItems % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kItems; j += 4) {
      const int4 v = *reinterpret_cast<const int4*>(src + j);
      n[j] = v.x, n[j + 1] = v.y, n[j + 2] = v.z, n[j + 3] = v.w;
    }
  } else if constexpr (kItems % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kItems; j += 2) {
      const int2 v = *reinterpret_cast<const int2*>(src + j);
      n[j] = v.x, n[j + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kItems; ++j) n[j] = src[j];
  }
}

//! Where run r (column order: r = j * kWarps + w) is kept in run_offset (store_runs).
template <int kThreads, int kItems>
__device__ __forceinline__ int run_slot(int r) {
  constexpr int kWarps = Tile<kThreads, kItems>::kWarps;
  return (r % kWarps) * kItems + r / kWarps;
}

/*!
 * \brief Ballots of the valid slots and the exclusive prefix of valid slots per run in
 *        run_offset (run_slot's places), the tile's total in run_offset[kRuns]. Block-wide:
 *        every thread calls it; run_offset (16-byte aligned) is readable when it returns.
 */
template <int kThreads, int kItems>
__device__ __forceinline__ void count_tile(Tile<kThreads, kItems>& tile, int* run_offset) {
  constexpr int kRuns = Tile<kThreads, kItems>::kRuns;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int n[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    tile.valid[j] = __ballot_sync(0xffffffffu, tile.slot[j] >= 0);
    n[j] = __popc(tile.valid[j]);
  }
  if (lane == 0) store_runs<kItems>(run_offset + warp * kItems, n);
  __syncthreads();
  if (warp == 0) {  // exclusive scan of the kRuns counts in column order, two per lane
    const int s0 = run_slot<kThreads, kItems>(2 * lane);
    const int s1 = run_slot<kThreads, kItems>(2 * lane + 1);
    const int n0 = 2 * lane < kRuns ? run_offset[s0] : 0;
    const int n1 = 2 * lane + 1 < kRuns ? run_offset[s1] : 0;
    const int incl = warp_inclusive_sum(n0 + n1);
    __syncwarp();
    if (2 * lane < kRuns) run_offset[s0] = incl - n0 - n1;
    if (2 * lane + 1 < kRuns) run_offset[s1] = incl - n1;
    if (lane == 31) run_offset[kRuns] = incl;
  }
  __syncthreads();
}

/*!
 * \brief `*p = v` when v >= 0, as one predicated store: the compiler would otherwise sink
 *        the position's arithmetic under a branch per column (BSSY / BRA / BSYNC each).
 *        Streamed (evict-first), like every slot store: the block table keeps its L2 lines.
 */
__device__ __forceinline__ void store_if_valid(int32_t* p, int32_t v) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ge.s32 p, %1, 0;\n @p st.global.cs.b32 [%0], %1;\n}" ::"l"(
          __cvta_generic_to_global(p)),  // st.global takes a global address (no SASS cost)
      "r"(v)
      : "memory");
}

//! Writes the tile's valid slots compacted, the first at out[0] (column order kept).
template <int kThreads, int kItems, bool kDense>
__device__ __forceinline__ void store_compacted(const Tile<kThreads, kItems>& tile,
                                                const int* run_offset, int32_t* out,
                                                int64_t out_stride) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  out = address_base(out);
  int below[kItems];
  load_runs<kItems>(run_offset + warp * kItems, below);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    // The position within the tile (< its column count) is computed unconditionally, so
    // only the store is predicated.
    const int32_t pos = below[j] + __popc(tile.valid[j] & lanes_below);
    store_if_valid(out + (kDense ? pos : pos * out_stride), tile.slot[j]);
  }
}

//! Writes the tile's slots in place (column c of the input -> column c of the output).
template <int kThreads, int kItems, bool kDense>
__device__ __forceinline__ void store_in_place(const Tile<kThreads, kItems>& tile, int32_t live,
                                               int32_t* out, int64_t out_stride) {
  const int32_t i = static_cast<int32_t>(threadIdx.x);
  const int32_t left = live - i;
  int32_t* mine = address_base(out + (kDense ? i : i * out_stride));
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (j * kThreads < left) {
      __stcs(mine + (kDense ? j * kThreads : j * kThreads * out_stride), tile.slot[j]);
    }
  }
}

/*!
 * \brief Writes -1 to the columns of a tile (first column `out`) in [from, live), from <=
 *        live.
 * \note  One unsigned compare per column (c - from < live - from), not the two bounds: the
 *        bound `live` is also the loads' predicate, which the compiler would otherwise keep
 *        live in predicate registers through the whole conversion. A full tile (live >=
 *        its columns) tests c >= from only.
 */
template <int kThreads, int kItems, bool kDense>
__device__ __forceinline__ void fill_columns(int32_t from, int32_t live, int32_t* out,
                                             int64_t out_stride) {
  const int32_t i = static_cast<int32_t>(threadIdx.x);
  int32_t* mine = address_base(out + (kDense ? i : i * out_stride));
  if (live >= kThreads * kItems) {  // a full tile (the whole CTA): only c >= from to test
    const int32_t above = i - from;  // column c = i + j * kThreads is filled when >= from
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (above >= -j * kThreads) {
        __stcs(mine + (kDense ? j * kThreads : j * kThreads * out_stride), -1);
      }
    }
    return;
  }
  const uint32_t base = static_cast<uint32_t>(i - from);
  const uint32_t n = static_cast<uint32_t>(live - from);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    if (base + j * kThreads < n) {
      __stcs(mine + (kDense ? j * kThreads : j * kThreads * out_stride), -1);
    }
  }
}

/*!
 * \brief Split rows: CTA `part` of row t converts columns [part * tile, (part + 1) * tile).
 *
 * kCluster (counts needed): the `parts` CTAs of a row are one cluster. Each part pushes its
 * valid count (run_offset[kRuns]) into every other part's shared memory (cluster_push.h)
 * and waits for theirs, which gives its compaction offset and the row total. With
 * compaction, the stores of a part land below its own columns' end, so an output that
 * aliases the input is written only after every part of the row has read its tile: a part
 * sends its count only once its tile's loads have returned.
 *
 * kRowsFirst (ConvertIndexArgs::rows_before_wait): the row's request and table are read
 * before the wait, so that after it only the token ids' load is on the critical path; else
 * after the tile's loads are issued, which they overlap. A template parameter, not a
 * branch: the branch made each split kernel 80-192 SASS instructions longer and the
 * plain conversion slower (H100, tools/convert_times.py, two alternations, graph us:
 * T = 16384 compacted W = 1 119.8 -> 116.4, W = 4 119.8 -> 117.9; T = 4096 compacted
 * W = 1 29.8 -> 28.8; T = 1024 7.1-7.2 -> 7.0).
 */
template <int kItems, bool kCompact, bool kDense, bool kCluster, bool kPow2, bool kStaged,
          bool kRowsFirst>
__device__ __forceinline__ void convert_split(const ConvertIndexArgs& a, const FastDiv by_parts) {
  constexpr int kThreads = kSplitThreads;
  constexpr int kRuns = Tile<kThreads, kItems>::kRuns;
  constexpr int32_t kTile = kThreads * kItems;
  static_assert(!kStaged || (kDense && kPow2), "decode_slots reads the staged table");
  __shared__ __align__(16) int run_offset[kRuns + 1];
  __shared__ int32_t staged_table[kStaged ? kStagedBlocks : 1];
  __shared__ uint32_t part_count[kMaxParts];  // the other parts' counts, pushed
  __shared__ uint64_t counts_landed;
  const int parts = static_cast<int>(by_parts.d);
  const uint32_t t = by_parts.div(blockIdx.x);  // the grid has < 2^31 CTAs
  const int part = static_cast<int>(blockIdx.x - t * by_parts.d);
  ConvertRow row;
  auto look_up_row = [&] {
    row = convert_row(a, t);
    if constexpr (kStaged) stage_table_row<kThreads>(row, staged_table);
  };
  if constexpr (kRowsFirst) look_up_row();
  await_previous_kernel();
  if (kCluster && parts > 1) {
    if (threadIdx.x == 0) push_barrier_init(&counts_landed, 4u * (parts - 1));
    push_arrive();
  }

  // A split row has at most kMaxParts tiles of at most 8 * kThreads columns (convert_plan):
  // its column indices are 32-bit. Row offsets (t * row_stride) stay 64-bit.
  const int32_t K = static_cast<int32_t>(a.token_indices.cols);
  const int32_t first = part * kTile;
  const int32_t live = K - first;  // > 0; the tile's columns past it do not exist
  const int64_t in_stride = kDense ? 1 : a.token_indices.col_stride;
  const int64_t out_stride = kDense ? 1 : a.out.col_stride;
  int32_t* out = a.out.row(t);
  int32_t* out_tile = out + (kDense ? first : first * out_stride);

  Tile<kThreads, kItems> tile;
  // The tile's loads, issued before a row lookup made after the wait.
  load_tile<kThreads, kItems, kDense>(
      a.token_indices.row(t) + (kDense ? first : first * in_stride), live, in_stride, tile);
  if constexpr (!kRowsFirst) look_up_row();
  convert_loaded<kThreads, kItems, kDense, kPow2, !kCompact, kStaged>(a, row, tile);
  if constexpr (!kCluster) {
    store_in_place<kThreads, kItems, kDense>(tile, live, out_tile, out_stride);
  } else {
    count_tile<kThreads, kItems>(tile, run_offset);
    int count = run_offset[kRuns], below = 0;
    if (parts > 1) {
      push_ready();
      if (static_cast<int>(threadIdx.x) < parts && static_cast<int>(threadIdx.x) != part) {
        push_u32(&part_count[part], static_cast<uint32_t>(count), &counts_landed, threadIdx.x);
      }
      push_wait(&counts_landed);
      const int lane = threadIdx.x % 32;
      count = lane < parts ? (lane == part ? count : static_cast<int>(part_count[lane])) : 0;
      below = lane < part ? count : 0;
      count = warp_sum(count);
      below = warp_sum(below);
    }
    const int32_t total = count;
    if constexpr (kCompact) {
      store_compacted<kThreads, kItems, kDense>(tile, run_offset,
                                                out + (kDense ? below : below * out_stride),
                                                out_stride);
      // This part also owns the -1 tail inside its own columns (tile-relative: from
      // total - first, which may be negative, to live).
      const int32_t from = total - first;
      if (from < live) fill_columns<kThreads, kItems, kDense>(from, live, out_tile, out_stride);
    } else {
      store_in_place<kThreads, kItems, kDense>(tile, live, out_tile, out_stride);
    }
    if (part == 0 && threadIdx.x == 0 && a.valid_counts.present()) {
      a.valid_counts[t] = total;
    }
  }
}

template <int kItems, bool kCompact, bool kDense, bool kCluster, bool kPow2, bool kStaged,
          bool kRowsFirst>
__global__ void __launch_bounds__(kSplitThreads)
    convert_split_kernel(const ConvertIndexArgs a, const FastDiv by_parts) {
  convert_split<kItems, kCompact, kDense, kCluster, kPow2, kStaged, kRowsFirst>(a, by_parts);
}

/*!
 * \brief convert_split of 8-column tiles, with registers for kWideSplitMinBlocks CTAs per
 *        SM. Only these run many CTAs per SM (counted rows past two per SM), and their
 *        gathers wait on memory, so occupancy pays more than registers: unbounded they
 *        took 55 registers, 4 CTAs per SM (T = 16384, K = 2048, compact: 142 against
 *        122 us). The narrower tiles keep the compiler's own choice (32 registers for 4
 *        columns; bounds made it 39 or spill, and T = 256 slower).
 */
template <bool kCompact, bool kDense, bool kCluster, bool kPow2, bool kStaged, bool kRowsFirst>
__global__ void __launch_bounds__(kSplitThreads, kWideSplitMinBlocks)
    convert_split_wide_kernel(const ConvertIndexArgs a, const FastDiv by_parts) {
  convert_split<8, kCompact, kDense, kCluster, kPow2, kStaged, kRowsFirst>(a, by_parts);
}

/*!
 * \brief One CTA per row (grid-stride over rows), looping over the row's tiles with the
 *        running valid count; the compacted tail is filled with -1 after the last tile.
 */
template <int kThreads, bool kCompact, bool kDense, bool kPow2>
__global__ void __launch_bounds__(kThreads, kRowMinBlocks)
    convert_row_kernel(const ConvertIndexArgs a) {
  constexpr int kItems = kRowItems;
  constexpr int kRuns = Tile<kThreads, kItems>::kRuns;
  constexpr int64_t kTile = static_cast<int64_t>(kThreads) * kItems;
  __shared__ __align__(16) int run_offset[kRuns + 1];
  await_previous_kernel();

  const int64_t K = a.token_indices.cols;
  const int64_t in_stride = kDense ? 1 : a.token_indices.col_stride;
  const int64_t out_stride = kDense ? 1 : a.out.col_stride;
  const bool need_count = kCompact || a.valid_counts.present();
  // The columns of the tile at `first` that exist (K may be 2^31 or more: 64-bit here).
  const auto live = [&](int64_t first) {
    return static_cast<int32_t>(K - first < kTile ? K - first : kTile);
  };

  for (int64_t t = blockIdx.x; t < a.token_indices.rows; t += gridDim.x) {
    const int32_t* in = a.token_indices.row(t);
    int32_t* out = a.out.row(t);
    int64_t row_count = 0;
    Tile<kThreads, kItems> tile;
    load_tile<kThreads, kItems, kDense>(in, live(0), in_stride, tile);
    const ConvertRow row = convert_row(a, t);
    for (int64_t first = 0;;) {
      convert_loaded<kThreads, kItems, kDense, kPow2, !kCompact>(a, row, tile);
      if (need_count) count_tile<kThreads, kItems>(tile, run_offset);
      if constexpr (kCompact) {
        store_compacted<kThreads, kItems, kDense>(
            tile, run_offset, out + (kDense ? row_count : row_count * out_stride), out_stride);
      } else {
        store_in_place<kThreads, kItems, kDense>(
            tile, live(first), out + (kDense ? first : first * out_stride), out_stride);
      }
      if (need_count) {
        row_count += run_offset[kRuns];
        __syncthreads();  // run_offset is rewritten by the next tile
      }
      first += kTile;
      if (first >= K) break;
      load_tile<kThreads, kItems, kDense>(in + (kDense ? first : first * in_stride), live(first),
                                          in_stride, tile);
    }
    if constexpr (kCompact) {
      for (int64_t c = row_count + threadIdx.x; c < K; c += kThreads) {
        __stcs(out + (kDense ? c : c * out_stride), -1);
      }
    }
    if (threadIdx.x == 0 && a.valid_counts.present()) {
      a.valid_counts[t] = static_cast<int32_t>(row_count);
    }
  }
}

std::atomic<int> g_plan_override{-1};

//! The split kernel of kItems-column tiles.
template <int kItems, bool kCompact, bool kDense, bool kCluster, bool kPow2, bool kStaged,
          bool kRowsFirst>
constexpr auto split_kernel() {
  if constexpr (kItems == 8) {
    return convert_split_wide_kernel<kCompact, kDense, kCluster, kPow2, kStaged, kRowsFirst>;
  } else {
    return convert_split_kernel<kItems, kCompact, kDense, kCluster, kPow2, kStaged, kRowsFirst>;
  }
}

//! Launches the split kernel, `parts` CTAs a row (a cluster of them where `cluster`).
template <int kItems, bool kCompact, bool kDense, bool kPow2, bool kStaged, bool kRowsFirst>
void launch_split(const ConvertIndexArgs& a, int parts, bool cluster, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(a.token_indices.rows * parts);
  const FastDiv by_parts(static_cast<uint32_t>(parts));
  if (cluster) {
    launch_clustered_kernel(
        split_kernel<kItems, kCompact, kDense, true, kPow2, kStaged, kRowsFirst>(), grid,
        kSplitThreads, parts, 0, stream, "convert_index kernel launch", a, by_parts);
  } else {
    launch_kernel(split_kernel<kItems, false, kDense, false, kPow2, kStaged, kRowsFirst>(), grid,
                  kSplitThreads, stream, "convert_index kernel launch", a, by_parts);
  }
}

//! launch_split in the row order `a` asks for (rows_before_wait: kRowsFirst).
template <int kItems, bool kCompact, bool kDense, bool kPow2, bool kStaged>
void launch_split(const ConvertIndexArgs& a, int parts, bool cluster, cudaStream_t stream) {
  a.rows_before_wait
      ? launch_split<kItems, kCompact, kDense, kPow2, kStaged, true>(a, parts, cluster, stream)
      : launch_split<kItems, kCompact, kDense, kPow2, kStaged, false>(a, parts, cluster, stream);
}

//! launch_split, the table staged where the plan says so (only where tokens_to_stage
//! allowed it: dense, power-of-two arithmetic).
template <int kItems, bool kCompact, bool kDense, bool kPow2>
void launch_split(const ConvertIndexArgs& a, const ConvertPlan& plan, bool cluster,
                  cudaStream_t stream) {
  if constexpr (kDense && kPow2) {
    if (plan.staged) {
      return launch_split<kItems, kCompact, kDense, kPow2, true>(a, plan.parts, cluster, stream);
    }
  }
  launch_split<kItems, kCompact, kDense, kPow2, false>(a, plan.parts, cluster, stream);
}

template <bool kCompact, bool kDense, bool kPow2>
void launch_plan(const ConvertIndexArgs& a, const ConvertPlan& plan, cudaStream_t stream) {
  if (plan.split_items > 0) {
    const bool cluster = kCompact || a.valid_counts.present();
    switch (plan.split_items) {
      case 1: return launch_split<1, kCompact, kDense, kPow2>(a, plan, cluster, stream);
      case 2: return launch_split<2, kCompact, kDense, kPow2>(a, plan, cluster, stream);
      case 4: return launch_split<4, kCompact, kDense, kPow2>(a, plan, cluster, stream);
      default: return launch_split<8, kCompact, kDense, kPow2>(a, plan, cluster, stream);
    }
  }
  const unsigned grid = static_cast<unsigned>(
      a.token_indices.rows < kMaxGridX ? a.token_indices.rows : kMaxGridX);
  launch_kernel(convert_row_kernel<kRowThreads, kCompact, kDense, kPow2>, grid, kRowThreads,
                stream, "convert_index kernel launch", a);
}

template <bool kCompact, bool kDense>
void launch_plan(const ConvertIndexArgs& a, const ConvertPlan& plan, cudaStream_t stream) {
  convert_pow2(a) ? launch_plan<kCompact, kDense, true>(a, plan, stream)
                  : launch_plan<kCompact, kDense, false>(a, plan, stream);
}

//! Where the table can be staged: the fewest token columns a CTA needs for staging to pay,
//! the table's columns times the DCP world size (about one local token per staged entry:
//! with fewer, the copy costs more than the gathers it replaces); 0 where it cannot be
//! (a strided table or token ids, arithmetic that is not a power of two, or a table wider
//! than kStagedBlocks).
int64_t tokens_to_stage(const ConvertIndexArgs& a, bool dense) {
  if (!dense || !convert_pow2(a) || a.block_table.cols > kStagedBlocks) return 0;
  const int64_t cols = a.block_table.cols > 1 ? a.block_table.cols : 1;
  return cols * a.dcp.world;
}

}  // namespace

ConvertPlan convert_plan(int64_t rows, int64_t cols, int64_t sms, bool counts,
                         int64_t stage_tokens) {
  ConvertPlan plan;
  const int forced = g_plan_override.load(std::memory_order_relaxed);
  // Columns per thread, from the H200 sweeps against vLLM (RESULTS.md): the fewer the rows,
  // the shorter the tiles and the more CTAs a row is spread over. Counted rows go to 8 from
  // an eighth of the SMs: a K = 2048 row is then one CTA and needs no cluster exchange
  // (T = 32 / 64 / 256: 2.57 / 2.75 / 3.64 us with 2 / 2 / 4 columns, 2.35 / 2.42 / 3.08
  // with 8; T = 16 ties). Without counts 4 win on many rows (K = 2048, T = 1024 / 16384:
  // 8.0 / 112 us against 8.2 / 117), unless 8 stage the table (T = 4096 / 16384: 20.6 /
  // 84.4 against 24.6 / 103.8), from a quarter of the SMs on (T = 64: 1.74 with 4, 1.72
  // with 8 staged, 2.00 with 2), and rows past 8 parts of 4 still take 8 below.
  const bool stage_wide = stage_tokens > 0 && stage_tokens <= kSplitThreads * 8;
  int items = rows * (counts ? 64 : 8) <= sms ? 1
              : rows * (counts ? 8 : 4) <= sms ? 2
              : counts || stage_wide          ? 8
                                              : 4;
  if (forced >= 0) items = forced;
  // Counted rows pay a cluster exchange per part: past a few rows, at most 4 parts.
  const int64_t max_parts = counts && rows * 64 > sms ? kMaxParts / 2 : kMaxParts;
  while (items > 1 && static_cast<int64_t>(kSplitThreads) * items / 2 >= cols) items /= 2;
  if (items > 0) {
    while (items < 8 && cols > max_parts * kSplitThreads * items) items *= 2;
    const int64_t tile = static_cast<int64_t>(kSplitThreads) * items;
    const int64_t parts = (cols + tile - 1) / tile;
    // With rows enough to fill the device, a cluster exchange costs more than a CTA
    // looping over the row's tiles.
    const bool exchange_pays = parts == 1 || !counts || rows <= 2 * sms || forced > 0;
    if (parts <= kMaxParts && rows * parts <= kMaxGridX && exchange_pays) {
      plan.split_items = items;
      plan.parts = static_cast<int>(parts);
      plan.staged = stage_tokens > 0 && (tile < cols ? tile : cols) >= stage_tokens;
      return plan;
    }
  }
  plan.row_threads = kRowThreads;
  return plan;
}

void set_convert_plan_override(int64_t code) {
  if (code != -1 && code != 0 && code != 1 && code != 2 && code != 4 && code != 8) {
    throw std::invalid_argument(
        "set_convert_plan_override: code must be -1, 0, 1, 2, 4 or 8, got " + std::to_string(code));
  }
  g_plan_override.store(static_cast<int>(code), std::memory_order_relaxed);
}

std::array<int64_t, 4> convert_index_plan(int64_t rows, int64_t cols, bool counts,
                                          int64_t stage_tokens, int64_t device) {
  DeviceGuard guard(device);
  const ConvertPlan plan = convert_plan(rows, cols, sm_count(device), counts, stage_tokens);
  return {plan.split_items, plan.parts, plan.row_threads, plan.staged};
}

void convert_index_cuda(const ConvertIndexArgs& a, const Place& place) {
  if (a.token_indices.rows == 0 || a.token_indices.cols == 0) return;
  DeviceGuard guard(place.device);
  const bool dense = a.token_indices.col_stride == 1 && a.out.col_stride == 1 &&
                     a.block_table.col_stride == 1;
  const ConvertPlan plan =
      convert_plan(a.token_indices.rows, a.token_indices.cols, sm_count(place.device),
                   a.compact || a.valid_counts.present(), tokens_to_stage(a, dense));
  const cudaStream_t stream = place.cuda_stream();
  if (a.compact) {
    dense ? launch_plan<true, true>(a, plan, stream) : launch_plan<true, false>(a, plan, stream);
  } else {
    dense ? launch_plan<false, true>(a, plan, stream)
          : launch_plan<false, false>(a, plan, stream);
  }
}

}  // namespace dsa
