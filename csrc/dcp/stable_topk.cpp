// Stable global top-K: the entry point, the CPU implementation and the cubin launch.
#include "stable_topk.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/overlap.h"
#include "cubin_loader.h"

namespace dsa {
namespace {

// Kernel parameters as CuTeDSL passes a dynamic cute.Tensor by value:
// {data; int32 shape[#dynamic modes]; int64 stride[#dynamic modes]} (all modes dynamic
// here). Checked against the cubin's parameter table (cuobjdump -elf: KPARAM_INFO sizes
// 0x30 and 0x20 at offsets 0x0 and 0x30, then sel at 0x50).
struct CandParam {
  const int64_t* data;
  int32_t shape[3];  // (W, rows, K)
  int64_t stride[3];
};
struct OutParam {
  int32_t* data;
  int32_t shape[2];  // (rows, k)
  int64_t stride[2];
};
static_assert(sizeof(CandParam) == 48, "cute.Tensor parameter layout");
static_assert(sizeof(OutParam) == 32, "cute.Tensor parameter layout");

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Tests and tuning: the variant every launch must run ("" lets choose_variant pick).
std::mutex g_override_mutex;
std::string g_variant_override;

std::string variant_override() {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  return g_variant_override;
}

//! Whether variant `e` can run rows of `segments` x `seg_len` candidates in the order
//! asked for: `sorted` needs a bitonic sort of at least `n_sort` keys, or a rank sort of
//! exactly `n_rank` (its select stops once the candidates fit, and a rank sort's cost
//! follows the candidates, not S).
bool variant_fits(const EmbeddedKernel& e, int64_t segments, int64_t seg_len, int64_t n_sort,
                  int64_t n_rank, bool sorted) {
  // sort_size 0: the default order (any k); else a sort of that many keys.
  if (!sorted) {
    if (e.sort_size != 0) return false;
  } else if (e.ranked ? e.sort_size != n_rank : e.sort_size < n_sort) {
    return false;
  }
  // A register variant holds one key of every (segment, block-wide chunk) per thread
  // (the CTAs of a cluster share them out).
  const int64_t chunks = segments * ((seg_len + e.block[0] - 1) / e.block[0]);
  return e.keys_per_thread == 0 || chunks <= e.keys_per_thread * e.cluster[0];
}

//! The variant that runs `rows` rows of `segments` x `seg_len` candidates, selecting
//! `sel` = min(k, N) of each in position order (or `sorted`), on `device`. The rules
//! follow the variant table (cute_dsl_aot/variants.py), in its order.
const LoadedKernel& choose_variant(int64_t segments, int64_t rows, int64_t seg_len,
                                   int64_t sel, bool sorted, int64_t device) {
  const int64_t n_sort = std::max<int64_t>(next_pow2(sel), 2);
  // A rank sort of twice the keys taken (at most the row): the select stops passes
  // earlier (H200, W = 4, k = 2048, 64 rows: 7.6 us against 10.5 for S = 2048).
  const int64_t n_rank =
      std::max(n_sort, std::min(2 * n_sort, next_pow2(segments * seg_len)));
  int count = 0;
  const LoadedKernel* variants =
      kernels_for_device("stable_topk", static_cast<int>(device), &count);
  const std::string forced = variant_override();
  for (int i = 0; i < count; ++i) {  // manifest order: fastest first
    const EmbeddedKernel& e = *variants[i].info;
    if (!forced.empty()) {
      if (forced != e.variant) continue;
      const bool any_size = e.ranked && e.sort_size >= n_sort;  // forced: any S that fits
      if (!variant_fits(e, segments, seg_len, n_sort, any_size ? e.sort_size : n_rank,
                        sorted)) {
        throw std::invalid_argument("dsa_ext: stable_topk_from_candidates: the forced variant " +
                                    forced + " cannot run this shape");
      }
      return variants[i];
    }
    const int64_t sms = variants[i].multiprocessors;
    // A CTA pair per row pays off only while the pairs fit the SMs side by side.
    if (e.cluster[0] > 1 && rows * e.cluster[0] > sms) continue;
    // Two CTAs per SM (one's sort beside the other's select) pay off once the rows
    // outnumber the SMs (H200, k = 2048: +7% at 1 row per SM, -15% at 1.5, -3% to -13%
    // from 3); three, whose registers are capped lower, for a sort only once the rows
    // outnumber the SMs twice over (H200, W = 2, 256 rows: 27.0 us against 24.5 for two).
    const int64_t fill = sorted ? e.ctas_per_sm - 1 : 1;
    if (e.ctas_per_sm > 1 && rows <= sms * fill) continue;
    if (variant_fits(e, segments, seg_len, n_sort, n_rank, sorted)) return variants[i];
  }
  throw std::runtime_error("dsa_ext: stable_topk_from_candidates: no CUDA variant for " +
                           std::string(sorted ? "sorted " : "") + "min(k, N) = " +
                           std::to_string(sel) + " in this build");
}

void stable_topk_cuda(const TopkCandidates& cand, const Strided2D<int32_t>& out, bool sorted,
                      const Place& place) {
  const int64_t sel = std::min<int64_t>(out.cols, cand.per_row());
  const LoadedKernel& chosen =
      choose_variant(cand.segments, cand.rows, cand.seg_len, sel, sorted, place.device);
  CandParam c{cand.data,
              {static_cast<int32_t>(cand.segments), static_cast<int32_t>(cand.rows),
               static_cast<int32_t>(cand.seg_len)},
              {cand.seg_stride, cand.row_stride, cand.col_stride}};
  OutParam o{out.data,
             {static_cast<int32_t>(out.rows), static_cast<int32_t>(out.cols)},
             {out.row_stride, out.col_stride}};
  int32_t sel32 = static_cast<int32_t>(sel);
  void* params[] = {&c, &o, &sel32};
  launch_kernel(chosen, static_cast<unsigned>(cand.rows * chosen.info->cluster[0]),
                reinterpret_cast<void*>(static_cast<uintptr_t>(place.stream)), params);
}

}  // namespace

void stable_topk_cpu(const TopkCandidates& cand, const Strided2D<int32_t>& out, bool sorted) {
  const int64_t n = cand.per_row();
  const int64_t sel = std::min<int64_t>(out.cols, n);
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  std::vector<uint64_t> row_keys(static_cast<size_t>(n));
  for (int64_t r = 0; r < cand.rows; ++r) {
    size_t i = 0;
    for (int64_t w = 0; w < cand.segments; ++w) {
      for (int64_t c = 0; c < cand.seg_len; ++c) keys[i++] = cand.key(w, r, c);
    }
    int64_t j = 0;
    if (sorted) {
      // Descending unsigned keys: equal keys are identical candidates, so the order among
      // them cannot show in the output.
      std::partial_sort(keys.begin(), keys.begin() + sel, keys.end(),
                        std::greater<uint64_t>());
      for (; j < sel && keys[static_cast<size_t>(j)] != 0; ++j) {
        out(r, j) = decode_candidate_gid(keys[static_cast<size_t>(j)]);
      }
    } else {
      // Position order: every key above the sel-th largest one (the threshold), plus the
      // first `ties` copies of the threshold; key 0 (invalid) is never taken.
      row_keys = keys;
      std::nth_element(keys.begin(), keys.begin() + (sel - 1), keys.end(),
                       std::greater<uint64_t>());
      const uint64_t threshold = keys[static_cast<size_t>(sel - 1)];
      int64_t ties = sel;
      for (uint64_t key : row_keys) ties -= key > threshold;
      for (uint64_t key : row_keys) {
        if (key == 0) continue;
        if (key > threshold || (key == threshold && ties-- > 0)) {
          out(r, j++) = decode_candidate_gid(key);
        }
      }
    }
    for (; j < out.cols; ++j) out(r, j) = -1;
  }
}

void set_stable_topk_variant_override(const std::string& name) {
  if (!name.empty() && !embedded_variant_exists("stable_topk", name.c_str())) {
    throw std::invalid_argument("set_stable_topk_variant_override: no variant named '" + name +
                                "' in this build");
  }
  std::lock_guard<std::mutex> lock(g_override_mutex);
  g_variant_override = name;
}

std::string stable_topk_variant(int64_t segments, int64_t rows, int64_t seg_len, int64_t k,
                                bool sorted, int64_t device) {
  const int64_t sel = std::min<int64_t>(k, segments * seg_len);
  return choose_variant(segments, rows, seg_len, sel, sorted, device).info->variant;
}

void stable_topk_from_candidates(const Desc3& candidates, const Desc2& out_desc,
                                 bool sorted, int64_t device, int64_t stream) {
  const TopkCandidates cand(candidates);
  const Strided2D<int32_t> out(out_desc);
  require_apart("out", out, "candidates", Strided3D<const int64_t>(candidates));
  if (cand.rows == 0 || out.cols == 0) return;
  const Place place{device, stream};
  if (place.on_cuda()) {
    stable_topk_cuda(cand, out, sorted, place);
  } else {
    stable_topk_cpu(cand, out, sorted);
  }
}

}  // namespace dsa
