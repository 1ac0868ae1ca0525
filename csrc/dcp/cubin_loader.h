// Ahead-of-time exported CuTeDSL cubins: the embedded table and the driver-API launcher.
//
// The cubins and their manifest (entry name, block, dynamic shared memory, cluster) are
// embedded at build time by cute_dsl_aot/embed.py into a generated .cpp that defines
// kEmbeddedKernels. The driver is reached with dlopen("libcuda.so.1") at first use, never
// linked, so importing the module needs no driver.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsa {

//! Version of the kernel parameter layout the launchers pass (cute_dsl_aot/variants.py's
//! ABI_VERSION, written into each manifest). The generated table static_asserts that its
//! manifests carry this version, so cubins exported for another layout fail the build.
constexpr int kCubinAbiVersion = 5;

//! One exported kernel variant for one arch (generated table entry).
struct EmbeddedKernel {
  const char* family;          // e.g. "stable_topk"
  const char* arch;            // "sm_90a", "sm_100a"
  const char* variant;         // e.g. "r8_s2048"
  const unsigned char* cubin;  // cubin bytes
  const char* entry;           // kernel symbol in the cubin
  unsigned block[3];
  unsigned cluster[3];
  unsigned dynamic_smem;  // bytes
  int64_t sort_size;        // stable_topk: keys the sort orders (S; 0: position order)
  int64_t keys_per_thread;  // stable_topk: register slots per thread (0: row streamed)
  unsigned ctas_per_sm;     // stable_topk: CTAs the kernel is compiled to fit on one SM
  bool ranked;              // stable_topk: a rank sort, run only where sort_size is the
                            // launcher's S for it (else a bitonic sort, of any S that fits)
};

extern const EmbeddedKernel kEmbeddedKernels[];
extern const int kNumEmbeddedKernels;

//! A kernel ready to launch on one device (handles cached for the process lifetime).
struct LoadedKernel {
  void* kernel = nullptr;    // CUkernel (context independent)
  void* function = nullptr;  // CUfunction: the kernel loaded into `context`
  void* context = nullptr;   // CUcontext: the device's primary context
  const EmbeddedKernel* info = nullptr;
  int multiprocessors = 0;   // SMs of the device (the launcher picks variants by rows/SM)
};

/*!
 * \brief The variants of `family` for `device`, loaded on first use (thread safe) and
 *        ordered as in the manifest. Throws std::runtime_error when the driver is missing
 *        or the build has no cubin for the device's architecture.
 * \param count set to the number of variants.
 */
const LoadedKernel* kernels_for_device(const char* family, int device, int* count);

//! Whether the build embeds a cubin of `variant` of `family` (for any architecture).
bool embedded_variant_exists(const char* family, const char* variant);

/*!
 * \brief Launches `k` with grid (grid_x, 1, 1) on `stream` (a CUstream/cudaStream_t),
 *        block, dynamic shared memory and cluster from its manifest entry (grid_x counts
 *        CTAs: a multiple of the cluster size).
 */
void launch_kernel(const LoadedKernel& k, unsigned grid_x, void* stream, void** params);

}  // namespace dsa
