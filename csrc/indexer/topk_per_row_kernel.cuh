// The indexer's per-row top-K: the selection kernels and their launcher, shared by the
// kernel files of the three ops (topk_per_row.cu, topk_to_slots.cu and
// topk_to_slots_pow2.cu, topk_to_candidates.cu): a translation unit per sink, so that a
// build compiles them in parallel.
//
// Radix select on the 32-bit order keys (score_key), digits of 11, 11 and 10 bits from the
// top. Each row is one thread block cluster of `cluster` CTAs; CTA r holds the contiguous
// slice [r * per, (r + 1) * per) of the row's window (per = ceil(count / cluster)).
//
// - Resident plan: while loading its slice (16-byte loads, eight per thread in flight) a
//   CTA stores the keys in shared memory and builds the first digit's histogram, so the
//   row is read from global memory once; the later walks run over shared memory. The
//   streamed plan (slices past one CTA's shared memory, or launches past one wave, where
//   two streamed CTAs per SM overlap) reads the slice from global memory in each walk.
// - After each pass every CTA sums its histogram in groups of 64 bins, and warp 0 of each
//   CTA takes the cluster's group sums, then the bins of the one group holding the k-th
//   key, so every CTA finds the same digit (cluster_digit). The CTAs push their sums into
//   every CTA's shared memory (st.async into each sender's slots, SenderMail, where the
//   keys are resident; red.async, added up as they land, SumMail, where streamed CTAs have
//   no room for the slots): no cluster barrier and no reads of another CTA's shared
//   memory. A pass whose digit bin is taken whole ends the selection early, and bf16 rows
//   stop after two passes (their keys have 16 significant bits).
// - Candidates: after the first pass one walk over the slice marks the keys whose first
//   digit is above the threshold digit in a bitmap (a warp's ballot is one bitmap word)
//   and appends those in the threshold bin, with their columns, to a candidate list in
//   shared memory (its length is known from the CTA's own histogram, so the list is used
//   only where it fits). The refining passes then run over the candidates alone, and the
//   candidates are marked in the bitmaps (selected, or equal to the final threshold) from
//   the list. A CTA whose bin does not fit refines over its whole slice and marks by a
//   walk over the slice after the last pass. Streamed CTAs skip that walk: while counting
//   they capture every key at or above a floor (count_and_capture), a digit estimated once
//   from the first batch of loads to lie at or below the row's threshold digit with a margin
//   (capture_floor); the rest of the slice is counted and captured with no block barrier.
//   Where that digit's keys would overflow the list (ties, narrow ranges), one CTA per row
//   refines the floor to a second digit (refine_capture_floor): the list then holds the
//   row's selection when it holds at least k keys. A CTA walks only when the capture
//   overflowed or missed the selection, and shorter slices (kCaptureMinSlice) walk without
//   capturing.
// - Output positions: the selection is the marked keys above the threshold and the first
//   `remaining` (in column order) of those equal to it. Each thread counts both bitmaps
//   over a contiguous run of words (an odd number, so a warp's reads hit distinct banks);
//   a block scan and the selected keys of the CTAs before give every selected column its
//   output position, the number of selected columns before it. Streamed CTAs exchange their
//   totals (pushed, cluster_exchange); resident ones, whose
//   marks are the very keys their histograms counted, sum what find_digit read of the CTAs
//   before in each pass (H200, beside main in one call: 1 x 32K 9.50 -> 9.02 us, 16 x 128K
//   17.81 -> 17.44). Ids are in ascending column order, no sort; up to kStagedSlots per CTA
//   are staged in shared memory in that order and written coalesced. A slice longer than
//   the bitmaps (kSegmentColumns; streamed plans only) is marked and counted one segment
//   at a time, unless every key equal to the threshold is selected (distinct scores): then
//   nothing tells a taken tie from a key above it, and the two bitmaps are one of twice
//   the columns, marked once (H200, 256 x 128K: 61.6 -> 58.1 us). In the fp32 capturing
//   64-register builds such a merged slice's listed keys take their positions themselves
//   (list_positions: a prefix per bitmap word plus the bits below), not by a walk of each
//   word's bits.
// - sorted: once the cluster has written the ids, CTA 0 rebuilds their 64-bit selection
//   ranks, sorts them (bitonic, shared memory) and rewrites the row.
//
// Two kernels beside it: rows of at most kShortColumns take topk_short_rows_kernel (one CTA
// a row, keys in registers, 8-bit digits), and resident slices of at most kRegisterSlice
// columns take topk_register_kernel (the same passes over keys in registers, positions from
// a block scan of each thread's counts: no list, bitmaps or staging).
#pragma once

#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../common/cluster_push.h"
#include "../common/warp_scan.h"
#include "topk_per_row.h"

namespace dsa {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;                 // 11-bit digits
constexpr int kGroupBins = 64;              // bins per group sum (find_digit)
//! Bitmap words a warp takes at a time in a walk (its loads in flight, and its batch of
//! ballots): a streamed walk is bound by its round trips to L2 / HBM (H200, 64 x 128K: 33.0
//! -> 29.7 us from 4 to 8 words), a resident one by its issue rate (16 spills at the
//! 64-register bound).
constexpr int kWalkWords = 8;
constexpr int kLoadsInFlight = 8;           // 16-byte loads per thread per batch
//! Largest cluster the plan picks (the portable limit); the override may force up to 16.
constexpr int kMaxPlanCluster = 8;
constexpr int kMaxCluster = 16;
//! Threshold-bin keys a CTA keeps as candidates (key and column, 8 bytes each): 2048 when
//! the slice's keys fill shared memory (resident), 10112 when they do not (streamed: 79 KB,
//! and two CTAs of 64K-column slices with their mail still fit an SM). A 64K-column slice of 16 distinct
//! integers holds about 8K keys in its threshold bin (the first digit keeps two mantissa
//! bits: 14 and 15 share a bin); at 8192 half such CTAs overflowed and walked the slice.
constexpr int64_t list_capacity(bool resident) { return resident ? 2048 : 10112; }
//! A streamed CTA's capture floor (capture_floor): its margin in rank over the estimate of
//! the row's threshold key, and the share of the list (kFloorFillNum / kFloorFillDen) its
//! captured keys may be expected to fill before the margin is given up.
constexpr uint32_t kFloorMargin = 2;
constexpr uint32_t kFloorFillNum = 9, kFloorFillDen = 10;
//! Streamed fp32 slices shorter than this many columns, and bf16 ones of at most this many,
//! walk instead of capturing (streamed_capture). H100, graph us, k = 2048, one CTA a row,
//! capturing at 32768 fp32 columns against walking: 256 x 32K 27.6 -> 25.5, 512 x 32K 58.3 ->
//! 54.2, 1024 x 32K 106.1 -> 100.6, its slots, candidates and sorted ids 1.5-2.0 faster;
//! shorter slices lost (300 x 24576 33.2 -> 35.0, 256 x 16384 18.3 -> 19.3, 256 x 10000 14.9
//! -> 17.7), and so did bf16 at 32768 (25.0 -> 25.6: the slice is its first batch, 32K bf16
//! keys, count_and_capture).
constexpr int64_t kCaptureMinSlice = 32768;
//! Whether streamed CTAs of `slice` columns capture candidates while counting (else k alone
//! would fill the list, or the slice is short enough to walk).
template <typename Bits>
__host__ __device__ constexpr bool streamed_capture(int64_t k, int64_t slice) {
  return k < list_capacity(false) &&
         (sizeof(Bits) == 4 ? slice >= kCaptureMinSlice : slice > kCaptureMinSlice);
}
//! Columns the two bitmaps of a CTA cover at most (16 KB: with the streamed list, 96 KB,
//! two streamed CTAs fit an SM); longer slices are marked one segment at a time.
constexpr int64_t kSegmentColumns = 65536;
//! Keys per CTA at most: one CTA per SM (176 KB of keys, 11 KB of bitmaps, the candidates).
constexpr int64_t kSliceOneCta = 45056;
//! Fewest columns per CTA the plan spreads a row to (shorter slices only add exchanges).
constexpr int64_t kMinSlice = 1024;
//! Most columns per CTA the plan gives (the list holds their threshold bin on randn rows),
//! unless longer slices, up to kPlanLongSlice, save a wave of streamed CTAs (topk_plan).
constexpr int64_t kPlanSlice = 65536;
//! Longest streamed slice the plan gives: two bitmap segments; the list still holds a
//! randn row's capture (about 5.2K keys at 128K columns, k = 2048).
constexpr int64_t kPlanLongSlice = 2 * kSegmentColumns;
//! Streamed CTAs an SM holds (512 threads of 64 registers, 96 KB of list and bitmaps).
constexpr int64_t kStreamedPerSm = 2;
//! A wave of streamed CTAs costs about its slice's columns plus this many for its serial
//! tail (passes, marks, scans, writes, with the loads idle). An estimate from one shape:
//! H200, 256 x 128K in two waves of 64K-column slices, about 40 us a wave, of which about
//! 17 us is the stream (256 KB a CTA at the copy bandwidth).
constexpr int64_t kWaveTailColumns = 65536;
//! The register kernel (topk_register_kernel): resident slices of at most kRegisterSlice
//! columns, their keys in registers, kRegisterItems a thread of kRegisterThreads. Longer
//! slices lost to the cluster kernel (H100, graph us, k = 2048, one build: 8K-column slices
//! of 512 x 16 keys level, 1 x 64K 12.29 -> 12.20; 16K of 1024 x 16 slower, 64 x 32K
//! 14.82 -> 16.53, 1 x 128K 11.77 -> 12.50; 16K of 512 x 32, against main's build, 64 x
//! 32K 14.78 -> 18.17, 1 x 128K 11.74 -> 14.12).
constexpr int kRegisterThreads = 512;
constexpr int kRegisterItems = 8;
constexpr int64_t kRegisterSlice = int64_t{kRegisterThreads} * kRegisterItems;
//! A CTA's selected ids are staged in its histograms' shared memory, in output order, when
//! there are at most this many of them.
constexpr int64_t kStagedSlots = 4096;
constexpr int kStagedPerThread = static_cast<int>(kStagedSlots / kThreads);  // plain slots
//! The short-row kernel (topk_short_rows_kernel): 256 threads per CTA, 512 for rows past
//! 256 x kShortMaxItems columns; at most kShortMaxItems keys per thread in registers; the
//! registers of kShortBlockThreads threads per SM (64 each: 16 keys per thread fit).
constexpr int kShortMaxItems = 16;
constexpr int kShortBlockThreads = 1024;
constexpr int64_t kShortColumns = int64_t{512} * kShortMaxItems;
//! Positions the short-row kernel converts per round for topk_to_slots: DSA's k of 2048 in
//! one (fewer slots per thread than a whole row's items: only the selected are converted).
constexpr int kSlotTile = 2048;

//! Digit passes: shift of the digit and its width.
__device__ __forceinline__ int pass_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ int pass_bins(int pass) { return pass == 2 ? 1024 : 2048; }

//! x >> s for s in [0, 32] (32: every key has the same, empty, high part).
__device__ __forceinline__ uint32_t high_bits(uint32_t x, int s) { return s >= 32 ? 0u : x >> s; }

//! Adds 1 to the 32-bit word at shared-memory address `address` (a shared-window offset,
//! as __cvta_generic_to_shared gives): this CTA's own shared memory only (atomicAdd on a
//! generic pointer also reaches another CTA's).
__device__ __forceinline__ void shared_increment(uint32_t address) {
  asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(address) : "memory");
}

//! Returns the 32-bit word at shared-memory address `address` (as shared_increment) and adds
//! `v` to it: one atomic of the calling lane (atomicAdd from one lane of a warp is compiled
//! to a warp-aggregated sequence, a dozen instructions).
__device__ __forceinline__ uint32_t shared_fetch_add(uint32_t address, uint32_t v) {
  uint32_t old;
  asm volatile("atom.shared.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(address), "r"(v) : "memory");
  return old;
}

//! The shared-window address of `p`; kPinned: made opaque, so it stays in a register. At
//! the 64-register bound the compiler otherwise rebuilds it before every use (S2UR of the
//! CTA's cluster id, then ULEA: in a counting loop, a dependent pair per increment).
template <bool kPinned = true>
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  if constexpr (kPinned) asm("" : "+r"(address));
  return address;
}

//! The shared address of the first-digit bin of `key` in the histogram at `hist_address`:
//! two instructions (a shift, then a multiply-add). Left to itself the compiler shifts by
//! 19, masks and adds, one more per counted key.
__device__ __forceinline__ uint32_t first_digit_bin(uint32_t hist_address, uint32_t key) {
  uint32_t address;
  asm("{\n\t.reg .u32 digit;\n\tshr.u32 digit, %1, 21;\n\tmad.lo.u32 %0, digit, 4, %2;\n\t}"
      : "=r"(address)
      : "r"(key), "r"(hist_address));
  return address;
}

//! The shared address of the second-digit (pass 1) bin of `key` in the histogram at
//! `hist_address`.
__device__ __forceinline__ uint32_t second_digit_bin(uint32_t hist_address, uint32_t key) {
  return hist_address + ((key >> pass_shift(1)) & (pass_bins(1) - 1)) * 4u;
}

//! 32-bit words of one bitmap for a slice of `columns` columns.
constexpr int64_t bitmap_words(int64_t columns) {
  const int64_t covered = columns < kSegmentColumns ? columns : kSegmentColumns;
  return (covered + 31) / 32;
}

//! Dynamic shared memory of a launch whose slices hold at most `slice` columns: the
//! candidates ((key, column) pairs), the two bitmaps, then (resident) the keys.
constexpr int64_t dynamic_smem_bytes(int64_t slice, bool resident) {
  return list_capacity(resident) * 8 + bitmap_words(slice) * 8 + (resident ? slice * 4 : 0);
}
constexpr int kMaxDynamicSmem = static_cast<int>(dynamic_smem_bytes(kSliceOneCta, true));

//! What refine_capture_floor needs from capture_floor (fill_rank 0: nothing to refine).
struct RefineFloor {
  uint32_t bin, fill_rank, margin_rank;
};

struct SharedState {
  alignas(16) uint32_t hist[2][kBins];  // read as 16-byte vectors; then the staged ids
  uint32_t warp_a[kWarps], warp_b[kWarps];
  uint32_t groups[2][kBins / kGroupBins];  // group sums of hist (a cluster of one; capture_floor)
  uint32_t digit, above, in_bin;
  // find_digit's counts over the CTAs of lower rank, and the kernel's sums of them over the
  // passes: the selected keys of those CTAs above the threshold and equal to it.
  uint32_t above_before, in_bin_before, gt_before, eq_before;
  uint32_t bin_lo, bin_hi;  // this CTA's least and greatest key of the first digit's bin
  uint32_t single_key;      // the cluster's bin holds one key (pass 1), and which
  uint32_t bin_key;
  uint32_t candidates;  // appended to the candidate list
  RefineFloor refine;   // capture_floor's hand-over to refine_capture_floor
  uint32_t sums[4];     // the exchange's result, for every thread
};

static_assert(2 * kSegmentColumns / 32 * sizeof(uint32_t) <= sizeof(SharedState::hist),
              "a merged bitmap's word prefixes fit in the histograms (list_positions)");
static_assert(kStagedSlots * sizeof(int32_t) <= sizeof(SharedState::hist) &&
                  kStagedSlots * sizeof(int32_t) <= list_capacity(true) * sizeof(uint2),
              "a CTA's ids are staged in the histograms (streamed) or the list (resident)");

/*!
 * \brief Exclusive block-wide prefix sums of (a, b) in thread order, and their totals.
 *        Every thread calls it. kEndBarrier: it ends with a barrier, so the scratch can be
 *        reused at once; without, the caller passes another barrier before the next scan.
 */
