// Cost of one exchange round between the 8 CTAs of a thread block cluster, three ways:
// cluster.sync() + a DSMEM read, the bare relaxed cluster barrier, and st.async pushes onto
// an mbarrier (what csrc/common/cluster_push.h does). Then what a whole 2048-bin histogram
// (8 KB) sent to every other CTA of a cluster of 2 or 8 costs a round, summed by the
// receiver: pushed as 16-byte st.async vectors by every thread, or as one cp.async.bulk a
// destination, the cost behind the per-row top-K keeping two small rounds a pass (H100: 0.78
// us at 2 CTAs, 2.2 us at 8, against 0.2 us for one pushed word). A measurement tool, not
// part of the library:  nvcc -O3 -arch=sm_90a -o /tmp/cc tools/cluster_exchange_cost.cu && /tmp/cc
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdint>
namespace cg = cooperative_groups;
constexpr int N = 200;

__global__ void __cluster_dims__(8, 1, 1) sync_rounds(int* out) {
  __shared__ int v[2];
  cg::cluster_group cl = cg::this_cluster();
  int acc = 0;
  for (int i = 0; i < N; ++i) {
    if (threadIdx.x == 0) v[i & 1] = i + blockIdx.x;
    cl.sync();
    if (threadIdx.x < 8) acc += *cl.map_shared_rank(&v[i & 1], threadIdx.x);
  }
  cl.sync();
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

__global__ void __cluster_dims__(8, 1, 1) relaxed_rounds(int* out) {
  // barrier only (no ordering): the floor of the hardware barrier itself
  int acc = 0;
  for (int i = 0; i < N; ++i) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    acc += i;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// The two round barriers (one arrival each), published to the cluster before any push.
__device__ void open_round_barriers(uint64_t* bar) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      uint32_t a = (uint32_t)__cvta_generic_to_shared(&bar[b]);
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// Waits until round barrier `bar` (a shared-window address) completes the phase `parity`.
__device__ void await_round(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  }
}

// The addresses of this CTA's `slot` and `bar` (shared-window addresses) in cluster CTA `rank`.
struct Remote {
  uint32_t slot, bar;
};
__device__ Remote remote(uint32_t slot, uint32_t bar, unsigned rank) {
  Remote r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r.slot) : "r"(slot), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r.bar) : "r"(bar), "r"(rank));
  return r;
}

