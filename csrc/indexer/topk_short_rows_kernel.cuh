// The per-row top-K's kernel for rows of at most kShortColumns columns: one CTA a row,
// the keys in registers, 8-bit digits.
#pragma once

#include "topk_select_common.cuh"

namespace dsa {
namespace {

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

}  // namespace
}  // namespace dsa
