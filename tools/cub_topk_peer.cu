// CUB's DeviceBatchedTopK (CCCL 3.5.0, PyPI's nvidia-cuda-cccl 13.3.5) as a peer of
// dsa_ext.topk_per_row for short rows, a measurement tool only (tools/build_cub_peer.sh
// builds it, tools/topk_cub_side_by_side.py loads it with ctypes). Rows of `cols` fp32
// scores (at most PEER_MAX_COLS: that release keeps a segment in one block's shared memory,
// and 16384 fp32 pairs no longer fit), the k largest per row with their columns, unsorted
// and non-deterministic under ties: the only mode that release implements.
#include <cub/device/device_batched_topk.cuh>
#include <cuda/iterator>
#include <cuda_runtime.h>

#ifndef PEER_MAX_COLS
#define PEER_MAX_COLS 8192
#endif

namespace {
struct RowPtr {
  const float* base;
  long long stride;
  __host__ __device__ const float* operator()(int i) const { return base + i * stride; }
};
template <typename T>
struct OutPtr {
  T* base;
  long long stride;
  __host__ __device__ T* operator()(int i) const { return base + i * stride; }
};
}  // namespace

//! temp == nullptr: writes the temporary storage size to *temp_bytes. Returns a cudaError_t.
extern "C" int cub_topk_rows(const float* logits, long long row_stride, int rows, int cols,
                             int k, float* out_vals, int* out_ids, void* temp,
                             size_t* temp_bytes, cudaStream_t stream) {
  // Segment i: row i of the scores; its values are the columns 0, 1, ...
  const cuda::counting_iterator<int> rows_at(0);
  auto keys_in = cuda::make_transform_iterator(rows_at, RowPtr{logits, row_stride});
  auto keys_out = cuda::make_transform_iterator(rows_at, OutPtr<float>{out_vals, k});
  auto ids_out = cuda::make_transform_iterator(rows_at, OutPtr<int>{out_ids, k});
  auto ids_in = cuda::constant_iterator<cuda::counting_iterator<int>>(rows_at);
  auto env = cuda::std::execution::env{
      cuda::execution::require(cuda::execution::determinism::not_guaranteed,
                               cuda::execution::tie_break::unspecified,
                               cuda::execution::output_ordering::unsorted),
      cuda::stream_ref{stream}};
  const cudaError_t e = cub::DeviceBatchedTopK::MaxPairs(
      temp, *temp_bytes, keys_in, keys_out, ids_in, ids_out,
      cuda::args::immediate{cols, cuda::args::bounds<1, PEER_MAX_COLS>()},
      cuda::args::immediate{k, cuda::args::bounds<1, PEER_MAX_COLS>()}, rows, env);
  return static_cast<int>(e);
}
