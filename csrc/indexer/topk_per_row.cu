// The indexer's per-row top-K: the CUDA kernel and its launcher.
//
// Radix select on the 32-bit order keys (score_key), digits of 11, 11 and 10 bits from the
// top. Each row is one thread block cluster of `cluster` CTAs; CTA r holds the contiguous
// slice [r * per, (r + 1) * per) of the row's window (per = ceil(count / cluster)).
//
// - Resident plan: while loading its slice (16-byte loads, eight per thread in flight) a
//   CTA stores the keys in shared memory and builds the first digit's histogram, so the
//   row is read from global memory once; the later passes run over shared memory. The
//   streamed plan (rows longer than the cluster's shared memory) re-reads the slice from
//   global memory in every pass instead.
// - After each pass the CTAs of the cluster read each other's histograms through
//   distributed shared memory (one cluster barrier per pass: the histograms are double
//   buffered) and every CTA finds the same digit holding the k-th key. A pass whose
//   digit bin is taken whole ends the selection early.
// - The selection is then: keys whose decided high bits are above the threshold, and the
//   first `remaining` (in column order) of those equal to it. Each thread counts both kinds in a
//   contiguous chunk of its CTA's slice (an odd chunk length, so the warp's shared memory
//   reads hit distinct banks); a block scan and the cluster's per-CTA totals (distributed
//   shared memory) give every selected column its output position, the number of
//   selected columns before it. Ids are written in ascending column order, no sort.
// - sorted: once the cluster has written the ids, CTA 0 rebuilds their 64-bit selection
//   ranks, sorts them (bitonic, shared memory) and rewrites the row.
//
// Measured on the H200 (RESULTS.md, k = 2048, fp32 randn): 14.2 us for one 32K row, 205 us
// for 256 rows of 128K, slower than vLLM's compiled kernels. A cluster barrier round is not
// what costs: cluster.sync() and a DSMEM read take 0.30 us a round on a cluster of 8
// (st.async pushes onto an mbarrier: 0.20 us), about 2 us of the 15 us of one 32K row
// (ncu: the SMs issue in 27% of their cycles, waiting on the chain of passes). The keys are
// walked five times (load, two refining passes, count, write) and the first digit's bins
// are contended: compacting the threshold bin after the first pass (the later passes over a
// few candidates, in one CTA) is the next step.
#include <cooperative_groups.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "topk_per_row.h"

namespace dsa {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;                 // 11-bit digits
constexpr int kLoadsInFlight = 8;           // 16-byte loads per thread per batch
//! Largest cluster the plan picks (the portable limit); the override may force up to 16.
constexpr int kMaxPlanCluster = 8;
constexpr int kMaxCluster = 16;
//! Keys per CTA at most: one CTA per SM (208 KB of keys).
constexpr int64_t kSliceOneCta = 53248;
constexpr int kMaxDynamicSmem = static_cast<int>(kSliceOneCta * 4);
//! Fewest columns per CTA the plan spreads a row to (shorter slices only add exchanges).
constexpr int64_t kMinSlice = 1024;
//! topk_to_slots: a CTA's selected ids are staged in its histograms' shared memory (and
//! converted kStagedPerThread per thread) when there are at most this many of them.
constexpr int kStagedPerThread = 8;
constexpr int64_t kStagedSlots = int64_t{kThreads} * kStagedPerThread;

//! Digit passes: shift of the digit and its width.
__device__ __forceinline__ int pass_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ int pass_bins(int pass) { return pass == 2 ? 1024 : 2048; }

//! x >> s for s in [0, 32] (32: every key has the same, empty, high part).
__device__ __forceinline__ uint32_t high_bits(uint32_t x, int s) { return s >= 32 ? 0u : x >> s; }

struct SharedState {
  alignas(16) uint32_t hist[2][kBins];  // read as 16-byte vectors; then topk_to_slots' stage
  uint32_t warp_a[kWarps], warp_b[kWarps];
  uint32_t digit, above, in_bin;
  uint32_t cta[2][2];  // this CTA's totals per exchange, read by the others
  uint32_t sums[4];    // the exchange's result, for every thread
};

static_assert(kStagedSlots * sizeof(int32_t) <= sizeof(SharedState::hist),
              "topk_to_slots stages a CTA's ids in the histograms");

/*!
 * \brief Exclusive block-wide prefix sums of (a, b) in thread order, and their totals.
 *        Every thread calls it; it ends with a barrier, so the scratch can be reused.
 */
__device__ __forceinline__ void block_scan2(SharedState& s, uint32_t a, uint32_t b,
                                            uint32_t& a_before, uint32_t& b_before,
                                            uint32_t& a_total, uint32_t& b_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t ia = a, ib = b;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t ua = __shfl_up_sync(0xffffffffu, ia, d);
    const uint32_t ub = __shfl_up_sync(0xffffffffu, ib, d);
    if (lane >= d) ia += ua, ib += ub;
  }
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
  __syncthreads();
}

