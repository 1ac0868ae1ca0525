// Host-side helpers for launchers: where an op runs, CUDA error checks, device guard.
//
// Argument validation lives in the Python layer (it names the argument); the C++ side
// only reports CUDA failures and internal invariant violations, as exceptions that
// pybind11 turns into RuntimeError.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsa {

/*!
 * \brief Where an op runs: device < 0 is the CPU, else the CUDA device index; stream is
 *        the caller's cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream).
 */
struct Place {
  int64_t device = -1;
  int64_t stream = 0;

  bool on_cuda() const { return device >= 0; }
  cudaStream_t cuda_stream() const {
    return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
  }
};

//! Runs `cpu(args)` for a CPU place, else `cuda(args, place)`: every entry point's last step.
template <typename Args>
void run_on(const Place& place, const Args& args, void (*cpu)(const Args&),
            void (*cuda)(const Args&, const Place&)) {
  if (place.on_cuda()) {
    cuda(args, place);
  } else {
    cpu(args);
  }
}

inline void throw_on_cuda_error(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("dsa_ext: ") + what + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

/*!
 * \brief Makes `device` current for the scope of a launch, restoring the previous one.
 * \note  cudaGetDevice/cudaSetDevice are cheap host calls; no synchronization happens.
 */
class DeviceGuard {
 public:
  explicit DeviceGuard(int64_t device) {
    throw_on_cuda_error(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      throw_on_cuda_error(cudaSetDevice(static_cast<int>(device)), "cudaSetDevice");
    }
    target_ = static_cast<int>(device);
  }
  ~DeviceGuard() {
    if (previous_ != target_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, target_ = 0;
};

/*!
 * \brief Puts the calling thread in relaxed stream-capture mode for a scope, then restores
 *        its mode. Wraps the one-time setup of an op's kernels on a device (loading
 *        libraries, setting kernel attributes, occupancy queries): global capture mode,
 *        torch.cuda.graph's default, may refuse such calls while any stream is captured,
 *        and an op's first call can come inside a capture. Its launches stay outside.
 */
class ScopedRelaxedCapture {
 public:
  ScopedRelaxedCapture() {
    throw_on_cuda_error(cudaThreadExchangeStreamCaptureMode(&mode_),
                        "cudaThreadExchangeStreamCaptureMode");
  }
  ~ScopedRelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ScopedRelaxedCapture(const ScopedRelaxedCapture&) = delete;
  ScopedRelaxedCapture& operator=(const ScopedRelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // then the mode to restore
};

//! SM count of a device, queried once per device (no synchronization involved).
inline int sm_count(int64_t device) {
  static std::atomic<int> cache[64] = {};
  const bool cached = device >= 0 && device < 64;
  if (cached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  throw_on_cuda_error(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount,
                                             static_cast<int>(device)),
                      "cudaDeviceGetAttribute");
  if (cached) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

/*!
 * \brief Whether launches let the next kernel start early (programmatic dependent launch):
 *        on unless the environment sets DSA_EXT_PDL=0, read once per process.
 *
 * Off, dsa_ext's kernels start in plain stream order; they still let a PDL-aware kernel
 * after them start early (that kernel waits for them before it reads anything).
 *
 * A kernel launched this way may start while the previous kernel in the stream still
 * runs; its first statement, await_previous_kernel(), waits until that kernel has
 * finished and its writes are visible. What overlaps is the launch and the block
 * scheduling (about 1 us), which dominate the small decode-step ops. Graph capture keeps
 * the overlap as a programmatic edge.
 */
inline bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("DSA_EXT_PDL");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

#ifdef __CUDACC__
/*!
 * \brief First statement of every kernel: waits for the previous kernel in the stream
 *        (and for the visibility of its writes), then lets the next one start launching.
 *        Only work on the CTA's own shared memory may come before it (the per-row top-K's
 *        resident CTAs clear their histograms there, overlapping the previous kernel's tail),
 *        and reads of what the previous kernel does not write, where the launcher knows that
 *        (the index conversion after the ids kernel: ConvertIndexArgs::rows_before_wait).
 *
 * The next kernel's blocks can only launch once every block of this grid has passed this
 * point, so they never take the place of a block of this grid that has yet to start.
 */
__device__ __forceinline__ void await_previous_kernel() {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ < 900
#error "dsa_ext kernels need sm_90 or newer: they are launched to start early and wait here"
#endif
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

//! The launch attribute that groups a grid's CTAs in clusters of `cluster_x` along x.
inline cudaLaunchAttribute cluster_dimension(int cluster_x) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster_x);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

/*!
 * \brief Launches `kernel` on `stream` in clusters of `cluster_x` CTAs along x (1: no
 *        cluster) with `dynamic_smem` bytes of dynamic shared memory per CTA, as a
 *        programmatic dependent launch unless DSA_EXT_PDL=0; `what` names the op in the
 *        error.
 */
template <typename... Params, typename... Args>
void launch_clustered_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int cluster_x,
                             size_t dynamic_smem, cudaStream_t stream, const char* what,
                             Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (programmatic_launch_enabled()) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_x > 1) attributes[count++] = cluster_dimension(cluster_x);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = dynamic_smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  throw_on_cuda_error(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

/*!
 * \brief Clusters of `cluster_x` CTAs of `kernel` (`block` threads, `dynamic_smem` bytes of
 *        dynamic shared memory each) that the current device runs at once: a GPC holds
 *        whole clusters, so this can be below the SM count / cluster_x. A host query, no
 *        stream work; callers cache it. The kernel's shared-memory and cluster-size
 *        attributes must be set before.
 */
template <typename... Params>
int max_active_clusters(void (*kernel)(Params...), int block, int cluster_x,
                        size_t dynamic_smem) {
  cudaLaunchAttribute attribute = cluster_dimension(cluster_x);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster_x));
  config.blockDim = dim3(static_cast<unsigned>(block));
  config.dynamicSmemBytes = dynamic_smem;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  throw_on_cuda_error(
      cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(kernel), &config),
      "cudaOccupancyMaxActiveClusters");
  return clusters;
}

//! Launches `kernel` on `stream` without clusters (see launch_clustered_kernel).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                   const char* what, Args&&... args) {
  launch_clustered_kernel(kernel, grid, block, 1, 0, stream, what, std::forward<Args>(args)...);
}
#endif

//! Grid dimension x is limited to 2^31 - 1 blocks, y (and z) to 65535.
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

}  // namespace dsa