template <bool kEndBarrier = true>
__device__ __forceinline__ void block_scan2(SharedState& s, uint32_t a, uint32_t b,
                                            uint32_t& a_before, uint32_t& b_before,
                                            uint32_t& a_total, uint32_t& b_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t ia = warp_inclusive_sum(a), ib = warp_inclusive_sum(b);
  if (lane == 31) s.warp_a[warp] = ia, s.warp_b[warp] = ib;
  __syncthreads();
  uint32_t wa = 0, wb = 0, ta = 0, tb = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t xa = s.warp_a[w], xb = s.warp_b[w];
    if (w < warp) wa += xa, wb += xb;
    ta += xa, tb += xb;
  }
  a_before = wa + ia - a;
  b_before = wb + ib - b;
  a_total = ta;
  b_total = tb;
  if (kEndBarrier) __syncthreads();
}

//! Arrives at the cluster barrier with every thread's memory accesses before it released
//! to the cluster (see cluster_barrier). Every thread calls it.
__device__ __forceinline__ void cluster_arrive_released() {
  __syncthreads();
  if (threadIdx.x < 32) asm volatile("fence.acq_rel.cluster;" ::: "memory");
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

//! Waits until every CTA of the cluster has arrived (a plain block barrier without one);
//! every thread's memory accesses before it (shared, distributed shared and global) are
//! visible to every thread of the cluster after it. The block barrier orders the CTA's
//! accesses before one warp's cluster-scope release fence, which covers them all
//! (cumulativity), and the arrivals are relaxed. cluster.sync() releases in every thread:
//! a GPU-wide fence (MEMBAR.ALL.GPU) in each of the 16 warps (H100, graph us, k = 2048,
//! against it: 1 x 32K 8.0 -> 6.9, 8 x 32K 10.0 -> 8.8, 64 x 32K 14.8 -> 13.6, 1 x 128K
//! 11.8 -> 10.8, 64 x 128K 25.9 -> 24.7). The cluster of 1 keeps its own branch: the
//! 64-register streamed builds spilled with one block barrier before the test.
__device__ __forceinline__ void cluster_barrier(int cluster) {
  if (cluster > 1) {
    cluster_arrive_released();
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  } else {
    __syncthreads();
  }
}

template <typename Bits, bool kResident>
struct RowSlice {
  const Bits* src;  // column 0 of this CTA's slice in global memory
  const uint32_t* keys;
  uint32_t n;       // columns in the slice (slice indices are 32-bit: a row has < 2^31)

  __device__ __forceinline__ uint32_t key(uint32_t j) const {
    if constexpr (kResident) {
      return keys[j];
    } else {
      return score_key(__ldg(src + j));
    }
  }

  /*!
   * \brief Calls f(key) for every key of the slice, thread i taking the columns i,
   *        i + kThreads, ...: kWalkWords loads in flight per thread (a pass over a streamed
   *        slice is bound by its round trips). Every thread calls it.
   */
  template <typename F>
  __device__ __forceinline__ void for_each_key(F&& f) const {
    constexpr uint32_t kStep = kThreads * kWalkWords;
    uint32_t base = 0;
    for (; n - base >= kStep; base += kStep) {  // base <= n throughout
      uint32_t k[kWalkWords];
#pragma unroll
      for (int u = 0; u < kWalkWords; ++u) k[u] = key(base + u * kThreads + threadIdx.x);
#pragma unroll
      for (int u = 0; u < kWalkWords; ++u) f(k[u]);
    }
    for (uint32_t j = base + threadIdx.x; j < n; j += kThreads) f(key(j));
  }
};

//! Where the 16-byte vectors of a slice of `n` columns at `src` lie: `head` columns before
//! the first aligned one, `vectors` vectors, then the columns from `tail` on.
struct VectorLayout {
  uint32_t head, vectors, tail;
};

//! Columns of a slice outside its 16-byte vectors at most: an unaligned head and tail.
template <typename Bits>
constexpr uint32_t kUnalignedKeys = 2 * (16 / sizeof(Bits) - 1);

template <typename Bits>
__device__ __forceinline__ VectorLayout vector_layout(const Bits* src, uint32_t n) {
  constexpr int kPerVector = 16 / sizeof(Bits);
  const uintptr_t address = reinterpret_cast<uintptr_t>(src);
  uint32_t head = static_cast<uint32_t>(((16 - address % 16) % 16) / sizeof(Bits));
  if (head > n) head = n;
  const uint32_t vectors = (n - head) / kPerVector;
  return {head, vectors, head + vectors * kPerVector};
}

/*!
 * \brief Resident plans: loads the slice's keys into shared memory and counts the first
 *        digit into `hist`.
 */
template <typename Bits>
__device__ __forceinline__ void load_and_count(const Bits* src, uint32_t n, uint32_t* keys,
                                               uint32_t* hist) {
  const uint32_t hist_address = shared_address(hist);
  auto take = [&](uint32_t j, Bits bits) {
    const uint32_t key = score_key(bits);
    keys[j] = key;
    shared_increment(first_digit_bin(hist_address, key));
  };
  constexpr int kPerVector = 16 / sizeof(Bits);
  const VectorLayout l = vector_layout(src, n);
  if (threadIdx.x < l.head) take(threadIdx.x, src[threadIdx.x]);
  if (threadIdx.x < n - l.tail) take(l.tail + threadIdx.x, src[l.tail + threadIdx.x]);
  const uint4* body = reinterpret_cast<const uint4*>(src + l.head);
  for (uint32_t first = threadIdx.x; first < l.vectors; first += kThreads * kLoadsInFlight) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const uint32_t i = first + u * kThreads;
      if (i < l.vectors) v[u] = __ldcs(body + i);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const uint32_t i = first + u * kThreads;
      if (i < l.vectors) {
        const Bits* lanes = reinterpret_cast<const Bits*>(&v[u]);
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) take(l.head + i * kPerVector + e, lanes[e]);
      }
    }
  }
}

/*!
 * \brief Sums this CTA's histogram `hist` (`bins` bins) in groups of kGroupBins bins: warp w
 *        sums groups w, w + kWarps, ..., and every thread calls take(group, sum, lane) for
 *        each of its warp's groups. Where two groups share a warp (2 * kWarps groups),
 *        each half-warp takes one of them, lane = 0..15 in each half; else the warp's 32
 *        lanes take each group, lane = 0..31. Either way lanes 0..15 of every group call
 *        take (a caller that acts in lanes below the cluster size reaches every CTA).
 *        Every thread calls it once the histogram is complete (after a block barrier).
 */
static_assert(kMaxCluster <= 16, "for_each_group_sum's lanes below 16 reach every CTA");

template <typename Take>
__device__ __forceinline__ void for_each_group_sum(const uint32_t* hist, int bins, Take&& take) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (bins / kGroupBins == 2 * kWarps) {
    // Two groups a warp, g0 = warp and g1 = warp + kWarps, in one chain of shuffles: the
    // first step leaves halves of g0's sums in lanes 0-15 and of g1's in lanes 16-31,
    // then each half-warp sums its own. One take() serves both (lane % 16 in each half),
    // where a loop of two waited for each group's chain and its pushes in turn.
    const uint2 a = reinterpret_cast<const uint2*>(hist + warp * kGroupBins)[lane];
    const uint2 b = reinterpret_cast<const uint2*>(hist + (warp + kWarps) * kGroupBins)[lane];
    const bool low = lane < 16;
    const uint32_t x = a.x + a.y, y = b.x + b.y;
    uint32_t sum = (low ? x : y) + __shfl_xor_sync(0xffffffffu, low ? y : x, 16);
#pragma unroll
    for (int step = 8; step > 0; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);
    take(low ? warp : warp + kWarps, sum, lane % 16);
    return;
  }
  for (int g = warp; g < bins / kGroupBins; g += kWarps) {
    const uint2 q = reinterpret_cast<const uint2*>(hist + g * kGroupBins)[lane];
    take(g, warp_sum(q.x + q.y), lane);
  }
}

//! The group sums of `hist` into `groups` (for_each_group_sum).
__device__ __forceinline__ void sum_groups(const uint32_t* hist, int bins, uint32_t* groups) {
  for_each_group_sum(hist, bins, [&](int g, uint32_t sum, int lane) {
    if (lane == 0) groups[g] = sum;
  });
}

/*!
 * \brief The sum over the cluster's CTAs r < cluster of load(r) (a SenderMail's slot of
 *        sender r), and (kBefore) in `before` the sum over the CTAs r < rank, with up to
 *        eight loads in flight at once: in fixed batches of eight whatever the cluster size
 *        (a loop of `cluster` iterations is not unrolled for the sizes below its unroll
 *        factor, and waits for each load in turn). Ranks past the cluster load from the last
 *        CTA and are not added.
 */
template <bool kBefore, typename T, typename Load>
__device__ __forceinline__ T sum_over_cluster(int cluster, int rank, Load&& load, T& before) {
  constexpr int kInFlight = 8;
  T total{};
  before = T{};
  for (int r0 = 0; r0 < cluster; r0 += kInFlight) {
    T v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = load(min(r0 + u, cluster - 1));
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (r0 + u < cluster) total += v[u];
      if (kBefore && r0 + u < rank) before += v[u];
    }
  }
  return total;
}

//! Two bin counts, summed component-wise by sum_over_cluster.
struct BinPair {
  uint32_t x = 0, y = 0;
  __device__ __forceinline__ BinPair& operator+=(const BinPair& o) {
    x += o.x, y += o.y;
    return *this;
  }
};

//! find_digit's sums of a cluster of one: this CTA's histogram and its group sums.
struct LocalSums {
  const uint32_t* hist;
  const uint32_t* groups;
  __device__ __forceinline__ void await_groups() const {}
  __device__ __forceinline__ uint32_t group_sum(int g, uint32_t& before) const {
    before = 0;
    return groups[g];
  }
  __device__ __forceinline__ void await_bins(int) const {}
  //! Bins top - 2 - 2 * lane (x) and top - 1 - 2 * lane (y): lane `lane`'s pair of the
  //! group below `top`.
  __device__ __forceinline__ uint2 bin_pair(int top, int lane, uint2& before) const {
    before = uint2{0, 0};
    return *reinterpret_cast<const uint2*>(hist + top - 2 - 2 * lane);
  }
};

/*!
 * \brief The mail of a resident CTA (and of the register kernel's): every CTA's sums of
 *        the passes, pushed into every CTA of the cluster (st.async, cluster_push.h) instead
 *        of read where they are after a cluster barrier (its release is a GPU-wide fence; a
 *        read is a round trip). A pass has two rounds: the group sums of the histogram, then
 *        the 64 bins of the one group holding the pass's key. Each slot has one sender
 *        (the reader sums them, over every CTA and over those before it), so no round's
 *        pushes overwrite a slot still read: a CTA pushes a round only after the round
 *        before has landed from every CTA, each of which had read the slot's previous
 *        contents by then. H100, graph us, k = 2048, against the barrier and reads
 *        (fcdecae): 1 x 32K 6.96 -> 6.45, 8 x 32K 8.87 -> 8.01, 64 x 32K 13.66 -> 12.36, 1 x
 *        128K 10.79 -> 10.28, 16 x 128K 16.02 -> 14.83. The sums added up as they land
 *        (SumMail, with a second copy over the CTAs before) were 0.3-0.7 us slower at 8 CTAs
 *        a row and 3 us at 16.
 */
struct SenderMail {
  uint32_t groups[kMaxCluster][kBins / kGroupBins];     // [sender][group]
  alignas(16) uint32_t bins[kMaxCluster][kGroupBins];   // [sender][bin of the group]
  uint64_t landed[3][2];                                // per pass: the groups, the bins
};

/*!
 * \brief The mail of a streamed CTA: the cluster's sums added up as they land (red.async),
 *        1.2 KB where SenderMail's 6 KB would not leave two streamed CTAs an SM. Per pass the
 *        group sums (pass 1: with the least and greatest key of the first digit's bin), then
 *        the bins of the group holding the pass's key; then the CTAs' totals
 *        (cluster_exchange). Every slot is used once (cleared by open_mail). H100, graph us,
 *        k = 2048, against a cluster barrier and reads: 64 x 128K 24.8 -> 23.0, 32 x 256K
 *        33.2 -> 31.1, 8 x 512K 23.0 -> 21.7, 64 x 128K of 16 values 29.0 -> 27.3.
 */
struct SumMail {
  uint32_t groups[3][kBins / kGroupBins];  // [pass][group]
  alignas(8) uint32_t bins[3][kGroupBins];  // [pass][bin of the group]
  uint32_t bounds[2];  // pass 1: least, greatest key of the first digit's bin
  uint64_t totals[2];  // the exchange's (y << 32 | x): every CTA, those before
  uint64_t landed[3][2];  // per pass: the groups (and bounds), the bins
  uint64_t exchanged;
};

//! The mail of a resident (register kernel's too) or streamed CTA.
template <bool kResident>
using ClusterMail = std::conditional_t<kResident, SenderMail, SumMail>;

// sm_90 / sm_100: at most 227 KB of shared memory per CTA, 228 KB per SM (1 KB of it
// reserved per CTA).
static_assert(kMaxDynamicSmem + sizeof(SharedState) + sizeof(SenderMail) <= 227 * 1024,
              "a resident CTA of kSliceOneCta columns has room for its mail");
static_assert(kStreamedPerSm * (dynamic_smem_bytes(kPlanLongSlice, false) +
                                static_cast<int64_t>(sizeof(SharedState)) +
                                static_cast<int64_t>(sizeof(SumMail)) + 1024) <=
                  228 * 1024,
              "kStreamedPerSm streamed CTAs fit an SM");

/*!
 * \brief Opens the mail of CTA `rank` of `cluster` (> 1): sets up its barriers with the
 *        bytes each round brings (SumMail: and clears its sums, which its arrival releases
 *        to the cluster), then every thread arrives at the cluster barrier that publishes
 *        them (waited on before the first push, push_ready). Every thread calls it.
 */
template <typename Mail>
__device__ __forceinline__ void open_mail(Mail& mail, int cluster, int rank) {
  constexpr bool kSums = std::is_same<Mail, SumMail>::value;
  if constexpr (kSums) {
    constexpr int kWords = static_cast<int>(offsetof(SumMail, landed) / 4);
    constexpr int kLeast = static_cast<int>(offsetof(SumMail, bounds) / 4);
    uint32_t* words = reinterpret_cast<uint32_t*>(&mail);
    for (int i = threadIdx.x; i < kWords; i += blockDim.x) words[i] = i == kLeast ? ~0u : 0u;
  }
  if (threadIdx.x == 0) {
    for (int pass = 0; pass < 3; ++pass) {
      const uint32_t bounds = kSums && pass == 1 ? cluster * 8u : 0u;  // a least, a greatest
      push_barrier_init(&mail.landed[pass][0],
                        cluster * (pass_bins(pass) / kGroupBins) * 4u + bounds);
      push_barrier_init(&mail.landed[pass][1], cluster * kGroupBins * 4u);
    }
    if constexpr (kSums) {
      push_barrier_init(&mail.exchanged, (cluster + rank) * 8u);  // every CTA's, those before's
    }
  }
  if constexpr (kSums) {
    cluster_arrive_released();  // the cleared sums before any push
  } else {
    push_arrive();
  }
}

//! find_digit's sums in a SenderMail: each CTA's, summed by the reader.
struct SenderSums {
  const uint32_t* hist;  // this CTA's histogram of the pass
  SenderMail* mail;
  int pass, cluster, rank;
  __device__ __forceinline__ void await_groups() const { push_wait(&mail->landed[pass][0]); }
  __device__ __forceinline__ uint32_t group_sum(int g, uint32_t& before) const {
    return sum_over_cluster<true, uint32_t>(cluster, rank, [&](int r) { return mail->groups[r][g]; },
                                            before);
  }
  //! Warp 0: pushes this CTA's bins [top - kGroupBins, top) into every CTA, then waits for
  //! the cluster's.
  __device__ __forceinline__ void await_bins(int top) const {
    constexpr int kVectors = kGroupBins / 4;
    const uint4* mine = reinterpret_cast<const uint4*>(hist + top - kGroupBins);
    uint4* slot = reinterpret_cast<uint4*>(mail->bins[rank]);
    for (int i = threadIdx.x; i < cluster * kVectors; i += 32) {
      push_u32x4(slot + i % kVectors, mine[i % kVectors], &mail->landed[pass][1], i / kVectors);
    }
    push_wait(&mail->landed[pass][1]);
  }
  __device__ __forceinline__ uint2 bin_pair(int, int lane, uint2& before) const {
    BinPair b;
    const BinPair c = sum_over_cluster<true, BinPair>(
        cluster, rank,
        [&](int r) {
          const uint2 q = *reinterpret_cast<const uint2*>(mail->bins[r] + kGroupBins - 2 - 2 * lane);
          return BinPair{q.x, q.y};
        },
        b);
    before = uint2{b.x, b.y};
    return uint2{c.x, c.y};
  }
};

