// The per-row top-K's cluster kernel (the design is in topk_per_row_kernel.cuh): a
// thread block cluster of up to kMaxCluster CTAs a row over resident or streamed
// slices, the selection, then the write phase through the op's sink.
#pragma once

#include "topk_candidates.cuh"

namespace dsa {
namespace {

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
      // Every break below is taken by every CTA of the cluster or none: it depends only on
      // the cluster's sums (remaining, s.in_bin, s.single_key) and the key type, so no CTA
      // leaves the pushes of the next pass (cluster_push.h). A break on a CTA's own state
      // (its list, its capture) would.
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

}  // namespace
}  // namespace dsa
