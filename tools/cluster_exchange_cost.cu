// Cost of one exchange round between the 8 CTAs of a thread block cluster, three ways:
// cluster.sync() + a DSMEM read, the bare relaxed cluster barrier, and st.async pushes onto
// an mbarrier (what csrc/common/cluster_push.h does). A measurement tool, not part of the
// library:  nvcc -O3 -arch=sm_90a -o /tmp/cc tools/cluster_exchange_cost.cu && /tmp/cc
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

__global__ void __cluster_dims__(8, 1, 1) push_rounds(int* out) {
  __shared__ uint32_t slot[2][8];
  __shared__ uint64_t bar[2];
  const unsigned rank = cg::this_cluster().block_rank();
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      uint32_t a = (uint32_t)__cvta_generic_to_shared(&bar[b]);
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  int acc = 0;
  for (int i = 0; i < N; ++i) {
    const int b = i & 1;
    const uint32_t parity = (i >> 1) & 1;
    uint32_t lb = (uint32_t)__cvta_generic_to_shared(&bar[b]);
    if (threadIdx.x == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(lb), "r"(28) : "memory");
    // a peer may push round i+2 into slot b only after it got our round i+1 push, which we send after reading round i
    __syncthreads();
    if (threadIdx.x < 8 && threadIdx.x != rank) {
      uint32_t ls = (uint32_t)__cvta_generic_to_shared(&slot[b][rank]), rs, rb;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rs) : "r"(ls), "r"(threadIdx.x));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(lb), "r"(threadIdx.x));
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(rs), "r"(i + rank), "r"(rb) : "memory");
    }
    uint32_t done = 0;
    while (!done) {
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(lb), "r"(parity) : "memory");
    }
    if (threadIdx.x < 8 && threadIdx.x != rank) acc += slot[b][threadIdx.x];
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

template <typename K> float time_it(K k, int* out) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  k<<<8, 512>>>(out); cudaDeviceSynchronize();
  cudaEventRecord(a); for (int r = 0; r < 10; ++r) k<<<8, 512>>>(out); cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b); return ms * 1e3f / 10 / N;
}
int main() {
  int* out; cudaMalloc(&out, 64 * 4);
  printf("cluster.sync + DSMEM read: %.3f us/round\n", time_it(sync_rounds, out));
  printf("relaxed arrive/wait only:  %.3f us/round\n", time_it(relaxed_rounds, out));
  printf("st.async push + mbarrier:  %.3f us/round\n", time_it(push_rounds, out));
  printf("err: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
}