//! find_digit's sums in a SumMail: added up as they landed (no counts of the CTAs before).
struct AddedSums {
  const uint32_t* hist;  // this CTA's histogram of the pass
  SumMail* mail;
  int pass, cluster;
  __device__ __forceinline__ void await_groups() const { push_wait(&mail->landed[pass][0]); }
  __device__ __forceinline__ uint32_t group_sum(int g, uint32_t& before) const {
    before = 0;
    return mail->groups[pass][g];
  }
  //! Warp 0: adds this CTA's bins [top - kGroupBins, top) into every CTA's, lane l's pair as
  //! one 64-bit word (bin top - 2 - 2l in its low half: each bin's sum over the row stays
  //! below 2^31, so the halves add up without a carry), then waits for the cluster's.
  __device__ __forceinline__ void await_bins(int top) const {
    const int lane = threadIdx.x;
    const uint2 own = *reinterpret_cast<const uint2*>(hist + top - 2 - 2 * lane);
    const uint64_t word = (uint64_t{own.y} << 32) | own.x;
    uint64_t* slot = reinterpret_cast<uint64_t*>(&mail->bins[pass][kGroupBins - 2 - 2 * lane]);
    for (int r = 0; r < cluster; ++r) push_add_u64(slot, word, &mail->landed[pass][1], r);
    push_wait(&mail->landed[pass][1]);
  }
  __device__ __forceinline__ uint2 bin_pair(int, int lane, uint2& before) const {
    before = uint2{0, 0};
    return *reinterpret_cast<const uint2*>(&mail->bins[pass][kGroupBins - 2 - 2 * lane]);
  }
};

/*!
 * \brief The pass's digit: finds, in the cluster's histograms (`bins` bins; `sums`:
 *        LocalSums, SenderSums or AddedSums) the bin holding the remaining-th key in
 *        descending digit order, and stores it in s.digit, the keys of the higher bins in
 *        s.above and the bin's count in s.in_bin; kBefore: the same two counts over the CTAs
 *        of lower rank than this one in s.above_before and s.in_bin_before. Warp 0 takes
 *        the cluster's group sums, then the 64 bins of the one group holding the key (3
 *        words per lane instead of whole histograms). Every thread calls it once the group
 *        sums are pushed; the results are visible after the next __syncthreads.
 */
template <bool kBefore, typename Sums>
__device__ __forceinline__ void find_digit(SharedState& s, const Sums& sums, int bins,
                                           uint32_t remaining) {
  if (threadIdx.x >= 32) return;
  sums.await_groups();
  const int lane = threadIdx.x;
  const int group_count = bins / kGroupBins;
  // Lane l holds group group_count - 1 - l (descending digit order along the lanes).
  const int g = group_count - 1 - lane;
  const int g_read = g >= 0 ? g : 0;  // lanes past the groups read group 0 and drop it
  uint32_t group_before = 0;
  uint32_t group_sum = sums.group_sum(g_read, group_before);
  if (g < 0) group_sum = 0, group_before = 0;
  // The counts of the CTAs before are scanned beside the totals (kBefore): warp 0 is on the
  // critical path of every CTA, each scan a chain of shuffles.
  const uint32_t incl = warp_inclusive_sum_u32(group_sum);
  const uint32_t incl_before = kBefore ? warp_inclusive_sum_u32(group_before) : 0;
  // The lowest group's lane (and below, the lowest bins' lane) always votes: it is the
  // first to reach `remaining` only where no group does, which takes a caller's race (a
  // streamed CTA's re-walk counting fewer keys than the pass before). Every CTA of the
  // cluster then still finds the same digit from the same sums, and takes the same
  // branches.
  const int first =
      __ffs(__ballot_sync(0xffffffffu, incl >= remaining || lane == group_count - 1)) - 1;
  const uint32_t above_group = __shfl_sync(0xffffffffu, incl - group_sum, first);
  const uint32_t above_group_before =
      kBefore ? __shfl_sync(0xffffffffu, incl_before - group_before, first) : 0;
  const int top = (group_count - 1 - first) * kGroupBins + kGroupBins;  // past the group
  sums.await_bins(top);
  // Lane l holds the bins top - 1 - 2l (c.x) and top - 2 - 2l (c.y).
  uint2 q_before;
  const uint2 q = sums.bin_pair(top, lane, q_before);
  const BinPair c{q.y, q.x}, b{q_before.y, q_before.x};  // b: the CTAs before this one
  const uint32_t need = remaining - above_group;
  const uint32_t pair = c.x + c.y;
  const uint32_t pair_incl = warp_inclusive_sum_u32(pair);
  const uint32_t pair_before = b.x + b.y;
  const uint32_t pair_before_incl = kBefore ? warp_inclusive_sum_u32(pair_before) : 0;
  const int at = __ffs(__ballot_sync(0xffffffffu, pair_incl >= need || lane == 31)) - 1;
  if (lane == at) {
    const uint32_t before = above_group + pair_incl - pair;
    const bool upper = before + c.x >= remaining;
    s.digit = static_cast<uint32_t>(top - 1 - 2 * lane - (upper ? 0 : 1));
    s.above = upper ? before : before + c.x;
    s.in_bin = upper ? c.x : c.y;
    if (kBefore) {
      const uint32_t before_b = above_group_before + pair_before_incl - pair_before;
      s.above_before = upper ? before_b : before_b + b.x;
      s.in_bin_before = upper ? b.x : b.y;
    }
  }
}

/*!
 * \brief The digit of pass `pass` over the cluster, once this CTA's histogram of the pass
 *        (s.hist[pass & 1], `bins` bins) is complete: its group sums pushed into every CTA's
 *        `mail` (opened by open_mail; the first pass waits for every CTA's to be open), then
 *        find_digit. kResident: a SenderMail, with the counts of the CTAs before; else a
 *        SumMail, where pass 1 also pushes `bounds`, this CTA's least and greatest key of
 *        the first digit's bin. Every thread calls it after a block barrier.
 */
template <bool kResident>
__device__ __forceinline__ void cluster_digit(SharedState& s, ClusterMail<kResident>* mail,
                                              int pass, int bins, int cluster, int rank,
                                              uint32_t remaining, uint2 bounds = {0, 0}) {
  uint32_t* hist = s.hist[pass & 1];
  uint32_t* groups = s.groups[pass & 1];
  if (cluster == 1) {
    sum_groups(hist, bins, groups);
    __syncthreads();
    find_digit<kResident>(s, LocalSums{hist, groups}, bins, remaining);
    return;
  }
  if (pass == 0) push_ready();
  uint64_t* landed = &mail->landed[pass][0];
  // Lane r of each warp pushes the warp's sums into CTA r.
  for_each_group_sum(hist, bins, [&](int g, uint32_t sum, int lane) {
    if (lane < cluster) {
      if constexpr (kResident) {
        push_u32(&mail->groups[rank][g], sum, landed, lane);
      } else {
        push_reduce_u32<PushOp::kAdd>(&mail->groups[pass][g], sum, landed, lane);
      }
    }
  });
  if constexpr (kResident) {
    find_digit<true>(s, SenderSums{hist, mail, pass, cluster, rank}, bins, remaining);
  } else {
    if (pass == 1 && static_cast<int>(threadIdx.x) < cluster) {
      push_reduce_u32<PushOp::kMin>(&mail->bounds[0], bounds.x, landed, threadIdx.x);
      push_reduce_u32<PushOp::kMax>(&mail->bounds[1], bounds.y, landed, threadIdx.x);
    }
    find_digit<false>(s, AddedSums{hist, mail, pass, cluster}, bins, remaining);
  }
}

/*!
 * \brief One CTA's shared memory for the marking: the candidate list (keys and their
 *        slice columns) and the two bitmaps over the slice's columns (bit j of `sel`: column
 *        j is above the threshold; of `tie`: equal to it).
 */
struct Marks {
  uint2* cand;  // (key, slice column)
  uint32_t capacity;  // of the list
  uint32_t* sel;
  uint32_t* tie;
};

/*!
 * \brief The r-th largest key's bin in the histogram `hist` of one CTA (`groups`: its
 *        group sums), r in [1, its total]. Warp 0 calls it; every lane gets the bin. It
 *        leaves the keys of the higher bins in s.above.
 */
__device__ __forceinline__ uint32_t nth_digit(SharedState& s, uint32_t* hist, uint32_t* groups,
                                              uint32_t r) {
  find_digit<false>(s, LocalSums{hist, groups}, kBins, r);
  __syncwarp();  // one lane wrote s.digit and s.above
  const uint32_t d = s.digit;
  __syncwarp();  // read before the next write
  return d;
}

/*!
 * \brief The capture floor of a streamed CTA, as a first digit, from the histogram `hist`
 *        of the keys it has counted so far (n_seen of them, the first batch of its slice of
 *        `n` columns; the row's window has `row_count`): the higher of
 *        - the first digit of the r-th largest key counted, r = ceil(kFloorMargin * k *
 *          n_seen / row_count): a row whose keys do not trend along the columns has about
 *          k * n_seen / row_count of those keys at or above its threshold key, so the floor
 *          is at or below the row's threshold digit with a margin of kFloorMargin in rank;
 *        - the lowest digit whose counted keys at or above it, scaled to the slice
 *          (n / n_seen), fit kFloorFillNum / kFloorFillDen of the list: the margin is given up
 *          only where the capture would overflow the list anyway.
 *        Where the second bound decides, it also leaves what refine_capture_floor needs in
 *        s.refine: the bin B of the key fit + 1 and the ranks in B of that key and (0 where
 *        it lies below B) of the r-th.
 *        The floor is NOT guaranteed to be at or below the threshold digit (sorted rows,
 *        rows that trend); the kernel checks it after the first pass and walks the slice
 *        when it is above. Every thread calls it once; it uses s.groups[1] and s.digit as
 *        scratch (pass 1 and pass 0 rewrite them).
 */
__device__ __forceinline__ uint32_t capture_floor(SharedState& s, uint32_t* hist, uint32_t k,
                                                  uint32_t n, uint32_t row_count,
                                                  uint32_t capacity) {
  __syncthreads();  // the first batch's counts are in
  sum_groups(hist, kBins, s.groups[1]);
  __syncthreads();
  if (threadIdx.x < 32) {
    const uint32_t seen = warp_sum(s.groups[1][threadIdx.x]);
    uint32_t floor = 0;  // nothing counted (an empty slice): nothing to choose from
    RefineFloor refine{0, 0, 0};
    if (seen > 0) {
      const uint64_t margin = (uint64_t{kFloorMargin} * k * seen + row_count - 1) / row_count;
      const uint32_t r = static_cast<uint32_t>(margin < seen ? margin : seen);
      floor = nth_digit(s, hist, s.groups[1], r);
      const uint32_t margin_digit = floor;
      // Keys of the first batch that scale to kFloorFillNum / kFloorFillDen of the list.
      const uint64_t fit =
          uint64_t{kFloorFillNum} * capacity * seen / (uint64_t{kFloorFillDen} * n);
      if (fit < seen) {  // else every digit fits
        const uint32_t fill_bin = nth_digit(s, hist, s.groups[1], static_cast<uint32_t>(fit) + 1);
        // The bin of key fit + 1 left out (2047 at most: the keys compare with floor << 21).
        const uint32_t fill_floor = min(fill_bin + 1, kBins - 1u);
        if (fill_floor > floor) {
          floor = fill_floor;
          const uint32_t above = s.above;  // keys in the bins above fill_bin
          refine = {fill_bin, static_cast<uint32_t>(fit) + 1 - above,
                    margin_digit == fill_bin ? r - above : 0};
        }
      }
    }
    if (threadIdx.x == 0) s.digit = floor, s.refine = refine;
  }
  __syncthreads();
  // The next write of s.digit (pass 0's find_digit) is behind two barriers.
  return s.digit;
}

/*!
 * \brief Where the list bound decided the capture floor (s.refine.fill_rank > 0), the floor
 *        to the next 11 bits: the first batch's keys of bin B = s.refine.bin are counted by
 *        their second digits in s.hist[1] (free until pass 1; cleared again here), and the
 *        floor becomes the higher of the second digit after that of the key fit + 1 and
 *        (where it lies in B) that of the r-th key (capture_floor). A bin of ties or of a
 *        narrow range (16 distinct values, uniform [0, 1)) then fits the list in part.
 *        Returns the floor as a key: capture_floor's digit << 21, or finer (above it only
 *        where the fill bin is the top one, 2047, whose keys are NaNs: the kernel's check
 *        after the first pass still decides whether the list is used).
 *        Every thread calls it with its keys of the first batch (`take(visit)` calls
 *        visit(key) for each of them).
 */
template <typename Take>
__device__ __forceinline__ uint32_t refine_capture_floor(SharedState& s, uint32_t floor,
                                                         Take&& take) {
  const RefineFloor refine = s.refine;  // written before capture_floor's last barrier
  if (refine.fill_rank == 0) return floor << 21;  // block-uniform
  uint32_t* const hist = s.hist[1];
  const uint32_t hist_address = shared_address(hist);
  take([&](uint32_t key) {
    if ((key >> pass_shift(0)) == refine.bin) shared_increment(second_digit_bin(hist_address, key));
  });
  __syncthreads();
  sum_groups(hist, kBins, s.groups[1]);
  __syncthreads();
  if (threadIdx.x < 32) {
    // The unaligned columns (capture_floor counted them) may leave the ranks past the bin.
    const uint32_t in_bin = warp_sum(s.groups[1][threadIdx.x]);
    uint32_t fine = floor << 11;  // capture_floor's floor in second-digit units
    if (in_bin > 0) {
      const uint32_t base = refine.bin << 11;
      fine = base + nth_digit(s, hist, s.groups[1], min(refine.fill_rank, in_bin)) + 1;
      if (refine.margin_rank > 0) {
        fine = max(fine, base + nth_digit(s, hist, s.groups[1], min(refine.margin_rank, in_bin)));
      }
      fine = min(fine, (1u << 22) - 1u);  // at most the highest second digit
    }
    if (threadIdx.x == 0) s.digit = fine;
  }
  __syncthreads();
  const uint32_t floor_key = s.digit << 10;
  for (int i = threadIdx.x; i < kBins; i += kThreads) hist[i] = 0;  // pass 1 counts here
  return floor_key;
}

/*!
 * \brief Streamed plans: counts the slice's first digits into `hist` (the slice has `n`
 *        columns at `src`, the row's window `row_count`) and captures into the candidate
 *        list every key at or above the capture floor, so that the selection needs no
 *        second walk over the slice. The floor is set once, from the first batch of loads
 *        (kThreads * kLoadsInFlight vectors: 16K fp32 or 32K bf16 keys), by capture_floor, and
 *        with `refine` (one CTA per row) to a second digit by refine_capture_floor; that batch
 *        is captured from the registers after it. Every later batch is counted and captured
 *        with the floor fixed and no block barrier: a thread marks its keys at or above the
 *        floor in a bit mask while counting, then its warp appends them with one atomic on
 *        the list's length. The unaligned columns (fewer than kUnalignedKeys) are captured
 *        whole. Returns the floor as a key. Where s.candidates <= m.capacity the list holds
 *        every key at or above it: every key at or above the row's threshold digit D where
 *        floor_key <= D << 21, every key at or above the row's k-th where s.candidates >=
 *        k + kUnalignedKeys (one CTA per row); else the kernel walks the slice. Host model of
 *        the list sizes: tools/topk_capture_sizes.py (k = 2048, 64K-column slices: about 2.6K
 *        captured on randn rows, 8.2K on 16-value and uniform ones). `capturing` false (k
 *        alone would fill the list, or the row's slices are short: streamed_capture):
 *        counts only, returns 0. Every thread calls it.
 */
