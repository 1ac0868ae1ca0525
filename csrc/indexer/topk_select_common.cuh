// The per-row top-K's common pieces (the design is in topk_per_row_kernel.cuh): the
// selection's constants and shared-memory layout, shared-memory atomics, block scans,
// cluster barriers, a CTA's slice of the row and its 16-byte loads.
#pragma once

#include <cstdint>
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

//! What the write phase stores for each selected id (the op's output).
struct IdsSink {};  // the ids (topk_per_row)

}  // namespace
}  // namespace dsa
