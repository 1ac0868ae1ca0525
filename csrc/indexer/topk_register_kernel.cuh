// The per-row top-K's register kernel: resident slices of at most kRegisterSlice
// columns, the cluster kernel's passes over keys held in registers.
#pragma once

#include "topk_cluster_digit.cuh"

namespace dsa {
namespace {

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
      // Breaks on the cluster's sums only, as in the cluster kernel (every CTA or none).
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

}  // namespace
}  // namespace dsa
