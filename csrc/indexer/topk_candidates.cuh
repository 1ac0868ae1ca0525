// The per-row top-K's candidates (the design is in topk_per_row_kernel.cuh): the
// streamed count that captures the keys at or above a floor (capture_floor,
// count_and_capture), the candidate list of the threshold bin, and the walks that mark
// the selected columns in the bitmaps.
#pragma once

#include "topk_cluster_digit.cuh"

namespace dsa {
namespace {

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

}  // namespace
}  // namespace dsa
