"""Phase times of the per-row top-K kernel, for reading where a launch's time goes.

    python tools/topk_phase_times.py BINARY      # here: writes the sources, compiles (nvcc)
    BINARY ROWS COLS [PLAN [ties]]               # on the GPU machine

The binary holds a copy of csrc/indexer/topk_per_row_kernel.cuh (the per-row top-K's own
headers inlined) with globaltimer stamps
(thread 0 of the first, the last and the second CTA: the first two of a cluster), the plan
and entry point of topk_per_row.cu and a driver: k = 2048 over generated rows (about
normal, or with `ties` 16 distinct values), PLAN as set_topk_plan_override, the ids
checked against a host selection (a MISMATCH line names the first difference). It prints
the back-to-back launch time and each stamp's microseconds since the CTA started:
1 after the wait for the previous kernel, 2 / 3 around the load, per pass p 4 + 4p / 5 + 4p
around the block barrier after the pass's counts and 6 + 4p once the cluster's digit is
known, 7 after the candidate list, 16 before the marking, 17 after the counts, 18 after the
exchange, 15 once the thread has staged its ids (before the barrier), 29 after that barrier,
30 after the id stores, 31 after the -1 fill (the end); where the marks are cleared and made per
segment (seg 0 / 1: 21 / 25 before the marks from the list, 22 / 26 after them, 23 / 27
after the word counts, 24 / 28 after their scan); in a resident cluster's pass p, 32 + 2p
once the CTAs' group sums have landed and 33 + 2p once their bins have (40 + p once thread
0 has pushed its share of the group sums; inside that step, 43 after pass 0's wait for the
cluster's barrier, push_ready, and for passes 0 and 1, 44 + p once thread 0's first group
sum is known and 46 + p after its first push). The compiler may move work across a stamp:
read them as approximate.
"""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


REGISTER_KERNEL = "template <typename Bits, typename Sink>\n__global__ void __launch_bounds__(kRegisterThreads, 1)"


def inlined(name: str, seen: set) -> str:
    """csrc/indexer/NAME with the per-row top-K's headers it includes inlined, each once."""
    seen.add(name)
    text = []
    for line in open(os.path.join(REPO, "csrc/indexer", name)).read().splitlines(keepends=True):
        header = re.fullmatch(r'#include "(topk_\w+\.cuh)"\n', line)
        if header is None:
            text.append(line)
        elif header.group(1) not in seen:
            text.append(inlined(header.group(1), seen))
    return "".join(text)