//! Waits until every CTA of the cluster has arrived (a plain block barrier without one).
__device__ __forceinline__ void cluster_barrier(int cluster) {
  if (cluster > 1) {
    cg::this_cluster().sync();
  } else {
    __syncthreads();
  }
}

template <typename Bits, bool kResident>
struct RowSlice {
  const Bits* src;  // column 0 of this CTA's slice in global memory
  const uint32_t* keys;
  int64_t n;        // columns in the slice

  __device__ __forceinline__ uint32_t key(int64_t j) const {
    if constexpr (kResident) {
      return keys[j];
    } else {
      return score_key(__ldg(src + j));
    }
  }
};

/*!
 * \brief Loads the slice's keys into shared memory (resident) and counts the first
 *        digit into `hist`; streamed, only counts.
 */
template <typename Bits, bool kResident>
__device__ __forceinline__ void load_and_count(const Bits* src, int64_t n, uint32_t* keys,
                                               uint32_t* hist) {
  auto take = [&](int64_t j, Bits bits) {
    const uint32_t key = score_key(bits);
    if constexpr (kResident) keys[j] = key;
    atomicAdd(&hist[key >> 21], 1u);
  };
  constexpr int kPerVector = 16 / sizeof(Bits);
  const uintptr_t address = reinterpret_cast<uintptr_t>(src);
  int64_t head = static_cast<int64_t>(((16 - address % 16) % 16) / sizeof(Bits));
  if (head > n) head = n;
  const int64_t vectors = (n - head) / kPerVector;
  const int64_t tail = head + vectors * kPerVector;
  if (threadIdx.x < head) take(threadIdx.x, src[threadIdx.x]);
  if (threadIdx.x < n - tail) take(tail + threadIdx.x, src[tail + threadIdx.x]);
  const uint4* body = reinterpret_cast<const uint4*>(src + head);
  for (int64_t first = threadIdx.x; first < vectors; first += kThreads * kLoadsInFlight) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t i = first + u * kThreads;
      if (i < vectors) v[u] = kResident ? __ldcs(body + i) : __ldg(body + i);
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t i = first + u * kThreads;
      if (i < vectors) {
        const Bits* lanes = reinterpret_cast<const Bits*>(&v[u]);
#pragma unroll
        for (int e = 0; e < kPerVector; ++e) take(head + i * kPerVector + e, lanes[e]);
      }
    }
  }
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
 * \brief Exchanges this CTA's totals (x, y) with the cluster through distributed shared
 *        memory, in slot `slot` (each exchange of a kernel has its own, as a slower CTA may
 *        still read the previous one). `last`: no CTA's shared memory is read after this,
 *        so the arrival that lets the CTAs exit is made here (the kernel waits for it
 *        last). Every thread calls it.
 */
__device__ __forceinline__ ClusterSums cluster_exchange(SharedState& s, int slot, int cluster,
                                                        int rank, uint32_t x, uint32_t y,
                                                        bool last) {
  ClusterSums sums;
  sums.x_all = x;
  sums.y_all = y;
  if (cluster == 1) return sums;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) s.cta[slot][0] = x, s.cta[slot][1] = y;
  cl.sync();  // every CTA's totals are published
  if (threadIdx.x < 32) {
    uint32_t v[4] = {0, 0, 0, 0};
    if (static_cast<int>(threadIdx.x) < cluster) {
      const SharedState* other = cl.map_shared_rank(&s, static_cast<int>(threadIdx.x));
      v[2] = other->cta[slot][0];
      v[3] = other->cta[slot][1];
      if (static_cast<int>(threadIdx.x) < rank) v[0] = v[2], v[1] = v[3];
    }
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) {
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] += __shfl_xor_sync(0xffffffffu, v[q], d);
    }
    if (threadIdx.x == 0) {
      for (int q = 0; q < 4; ++q) s.sums[q] = v[q];
    }
  }
  if (last) cl.barrier_arrive();  // done with the other CTAs' shared memory
  __syncthreads();
  sums.x_before = s.sums[0];
  sums.y_before = s.sums[1];
  sums.x_all = s.sums[2];
  sums.y_all = s.sums[3];
  return sums;
}