template <typename Bits, bool kFromRegisters>
__device__ __forceinline__ uint32_t count_and_capture(SharedState& s, const Bits* src, uint32_t n,
                                                      uint32_t row_count, uint32_t* hist,
                                                      const Marks& m, uint32_t k,
                                                      bool capturing, bool refine) {
  constexpr int kPerVector = 16 / sizeof(Bits);
  // Bit u * kPerVector + e: key e of the thread's vector u of the batch is captured.
  using Mask = std::conditional_t<(kLoadsInFlight * kPerVector > 32), uint64_t, uint32_t>;
  const int lane = threadIdx.x % 32;
  const VectorLayout l = vector_layout(src, n);
  const uint4* body = reinterpret_cast<const uint4*>(src + l.head);
  constexpr uint32_t kStep = kThreads * kLoadsInFlight;
  // The batch at `base`: vector u of this thread is base + u * kThreads + threadIdx.x (zero
  // past the slice's vectors).
  auto load = [&](uint32_t base, uint4 (&v)[kLoadsInFlight]) {
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const uint32_t i = base + u * kThreads + threadIdx.x;
      v[u] = i < l.vectors ? __ldg(body + i) : make_uint4(0, 0, 0, 0);
    }
  };
  auto keys_of = [&](const uint4& vec, uint32_t (&key)[kPerVector]) {
    const Bits* lanes = reinterpret_cast<const Bits*>(&vec);
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) key[e] = score_key(lanes[e]);
  };
  const uint32_t hist_address = shared_address(hist);
  auto count = [&](const uint32_t (&key)[kPerVector]) {
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) shared_increment(first_digit_bin(hist_address, key[e]));
  };
  // Sets the mask bits of vector u's keys at or above floor_key.
  auto mark = [&](const uint32_t (&key)[kPerVector], int u, uint32_t floor_key, Mask& mask) {
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) {
      if (key[e] >= floor_key) mask |= Mask{1} << (u * kPerVector + e);
    }
  };
  // Appends the keys of `mask` (the batch `vv` at `base`), with their columns, in lane
  // order. A warp whose keys would pass the capacity stores none: the list has overflowed
  // and is not used. The whole warp calls it.
  // kFromRegisters: the keys come from the batch's registers, computed again from opaque
  // copies of the loaded vectors (else the compiler keeps the marks' keys alive across the
  // warp's scan: 96 / 232 bytes of stack at the 64-register bound). H100, graph us, two
  // calls, k = 2048, re-reads -> registers: fp32 256 x 128K 70.1 -> 63.0, 16 distinct
  // values 256 x 128K 82.0 -> 74.0, 32 x 256K 45.9 -> 42.7, 64 x 128K 32.7 -> 30.9; but
  // bf16 256 x 128K 52.7 -> 54.1 and 32 x 256K 29.6 -> 32.0 (eight keys a vector), so the
  // fp32 kernels that capture are built with it (launch_plan) and no other.
  // Else a thread walks its own set bits, reading each captured key's bits again: at a
  // few percent captured almost every warp has a hit in every vector, so a pass over the
  // vectors would run whole for every warp, where this loop runs as often as the warp's
  // busiest lane hits. The reads mostly go to L2 (the streamed CTAs' shared memory leaves
  // L1 less than a batch), two in flight at a time (H200, beside the loop of one read in
  // one call: 64 x 128K fp32 24.3-24.8 -> 23.7-23.8 us, bf16 22.4 -> 21.3, 16 distinct
  // values 33.3 -> 31.0-31.5; 256 x 128K unchanged). Appending after the next batch's
  // loads are issued lost 1-11 us (H100: the re-reads wait behind those loads).
  auto append = [&](uint32_t base, Mask mask, const uint4 (&vv)[kLoadsInFlight]) {
    const uint32_t mine = static_cast<uint32_t>(__popcll(mask));
    const uint32_t incl = warp_inclusive_sum(mine);
    const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
    if (total == 0) return;  // warp-uniform
    uint32_t at = 0;
    if (lane == 31) at = atomicAdd(&s.candidates, total);
    at = __shfl_sync(0xffffffffu, at, 31);
    if (at + total > m.capacity) return;  // warp-uniform
    at += incl - mine;
    if constexpr (kFromRegisters) {
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        uint4 opaque = vv[u];
        asm volatile("" : "+r"(opaque.x), "+r"(opaque.y), "+r"(opaque.z), "+r"(opaque.w));
        uint32_t key[kPerVector];
        keys_of(opaque, key);
        const uint32_t c = l.head + (base + u * kThreads + threadIdx.x) * kPerVector;
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) {
          if ((mask >> (u * kPerVector + e)) & 1) m.cand[at++] = make_uint2(key[e], c + e);
        }
      }
      return;
    }
    auto column = [&](Mask& left) {
      const int bit = __ffsll(static_cast<long long>(left)) - 1;
      left &= left - 1;
      const int u = bit / kPerVector, e = bit % kPerVector;
      return l.head + (base + u * kThreads + threadIdx.x) * kPerVector + e;
    };
    while (mask != 0) {
      const uint32_t c0 = column(mask);
      const bool two = mask != 0;
      const uint32_t c1 = two ? column(mask) : c0;
      const Bits b0 = __ldg(src + c0), b1 = __ldg(src + c1);
      m.cand[at++] = make_uint2(score_key(b0), c0);
      if (two) m.cand[at++] = make_uint2(score_key(b1), c1);
    }
  };
  auto take_whole = [&](uint32_t j) {
    const uint32_t key = score_key(src[j]);
    atomicAdd(&hist[key >> 21], 1u);
    if (!capturing) return;
    const uint32_t i = atomicAdd(&s.candidates, 1u);
    if (i < m.capacity) m.cand[i] = make_uint2(key, j);
  };
  if (threadIdx.x < l.head) take_whole(threadIdx.x);
  if (threadIdx.x < n - l.tail) take_whole(l.tail + threadIdx.x);
  uint4 v[kLoadsInFlight];
  // Loads the batch at `base` into v and counts its keys.
  auto load_and_count_batch = [&](uint32_t base) {
    load(base, v);
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      uint32_t key[kPerVector];
      keys_of(v[u], key);
      if (base + u * kThreads + threadIdx.x < l.vectors) count(key);
    }
  };
  // The first batch: counted, the floor set from it, then captured from the registers.
  load_and_count_batch(0);
  if (!capturing) {  // block-uniform
    for (uint32_t base = kStep; base < l.vectors; base += kStep) load_and_count_batch(base);
    return 0;
  }
  const uint32_t floor = capture_floor(s, hist, k, n, row_count, m.capacity);
  uint32_t floor_key = floor << 21;
  if (refine) {
    floor_key = refine_capture_floor(s, floor, [&](auto&& visit) {
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        uint32_t key[kPerVector];
        keys_of(v[u], key);
        if (u * kThreads + threadIdx.x < l.vectors) {
#pragma unroll
          for (int e = 0; e < kPerVector; ++e) visit(key[e]);
        }
      }
    });
  }
  Mask mask = 0;
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) {
    uint32_t key[kPerVector];
    keys_of(v[u], key);
    if (u * kThreads + threadIdx.x < l.vectors) mark(key, u, floor_key, mask);
  }
  append(0, mask, v);
  // The later batches, against the fixed floor: the warps run apart.
  for (uint32_t base = kStep; base < l.vectors; base += kStep) {  // block-uniform
    load(base, v);
    mask = 0;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      uint32_t key[kPerVector];
      keys_of(v[u], key);
      if (base + u * kThreads + threadIdx.x < l.vectors) {
        count(key);
        mark(key, u, floor_key, mask);
      }
    }
    append(base, mask, v);
  }
  return floor_key;
}

/*!
 * \brief The walk after the first pass: appends the slice's keys of the threshold digit
 *        `digit` to the candidate list and, when `mark` (the bitmaps cover the slice),
 *        stores the `sel` words (the keys of a higher digit; `tie` is cleared beforehand).
 *        A warp takes kWalkWords words' columns at a time (its ballots are the words),
 *        with one atomic on the list's length per batch; only a warp's last batch checks the
 *        slice's end.
 */
template <typename Slice>
__device__ __forceinline__ void collect_candidates(SharedState& s, const Slice& slice,
                                                   const Marks& m, uint32_t digit, bool mark) {
  const int lane = threadIdx.x % 32;
  const uint32_t lower = (1u << lane) - 1u;
  auto batch = [&](uint32_t base, auto checked) {
    constexpr bool kChecked = decltype(checked)::value;
    uint32_t key[kWalkWords], in_bin[kWalkWords], mine = 0, listed = 0;
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const uint32_t j = base + 32 * u + lane;
      key[u] = !kChecked || j < slice.n ? slice.key(j) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const bool valid = !kChecked || base + 32 * u + lane < slice.n;
      const uint32_t d = key[u] >> 21;
      const uint32_t above = __ballot_sync(0xffffffffu, valid && d > digit);
      in_bin[u] = __ballot_sync(0xffffffffu, valid && d == digit);
      mine = lane == u ? above : mine;  // lane u stores word u
      listed += __popc(in_bin[u]);
    }
    if (mark && lane < kWalkWords && (!kChecked || base + 32 * lane < slice.n)) {
      m.sel[base / 32 + lane] = mine;
    }
    if (listed == 0) return;  // warp-uniform
    uint32_t at = 0;
    if (lane == 0) at = atomicAdd(&s.candidates, listed);
    at = __shfl_sync(0xffffffffu, at, 0);
    // This lane's list positions: `at` plus the batch's candidates before its own, word by
    // word (most lanes have none; branch-free up to the stores).
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const uint32_t i = at + __popc(in_bin[u] & lower);
      // The histogram counted exactly these keys; the bound guards against logits changed
      // under the kernel.
      if (((in_bin[u] >> lane) & 1u) && i < m.capacity) {
        m.cand[i] = make_uint2(key[u], base + 32 * u + lane);
      }
      at += __popc(in_bin[u]);
    }
  };
  constexpr uint32_t kStep = kThreads * kWalkWords;
  uint32_t base = (threadIdx.x - lane) * kWalkWords;
  for (; base + 32 * kWalkWords <= slice.n; base += kStep) batch(base, std::false_type{});
  if (base < slice.n) batch(base, std::true_type{});
}

/*!
 * \brief collect_candidates for a resident slice (`n` keys at `keys` in shared memory, one
 *        segment): the same `sel` words and candidates in fewer instructions per key (the
 *        walk over shared memory is bound by what it issues, not by its reads). A key is
 *        compared with the bin's least and greatest key (no digit extracted); lane 0 stores
 *        a batch's eight `sel` words (two 16-byte stores, no select per key); a thread notes
 *        its threshold-bin keys as bits of a mask, and after every 32 of its keys the warp
 *        appends them with one scan and one atomic, each lane reading its few keys back from
 *        shared memory. The list's order is not collect_candidates' (lane by lane, not word
 *        by word); nothing depends on it: the list is only counted and marked from. The
 *        appended keys are counted into `next_hist`, pass 1's histogram, as they are written
 *        (the pass then has no walk over the list). Every thread calls it; the block barrier
 *        of pass 1 publishes the list and the counts.
 */
__device__ __forceinline__ void collect_resident_candidates(SharedState& s, const uint32_t* keys,
                                                            uint32_t n, const Marks& m,
                                                            uint32_t digit, uint32_t* next_hist) {
  constexpr uint32_t kStep = kThreads * kWalkWords;
  constexpr int kFlushBatches = 32 / kWalkWords;  // a 32-bit mask of a thread's keys
  static_assert(kWalkWords == 8, "a batch is two 16-byte stores of sel words");
  const int lane = threadIdx.x % 32;
  const uint32_t bin_floor = digit << 21, bin_ceiling = bin_floor | ((1u << 21) - 1);
  // A batch at `base` (the warp's columns base + 32 u + lane): stores its sel words and
  // returns this lane's threshold-bin keys as bits u.
  auto batch = [&](uint32_t base, auto checked) {
    constexpr bool kChecked = decltype(checked)::value;
    uint32_t key[kWalkWords], word[kWalkWords], bits = 0;
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const uint32_t j = base + 32 * u + lane;
      key[u] = !kChecked || j < n ? keys[j] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const bool valid = !kChecked || base + 32 * u + lane < n;
      const bool above = key[u] > bin_ceiling;
      word[u] = __ballot_sync(0xffffffffu, valid && above);
      if (valid && !above && key[u] >= bin_floor) bits |= 1u << u;
    }
    uint32_t* const sel = m.sel + base / 32;  // 32-byte aligned: base is a multiple of 256
    if (!kChecked) {
      if (lane == 0) {
        reinterpret_cast<uint4*>(sel)[0] = make_uint4(word[0], word[1], word[2], word[3]);
        reinterpret_cast<uint4*>(sel)[1] = make_uint4(word[4], word[5], word[6], word[7]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kWalkWords; ++u) {
        if (lane == 0 && base + 32 * u < n) sel[u] = word[u];
      }
    }
    return bits;
  };
  const uint32_t next_hist_address = shared_address(next_hist);
  // Appends the keys of `mask` (bit 8 b + u: word u of the b-th batch from `first`), with
  // their columns, and counts their pass-1 digits. The whole warp calls it.
  auto flush = [&](uint32_t first, uint32_t mask) {
    const uint32_t mine = __popc(mask);
    const uint32_t incl = warp_inclusive_sum_u32(mine);
    uint32_t at = 0;
    if (lane == 31) at = shared_fetch_add(shared_address(&s.candidates), incl);
    at = __shfl_sync(0xffffffffu, at, 31) + incl - mine;
    // No bound on `at`: the histogram counted these very keys (from shared memory, which
    // nothing else writes), and the caller collects only a bin that fits the list.
    const uint32_t column = first + lane;
    while (mask != 0) {  // most lanes hold none or one
      const uint32_t p = 31u - __clz(mask);
      mask ^= 1u << p;
      const uint32_t j = column + (p / kWalkWords) * kStep + (p % kWalkWords) * 32;
      const uint32_t key = keys[j];
      m.cand[at++] = make_uint2(key, j);
      shared_increment(second_digit_bin(next_hist_address, key));
    }
  };
  uint32_t first = (threadIdx.x - lane) * kWalkWords;  // the warp's first batch of the flush
  while (first < n) {  // warp-uniform
    uint32_t mask = 0;
#pragma unroll 1
    for (int b = 0; b < kFlushBatches && first + b * kStep < n; ++b) {
      const uint32_t base = first + b * kStep;
      const uint32_t bits = base + 32 * kWalkWords <= n ? batch(base, std::false_type{})
                                                          : batch(base, std::true_type{});
      mask |= bits << (kWalkWords * b);
    }
    flush(first, mask);
    first += kFlushBatches * kStep;
  }
}

/*!
 * \brief Calls visit(entry) for the candidate list's entries [0, n) that this thread takes
 *        (threadIdx.x + i * kThreads), in batches of four loads issued before their
 *        visits: the visits write shared memory that the compiler cannot tell from the
 *        list's, so a plain loop would wait for each entry's load in turn.
 */
template <typename Visit>
__device__ __forceinline__ void for_each_listed(const uint2* cand, uint32_t n, Visit&& visit) {
  constexpr int kAhead = 4;
  uint32_t c = threadIdx.x;
  for (; c + (kAhead - 1) * kThreads < n; c += kAhead * kThreads) {
    uint2 e[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) e[u] = cand[c + u * kThreads];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) visit(e[u]);
  }
  for (; c < n; c += kThreads) visit(cand[c]);
}

/*!
 * \brief Marks the columns [s0, s1) of the slice in the bitmaps by their keys (bit j - s0):
 *        high_bits(key, shift) above `threshold` in `sel`, equal in `tie`. With shift 32
 *        every column is equal (the keys are not read). kWalkWords words per warp
 *        at a time, as in collect_candidates.
 */
