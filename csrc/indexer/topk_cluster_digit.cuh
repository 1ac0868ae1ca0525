// The per-row top-K's digit of each radix pass (the design is in
// topk_per_row_kernel.cuh): a CTA's histogram summed in groups of kGroupBins bins, the
// sums pushed into every CTA of the cluster (SenderMail where the keys are resident,
// SumMail where they are streamed), and the digit that every CTA finds from them
// (cluster_digit).
#pragma once

#include "topk_select_common.cuh"

namespace dsa {
namespace {

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
  //! the cluster's. The pushes also tell the other CTAs that this one has read their group
  //! sums: the __syncwarp orders every lane's reads before any lane's push (`top` depends
  //! on them through shuffles only, which the memory model does not count).
  __device__ __forceinline__ void await_bins(int top) const {
    __syncwarp();
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

}  // namespace
}  // namespace dsa