/*!
 * \brief One kernel for the three ops: the selection, then a write phase that stores each
 *        selected id at its output position through the sink: the id (IdsSink), its slot
 *        (ConvertIndexArgs: convert_row / convert_token), or its candidate key
 *        (PackCandidatesArgs: pack_candidate).
 */
template <typename Bits, bool kResident, typename Sink>
__global__ void __launch_bounds__(kThreads, 2)
    topk_per_row_kernel(const TopkPerRowArgs a, const Sink sink, int cluster) {
  constexpr bool kSlots = std::is_same<Sink, ConvertIndexArgs>::value;
  constexpr bool kCandidates = std::is_same<Sink, PackCandidatesArgs>::value;
  extern __shared__ __align__(16) uint32_t dynamic_smem[];
  __shared__ SharedState s;
  await_previous_kernel();

  const int64_t row = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x - row * cluster);
  const RowWindow w = row_window(a, row);
  const int64_t per = (w.count + cluster - 1) / cluster;
  const int64_t lo = rank * per < w.count ? rank * per : w.count;
  const int64_t hi = lo + per < w.count ? lo + per : w.count;
  const Bits* row_src = static_cast<const Bits*>(a.logits) + row * a.row_stride + w.start;
  const RowSlice<Bits, kResident> slice{row_src + lo, dynamic_smem, hi - lo};
  const int64_t k = a.k;

  // The selection: keys with high_bits(key, shift) > threshold, and the first `remaining`
  // (column order) of those equal to it. A window of at most k columns is taken whole.
  int shift = 32;
  uint32_t threshold = 0, remaining = static_cast<uint32_t>(w.count < k ? w.count : k);

  if (w.count > k) {
    for (int i = threadIdx.x; i < 2 * kBins; i += kThreads) (&s.hist[0][0])[i] = 0;
    __syncthreads();
    load_and_count<Bits, kResident>(slice.src, slice.n, dynamic_smem, s.hist[0]);
    uint32_t prefix = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const int digit_shift = pass_shift(pass), bins = pass_bins(pass);
      uint32_t* hist = s.hist[pass & 1];
      if (pass > 0) {
        const int decided = digit_shift + (pass == 1 ? 11 : 10);
        const uint32_t want = high_bits(prefix, decided);
        for (int64_t j = threadIdx.x; j < slice.n; j += kThreads) {
          const uint32_t key = slice.key(j);
          if (high_bits(key, decided) == want) {
            atomicAdd(&hist[(key >> digit_shift) & (bins - 1)], 1u);
          }
        }
      }
      cluster_barrier(cluster);  // every CTA's histogram of this pass is complete
      // Thread t sums the cluster's bins [top - per_thread, top), top = bins - per_thread t
      // (descending digit order across threads); a scan finds the bin holding the
      // remaining-th key.
      const int per_thread = bins / kThreads;
      const int top = bins - per_thread * threadIdx.x;
      uint32_t counts[4] = {0, 0, 0, 0};
#pragma unroll 4
      for (int r = 0; r < cluster; ++r) {  // independent loads: unrolled to overlap
        const uint32_t* h = cluster > 1 ? cg::this_cluster().map_shared_rank(hist, r) : hist;
        if (per_thread == 4) {
          const uint4 q = *reinterpret_cast<const uint4*>(h + top - 4);
          counts[0] += q.w, counts[1] += q.z, counts[2] += q.y, counts[3] += q.x;
        } else {
          const uint2 q = *reinterpret_cast<const uint2*>(h + top - 2);
          counts[0] += q.y, counts[1] += q.x;
        }
      }
      uint32_t sum = counts[0] + counts[1] + counts[2] + counts[3];
      uint32_t above, unused_b, total, unused_t;
      block_scan2(s, sum, 0, above, unused_b, total, unused_t);
      for (int e = 0; e < per_thread; ++e) {
        if (above < remaining && above + counts[e] >= remaining) {
          s.digit = static_cast<uint32_t>(top - 1 - e);
          s.above = above;
          s.in_bin = counts[e];
        }
        above += counts[e];
      }
      if (pass == 1) {  // pass 2 reuses pass 0's buffer: every CTA has read it by now
        for (int i = threadIdx.x; i < kBins; i += kThreads) s.hist[0][i] = 0;
      }
      __syncthreads();
      prefix |= s.digit << digit_shift;
      remaining -= s.above;
      shift = digit_shift;
      threshold = high_bits(prefix, shift);
      // s.digit is rewritten only after the next pass's scan barriers.
      if (s.in_bin == remaining) break;  // the whole bin is taken: nothing to refine
    }
  }

  // Count the selected columns of each thread's chunk (odd length: no bank conflicts).
  int64_t chunk = (slice.n + kThreads - 1) / kThreads;
  chunk |= 1;
  const int64_t c0 = threadIdx.x * chunk < slice.n ? threadIdx.x * chunk : slice.n;
  const int64_t c1 = c0 + chunk < slice.n ? c0 + chunk : slice.n;
  uint32_t gt = 0, eq = 0;
  for (int64_t j = c0; j < c1; ++j) {
    const uint32_t h = high_bits(slice.key(j), shift);
    gt += h > threshold;
    eq += h == threshold;
  }
  uint32_t gt_before, eq_before, gt_total, eq_total;
  block_scan2(s, gt, eq, gt_before, eq_before, gt_total, eq_total);
  // Slots counted (compaction, valid counts) need a second exchange, after the first.
  bool counted = false;
  if constexpr (kSlots) counted = sink.compact || sink.valid_counts.present();
  const ClusterSums selected =
      cluster_exchange(s, 0, cluster, rank, gt_total, eq_total, !counted && !a.sorted);
  gt_before += selected.x_before;
  eq_before += selected.y_before;
  const int64_t taken = w.count < k ? w.count : k;

  // Calls visit(position, id) for each selected column of the chunk, in column order:
  // position = the number of selected columns before it.
  auto for_each_selected = [&](auto&& visit) {
    uint32_t g = gt_before, e = eq_before;
    for (int64_t j = c0; j < c1; ++j) {
      const uint32_t h = high_bits(slice.key(j), shift);
      if (h > threshold) {
        visit(static_cast<int64_t>(g) + (e < remaining ? e : remaining),
              static_cast<int32_t>(lo + j));
        ++g;
      } else if (h == threshold) {
        if (e < remaining) visit(static_cast<int64_t>(g) + e, static_cast<int32_t>(lo + j));
        ++e;
      }
    }
  };
  const int64_t fill_step = static_cast<int64_t>(cluster) * kThreads;
  const int64_t fill_first = rank * kThreads + threadIdx.x;

  if constexpr (kCandidates) {
    uint64_t* out = sink.out.row(row);
    const int64_t stride = sink.out.col_stride;
    const int64_t start = pack_row_start(sink, row);
    for_each_selected([&](int64_t pos, int32_t id) {
      out[pos * stride] = pack_candidate(sink, row, start, id);
    });
    for (int64_t j = taken + fill_first; j < k; j += fill_step) {
      out[j * stride] = kInvalidCandidateKey;
    }
  } else if constexpr (kSlots) {
    int32_t* out = sink.out.row(row);
    const int64_t stride = sink.out.col_stride;
    const ConvertRow convert = convert_row(sink, row);
    // This CTA's selected ids hold the output positions [first, first + count): positions
    // follow the column order and the CTA's columns are one contiguous slice.
    const uint32_t eq_taken_before = selected.y_before < remaining ? selected.y_before : remaining;
    const uint32_t eq_left = remaining - eq_taken_before;
    const int64_t first = static_cast<int64_t>(selected.x_before) + eq_taken_before;
    const int64_t count = static_cast<int64_t>(gt_total) + (eq_total < eq_left ? eq_total : eq_left);
    int64_t end = taken;  // past the last written position
    if (count <= kStagedSlots) {
      // Staged: the ids go to shared memory (the histograms are free: every CTA of the
      // cluster has read them before the exchange above), then each thread converts a
      // contiguous run of them with all its block-table gathers in flight at once.
      int32_t* stage = reinterpret_cast<int32_t*>(&s.hist[0][0]);
      for_each_selected([&](int64_t pos, int32_t id) { stage[pos - first] = id; });
      __syncthreads();
      const int per = static_cast<int>((count + kThreads - 1) / kThreads);
      const int64_t i0 = static_cast<int64_t>(threadIdx.x) * per;
      const int mine = static_cast<int>(count - i0 < per ? (count > i0 ? count - i0 : 0) : per);
      PagedSlot src[kStagedPerThread];
      int32_t slot[kStagedPerThread];
      uint32_t valid = 0;
#pragma unroll
      for (int i = 0; i < kStagedPerThread; ++i) {
        src[i] = i < mine ? token_slot(sink, convert, stage[i0 + i]) : PagedSlot{};
      }
#pragma unroll
      for (int i = 0; i < kStagedPerThread; ++i) {
        slot[i] = paged_slot_entry(src[i], convert.table_row, sink.block_table.col_stride);
      }
#pragma unroll
      for (int i = 0; i < kStagedPerThread; ++i) {
        slot[i] = paged_slot_value(src[i], slot[i], sink.block_stride);  // -1 past `mine`
        valid += slot[i] >= 0;
      }
      if (!counted) {
#pragma unroll
        for (int i = 0; i < kStagedPerThread; ++i) {
          if (i < mine) out[(first + i0 + i) * stride] = slot[i];
        }
      } else {
        uint32_t valid_before, unused_b, valid_total, unused_t;
        block_scan2(s, valid, 0, valid_before, unused_b, valid_total, unused_t);
        const ClusterSums sums = cluster_exchange(s, 1, cluster, rank, valid_total, 0, true);
        int64_t next = static_cast<int64_t>(sums.x_before) + valid_before;
#pragma unroll
        for (int i = 0; i < kStagedPerThread; ++i) {
          if (i >= mine) continue;
          if (!sink.compact) {
            out[(first + i0 + i) * stride] = slot[i];
          } else if (slot[i] >= 0) {
            out[(next++) * stride] = slot[i];
          }
        }
        if (sink.compact) end = sums.x_all;
        if (rank == 0 && threadIdx.x == 0 && sink.valid_counts.present()) {
          sink.valid_counts[row] = static_cast<int32_t>(sums.x_all);
        }
      }
    } else if (!counted) {
      for_each_selected([&](int64_t pos, int32_t id) {
        out[pos * stride] = convert_token(sink, convert, id);
      });
    } else {
      uint32_t valid = 0;
      for_each_selected([&](int64_t, int32_t id) {
        valid += convert_token(sink, convert, id) >= 0;
      });
      uint32_t valid_before, unused_b, valid_total, unused_t;
      block_scan2(s, valid, 0, valid_before, unused_b, valid_total, unused_t);
      const ClusterSums sums = cluster_exchange(s, 1, cluster, rank, valid_total, 0, true);
      int64_t next = static_cast<int64_t>(sums.x_before) + valid_before;
      for_each_selected([&](int64_t pos, int32_t id) {
        const int32_t slot = convert_token(sink, convert, id);
        if (!sink.compact) {
          out[pos * stride] = slot;
        } else if (slot >= 0) {
          out[(next++) * stride] = slot;
        }
      });
      if (sink.compact) end = sums.x_all;
      if (rank == 0 && threadIdx.x == 0 && sink.valid_counts.present()) {
        sink.valid_counts[row] = static_cast<int32_t>(sums.x_all);
      }
    }
    for (int64_t j = end + fill_first; j < k; j += fill_step) out[j * stride] = -1;
  } else {
    int32_t* out = a.out.row(row);
    const int64_t stride = a.out.col_stride;
    for_each_selected([&](int64_t pos, int32_t id) { out[pos * stride] = id; });
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
        if (i < taken) {
          const int32_t c = out[i * stride];
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
  if (cluster > 1) cg::this_cluster().barrier_wait();
}

std::atomic<int> g_plan_override{-1};

template <typename Bits, bool kResident, typename Sink>
void launch(const TopkPerRowArgs& a, const Sink& sink, const TopkPlan& plan, const Place& place) {
  auto* kernel = topk_per_row_kernel<Bits, kResident, Sink>;
  // Per device: the attributes are set once (a launch on another device needs them too).
  static std::atomic<uint64_t> configured{0};
  const uint64_t bit = uint64_t{1} << (place.device % 64);
  if ((configured.load(std::memory_order_relaxed) & bit) == 0) {
    throw_on_cuda_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kMaxDynamicSmem),
                        "topk_per_row shared memory attribute");
    throw_on_cuda_error(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
        "topk_per_row cluster attribute");
    configured.fetch_or(bit, std::memory_order_relaxed);
  }
  size_t smem = kResident ? static_cast<size_t>(plan.slice) * 4 : 0;
  if (a.sorted) {
    const int64_t taken = a.k < a.cols ? a.k : a.cols;
    size_t n = 1;
    while (static_cast<int64_t>(n) < taken) n *= 2;
    if (n * 8 > smem) smem = n * 8;
  }
  if (a.rows * plan.cluster > kMaxGridX) {
    throw std::invalid_argument("topk_per_row: rows * cluster must be < 2^31, got " +
                                std::to_string(a.rows) + " * " + std::to_string(plan.cluster));
  }
  const unsigned grid = static_cast<unsigned>(a.rows * plan.cluster);
  launch_clustered_kernel(kernel, grid, kThreads, plan.cluster, smem, place.cuda_stream(),
                          "topk_per_row kernel launch", a, sink, plan.cluster);
}