__global__ void __cluster_dims__(8, 1, 1) push_rounds(int* out) {
  __shared__ uint32_t slot[2][8];
  __shared__ uint64_t bar[2];
  const unsigned rank = cg::this_cluster().block_rank();
  open_round_barriers(bar);
  int acc = 0;
  for (int i = 0; i < N; ++i) {
    const int b = i & 1;
    const uint32_t parity = (i >> 1) & 1;
    uint32_t lb = (uint32_t)__cvta_generic_to_shared(&bar[b]);
    if (threadIdx.x == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lb), "r"(28) : "memory");
    // a peer may push round i+2 into slot b only after it got our round i+1 push, which we send after reading round i
    __syncthreads();
    if (threadIdx.x < 8 && threadIdx.x != rank) {
      const Remote r = remote((uint32_t)__cvta_generic_to_shared(&slot[b][rank]), lb, threadIdx.x);
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(r.slot), "r"(i + rank), "r"(r.bar) : "memory");
    }
    await_round(lb, parity);
    if (threadIdx.x < 8 && threadIdx.x != rank) acc += slot[b][threadIdx.x];
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// One round: every CTA sends its histogram own[b] (kHistWords words, rewritten each round) to
// slot[b][rank] of every other CTA, waits for the cluster's, and sums them (thread t: words
// 4t..4t+3). Slots and sources alternate by round parity: a peer sends round i + 2 into a
// slot only after it has our round i + 1, which we send after summing round i. kBulk: one
// cp.async.bulk of 8 KB a destination (thread d sends to CTA d); else 16-byte st.async
// vectors from every thread. out[cta] counts the words whose sum was wrong.
constexpr int kHistWords = 2048;
template <bool kBulk>
__global__ void histogram_rounds(int* out) {
  extern __shared__ __align__(16) uint32_t smem[];
  __shared__ uint64_t bar[2];
  const unsigned rank = cg::this_cluster().block_rank();
  const unsigned cluster = cg::this_cluster().num_blocks();
  uint32_t* own = smem;                        // [2][kHistWords]
  uint32_t* slot = smem + 2 * kHistWords;      // [2][cluster][kHistWords]
  open_round_barriers(bar);
  int wrong = 0;
  const uint32_t bytes = (cluster - 1) * kHistWords * 4;
  for (int i = 0; i < N; ++i) {
    const int b = i & 1;
    const uint32_t parity = (i >> 1) & 1;
    uint32_t lb = (uint32_t)__cvta_generic_to_shared(&bar[b]);
    uint32_t* src = own + b * kHistWords;
    for (int w = threadIdx.x; w < kHistWords; w += blockDim.x) src[w] = i * 7 + rank * 131 + w;
    if (threadIdx.x == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lb), "r"(bytes) : "memory");
    if (kBulk) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores before the copy's reads
    __syncthreads();
    uint32_t* mine = slot + (b * cluster + rank) * kHistWords;
    uint32_t ls = (uint32_t)__cvta_generic_to_shared(mine);
    if (kBulk) {
      if (threadIdx.x < cluster && threadIdx.x != rank) {
        const Remote r = remote(ls, lb, threadIdx.x);
        asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(r.slot), "r"((uint32_t)__cvta_generic_to_shared(src)), "r"(kHistWords * 4), "r"(r.bar) : "memory");
      }
    } else {
      for (unsigned d = 0; d < cluster; ++d) {
        if (d == rank) continue;
        const Remote r = remote(ls, lb, d);
        for (int v = threadIdx.x; v < kHistWords / 4; v += blockDim.x) {
          const uint4 q = reinterpret_cast<const uint4*>(src)[v];
          asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
                       ::"r"(r.slot + 16 * v), "r"(q.x), "r"(q.y), "r"(q.z), "r"(q.w), "r"(r.bar) : "memory");
        }
      }
    }
    await_round(lb, parity);
    for (int v = threadIdx.x; v < kHistWords / 4; v += blockDim.x) {
      uint4 sum = reinterpret_cast<const uint4*>(src)[v];
      for (unsigned r = 0; r < cluster; ++r) {
        if (r == rank) continue;
        const uint4 q = reinterpret_cast<const uint4*>(slot + (b * cluster + r) * kHistWords)[v];
        sum.x += q.x, sum.y += q.y, sum.z += q.z, sum.w += q.w;
      }
      const uint32_t w = 4 * v, base = cluster * (i * 7u) + 131u * (cluster * (cluster - 1) / 2);
      wrong += (sum.x != base + cluster * w) + (sum.y != base + cluster * (w + 1)) +
               (sum.z != base + cluster * (w + 2)) + (sum.w != base + cluster * (w + 3));
    }
    __syncthreads();
  }
  if (wrong) atomicAdd(&out[blockIdx.x], wrong);
}

// Microseconds a round: `launch` (N rounds) once to warm up, then ten times between events.
template <typename Launch> float us_per_round(Launch launch) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  launch(); cudaDeviceSynchronize();
  cudaEventRecord(a); for (int r = 0; r < 10; ++r) launch(); cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b); return ms * 1e3f / 10 / N;
}

template <bool kBulk> float time_histogram(int cluster, int* out) {
  const int smem = (2 + 2 * cluster) * kHistWords * 4;
  cudaFuncSetAttribute(histogram_rounds<kBulk>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster), cfg.blockDim = dim3(512), cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  cudaMemset(out, 0, 64 * 4);
  const float us = us_per_round([&] { cudaLaunchKernelEx(&cfg, histogram_rounds<kBulk>, out); });
  int wrong[64]; cudaMemcpy(wrong, out, sizeof(wrong), cudaMemcpyDeviceToHost);
  long total = 0; for (int c = 0; c < cluster; ++c) total += wrong[c];
  if (total) printf("  MISMATCH: %ld wrong sums\n", total);
  return us;
}

template <typename K> float time_it(K k, int* out) {
  return us_per_round([&] { k<<<8, 512>>>(out); });
}
int main() {
  int* out; cudaMalloc(&out, 64 * 4);
  printf("cluster.sync + DSMEM read: %.3f us/round\n", time_it(sync_rounds, out));
  printf("relaxed arrive/wait only:  %.3f us/round\n", time_it(relaxed_rounds, out));
  printf("st.async push + mbarrier:  %.3f us/round\n", time_it(push_rounds, out));
  for (int c : {2, 8}) {
    printf("8 KB histogram, cluster of %d, st.async vectors + sum: %.3f us/round\n", c, time_histogram<false>(c, out));
    printf("8 KB histogram, cluster of %d, cp.async.bulk + sum:     %.3f us/round\n", c, time_histogram<true>(c, out));
  }
  printf("err: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
