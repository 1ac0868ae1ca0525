// Small messages between the CTAs of a thread block cluster, pushed into the receiver's
// shared memory by st.async (or added to what is there by red.async) and counted by a
// transaction barrier (mbarrier) there.
//
// Why not cluster.sync() and distributed shared memory reads: the barrier's release
// compiles to a GPU-wide memory fence (MEMBAR.ALL.GPU), and the reads are a round trip
// each. A push is one one-way write; the receiver waits on its own barrier for the bytes
// it expects (that wait's cluster-scope acquire still invalidates L1 once, CCTL.IVALL).
// Measured on the H200, a cluster of 8: 0.20 us a round against 0.30
// (tools/cluster_exchange_cost.cu). The exchanges need one barrier across the cluster,
// the one that publishes the mbarriers' initialization, arrived at when the kernel starts
// and waited on just before the first push, when every CTA of the cluster has long
// arrived. (The per-row top-K's sorted output has a second, before CTA 0 reads the row.)
//
// Every receiver waits for all the bytes it expects before it exits, so no push lands in
// the shared memory of a CTA that has finished. That holds only where every CTA of a
// cluster takes part in the same rounds: a CTA that left a round early (a break on its own
// state rather than on the sums the cluster shares) would free its shared memory before
// the others' pushes of the next round land there, and they would wait for its pushes.
#pragma once

#include <cstdint>

#ifdef __CUDACC__

namespace dsa {

//! The barrier of the pushes into this CTA: single use (phase 0), one local arrival that
//! expects `bytes` bytes. One thread calls it, then every thread calls push_arrive().
__device__ __forceinline__ void push_barrier_init(uint64_t* barrier, uint32_t bytes) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

//! Every thread of every CTA of the cluster, after push_barrier_init, at the start.
__device__ __forceinline__ void push_arrive() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

//! Every thread, before its first push: every CTA's barrier is initialized.
__device__ __forceinline__ void push_ready() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

//! The addresses of `slot` and `barrier` (this CTA's) in the shared memory of cluster CTA
//! `rank`.
struct RemoteSlot {
  uint32_t slot, barrier;
};
__device__ __forceinline__ RemoteSlot remote_slot(const void* slot, const uint64_t* barrier,
                                                  uint32_t rank) {
  RemoteSlot r;
  const uint32_t local_slot = static_cast<uint32_t>(__cvta_generic_to_shared(slot));
  const uint32_t local_bar = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r.slot) : "r"(local_slot), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r.barrier) : "r"(local_bar), "r"(rank));
  return r;
}

//! Writes `value` to `slot` (this CTA's address of it) in the shared memory of cluster CTA
//! `rank`, counted by that CTA's `barrier`.
__device__ __forceinline__ void push_u32(uint32_t* slot, uint32_t value, uint64_t* barrier,
                                         uint32_t rank) {
  const RemoteSlot r = remote_slot(slot, barrier, rank);
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(r.slot), "r"(value), "r"(r.barrier) : "memory");
}

//! push_u32 for 16 bytes (`slot` 16-byte aligned).
__device__ __forceinline__ void push_u32x4(uint4* slot, uint4 value, uint64_t* barrier,
                                           uint32_t rank) {
  const RemoteSlot r = remote_slot(slot, barrier, rank);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(r.slot), "r"(value.x), "r"(value.y), "r"(value.z), "r"(value.w), "r"(r.barrier)
      : "memory");
}

//! What a red.async push does to the receiver's slot.
enum class PushOp { kAdd, kMin, kMax };

//! Adds `value` to `slot` (kMin / kMax: keeps the least / greatest of the two) in the shared
//! memory of cluster CTA `rank`, counted by that CTA's `barrier` as 4 bytes. The values
//! several CTAs push into one slot combine there.
template <PushOp kOp>
__device__ __forceinline__ void push_reduce_u32(uint32_t* slot, uint32_t value,
                                                uint64_t* barrier, uint32_t rank) {
  const RemoteSlot r = remote_slot(slot, barrier, rank);
  if constexpr (kOp == PushOp::kAdd) {
    asm volatile("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.u32"
                 " [%0], %1, [%2];" ::"r"(r.slot), "r"(value), "r"(r.barrier) : "memory");
  } else if constexpr (kOp == PushOp::kMin) {
    asm volatile("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.min.u32"
                 " [%0], %1, [%2];" ::"r"(r.slot), "r"(value), "r"(r.barrier) : "memory");
  } else {
    asm volatile("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.max.u32"
                 " [%0], %1, [%2];" ::"r"(r.slot), "r"(value), "r"(r.barrier) : "memory");
  }
}

//! push_reduce_u32<PushOp::kAdd> of a 64-bit value (8 bytes).
__device__ __forceinline__ void push_add_u64(uint64_t* slot, uint64_t value, uint64_t* barrier,
                                             uint32_t rank) {
  const RemoteSlot r = remote_slot(slot, barrier, rank);
  asm volatile("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.u64"
               " [%0], %1, [%2];" ::"r"(r.slot), "l"(value), "r"(r.barrier) : "memory");
}

//! Waits until every byte this CTA's barrier expects has landed (and is visible).
__device__ __forceinline__ void push_wait(uint64_t* barrier) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done) : "r"(bar) : "memory");
  }
}

}  // namespace dsa

#endif