//! Picks the plan and the kernel for the score type and launches it.
template <typename Sink>
void run_selection(const TopkPerRowArgs& a, const Sink& sink, const Place& place) {
  if (a.rows == 0) return;
  DeviceGuard guard(place.device);
  const TopkPlan plan = topk_plan(a.rows, a.cols, sm_count(place.device));
  if (a.bf16) {
    plan.resident ? launch<uint16_t, true>(a, sink, plan, place)
                  : launch<uint16_t, false>(a, sink, plan, place);
  } else {
    plan.resident ? launch<uint32_t, true>(a, sink, plan, place)
                  : launch<uint32_t, false>(a, sink, plan, place);
  }
}

}  // namespace

TopkPlan topk_plan(int64_t rows, int64_t cols, int64_t sms) {
  TopkPlan plan;
  const int forced = g_plan_override.load(std::memory_order_relaxed);
  if (forced > 0) {
    plan.cluster = forced % 100;
    plan.slice = (cols + plan.cluster - 1) / plan.cluster;
    plan.resident = forced < 100 && plan.slice <= kSliceOneCta;
    return plan;
  }
  // Few rows: spread each over up to a cluster of 8 (latency); many rows: the fewest CTAs
  // whose slices fit one CTA's shared memory. H200, k = 2048, fp32 (cluster size: us):
  // 64 x 32K 2: 18.4, 4: 28.0; 256 x 32K 1: 48.3, 2: 49.2; 64 x 128K 3: 63.8, 6: 66.5;
  // 256 x 128K 3: 205, 6: 221; 1 x 128K 8: 22.0, 6: 24.5.
  const int64_t needed = (cols + kSliceOneCta - 1) / kSliceOneCta;
  int64_t spread = sms / (rows > 0 ? rows : 1);
  if (spread > kMaxPlanCluster) spread = kMaxPlanCluster;
  if (spread > (cols + kMinSlice - 1) / kMinSlice) spread = (cols + kMinSlice - 1) / kMinSlice;
  int64_t c = needed > spread ? needed : spread;
  if (c < 1) c = 1;
  if (c > kMaxPlanCluster) {
    c = kMaxPlanCluster;
    plan.resident = (cols + c - 1) / c <= kSliceOneCta;
  }
  plan.cluster = static_cast<int>(c);
  plan.slice = (cols + c - 1) / c;
  return plan;
}

void set_topk_plan_override(int64_t code) {
  const bool resident_code = code >= 1 && code <= kMaxCluster;
  const bool streamed_code = code >= 101 && code <= 100 + kMaxCluster;
  if (code != -1 && !resident_code && !streamed_code) {
    throw std::invalid_argument(
        "set_topk_plan_override: code must be -1, 1..16 or 101..116, got " +
        std::to_string(code));
  }
  g_plan_override.store(static_cast<int>(code), std::memory_order_relaxed);
}

std::array<int64_t, 3> topk_per_row_plan(int64_t rows, int64_t cols, int64_t device) {
  DeviceGuard guard(device);
  const TopkPlan plan = topk_plan(rows, cols, sm_count(device));
  return {plan.cluster, plan.slice, plan.resident ? 1 : 0};
}

void topk_per_row_cuda(const TopkPerRowArgs& a, const Place& place) {
  run_selection(a, IdsSink{}, place);
}

void topk_to_slots_cuda(const TopkSlotsArgs& a, const Place& place) {
  run_selection(a.topk, a.convert, place);
}

void topk_to_candidates_cuda(const TopkCandidatesArgs& a, const Place& place) {
  run_selection(a.topk, a.pack, place);
}

}  // namespace dsa