template <typename Slice>
__device__ __forceinline__ void mark_by_walk(const Slice& slice, const Marks& m, uint32_t s0,
                                             uint32_t s1, int shift, uint32_t threshold) {
  const int lane = threadIdx.x % 32;
  auto batch = [&](uint32_t base, auto checked) {
    constexpr bool kChecked = decltype(checked)::value;
    uint32_t h[kWalkWords], above = 0, equal = 0;
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const uint32_t j = base + 32 * u + lane;
      h[u] = (!kChecked || j < s1) && shift < 32 ? slice.key(j) >> shift : 0u;
    }
#pragma unroll
    for (int u = 0; u < kWalkWords; ++u) {
      const bool valid = !kChecked || base + 32 * u + lane < s1;
      const uint32_t a = __ballot_sync(0xffffffffu, valid && h[u] > threshold);
      const uint32_t e = __ballot_sync(0xffffffffu, valid && h[u] == threshold);
      above = lane == u ? a : above;  // lane u stores word u
      equal = lane == u ? e : equal;
    }
    if (lane < kWalkWords && (!kChecked || base + 32 * lane < s1)) {
      m.sel[(base - s0) / 32 + lane] = above;
      m.tie[(base - s0) / 32 + lane] = equal;
    }
  };
  constexpr uint32_t kStep = kThreads * kWalkWords;
  uint32_t base = s0 + (threadIdx.x - lane) * kWalkWords;
  for (; base < s1 && s1 - base >= 32 * kWalkWords; base += kStep) batch(base, std::false_type{});
  if (base < s1) batch(base, std::true_type{});
}

/*!
 * \brief Asks L2 for a streamed CTA's first batch of loads, so that it is on its way while
 *        the CTA clears its counters and bitmaps: thread t asks for the 16-byte blocks
 *        u * kThreads + t of the slice of `n` columns at `src`. count_and_capture's vectors
 *        start after the slice's unaligned head, less than 16 bytes later: the same cache
 *        lines but for the batch's last one.
 */
template <typename Bits>
__device__ __forceinline__ void prefetch_first_batch(const Bits* src, uint32_t n) {
  const char* bytes = reinterpret_cast<const char*>(src);
#pragma unroll
  for (int u = 0; u < kLoadsInFlight; ++u) {
    const uint32_t at = (u * kThreads + threadIdx.x) * 16u;
    if (at < n * sizeof(Bits)) asm volatile("prefetch.global.L2 [%0];" ::"l"(bytes + at));
  }
}

//! The `n` lowest set bits of `x` (n below its bit count).
__device__ __forceinline__ uint32_t lowest_bits(uint32_t x, uint32_t n) {
  uint32_t kept = 0;
  for (; n > 0; --n) kept |= x & (0u - x), x &= x - 1;
  return kept;
}

//! Bitonic sort of `n` (a power of two) 64-bit values in shared memory, descending.
__device__ __forceinline__ void sort_descending(uint64_t* v, int n) {
  for (int size = 2; size <= n; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < n / 2; i += kThreads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const uint64_t x = v[lo], y = v[hi];
        if ((x < y) == descending) v[lo] = y, v[hi] = x;
      }
      __syncthreads();
    }
  }
}

//! What the write phase stores for each selected id (the op's output).
struct IdsSink {};  // the ids (topk_per_row)

//! Sums of (x, y) over the cluster's CTAs before this one and over all of them.
struct ClusterSums {
  uint32_t x_before = 0, y_before = 0, x_all = 0, y_all = 0;
};

/*!
 * \brief Exchanges this CTA's totals (x, y) with the cluster: added into every CTA's `mail`
 *        (SumMail; each total below 2^31 over the row, so x and y add up in one 64-bit word
 *        without a carry between them). Every thread calls it, after the mail's push_ready.
 */
__device__ __forceinline__ ClusterSums cluster_exchange(SharedState& s, SumMail* mail,
                                                        int cluster, int rank, uint32_t x,
                                                        uint32_t y) {
  ClusterSums sums;
  sums.x_all = x;
  sums.y_all = y;
  if (cluster == 1) return sums;
  const uint64_t word = (uint64_t{y} << 32) | x;
  const int r = static_cast<int>(threadIdx.x);
  if (r < cluster) {
    push_add_u64(&mail->totals[0], word, &mail->exchanged, r);
    if (rank < r) push_add_u64(&mail->totals[1], word, &mail->exchanged, r);
  }
  if (threadIdx.x == 0) {
    push_wait(&mail->exchanged);
    const uint64_t all = mail->totals[0], before = mail->totals[1];
    s.sums[0] = static_cast<uint32_t>(before), s.sums[1] = static_cast<uint32_t>(before >> 32);
    s.sums[2] = static_cast<uint32_t>(all), s.sums[3] = static_cast<uint32_t>(all >> 32);
  }
  __syncthreads();
  sums.x_before = s.sums[0];
  sums.y_before = s.sums[1];
  sums.x_all = s.sums[2];
  sums.y_all = s.sums[3];
  return sums;
}

/*!
 * \brief The selection, then a write phase that stores each selected id at its output
 *        position through the sink: the id (IdsSink), its candidate key
 *        (PackCandidatesArgs: pack_candidate) or its slot (ConvertIndexArgs without
 *        compaction or counts: convert_tokens; kPow2: convert_pow2 holds).
 *        kCtasPerSm: the CTAs per SM its registers are budgeted for: 2 (64 registers a
 *        thread), or 1 (128) for launches whose clusters all fit one CTA per SM (launch).
 *        kAppendFromRegisters: streamed CTAs append their captured keys from the registers
 *        (count_and_capture; launch_plan says which launches). `cluster`: CTAs a row;
 *        `first_wave`: the CTAs of the launch's first wave (launch's estimate), past which
 *        streamed CTAs prefetch their first batch (prefetch_first_batch).
 */
