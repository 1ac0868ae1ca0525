// The indexer's per-row top-K: the plan (a row's CTAs, resident or streamed slices) and the
// kernels of topk_per_row, whose sink stores the ids (topk_per_row_kernel.cuh).
#include <atomic>
#include <stdexcept>
#include <string>

#include "topk_per_row_kernel.cuh"

namespace dsa {
namespace {

std::atomic<int> g_plan_override{-1};  // set_topk_plan_override's code (-1: none)

}  // namespace

TopkPlan topk_plan(int64_t rows, int64_t cols, int64_t device) {
  const int64_t sms = sm_count(device);
  TopkPlan plan;
  const int forced = g_plan_override.load(std::memory_order_relaxed);
  if (forced > 0) {
    plan.cluster = forced % 100;
    plan.slice = (cols + plan.cluster - 1) / plan.cluster;
    plan.resident = (forced < 100 || forced > 200) && plan.slice <= kSliceOneCta;
    plan.register_cluster = forced > 200 && plan.slice <= kRegisterSlice ? plan.cluster : 0;
    return plan;
  }
  plan.short_rows = cols <= kShortColumns;
  // Few rows: spread each over up to a cluster of 8 (latency). Slices of at most
  // kPlanSlice columns (a longer slice's threshold bin overflows the candidate list on
  // randn-like rows). Resident only when the launch is one wave of one CTA per SM: past it,
  // streamed CTAs (two per SM, their second walk mostly from L2) overlap one another's
  // loads and walks. H200, k = 2048, fp32 (cluster size, r = resident / s = streamed: us):
  // 256 x 32K 1r: 39.7, 1s: 32.1; 1024 x 32K 1r: 145, 1s: 106; 64 x 32K 2r: 16.2, 2s: 16.8;
  // 256 x 128K 3r: 174, 2s: 108, 3s: 129; 128 x 128K 3r: 99, 2s: 58; 16 x 128K 8r: 21.1;
  // 1 x 128K 1s: 155 (the list overflows), 8r: 15.4.
  const int64_t needed = (cols + kPlanSlice - 1) / kPlanSlice;
  int64_t spread = sms / (rows > 0 ? rows : 1);
  if (spread > kMaxPlanCluster) spread = kMaxPlanCluster;
  if (spread > (cols + kMinSlice - 1) / kMinSlice) spread = (cols + kMinSlice - 1) / kMinSlice;
  int64_t c = needed > spread ? needed : spread;
  if (c < 1) c = 1;
  if (c > kMaxPlanCluster) c = kMaxPlanCluster;
  plan.resident = (cols + c - 1) / c <= kSliceOneCta && rows * c <= sms;
  // A GPC holds whole clusters, so rows * c <= sms does not mean that the rows' clusters
  // run at once at one CTA per SM (the build with the whole SM's registers, launch()):
  // then fewer CTAs a row, the most whose clusters do (their slices still resident). H100
  // (clusters of 8 / 7 / 6 / 5 that fit: 15 / 15 / 17 / 22), graph us, one call, before ->
  // after: 16 x 128K 19.15 -> 17.40 (6 CTAs), 18 x 128K 21.94 -> 18.38 (5), 16 x 32K
  // 13.15 -> 12.49, 18 x 64K 16.22 -> 14.08; 8-15 rows keep 8.
  if (plan.resident) {
    while (c > needed && rows > whole_sm_clusters(device, static_cast<int>(c)) &&
           (cols + c - 2) / (c - 1) <= kSliceOneCta) {
      --c;
    }
  }
  if (!plan.resident) {
    // Streamed, each wave of CTAs pays the selection's serial tail with its loads idle:
    // slices up to kPlanLongSlice columns where the waves they save outweigh their length.
    int64_t longest = (cols + kPlanLongSlice - 1) / kPlanLongSlice;
    if (longest < 1) longest = 1;
    const int64_t per_wave = kStreamedPerSm * sms;
    auto cost = [&](int64_t n) {  // waves x (slice + tail), in columns
      return (rows * n + per_wave - 1) / per_wave * ((cols + n - 1) / n + kWaveTailColumns);
    };
    if (longest < c && cost(longest) < cost(c)) c = longest;
  }
  plan.cluster = static_cast<int>(c);
  plan.slice = (cols + c - 1) / c;
  // The register kernel: the plan's CTAs where their slices fit it; else, for rows whose
  // 8-CTA slices are too long, 16 CTAs a row (past the portable 8) where those clusters all
  // run at once. H100, graph us, k = 2048, against the cluster kernel at 8: 1 / 2 / 4 x 64K
  // 12.46 / 12.31 / 10.42 -> 11.53 / 11.50 / 9.15 (7 clusters of 16 fit an H100).
  if (plan.resident && !plan.short_rows) {
    if (plan.slice <= kRegisterSlice && rows <= whole_sm_clusters(device, plan.cluster)) {
      plan.register_cluster = plan.cluster;
    } else if (plan.cluster == kMaxPlanCluster &&
               (cols + kMaxCluster - 1) / kMaxCluster <= kRegisterSlice &&
               rows <= whole_sm_clusters(device, kMaxCluster)) {
      plan.register_cluster = kMaxCluster;
    }
  }
  return plan;
}

void set_topk_plan_override(int64_t code) {
  const bool resident_code = code >= 1 && code <= kMaxCluster;
  const bool streamed_code = code >= 101 && code <= 100 + kMaxCluster;
  const bool register_code = code >= 201 && code <= 200 + kMaxCluster;
  if (code != -1 && !resident_code && !streamed_code && !register_code) {
    throw std::invalid_argument(
        "set_topk_plan_override: code must be -1, 1..16, 101..116 or 201..216, got " +
        std::to_string(code));
  }
  g_plan_override.store(static_cast<int>(code), std::memory_order_relaxed);
}

std::array<int64_t, 5> topk_per_row_plan(int64_t rows, int64_t cols, int64_t device) {
  DeviceGuard guard(device);
  const TopkPlan plan = topk_plan(rows, cols, device);
  return {plan.cluster, plan.slice, plan.resident ? 1 : 0, plan.short_rows ? 1 : 0,
          plan.register_cluster};
}

int whole_sm_clusters(int64_t device, int cluster) {
  // Any build of one CTA per SM (registers for the whole SM, the largest shared memory)
  // fits as many clusters as another: this one asks for all of them.
  auto* kernel = topk_per_row_kernel<uint32_t, true, IdsSink, 1>;
  static std::atomic<int> fitting[64][kMaxCluster + 1] = {};  // 0: not yet asked
  const bool cached = device >= 0 && device < 64 && cluster >= 1 && cluster <= kMaxCluster;
  int fit = cached ? fitting[device][cluster].load(std::memory_order_relaxed) : 0;
  if (fit != 0) return fit;
  DeviceGuard guard(device);
  allow_largest_launch(kernel);
  const ScopedRelaxedCapture setup_may_run_inside_a_capture;
  fit = max_active_clusters(kernel, kThreads, cluster, kMaxDynamicSmem);
  if (fit <= 0) fit = -1;
  if (cached) fitting[device][cluster].store(fit, std::memory_order_relaxed);
  return fit;
}

void topk_per_row_cuda(const TopkPerRowArgs& a, const Place& place) {
  run_selection(a, IdsSink{}, place);
}

}  // namespace dsa