def stamped_kernel() -> str:
    global src
    src = inlined("topk_per_row_kernel.cuh", set())
    pre = '''
    __device__ unsigned long long g_stamps[3][48];
    __device__ __forceinline__ void stamp(int i) {
      if (threadIdx.x != 0) return;
      int b = blockIdx.x == 0 ? 0 : blockIdx.x == gridDim.x - 1 ? 1 : blockIdx.x == 1 ? 2 : -1;
      if (b < 0) return;
      unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); g_stamps[b][i] = t;
    }
    '''
    # The stamps go into the cluster kernel (topk_per_row_kernel): the text before the
    # register kernel, which repeats some of its lines.
    head, sep, tail = src.partition(REGISTER_KERNEL)
    assert sep, "the register kernel's declaration moved"
    src = head

    def rep(old, new, count=1):
        global src
        assert src.count(old) == count, (old, src.count(old))
        src = src.replace(old, new)
    # The stamps before the first header's code (each header opens the namespaces).
    opening = "namespace dsa {\nnamespace {\n"
    assert opening in src
    src = src.replace(opening, opening + pre, 1)
    # A resident cluster's two rounds (SenderSums): 32 + 2p once the group sums have
    # landed, 33 + 2p once the bins have.
    rep("  __device__ __forceinline__ void await_groups() const { push_wait(&mail->landed[pass][0]); }\n  __device__ __forceinline__ uint32_t group_sum(int g, uint32_t& before) const {\n    return sum_over_cluster",
        "  __device__ __forceinline__ void await_groups() const { push_wait(&mail->landed[pass][0]); stamp(32 + 2 * pass); }\n  __device__ __forceinline__ uint32_t group_sum(int g, uint32_t& before) const {\n    return sum_over_cluster")
    # 40 + p: once thread 0 has made and pushed its share of the group sums.
    rep("  if constexpr (kResident) {\n    find_digit<true>(s, SenderSums{hist, mail, pass, cluster, rank}, bins, remaining);\n",
        "  stamp(40 + pass);\n  if constexpr (kResident) {\n    find_digit<true>(s, SenderSums{hist, mail, pass, cluster, rank}, bins, remaining);\n")
    # Inside the push step: 43 after push_ready, 44 + p / 46 + p around thread 0's first push.
    rep("  if (pass == 0) push_ready();\n  uint64_t* landed = &mail->landed[pass][0];\n",
        "  if (pass == 0) { push_ready(); stamp(43); }\n  uint64_t* landed = &mail->landed[pass][0];\n")
    rep("    if (lane < cluster) {\n      if constexpr (kResident) {\n        push_u32(&mail->groups[rank][g], sum, landed, lane);\n",
        "    if (g == 0 && pass < 2) stamp(44 + pass);\n    if (lane < cluster) {\n      if constexpr (kResident) {\n        push_u32(&mail->groups[rank][g], sum, landed, lane);\n        if (g == 0 && pass < 2) stamp(46 + pass);\n")
    rep("    push_wait(&mail->landed[pass][1]);\n  }\n  __device__ __forceinline__ uint2 bin_pair(int, int lane, uint2& before) const {\n    BinPair b;",
        "    push_wait(&mail->landed[pass][1]);\n    stamp(33 + 2 * pass);\n  }\n  __device__ __forceinline__ uint2 bin_pair(int, int lane, uint2& before) const {\n    BinPair b;")
    rep("  if (kResident) clear_counters();\n  await_previous_kernel();\n", "  stamp(0);\n  if (kResident) clear_counters();\n  await_previous_kernel();\n  stamp(1);\n")
    rep("    if constexpr (kResident) {\n      if (cluster > 1) open_mail(mail, cluster, rank);\n", "    stamp(2);\n    if constexpr (kResident) {\n      if (cluster > 1) open_mail(mail, cluster, rank);\n")
    rep("cluster == 1);\n    }\n", "cluster == 1);\n    }\n    stamp(3);\n")
    rep("      __syncthreads();\n      cluster_digit<kResident>(", "      stamp(4 + 4 * pass);\n      __syncthreads();\n      stamp(5 + 4 * pass);\n      cluster_digit<kResident>(")
    rep("      prefix |= s.digit << digit_shift;\n", "      stamp(6 + 4 * pass);\n      prefix |= s.digit << digit_shift;\n")
    rep("            listed_count = in_bin;\n", "            listed_count = in_bin;\n            stamp(7);\n")
    rep("            listed_count = s.candidates < kList ? s.candidates : kList;\n", "            listed_count = s.candidates < kList ? s.candidates : kList;\n            stamp(7);\n")
    rep("  const bool marked_from_list = listed && (one_segment || captured);\n", "  stamp(16);\n  const bool marked_from_list = listed && (one_segment || captured);\n")
    rep("  ClusterSums selected;\n", "  stamp(17);\n  ClusterSums selected;\n")
    rep("  const int64_t taken = w.count < k ? w.count : k;\n\n", "  stamp(18);\n  const int64_t taken = w.count < k ? w.count : k;\n\n")
    rep("      mark_from_list(s0, s1);\n    }\n    __syncthreads();\n", "      stamp(21 + 4 * (seg & 1));\n      mark_from_list(s0, s1);\n    }\n    __syncthreads();\n    stamp(22 + 4 * (seg & 1));\n")
    rep("    block_scan2<false>(s, gt, eq, gt_before, eq_before, gt_total, eq_total);\n  };", "    stamp(23 + 4 * (seg & 1));\n    block_scan2<false>(s, gt, eq, gt_before, eq_before, gt_total, eq_total);\n    stamp(24 + 4 * (seg & 1));\n  };")
    rep("    for_each_selected([&](int64_t pos, int32_t id) { stage[pos - first] = id; });\n    __syncthreads();\n  }\n", "    for_each_selected([&](int64_t pos, int32_t id) { stage[pos - first] = id; });\n    stamp(15);\n    __syncthreads();\n  }\n  stamp(29);\n")
    rep("    for_each_output([&](int64_t pos, int32_t id) { out[pos * stride] = id; });\n", "    for_each_output([&](int64_t pos, int32_t id) { out[pos * stride] = id; });\n    stamp(30);\n")
    rep("    for (int64_t j = taken + fill_first; j < k; j += fill_step) out[j * stride] = -1;\n    if (a.sorted) {", "    for (int64_t j = taken + fill_first; j < k; j += fill_step) out[j * stride] = -1;\n    stamp(31);\n    if (a.sorted) {")
    src += sep + tail
    # The plan and the entry point the driver calls, from the kernel file that includes it.
    body = open(os.path.join(REPO, "csrc/indexer/topk_per_row.cu")).read()
    src += body.replace('#include "topk_per_row_kernel.cuh"\n', "")
    return src