template <typename Bits, bool kResident, typename Sink, int kCtasPerSm = 1024 / kThreads,
          bool kPow2 = false, bool kAppendFromRegisters = false>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    topk_per_row_kernel(const TopkPerRowArgs a, const Sink sink, int cluster,
                        unsigned first_wave) {
  constexpr bool kSlots = std::is_same<Sink, ConvertIndexArgs>::value;
  constexpr bool kPacked = std::is_same<Sink, PackCandidatesArgs>::value;
  extern __shared__ __align__(16) uint32_t dynamic_smem[];
  __shared__ SharedState s;
  __shared__ ClusterMail<kResident> mail;  // the cluster's sums (cluster_digit, cluster_exchange)
  // Clears the histograms and counters (a window of more than k columns counts in them).
  // Resident CTAs clear them before the wait for the previous kernel, as no global memory is
  // read, so that this overlaps that kernel's tail (streamed kernels spilled with it, so
  // they clear after); the block barrier after the bitmaps' clearing orders it before the
  // counts.
  auto clear_counters = [&]() {
    for (int i = threadIdx.x; i < 2 * kBins; i += kThreads) (&s.hist[0][0])[i] = 0;
    if (threadIdx.x == 0) s.candidates = 0, s.bin_lo = ~0u, s.bin_hi = 0;
  };
  if (kResident) clear_counters();
  await_previous_kernel();

  const int64_t row = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x - row * cluster);
  const RowWindow w = row_window(a, row);
  // 32-bit divisions: a row has fewer than 2^31 columns.
  const int64_t per = static_cast<uint32_t>(w.count + cluster - 1) / static_cast<uint32_t>(cluster);
  const int64_t lo = rank * per < w.count ? rank * per : w.count;
  const int64_t hi = lo + per < w.count ? lo + per : w.count;
  // A window of at most k columns is taken whole: every column before this CTA's is.
  if (kResident && threadIdx.x == 0) s.gt_before = 0, s.eq_before = static_cast<uint32_t>(lo);
  // The layout of dynamic_smem_bytes for the launch's largest slice.
  const int64_t words =
      bitmap_words(static_cast<uint32_t>(a.cols + cluster - 1) / static_cast<uint32_t>(cluster));
  constexpr uint32_t kList = static_cast<uint32_t>(list_capacity(kResident));
  const Marks m{reinterpret_cast<uint2*>(dynamic_smem), kList, dynamic_smem + 2 * kList,
                dynamic_smem + 2 * kList + words};
  const Bits* row_src = static_cast<const Bits*>(a.logits) + row * a.row_stride + w.start;
  uint32_t* const keys = m.tie + words;  // resident
  const RowSlice<Bits, kResident> slice{row_src + lo, keys, static_cast<uint32_t>(hi - lo)};
  const int64_t k = a.k;
  const uint32_t segment = static_cast<uint32_t>(words) * 32;  // columns the bitmaps cover
  const bool one_segment = slice.n <= segment;
  // Streamed CTAs capture candidates while counting, unless k alone would fill the list or
  // the launch's slices are short (their walk is one re-read of a few batches, mostly from
  // L2, cheaper than capturing every batch). `per` is the same for every CTA of the row.
  const bool capturing = !kResident && streamed_capture<Bits>(k, per);

  // The selection: keys with high_bits(key, shift) > threshold, and the first `remaining`
  // (column order) of those equal to it. A window of at most k columns is taken whole.
  int shift = 32;
  uint32_t threshold = 0, remaining = static_cast<uint32_t>(w.count < k ? w.count : k);
  // This CTA's threshold-bin keys are in the candidate list (else in the slice only).
  bool listed = false;
  bool captured = false;  // ... and so are all the keys above them (count_and_capture)
  uint32_t listed_count = 0;
  // Every key equal to the threshold is selected (remaining is the cluster's count of them):
  // the selection is then the keys at or above it, whatever their column.
  bool all_ties_taken = false;
  uint32_t floor_key = 0;  // streamed: the capture floor (count_and_capture)

  // Streamed CTAs exchange their totals whatever the window (cluster_exchange).
  if (!kResident && cluster > 1) open_mail(mail, cluster, rank);
  if (w.count > k) {
    if (!kResident) {
      // A CTA past the launch's first wave starts beside other CTAs' streams and tails:
      // its first loads are asked for before the clearing (H100, graph us, k = 2048:
      // 1024 x 32K 110.4 -> 107.2, 2048 x 32K 206.0 -> 199.9, 300 x 128K 96.9 -> 95.9). In
      // a first wave, where every CTA starts at once, the same prefetch cost 0.4-0.8 us
      // (phase binaries: 256 x 128K, 64 x 128K, 256 x 32K).
      if (blockIdx.x >= first_wave) prefetch_first_batch(slice.src, slice.n);
      clear_counters();
    }
    for (int64_t i = threadIdx.x; i < words; i += kThreads) {
      m.tie[i] = 0;  // marked from the list
      if (!kResident) m.sel[i] = 0;  // marked from the captured list (else by a walk)
    }
    __syncthreads();
    if constexpr (kResident) {
      if (cluster > 1) open_mail(mail, cluster, rank);
      load_and_count<Bits>(slice.src, slice.n, keys, s.hist[0]);
    } else {
      floor_key = count_and_capture<Bits, kAppendFromRegisters>(
          s, slice.src, slice.n, static_cast<uint32_t>(w.count), s.hist[0], m,
          static_cast<uint32_t>(k), capturing, cluster == 1);
    }
    uint32_t prefix = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const int digit_shift = pass_shift(pass), bins = pass_bins(pass);
      uint32_t* hist = s.hist[pass & 1];
      if (pass > 0) {
        const int decided = digit_shift + (pass == 1 ? 11 : 10);
        const uint32_t want = high_bits(prefix, decided);
        // Streamed, pass 1 also keeps the least and greatest key of the bin: where they are
        // equal (heavy ties) the last pass would only find that key again, in one more walk
        // over global memory. (Resident walks read shared memory; there the two registers
        // would spill.)
        const bool bounds = !kResident && pass == 1;
        uint32_t lo = ~0u, hi = 0;
        auto count = [&](uint32_t key) {
          if (high_bits(key, decided) == want) {
            atomicAdd(&hist[(key >> digit_shift) & (bins - 1)], 1u);
            if (bounds) lo = min(lo, key), hi = max(hi, key);
          }
        };
        if (listed) {
          // Resident CTAs counted pass 1 while collecting the list.
          if (!kResident || pass == 2) {
            for_each_listed(m.cand, listed_count, [&](uint2 e) { count(e.x); });
          }
        } else {
          slice.for_each_key(count);
        }
        if (bounds) {
          lo = __reduce_min_sync(0xffffffffu, lo), hi = __reduce_max_sync(0xffffffffu, hi);
          if (threadIdx.x % 32 == 0) atomicMin(&s.bin_lo, lo), atomicMax(&s.bin_hi, hi);
        }
      }
      __syncthreads();
      cluster_digit<kResident>(s, &mail, pass, bins, cluster, rank, remaining,
                               uint2{s.bin_lo, s.bin_hi});
      // The cluster's bounds of the bin (pushed with the pass's sums, which warp 0 waited for).
      if constexpr (!kResident) {
        if (pass == 1 && threadIdx.x == 0) {
          const uint32_t lo = cluster > 1 ? mail.bounds[0] : s.bin_lo;
          const uint32_t hi = cluster > 1 ? mail.bounds[1] : s.bin_hi;
          s.single_key = lo == hi, s.bin_key = lo;
        }
      }
      if (pass == 1) {  // pass 2 reuses pass 0's buffer (its bins were pushed in pass 0)
        for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[0][i] = 0;
      }
      __syncthreads();
      if (kResident && threadIdx.x == 0) {
        s.gt_before += s.above_before, s.eq_before = s.in_bin_before;
      }
      prefix |= s.digit << digit_shift;
      remaining -= s.above;
      all_ties_taken = s.in_bin == remaining;
      shift = digit_shift;
      threshold = high_bits(prefix, shift);
      // s.digit is rewritten only after the next pass's scan barriers.
      // Captured while counting, the list holds every key at or above the digit unless it
      // overflowed or the floor (an estimate from the first batch) is above the digit; with
      // one CTA per row, also every selected key where it holds k besides the unaligned ones
      // (then the row's k-th key is at or above the floor).
      if (pass == 0 && capturing && s.candidates <= kList &&
          (floor_key <= s.digit << 21 ||
           (cluster == 1 && s.candidates >= k + kUnalignedKeys<Bits>))) {
        listed = captured = true;
        listed_count = s.candidates;
      }
      if (s.in_bin == remaining) break;  // the whole bin is taken: nothing to refine
      // A bf16 key's low 16 bits follow from its high ones: keys that share the 22 bits the
      // first two digits decide are equal, so a third pass would find the bin again.
      if (sizeof(Bits) == 2 && pass == 1) break;
      if (!kResident && pass == 1 && s.single_key) {  // every key of the bin is this one
        prefix = s.bin_key;
        shift = 0;
        threshold = prefix;
        break;
      }
      if (pass == 0 && !listed) {
        const uint32_t in_bin = s.hist[0][s.digit];  // this CTA's keys in the bin
        listed = in_bin <= kList;
        if (listed) {
          if constexpr (kResident) {
            // The list is exactly the bin's keys (the histogram counted them from shared
            // memory), so its length needs no barrier.
            collect_resident_candidates(s, keys, slice.n, m, s.digit, s.hist[1]);
            listed_count = in_bin;
          } else {  // the capture missed (see above): the list is refilled by a walk
            __syncthreads();  // every thread has read s.candidates
            if (threadIdx.x == 0) s.candidates = 0;
            __syncthreads();
            collect_candidates(s, slice, m, s.digit, one_segment);
            __syncthreads();
            listed_count = s.candidates < kList ? s.candidates : kList;
          }
        }
      }
    }
  }

  // A resident CTA's output positions need no exchange: the keys its passes counted are the
  // keys it marks (shared memory), so the counts of the CTAs before it are find_digit's. It
  // reads no other CTA's shared memory (the sums were pushed into its own), so it needs no
  // barrier before its exit.

  // Mark the selected columns and count them: CTA totals, and in one segment each thread's
  // counts before its run of bitmap words. The list marks them where it holds them: in one
  // segment (the walk that refilled it marked the keys above the bin), or captured.
  const bool marked_from_list = listed && (one_segment || captured);
  // Where every tie is taken, `sel` and `tie` (adjacent in shared memory) are one bitmap of
  // twice the columns: a slice of two segments is marked, counted and visited once, every
  // selected column as a `sel` bit.
  const bool merged = marked_from_list && !one_segment && all_ties_taken && slice.n <= 2 * segment;
  // Marks the listed selected columns of [s0, s1) (s0 a multiple of 32), bit j - s0.
  auto mark_from_list = [&](uint32_t s0, uint32_t s1) {
    for_each_listed(m.cand, listed_count, [&](uint2 c_key_col) {
      const uint32_t h = high_bits(c_key_col.x, shift), j = c_key_col.y - s0;
      if (h >= threshold && j < s1 - s0) {
        atomicOr(&(h > threshold || merged ? m.sel : m.tie)[j / 32], 1u << (j % 32));
      }
    });
  };
  if (marked_from_list && one_segment) mark_from_list(0, slice.n);
  // Thread t counts and visits the bitmap words [t * run, t * run + run) of a segment of
  // `seg_words` words (run odd: a warp's reads hit distinct banks).
  auto word_run = [&](uint32_t seg_words, uint32_t& w0, uint32_t& w1) {
    const uint32_t run = ((seg_words + kThreads - 1) / kThreads) | 1;
    w0 = threadIdx.x * run < seg_words ? threadIdx.x * run : seg_words;
    w1 = w0 + run < seg_words ? w0 + run : seg_words;
  };
  // Marks segment `seg` (unless the list did) and scans its counts; [w0, w1): the thread's
  // words.
  auto scan_segment = [&](uint32_t seg, uint32_t& w0, uint32_t& w1, uint32_t& gt_before,
                          uint32_t& eq_before, uint32_t& gt_total, uint32_t& eq_total) {
    const uint32_t s0 = seg * segment;
    const uint32_t s1 = merged || slice.n - s0 <= segment ? slice.n : s0 + segment;
    if (!marked_from_list) {
      mark_by_walk(slice, m, s0, s1, shift, threshold);
    } else if (!one_segment) {  // the callers' barrier: the previous words are read
      for (int64_t i = threadIdx.x; i < words; i += kThreads) m.sel[i] = 0, m.tie[i] = 0;
      __syncthreads();
      mark_from_list(s0, s1);
    }
    __syncthreads();
    word_run((s1 - s0 + 31) / 32, w0, w1);
    uint32_t gt = 0, eq = 0;
    for (uint32_t i = w0; i < w1; ++i) gt += __popc(m.sel[i]), eq += merged ? 0 : __popc(m.tie[i]);
    // No end barrier: the next scan follows the next segment's marks or the staging, each
    // behind a barrier (the exchange's own one, with a cluster).
    block_scan2<false>(s, gt, eq, gt_before, eq_before, gt_total, eq_total);
  };
  // Calls visit(position, id) for each selected column of the words [w0, w1) of the
  // segment starting at column s0, in column order: position = the number of selected
  // columns before it. (gt, eq): the counts before word w0.
  // A word's selected columns are its `sel` bits and the first remaining - eq of its `tie`
  // bits, so their positions run on from the word's first and the bit loop has no branch
  // (H100, beside a loop that told the two kinds apart bit by bit: 256 x 128K 63.4 -> 62.8
  // us, 16 distinct values 73.9 -> 70.3, 64 x 32K 15.3 -> 14.9).
  auto visit_words = [&](uint32_t s0, uint32_t w0, uint32_t w1, uint32_t gt, uint32_t eq,
                         auto&& visit) {
    const int32_t first_id = static_cast<int32_t>(lo + s0);
    for (uint32_t i = w0; i < w1; ++i) {
      const uint32_t above = m.sel[i];
      uint32_t ties = merged ? 0u : m.tie[i];
      const uint32_t tie_count = __popc(ties);
      if (eq + tie_count > remaining) {
        ties = eq < remaining ? lowest_bits(ties, remaining - eq) : 0u;
      }
      int64_t position = static_cast<int64_t>(gt) + (eq < remaining ? eq : remaining);
      gt += __popc(above), eq += tie_count;
      const int32_t word_id = first_id + static_cast<int32_t>(i * 32);
      for (uint32_t both = above | ties; both != 0; both &= both - 1) {
        visit(position++, word_id + __ffs(both) - 1);
      }
    }
  };
  const uint32_t segments = one_segment || merged ? 1 : (slice.n - 1) / segment + 1;
  // Staged ids (below) go to memory free after the passes: the candidate list of a resident
  // CTA, else the histograms.
  int32_t* const stage =
      kResident ? reinterpret_cast<int32_t*>(m.cand) : reinterpret_cast<int32_t*>(&s.hist[0][0]);
  // One CTA per row needs no exchange for its output positions: a slice of several
  // segments stages its ids as it counts them, each segment marked once (not once for the
  // totals and again for the positions: a walk of the slice where the list overflowed).
  const bool stage_while_counting = !kResident && cluster == 1 && segments > 1 && k <= kStagedSlots;
  uint32_t w0 = 0, w1 = 0;
  uint32_t gt_before = 0, eq_before = 0, gt_total = 0, eq_total = 0;
  if (marked_from_list && segments > 1 && !stage_while_counting) {  // totals from the list
    uint32_t gt = 0, eq = 0;
    for_each_listed(m.cand, listed_count, [&](uint2 e) {
      const uint32_t h = high_bits(e.x, shift);
      gt += h > threshold, eq += h == threshold;
    });
    block_scan2(s, gt, eq, gt_before, eq_before, gt_total, eq_total);
  } else {
    for (uint32_t seg = 0; seg < segments; ++seg) {
      uint32_t gt_seg, eq_seg;
      scan_segment(seg, w0, w1, gt_before, eq_before, gt_seg, eq_seg);
      if (stage_while_counting) {
        visit_words(seg * segment, w0, w1, gt_total + gt_before, eq_total + eq_before,
                    [&](int64_t pos, int32_t id) {
                      if (pos < kStagedSlots) stage[pos] = id;  // (logits changed mid-run)
                    });
        __syncthreads();  // the words are read before the next segment's marks
      }
      gt_total += gt_seg, eq_total += eq_seg;
    }
  }
  // Streamed CTAs exchange their totals for their output positions: a walk re-reads the
  // logits, so its marks may not be the keys counted where the logits changed mid-run.
  ClusterSums selected;
  if constexpr (kResident) {
    selected.x_before = s.gt_before;
    selected.y_before = s.eq_before;
  } else {
    if (w.count <= k && cluster > 1) push_ready();  // no pass waited for the mail
    selected = cluster_exchange(s, &mail, cluster, rank, gt_total, eq_total);
  }
  const int64_t taken = w.count < k ? w.count : k;

  // This CTA's selected ids hold the output positions [first, first + count): positions
  // follow the column order and the CTA's columns are one contiguous slice. A streamed
  // CTA's counts and marks come from walks that re-read the logits: where another stream
  // changed them mid-run they may not be the keys the passes counted, so its range is cut
  // to the row's [0, taken) and positions outside it are dropped (no store out of bounds).
  // A resident CTA counts and marks the keys it holds: its range needs no cut.
  const uint32_t eq_taken_before = selected.y_before < remaining ? selected.y_before : remaining;
  const uint32_t eq_left = remaining - eq_taken_before;
  const int64_t first = static_cast<int64_t>(selected.x_before) + eq_taken_before;
  const int64_t room = first < taken ? taken - first : 0;
  const int64_t counted_here =
      static_cast<int64_t>(gt_total) + (eq_total < eq_left ? eq_total : eq_left);
  const int64_t count = kResident || counted_here < room ? counted_here : room;
  // Calls visit(position, id) for each selected column of the CTA. Every thread calls it.
  auto for_each_selected = [&](auto&& visit) {
    auto in_range = [&](int64_t pos, int32_t id) {  // (a resident CTA's marks are its counts)
      if (kResident || static_cast<uint64_t>(pos - first) < static_cast<uint64_t>(count)) {
        visit(pos, id);
      }
    };
    if (segments == 1) {
      visit_words(0, w0, w1, selected.x_before + gt_before, selected.y_before + eq_before,
                  in_range);
      return;
    }
    uint32_t gt_base = selected.x_before, eq_base = selected.y_before;
    for (uint32_t seg = 0; seg < segments; ++seg) {
      uint32_t v0, v1;
      uint32_t gt_seg_before, eq_seg_before, gt_seg, eq_seg;
      scan_segment(seg, v0, v1, gt_seg_before, eq_seg_before, gt_seg, eq_seg);
      visit_words(seg * segment, v0, v1, gt_base + gt_seg_before, eq_base + eq_seg_before,
                  in_range);
      gt_base += gt_seg, eq_base += eq_seg;
      __syncthreads();  // the words are read before the next segment's marks
    }
  };
  const int64_t fill_step = static_cast<int64_t>(cluster) * kThreads;
  const int64_t fill_first = rank * kThreads + threadIdx.x;
  // Staged (at most kStagedSlots ids): the ids go to shared memory in output order, so that
  // the writes are coalesced (and the plain slot sink's gathers batched).
  const bool staged = count <= kStagedSlots;
  // Merged, the list holds every selected key and the one bitmap marks their columns: each
  // listed selected key finds its own position, the CTA's first plus the selected columns
  // before its word (a prefix per word, in the histograms) plus its word's bits below it.
  // No thread walks a word's bits, where a warp waits on its lane with the most. Two CTAs
  // an SM share its issue slots in their tails, where this pays (H100, graph us, against
  // the staging visit: ids 256 x 128K 62.6-63.6 -> 61.3-62.2, 512 x 128K 116.4-116.8 ->
  // 113.9-114.4; topk_to_candidates 256 x 128K 73.6-73.9 -> 70.2-70.8). So only the fp32
  // capturing 64-register builds take it: the whole-SM ones lost 0.2-0.5 (100 x 128K, 64 x
  // 256K), the bf16 64-register build spilled with it and lost 1.5-2.5 (256 / 512 x 128K),
  // and fp32 slices that do not capture are never merged. The slot sink stages its ids, to
  // convert them in batches.
  const bool list_positions = !kSlots && kCtasPerSm > 1 && kAppendFromRegisters && merged;
  uint32_t* const word_prefix = &s.hist[0][0];
  if (list_positions) {
    uint32_t before = gt_before;
    for (uint32_t i = w0; i < w1; ++i) word_prefix[i] = before, before += __popc(m.sel[i]);
    __syncthreads();
  } else if (staged && !stage_while_counting) {
    for_each_selected([&](int64_t pos, int32_t id) { stage[pos - first] = id; });
    __syncthreads();
  }
  // Calls put(position, id) for each selected id of the CTA. Every thread calls it.
  auto for_each_output = [&](auto&& put) {
    if (list_positions) {
      for_each_listed(m.cand, listed_count, [&](uint2 e) {
        const uint32_t j = e.y, word = j / 32;
        if (high_bits(e.x, shift) < threshold || j >= slice.n) return;
        const uint32_t rank = word_prefix[word] + __popc(m.sel[word] & ((1u << (j % 32)) - 1u));
        if (rank < count) put(first + rank, static_cast<int32_t>(lo + j));
      });
    } else if (staged) {
      for (int i = threadIdx.x; i < count; i += kThreads) put(first + i, stage[i]);
    } else {
      for_each_selected(put);
    }
  };

  if constexpr (kPacked) {
    uint64_t* out = sink.out.row(row);
    const int64_t stride = sink.out.col_stride;
    const int64_t start = pack_row_start(sink, row);
    for_each_output([&](int64_t pos, int32_t id) {
      out[pos * stride] = pack_candidate(sink, row, start, id);
    });
    for (int64_t j = taken + fill_first; j < k; j += fill_step) {
      out[j * stride] = kInvalidCandidateKey;
    }
  } else if constexpr (kSlots) {
    // Plain slots (no compaction or counts; topk_to_slots.cu picks the launches): the CTA's
    // ids go through the conversion kStagedSlots positions (a chunk) at a time, each thread
    // a contiguous run of a chunk with all its block-table gathers in flight at once.
    int32_t* out = sink.out.row(row);
    const int64_t stride = sink.out.col_stride;
    const ConvertRow convert = convert_row(sink, row);
    const int64_t chunks = staged ? 1 : (count - 1) / kStagedSlots + 1;  // staged: one
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t c0 = first + c * kStagedSlots;
      if (!staged) {
        __syncthreads();  // the previous chunk's ids are read
        for_each_selected([&](int64_t pos, int32_t id) {
          if (pos >= c0 && pos < c0 + kStagedSlots) stage[pos - c0] = id;
        });
        __syncthreads();
      }
      const int64_t n = count - c * kStagedSlots < kStagedSlots ? count - c * kStagedSlots
                                                                : kStagedSlots;
      const int per = static_cast<int>((n + kThreads - 1) / kThreads);
      const int64_t i0 = static_cast<int64_t>(threadIdx.x) * per;
      const int mine = static_cast<int>(n - i0 < per ? (n > i0 ? n - i0 : 0) : per);
      int32_t slot[kStagedPerThread];
#pragma unroll
      for (int i = 0; i < kStagedPerThread; ++i) slot[i] = i < mine ? stage[i0 + i] : -1;
      convert_tokens<kPow2, kPow2>(sink, convert, slot, sink.block_table.col_stride);
#pragma unroll
      for (int i = 0; i < kStagedPerThread; ++i) {
        if (i < mine) out[(c0 + i0 + i) * stride] = slot[i];
      }
    }
    for (int64_t j = taken + fill_first; j < k; j += fill_step) out[j * stride] = -1;
  } else {
    int32_t* out = a.out.row(row);
    const int64_t stride = a.out.col_stride;
    for_each_output([&](int64_t pos, int32_t id) { out[pos * stride] = id; });
    for (int64_t j = taken + fill_first; j < k; j += fill_step) out[j * stride] = -1;
    if (a.sorted) {
      // The cluster's writes of this row are visible to CTA 0 after the barrier.
      cluster_barrier(cluster);
      if (rank != 0) return;
      int n = 1;
      while (n < taken) n *= 2;
      uint64_t* ranks = reinterpret_cast<uint64_t*>(dynamic_smem);
      for (int i = threadIdx.x; i < n; i += kThreads) {
        uint64_t r = 0;  // below every real rank (a real rank's low word is ~column != 0)
        // A position no walk wrote (logits changed mid-run) holds whatever `out` held: only
        // a column of the row is read; anything else sorts last and reads back as -1.
        const int32_t c = i < taken ? out[i * stride] : -1;
        if (static_cast<uint64_t>(c) < static_cast<uint64_t>(w.count)) {
          r = selection_rank(score_key(row_src[c]), c);
        }
        ranks[i] = r;
      }
      __syncthreads();
      sort_descending(ranks, n);
      for (int i = threadIdx.x; i < taken; i += kThreads) {
        out[i * stride] = static_cast<int32_t>(~static_cast<uint32_t>(ranks[i]));
      }
      return;
    }
  }
}

/*!
 * \brief Short rows (at most kBlock * kItems columns): one CTA of kBlock threads per row,
 *        the keys in registers (column j * kBlock + i in item j of thread i), radix select
 *        by 8-bit digits over them (four passes at most, 256-bin histograms one warp
 *        scans), then each selected column's output position, the number of selected
 *        columns before it (ballots and a scan of the 32-column run counts), so the output
 *        keeps ascending column order. The cluster kernel's fixed costs (2048-bin
 *        histograms, candidate list, bitmaps, 96 KB of shared memory) outweigh the work of
 *        a row this short; this one keeps several CTAs per SM. Grid-stride over the rows.
 *        The sinks: ids (unsorted), DCP candidate keys, or slots (with compaction and
 *        valid counts too, which the cluster kernel's slot sink leaves to two launches):
 *        the ids are staged in shared memory at their output positions, then converted
 *        kSlotTile positions at a time (position p in thread p % kBlock), all block-table
 *        gathers of a thread in flight, so that only the selected ids are converted. With
 *        compaction or valid counts, a tile whose ids all have slots (a barrier's vote) is
 *        written as it is, shifted by the valid slots before it; another one takes a
 *        run-count scan of its valid slots. kPow2 (slots): convert_pow2 holds, so
 *        convert_tokens takes decode_slots.
 */
