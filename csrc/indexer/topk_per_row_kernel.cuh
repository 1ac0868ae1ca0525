// The indexer's per-row top-K: its design, and the launcher of its three kernels
// (topk_cluster_kernel.cuh, topk_short_rows_kernel.cuh, topk_register_kernel.cuh;
// their shared pieces in topk_select_common.cuh, topk_cluster_digit.cuh and
// topk_candidates.cuh), included by the kernel files of the three ops (topk_per_row.cu,
// topk_to_slots.cu and topk_to_slots_pow2.cu, topk_to_candidates.cu): a translation
// unit per sink, so that a build compiles them in parallel.
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

#include "topk_cluster_kernel.cuh"
#include "topk_short_rows_kernel.cuh"
#include "topk_register_kernel.cuh"

namespace dsa {
namespace {

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

//! Lets a kernel launched in clusters take clusters past the portable 8 (on the current
//! device; inside a capture too).
template <typename Kernel>
void allow_large_clusters(Kernel* kernel) {
  const ScopedRelaxedCapture setup_may_run_inside_a_capture;
  throw_on_cuda_error(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
      "topk_per_row cluster attribute");
}

//! Lets a kernel launched in clusters take the largest shared memory a launch asks for and
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