DRIVER = r"""#include "stamped.cu"
#include <cstdio>
#include <vector>
#include <cstring>
#include <algorithm>
#include <functional>
using namespace dsa;
int main(int argc, char** argv) {
  const int K = 2048;
  int rows = atoi(argv[1]), cols = atoi(argv[2]), plan = argc > 3 ? atoi(argv[3]) : -1;
  std::vector<float> h((size_t)rows * cols);
  uint64_t x = 88172645463325252ull;
  for (auto& v : h) {  // a sum of 4 uniforms (about normal), or 16 distinct values
    float s = 0; for (int i = 0; i < 4; ++i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; s += (x >> 40) * (1.0f / (1 << 24)); }
    v = (s - 2.0f) * 1.7f;
    if (argc > 4) v = (float)((x >> 20) % 16);
  }
  float* d; int32_t* o;
  cudaMalloc(&d, h.size() * 4); cudaMalloc(&o, (size_t)rows * K * 4);
  cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  TopkPerRowArgs a; a.logits = d; a.rows = rows; a.cols = cols; a.row_stride = cols; a.k = K;
  a.out = Strided2D<int32_t>(Desc2{(int64_t)(uintptr_t)o, rows, K, K, 1});
  if (plan > 0) set_topk_plan_override(plan);
  Place p; p.device = 0; p.stream = 0;
  std::vector<int32_t> ids((size_t)rows * K);
  const TopkPlan pl = topk_plan(rows, cols, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int it = 0; it < 20; ++it) topk_per_row_cuda(a, p);
  cudaEventRecord(e0);
  for (int it = 0; it < 50; ++it) topk_per_row_cuda(a, p);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  unsigned long long st[3][48] = {};
  cudaMemcpyToSymbol(g_stamps, st, sizeof st);
  topk_per_row_cuda(a, p); cudaDeviceSynchronize();
  cudaMemcpyFromSymbol(st, g_stamps, sizeof st);
  cudaMemcpy(ids.data(), o, ids.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<uint64_t> r(cols);  // a host selection (ascending column order expected)
  for (int i = 0, bad = 0; i < rows && bad < 3; ++i) {
    for (int j = 0; j < cols; ++j) { uint32_t b; memcpy(&b, &h[(size_t)i * cols + j], 4); r[j] = selection_rank(score_key(b), j); }
    std::nth_element(r.begin(), r.begin() + K, r.end(), std::greater<>());
    std::vector<int32_t> want(K);
    for (int j = 0; j < K; ++j) want[j] = decode_candidate_gid(r[j]);
    std::sort(want.begin(), want.end());
    for (int j = 0; j < K; ++j) if (want[j] != ids[(size_t)i * K + j]) { printf("MISMATCH ids row %d pos %d want %d got %d\n", i, j, want[j], ids[(size_t)i * K + j]); ++bad; break; }
  }
  printf("rows %d cols %d plan (%d, %lld, %d) ids: %.2f us per launch (stream, back to back); err %s\n", rows, cols, pl.cluster, (long long)pl.slice, pl.resident, ms * 1000 / 50, cudaGetErrorString(cudaGetLastError()));
  for (int b = 0; b < 3; ++b) {
    printf(" block %s:", b == 0 ? "0" : b == 1 ? "last" : "1");
    for (int i = 1; i < 48; ++i) if (st[b][i]) printf(" %d:%+.2f", i, (st[b][i] - st[b][0]) / 1000.0);
    printf("\n");
  }
}
"""


def main() -> None:
    binary = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "stamped.cu"), "w").write(stamped_kernel())
        open(os.path.join(tmp, "main.cu"), "w").write(DRIVER)
        subprocess.run(["nvcc", "-arch=sm_90a", "-O3", "-std=c++17", "--expt-relaxed-constexpr",
                        "-I", os.path.join(REPO, "csrc"), "-I", os.path.join(REPO, "csrc/indexer"),
                        os.path.join(tmp, "main.cu"), "-o", binary], check=True)


if __name__ == "__main__":
    main()