template <typename Bits, int kItems, int kBlock, typename Sink, bool kPow2 = false>
__global__ void __launch_bounds__(kBlock, kShortBlockThreads / kBlock)  // 64 registers
    topk_short_rows_kernel(const TopkPerRowArgs a, const Sink sink) {
  constexpr bool kPacked = std::is_same<Sink, PackCandidatesArgs>::value;
  constexpr bool kSlots = std::is_same<Sink, ConvertIndexArgs>::value;
  constexpr int kShortWarps = kBlock / 32;
  constexpr int kRuns = kItems * kShortWarps;  // run j * kShortWarps + w: item j of warp w
  // Slots: positions per thread in one tile of the conversion, and the tile's runs (the
  // same layout: run i * kShortWarps + w holds positions tile + i * kBlock + w * 32 + lane).
  constexpr int kSlotItems = kItems < kSlotTile / kBlock ? kItems : kSlotTile / kBlock;
  constexpr int kSlotRuns = kSlotItems * kShortWarps;
  static_assert(kRuns % 32 == 0 && kSlotRuns % 32 == 0,
                "warp 0 scans the run counts, the same number per lane");
  static_assert(kBlock >= 256, "a thread per histogram bin clears it");
  __shared__ __align__(16) uint32_t hist[256];
  __shared__ uint32_t runs[kRuns];  // run counts, then their exclusive prefix
  __shared__ uint32_t runs_total;
  __shared__ uint32_t found[3];     // digit, keys above its bin, keys in its bin
  // Slots: the selected ids at their output positions, and the row's request
  // (convert_row), which thread 0 reads when the row starts so that its load overlaps the
  // selection. Raw storage: a __shared__ variable cannot run ConvertRow's initializers.
  __shared__ int32_t staged[kSlots ? kBlock * kItems : 1];
  static_assert(std::is_trivially_copyable<ConvertRow>::value,
                "a ConvertRow is assigned into raw shared storage");
  __shared__ __align__(alignof(ConvertRow)) unsigned char request_storage[sizeof(ConvertRow)];
  ConvertRow& request = *reinterpret_cast<ConvertRow*>(request_storage);
  await_previous_kernel();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t k = a.k;
  // The first runs_count::value entries of runs[] (written by lane 0 of each warp) -> their
  // exclusive prefix in column order, the total in runs_total. Every thread calls it.
  auto scan_runs = [&](auto runs_count) {
    constexpr int kRunsPerLane = decltype(runs_count)::value / 32;
    __syncthreads();
    if (warp == 0) {
      uint32_t v[kRunsPerLane], sum = 0;
#pragma unroll
      for (int r = 0; r < kRunsPerLane; ++r) v[r] = runs[lane * kRunsPerLane + r], sum += v[r];
      const uint32_t incl = warp_inclusive_sum(sum);
      uint32_t acc = incl - sum;
#pragma unroll
      for (int r = 0; r < kRunsPerLane; ++r) runs[lane * kRunsPerLane + r] = acc, acc += v[r];
      if (lane == 31) runs_total = incl;
    }
    __syncthreads();
  };
  const auto column = [&](int j) { return j * kBlock + static_cast<int32_t>(threadIdx.x); };
  const uint32_t hist_address = shared_address(hist);

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const RowWindow w = row_window(a, row);
    const int32_t n = static_cast<int32_t>(w.count);  // <= kBlock * kItems
    const int64_t taken = n < k ? n : k;
    // Slots: thread 0 reads the row's request (convert_row) into shared memory, once its
    // key loads are issued, so that the request's load overlaps them and the selection.
    const auto fetch_request = [&]() {
      if constexpr (kSlots) {
        if (threadIdx.x == 0) request = convert_row(sink, row);
      }
    };
    if constexpr (!kSlots) {
      if (n <= k) {  // the whole window, then the fill
        if constexpr (kPacked) {
          uint64_t* out = sink.out.row(row);
          const int64_t start = pack_row_start(sink, row);
          for (int64_t j = threadIdx.x; j < k; j += kBlock) {
            out[j * sink.out.col_stride] =
                j < n ? pack_candidate(sink, row, start, static_cast<int32_t>(j))
                      : kInvalidCandidateKey;
          }
        } else {
          int32_t* out = a.out.row(row);
          for (int64_t j = threadIdx.x; j < k; j += kBlock) {
            out[j * a.out.col_stride] = j < n ? static_cast<int32_t>(j) : -1;
          }
        }
        continue;
      }
    }

    // The selection (slots: a window of at most k columns is taken whole, position p
    // holding id p, with nothing to select): keys with high_bits(key, shift) > threshold,
    // and the first `remaining` (column order) of those equal to it.
    if (n > k) {
      uint32_t key[kItems];
      uint32_t prefix = 0, remaining = static_cast<uint32_t>(taken);
      int shift = 32;
#pragma unroll
      for (int j = 0; j < kItems; ++j) key[j] = 0;
      const Bits* src = static_cast<const Bits*>(a.logits) + row * a.row_stride + w.start;
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (column(j) < n) key[j] = score_key(__ldcs(src + column(j)));
      }
      fetch_request();
      for (int digit_shift = 24; digit_shift >= 0; digit_shift -= 8) {
        if (threadIdx.x < 256) hist[threadIdx.x] = 0;
        __syncthreads();
        const uint32_t want = high_bits(prefix, digit_shift + 8);
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          if (column(j) < n && high_bits(key[j], digit_shift + 8) == want) {
            shared_increment(hist_address + ((key[j] >> digit_shift) & 255u) * 4u);
          }
        }
        __syncthreads();
        if (warp == 0) {  // lane l holds bins 255 - 8 l - i, i = 0..7 (from the top)
          const uint4 lo = *reinterpret_cast<const uint4*>(&hist[248 - 8 * lane]);
          const uint4 hi = *reinterpret_cast<const uint4*>(&hist[252 - 8 * lane]);
          const uint32_t bin[8] = {hi.w, hi.z, hi.y, hi.x, lo.w, lo.z, lo.y, lo.x};
          uint32_t sum = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) sum += bin[i];
          uint32_t acc = warp_inclusive_sum(sum) - sum;  // keys in the bins above this lane's
          if (acc < remaining && remaining <= acc + sum) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              if (acc < remaining && remaining <= acc + bin[i]) {
                found[0] = 255u - 8u * lane - i, found[1] = acc, found[2] = bin[i];
              }
              acc += bin[i];
            }
          }
        }
        __syncthreads();
        prefix |= found[0] << digit_shift;
        remaining -= found[1];
        shift = digit_shift;
        // found is rewritten only after the next pass's two barriers.
        if (found[2] == remaining) break;  // the whole bin is taken: nothing to refine
        // bf16: keys that share their high 16 bits are equal (score_key).
        if (sizeof(Bits) == 2 && digit_shift == 16) break;
      }
      const uint32_t threshold = high_bits(prefix, shift);

      // Output positions: run counts of the keys above and equal to the threshold (packed:
      // each total <= kItems * kBlock < 2^16), scanned in column order, then each selected
      // column's rank among the selected.
      const auto above = [&](int j) {
        return column(j) < n && high_bits(key[j], shift) > threshold;
      };
      const auto equal = [&](int j) {
        return column(j) < n && high_bits(key[j], shift) == threshold;
      };
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const uint32_t na = __popc(__ballot_sync(0xffffffffu, above(j)));
        const uint32_t ne = __popc(__ballot_sync(0xffffffffu, equal(j)));
        if (lane == 0) runs[j * kShortWarps + warp] = (ne << 16) | na;  // each <= 32
      }
      scan_runs(std::integral_constant<int, kRuns>{});
      // Calls put(j, position) for each selected item j of this thread.
      auto for_each_selected = [&](auto&& put) {
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          const bool is_above = above(j), is_equal = equal(j);
          const unsigned ba = __ballot_sync(0xffffffffu, is_above);
          const unsigned be = __ballot_sync(0xffffffffu, is_equal);
          const uint32_t before = runs[j * kShortWarps + warp];
          const uint32_t above_before = (before & 0xffffu) + __popc(ba & lanes_below);
          const uint32_t equal_before = (before >> 16) + __popc(be & lanes_below);
          if (is_above || (is_equal && equal_before < remaining)) {
            put(j, static_cast<int64_t>(above_before) +
                       (equal_before < remaining ? equal_before : remaining));
          }
        }
      };

      // n > k: every position is written.
      if constexpr (kSlots) {
        for_each_selected([&](int j, int64_t at) { staged[at] = column(j); });
      } else if constexpr (kPacked) {
        uint64_t* out = sink.out.row(row);
        const int64_t start = pack_row_start(sink, row);
        for_each_selected([&](int j, int64_t at) {
          out[at * sink.out.col_stride] = pack_candidate(sink, row, start, column(j));
        });
      } else {
        int32_t* out = a.out.row(row);
        for_each_selected([&](int j, int64_t at) { out[at * a.out.col_stride] = column(j); });
      }
    }

    if constexpr (kSlots) {
      if (n <= k) fetch_request();
      __syncthreads();  // the staged ids and the request are in
      const ConvertRow convert = request;
      const bool from_stage = n > k;
      const int32_t count = static_cast<int32_t>(taken);
      const bool counted = sink.compact || sink.valid_counts.present();
      int32_t* out = sink.out.row(row);
      const int64_t stride = sink.out.col_stride;
      uint32_t valid_before = 0;  // valid slots in the tiles before
      for (int32_t tile = 0; tile < count; tile += kBlock * kSlotItems) {
        const int32_t mine = tile + static_cast<int32_t>(threadIdx.x);  // item i: + i * kBlock
        int32_t slot[kSlotItems];  // -1 past the row's ids
#pragma unroll
        for (int i = 0; i < kSlotItems; ++i) {
          const int32_t p = mine + i * kBlock;
          slot[i] = p < count ? (from_stage ? staged[p] : p) : -1;
        }
        convert_tokens<kPow2, true>(sink, convert, slot, sink.block_table.col_stride);
        bool all_valid = true;  // every id of this thread in the tile has a slot
#pragma unroll
        for (int i = 0; i < kSlotItems; ++i) {
          all_valid &= mine + i * kBlock >= count || slot[i] >= 0;
        }
        // Counted: a tile whose ids all have slots (the common case: a request whose table
        // covers them) needs no scan: the barrier's vote tells, and its slots go out as they
        // are, after the valid slots of the tiles before. The barrier also orders the
        // previous tile's reads of runs[] before the writes below.
        if (!counted || __syncthreads_and(all_valid)) {
          const int32_t shift_by = sink.compact ? static_cast<int32_t>(valid_before) - tile : 0;
          // Opaque, so that the stores step from one address instead of each rebuilding
          // (mine + shift_by + i * kBlock) * stride in 64 bits.
          int32_t* dst = out + static_cast<int64_t>(mine + shift_by) * stride;
          asm("" : "+l"(dst));
          __builtin_assume(__isGlobal(dst));  // still a global pointer: STG, not a generic ST
          const int64_t step = int64_t{kBlock} * stride;  // between a thread's positions
#pragma unroll
          for (int i = 0; i < kSlotItems; ++i) {
            if (mine + i * kBlock < count) dst[i * step] = slot[i];
          }
          valid_before += min(count - tile, kBlock * kSlotItems);
          continue;
        }
        unsigned valid[kSlotItems];
#pragma unroll
        for (int i = 0; i < kSlotItems; ++i) {
          valid[i] = __ballot_sync(0xffffffffu, slot[i] >= 0);
          if (lane == 0) runs[i * kShortWarps + warp] = __popc(valid[i]);
        }
        scan_runs(std::integral_constant<int, kSlotRuns>{});
#pragma unroll
        for (int i = 0; i < kSlotItems; ++i) {
          const int32_t p = mine + i * kBlock;
          if (sink.compact) {
            const uint32_t at =
                valid_before + runs[i * kShortWarps + warp] + __popc(valid[i] & lanes_below);
            if (slot[i] >= 0) out[static_cast<int64_t>(at) * stride] = slot[i];
          } else if (p < count) {
            out[static_cast<int64_t>(p) * stride] = slot[i];
          }
        }
        valid_before += runs_total;
      }
      const int64_t end = sink.compact ? valid_before : taken;  // past the last written
      for (int64_t j = end + threadIdx.x; j < k; j += kBlock) out[j * stride] = -1;
      if (threadIdx.x == 0 && sink.valid_counts.present()) {
        sink.valid_counts[row] = static_cast<int32_t>(valid_before);
      }
    }
    __syncthreads();  // runs, hist (and the slots' stage and request) are rewritten next row
  }
}

/*!
 * \brief Thread i's keys of a slice of `n` columns at `src`: the columns [first, first +
 *        kItems), first = i * kItems (0 past the slice), in 16-byte loads where the slice
 *        is aligned.
 */
template <typename Bits, int kItems>
__device__ __forceinline__ void load_thread_keys(const Bits* src, int32_t n, int32_t first,
                                                 uint32_t (&key)[kItems]) {
  constexpr int kPerVector = 16 / sizeof(Bits);
  static_assert(kItems % kPerVector == 0, "a thread's keys are whole vectors");
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && first + kItems <= n) {
    const uint4* vectors = reinterpret_cast<const uint4*>(src + first);
    uint4 v[kItems / kPerVector];
#pragma unroll
    for (int u = 0; u < kItems / kPerVector; ++u) v[u] = __ldcs(vectors + u);
#pragma unroll
    for (int u = 0; u < kItems / kPerVector; ++u) {
      const Bits* lanes = reinterpret_cast<const Bits*>(&v[u]);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) key[u * kPerVector + e] = score_key(lanes[e]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      key[j] = first + j < n ? score_key(__ldcs(src + first + j)) : 0u;
    }
  }
}

//! The sinks topk_register_kernel writes: ids and DCP candidate keys (slots keep the cluster
//! kernel, which converts its ids in batches).
template <typename Sink>
constexpr bool register_kernel_sink() {
  return std::is_same<Sink, IdsSink>::value || std::is_same<Sink, PackCandidatesArgs>::value;
}

/*!
 * \brief Resident slices of at most kRegisterSlice columns with their keys in registers,
 *        thread i holding the slice's columns [i * kItems, (i + 1) * kItems): the cluster
 *        kernel's passes (11-bit digits, find_digit over the cluster) over the registers,
 *        then each selected column's output position from the thread's counts and one
 *        block scan. No candidate list, bitmaps or staging: the passes count every key of
 *        the slice, so the selected columns of the CTAs before this one are find_digit's
 *        counts (kBefore). The few-row decode shapes, whose time in the cluster kernel is
 *        mostly its walks and barriers after the load (H100, graph us, k = 2048, one
 *        build: 1 x 32K 9.59 -> 8.08, 8 x 32K 11.52 -> 9.96). Slices are whole 16-byte
 *        vectors long (but the row's last), so an aligned row loads in vectors. One CTA
 *        per SM. Sinks: ids (unsorted) and DCP candidate keys (made from the registers'
 *        keys where the sink reads the columns the selection did).
 */
template <typename Bits, typename Sink>
__global__ void __launch_bounds__(kRegisterThreads, 1)
    topk_register_kernel(const TopkPerRowArgs a, const Sink sink, int cluster) {
  constexpr int kBlock = kRegisterThreads, kItems = kRegisterItems;
  constexpr bool kPacked = std::is_same<Sink, PackCandidatesArgs>::value;
  static_assert(register_kernel_sink<Sink>(), "ids or candidate keys");
  static_assert(!kPacked || sizeof(Bits) == 4, "candidate keys come from fp32 logits");
  static_assert(kBlock == kThreads, "for_each_group_sum takes the kWarps warps of a CTA");
  constexpr int64_t kAlign = 16 / sizeof(Bits);  // columns of a 16-byte vector
  __shared__ SharedState s;
  __shared__ SenderMail mail;
  __shared__ uint32_t warp_counts[kWarps];
  for (int i = threadIdx.x; i < 2 * kBins; i += kBlock) (&s.hist[0][0])[i] = 0;
  if (threadIdx.x == 0) s.gt_before = 0, s.eq_before = 0;
  await_previous_kernel();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x - row * cluster);
  const RowWindow w = row_window(a, row);
  // 32-bit divisions: a row has fewer than 2^31 columns.
  int64_t per = static_cast<uint32_t>(w.count + cluster - 1) / static_cast<uint32_t>(cluster);
  per = (per + kAlign - 1) / kAlign * kAlign;  // <= kRegisterSlice (topk_plan's register_cluster)
  const int64_t lo = rank * per < w.count ? rank * per : w.count;
  const int64_t hi = lo + per < w.count ? lo + per : w.count;
  const int32_t n = static_cast<int32_t>(hi - lo);
  const int64_t k = a.k;
  const int64_t taken = w.count < k ? w.count : k;
  const int32_t first = static_cast<int32_t>(threadIdx.x) * kItems;  // this thread's columns

  // The sink's row: put(position, slice column, key) writes one selected column.
  int32_t* ids = nullptr;
  uint64_t* keys_out = nullptr;
  int64_t stride = 0;
  bool keys_from_registers = false;
  int64_t pack_start = 0;
  if constexpr (kPacked) {
    keys_out = sink.out.row(row), stride = sink.out.col_stride;
    pack_start = pack_row_start(sink, row);
    // The sink reads column id + its row start: the column the key came from unless the
    // window's start was clamped.
    keys_from_registers = pack_start == w.start;
  } else {
    ids = a.out.row(row), stride = a.out.col_stride;
  }
  auto put = [&](int64_t pos, int32_t column, uint32_t key) {
    const int32_t id = static_cast<int32_t>(lo + column);
    if constexpr (kPacked) {
      keys_out[pos * stride] = keys_from_registers
                                   ? encode_ordered_candidate_key(key, candidate_gid(sink, id))
                                   : pack_candidate(sink, row, pack_start, id);
    } else {
      ids[pos * stride] = id;
    }
  };

  if (w.count <= k) {  // the whole window: every CTA's columns at their own positions
    for (int32_t c = threadIdx.x; c < n; c += kBlock) {
      if constexpr (kPacked) {
        keys_out[(lo + c) * stride] =
            pack_candidate(sink, row, pack_start, static_cast<int32_t>(lo + c));
      } else {
        ids[(lo + c) * stride] = static_cast<int32_t>(lo + c);
      }
    }
  } else {
    if (cluster > 1) open_mail(mail, cluster, rank);
    uint32_t key[kItems];
    load_thread_keys<Bits, kItems>(static_cast<const Bits*>(a.logits) + row * a.row_stride +
                                       w.start + lo,
                                   n, first, key);
    __syncthreads();  // the histograms are cleared
    const uint32_t hist0 = shared_address(s.hist[0]), hist1 = shared_address(s.hist[1]);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (first + j < n) shared_increment(first_digit_bin(hist0, key[j]));
    }
    // The selection: keys with high_bits(key, shift) > threshold, and the first `remaining`
    // (column order) of those equal to it.
    uint32_t prefix = 0, remaining = static_cast<uint32_t>(taken);
    int shift = 32;
    for (int pass = 0; pass < 3; ++pass) {
      const int digit_shift = pass_shift(pass), bins = pass_bins(pass);
      if (pass > 0) {
        const int decided = digit_shift + (pass == 1 ? 11 : 10);
        const uint32_t want = high_bits(prefix, decided);
        const uint32_t hist = pass & 1 ? hist1 : hist0;
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
          if (first + j < n && high_bits(key[j], decided) == want) {
            shared_increment(hist + ((key[j] >> digit_shift) & (bins - 1)) * 4u);
          }
        }
      }
      __syncthreads();  // this CTA's histogram of the pass is complete
      cluster_digit<true>(s, &mail, pass, bins, cluster, rank, remaining);
      if (pass == 1) {  // pass 2 reuses pass 0's buffer (its bins were pushed in pass 0)
        for (int i = threadIdx.x; i < kBins; i += kBlock) s.hist[0][i] = 0;
      }
      __syncthreads();
      if (threadIdx.x == 0) s.gt_before += s.above_before, s.eq_before = s.in_bin_before;
      prefix |= s.digit << digit_shift;
      remaining -= s.above;
      shift = digit_shift;
      // s.digit is rewritten only after the next pass's barriers.
      if (s.in_bin == remaining) break;  // the whole bin is taken: nothing to refine
      // A bf16 key's low 16 bits follow from its high ones (see the cluster kernel).
      if (sizeof(Bits) == 2 && pass == 1) break;
    }
    // Output positions: the selected columns before each, those above the threshold and
    // the ties taken (the first `remaining` in column order). This thread's counts (ties
    // << 16 | above: each total < 2^16), scanned over the CTA in thread order: one warp
    // scan, not block_scan2's two and its loop over the warps (H100, graph us, block_scan2
    // 0.0-0.25 slower: 8 x 32K 10.01-10.06 against 10.19-10.26).
    const uint32_t threshold = high_bits(prefix, shift);
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const uint32_t h = high_bits(key[j], shift);
      if (first + j < n && h >= threshold) mine += h > threshold ? 1u : 1u << 16;
    }
    const uint32_t incl = warp_inclusive_sum_u32(mine);
    if (lane == 31) warp_counts[warp] = incl;
    __syncthreads();
    uint32_t warps_before = lane < warp ? warp_counts[lane] : 0u;
    warps_before = warp_sum(warps_before);
    const uint32_t before = warps_before + incl - mine;
    uint32_t gt = s.gt_before + (before & 0xffffu), eq = s.eq_before + (before >> 16);
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const uint32_t h = high_bits(key[j], shift);
      if (first + j < n && h >= threshold) {
        if (h > threshold) {
          put(static_cast<int64_t>(gt) + (eq < remaining ? eq : remaining), first + j, key[j]);
          ++gt;
        } else {
          if (eq < remaining) put(static_cast<int64_t>(gt) + eq, first + j, key[j]);
          ++eq;
        }
      }
    }
  }
  for (int64_t j = taken + rank * kBlock + threadIdx.x; j < k; j += int64_t{cluster} * kBlock) {
    if constexpr (kPacked) {
      keys_out[j * stride] = kInvalidCandidateKey;
    } else {
      ids[j * stride] = -1;
    }
  }
}

//! Runs `setup` (a kernel's attributes) once per device: `done` is the caller's own mask
//! (a launch on another device needs the attributes too).
template <typename Setup>
void once_per_device(std::atomic<uint64_t>& done, int64_t device, Setup&& setup) {
  const uint64_t bit = uint64_t{1} << (device % 64);
  if ((done.load(std::memory_order_relaxed) & bit) == 0) {
    setup();
    done.fetch_or(bit, std::memory_order_relaxed);
  }
}

//! Lets a cluster kernel of this file take clusters past the portable 8 (on the current
//! device; inside a capture too).
template <typename Kernel>
void allow_large_clusters(Kernel* kernel) {
  const ScopedRelaxedCapture setup_may_run_inside_a_capture;
  throw_on_cuda_error(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
      "topk_per_row cluster attribute");
}

//! Lets a cluster kernel of this file take the largest shared memory a launch asks for and
//! clusters past the portable 8 (on the current device; inside a capture too).
template <typename Kernel>
void allow_largest_launch(Kernel* kernel) {
  {
    const ScopedRelaxedCapture setup_may_run_inside_a_capture;
    throw_on_cuda_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kMaxDynamicSmem),
                        "topk_per_row shared memory attribute");
  }
  allow_large_clusters(kernel);
}

//! The grid of `rows` clusters of `cluster` CTAs (std::invalid_argument past CUDA's x limit).
inline unsigned cluster_grid(int64_t rows, int cluster) {
  if (rows * cluster > kMaxGridX) {
    throw std::invalid_argument("topk_per_row: rows * cluster must be < 2^31, got " +
                                std::to_string(rows) + " * " + std::to_string(cluster));
  }
  return static_cast<unsigned>(rows * cluster);
}

template <typename Bits, bool kResident, typename Sink, bool kPow2 = false,
          bool kAppendFromRegisters = false>
void launch(const TopkPerRowArgs& a, const Sink& sink, const TopkPlan& plan, const Place& place) {
  auto* kernel =
      topk_per_row_kernel<Bits, kResident, Sink, 1024 / kThreads, kPow2, kAppendFromRegisters>;
  // A launch whose clusters all fit the chip at one CTA per SM (every resident launch but
  // the largest, and streamed ones of one wave) runs a build with the registers of the whole
  // SM: the walks no longer spill. H200, beside the 64-register build in the same call:
  // 1 x 32K 9.07 -> 8.8 us, 64 x 32K 14.3 -> 13.6-14.0, 1 x 128K 13.3 -> 12.7-12.9,
  // 128 x 64K 23.3 -> 22.6-22.8. Checked with
  // cudaOccupancyMaxActiveClusters (whole_sm_clusters), as a GPC holds whole clusters: run
  // without that check, 16 clusters of 8 took a second wave (H200, 16 x 128K 17.2 -> 21.6
  // us), where the 64-register build runs two CTAs on some SMs (topk_plan now picks fewer
  // CTAs a row there).
  auto* whole_sm = topk_per_row_kernel<Bits, kResident, Sink, 1, kPow2, kAppendFromRegisters>;
  static std::atomic<uint64_t> configured{0};
  once_per_device(configured, place.device, [&] {
    allow_largest_launch(kernel);
    allow_largest_launch(whole_sm);
  });
  // CTAs of blockIdx.x >= first_wave start after the first wave (prefetch_first_batch):
  // kStreamedPerSm CTAs per SM in the 64-register build, in whole clusters (an estimate: it
  // only decides a prefetch).
  const unsigned grid = cluster_grid(a.rows, plan.cluster);
  int64_t first_wave = sm_count(place.device) * kStreamedPerSm / plan.cluster * plan.cluster;
  if (a.rows <= whole_sm_clusters(place.device, plan.cluster)) {
    kernel = whole_sm;
    first_wave = grid;
  }
  size_t smem = static_cast<size_t>(dynamic_smem_bytes(plan.slice, kResident));
  if (a.sorted) {
    const int64_t taken = a.k < a.cols ? a.k : a.cols;
    size_t n = 1;
    while (static_cast<int64_t>(n) < taken) n *= 2;
    if (n * 8 > smem) smem = n * 8;
  }
  launch_clustered_kernel(kernel, grid, kThreads, plan.cluster, smem, place.cuda_stream(),
                          "topk_per_row kernel launch", a, sink, plan.cluster,
                          static_cast<unsigned>(first_wave < grid ? first_wave : grid));
}

template <typename Bits, int kItems, int kBlock, typename Sink, bool kPow2>
void launch_short_rows(const TopkPerRowArgs& a, const Sink& sink, const Place& place) {
  const unsigned grid = static_cast<unsigned>(a.rows < kMaxGridX ? a.rows : kMaxGridX);
  launch_kernel(topk_short_rows_kernel<Bits, kItems, kBlock, Sink, kPow2>, grid, kBlock,
                place.cuda_stream(), "topk_per_row kernel launch", a, sink);
}

template <typename Bits, typename Sink, bool kPow2>
void launch_short_rows(const TopkPerRowArgs& a, const Sink& sink, const Place& place) {
  if (a.cols <= 256 * 4) return launch_short_rows<Bits, 4, 256, Sink, kPow2>(a, sink, place);
  if (a.cols <= 256 * 8) return launch_short_rows<Bits, 8, 256, Sink, kPow2>(a, sink, place);
  if (a.cols <= 256 * kShortMaxItems) {
    return launch_short_rows<Bits, kShortMaxItems, 256, Sink, kPow2>(a, sink, place);
  }
  launch_short_rows<Bits, kShortMaxItems, 512, Sink, kPow2>(a, sink, place);
}

//! Whether a sink takes bf16 logits: DCP candidate keys come from fp32 logits only
//! (topk_to_candidates never sets TopkPerRowArgs::bf16), so their bf16 kernels are not built.
template <typename Sink>
constexpr bool takes_bf16() {
  return !std::is_same<Sink, PackCandidatesArgs>::value;
}

//! The short-row kernel for the score type (the caller checked topk_plan's short_rows).
//! kPow2 (slots): the conversion takes the shifts and masks of convert_pow2 (the caller
//! checked it: topk_to_slots.cu).
template <typename Sink, bool kPow2 = false>
void run_short_rows(const TopkPerRowArgs& a, const Sink& sink, const Place& place) {
  if constexpr (takes_bf16<Sink>()) {
    if (a.bf16) return launch_short_rows<uint16_t, Sink, kPow2>(a, sink, place);
  }
  launch_short_rows<uint32_t, Sink, kPow2>(a, sink, place);
}

//! The kernel of a resident or streamed plan. Streamed fp32 slices that capture
//! (streamed_capture) append their captured keys from the registers (count_and_capture
//! says why only those).
template <typename Bits, typename Sink, bool kPow2>
void launch_plan(const TopkPerRowArgs& a, const Sink& sink, const TopkPlan& plan,
                 const Place& place) {
  if (plan.resident) return launch<Bits, true, Sink, kPow2>(a, sink, plan, place);
  if constexpr (sizeof(Bits) == 4) {
    if (streamed_capture<Bits>(a.k, plan.slice)) {
      return launch<Bits, false, Sink, kPow2, true>(a, sink, plan, place);
    }
  }
  launch<Bits, false, Sink, kPow2>(a, sink, plan, place);
}

//! The register kernel (topk_register_kernel) of the plan, plan.register_cluster CTAs a row.
template <typename Bits, typename Sink>
void launch_registers(const TopkPerRowArgs& a, const Sink& sink, const TopkPlan& plan,
                      const Place& place) {
  auto* kernel = topk_register_kernel<Bits, Sink>;
  const int cluster = plan.register_cluster;
  const unsigned grid = cluster_grid(a.rows, cluster);
  if (cluster > 8) {  // past the portable cluster size
    static std::atomic<uint64_t> configured{0};
    once_per_device(configured, place.device, [&] { allow_large_clusters(kernel); });
  }
  launch_clustered_kernel(kernel, grid, kRegisterThreads, cluster, 0, place.cuda_stream(),
                          "topk_per_row kernel launch", a, sink, cluster);
}

//! Whether the register kernel runs these arguments under `plan` (sorted ids take the
//! cluster kernel's rewrite; slots its conversion in batches). DCP candidates keep the
//! cluster kernel where the register kernel takes more CTAs a row than the plan (H100,
//! graph us, 8 CTAs against 16: 1 x 64K 12.70 against 13.10, 4 x 64K 10.78 / 10.59).
template <typename Sink>
bool register_kernel_serves(const TopkPerRowArgs& a, const TopkPlan& plan) {
  constexpr bool kPacked = std::is_same<Sink, PackCandidatesArgs>::value;
  return plan.register_cluster > 0 && !a.sorted && register_kernel_sink<Sink>() &&
         !(kPacked && plan.register_cluster > plan.cluster);
}

//! Picks the plan and the kernel for the score type and launches it. kPow2: as
//! run_short_rows.
template <typename Sink, bool kPow2 = false>
void run_selection(const TopkPerRowArgs& a, const Sink& sink, const Place& place) {
  if (a.rows == 0) return;
  DeviceGuard guard(place.device);
  const TopkPlan plan = topk_plan(a.rows, a.cols, place.device);
  if (short_row_kernel_serves(a, plan)) return run_short_rows<Sink, kPow2>(a, sink, place);
  if constexpr (register_kernel_sink<Sink>()) {
    if (register_kernel_serves<Sink>(a, plan)) {
      if constexpr (takes_bf16<Sink>()) {
        if (a.bf16) return launch_registers<uint16_t, Sink>(a, sink, plan, place);
      }
      return launch_registers<uint32_t, Sink>(a, sink, plan, place);
    }
  }
  if constexpr (takes_bf16<Sink>()) {
    if (a.bf16) return launch_plan<uint16_t, Sink, kPow2>(a, sink, plan, place);
  }
  launch_plan<uint32_t, Sink, kPow2>(a, sink, plan, place);
}

}  // namespace

//! topk_to_slots_cuda's one-kernel launches where convert_pow2 holds: their kernels
//! (run_selection<ConvertIndexArgs, true>) are in topk_to_slots_pow2.cu, a translation
//! unit of their own.
void topk_to_slots_pow2_cuda(const TopkSlotsArgs& a, const Place& place);

}  // namespace dsa
