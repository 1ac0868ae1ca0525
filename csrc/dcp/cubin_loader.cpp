// The driver-API side of the exported cubins: dlopen of libcuda, one cuLibraryLoadData
// per (family, arch) per process, one kernel attribute setup per device, cuLaunchKernelEx.
#include "cubin_loader.h"

#include "../common/launch.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace dsa {
namespace {

// ---------------------------------------------------------------------------------------
// The driver, reached at run time
// ---------------------------------------------------------------------------------------

struct Driver {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuLibraryLoadData) library_load_data = nullptr;
  decltype(&::cuLibraryGetKernel) library_get_kernel = nullptr;
  decltype(&::cuKernelSetAttribute) kernel_set_attribute = nullptr;
  decltype(&::cuKernelGetFunction) kernel_get_function = nullptr;
  decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&::cuThreadExchangeStreamCaptureMode) exchange_capture_mode = nullptr;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr && missing.empty()) missing = name;
  return fn != nullptr;
}

//! The driver entry points, loaded once; throws (every time) if that failed.
const Driver& driver() {
  static std::once_flag once;
  static Driver d;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      error = std::string("dsa_ext: cannot load the CUDA driver (libcuda.so.1): ") +
              (why ? why : "unknown error");
      return;
    }
    std::string missing;
    bind(lib, "cuInit", d.init, missing);
    bind(lib, "cuGetErrorString", d.get_error_string, missing);
    bind(lib, "cuDeviceGet", d.device_get, missing);
    bind(lib, "cuDeviceGetAttribute", d.device_get_attribute, missing);
    bind(lib, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, missing);
    bind(lib, "cuCtxGetCurrent", d.ctx_get_current, missing);
    bind(lib, "cuCtxSetCurrent", d.ctx_set_current, missing);
    bind(lib, "cuLibraryLoadData", d.library_load_data, missing);
    bind(lib, "cuLibraryGetKernel", d.library_get_kernel, missing);
    bind(lib, "cuKernelSetAttribute", d.kernel_set_attribute, missing);
    bind(lib, "cuKernelGetFunction", d.kernel_get_function, missing);
    bind(lib, "cuLaunchKernelEx", d.launch_kernel_ex, missing);
    bind(lib, "cuThreadExchangeStreamCaptureMode", d.exchange_capture_mode, missing);
    if (!missing.empty()) {
      error = "dsa_ext: the CUDA driver lacks " + missing + " (a driver for CUDA 12.0 or "
              "newer is required)";
      return;
    }
    if (d.init(0) != CUDA_SUCCESS) error = "dsa_ext: cuInit failed";
  });
  if (!error.empty()) throw std::runtime_error(error);
  return d;
}

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  const char* text = nullptr;
  driver().get_error_string(result, &text);
  throw std::runtime_error(std::string("dsa_ext: ") + what + " failed: " +
                           (text ? text : "unknown error") + " (CUresult " +
                           std::to_string(static_cast<int>(result)) + ")");
}

//! The cubin architecture that runs on a device: the exact "a" target of its compute
//! capability (sm_90a for 9.0, sm_100a for 10.0); the embedded table says which exist.
std::string arch_of(int device) {
  const Driver& d = driver();
  CUdevice dev = 0;
  int major = 0, minor = 0;
  check(d.device_get(&dev, device), "cuDeviceGet");
  check(d.device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        "cuDeviceGetAttribute");
  check(d.device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        "cuDeviceGetAttribute");
  return "sm_" + std::to_string(major) + std::to_string(minor) + (major >= 9 ? "a" : "");
}

//! Makes `wanted` the calling thread's current context for a scope, then restores.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext wanted) {
    check(driver().ctx_get_current(&previous_), "cuCtxGetCurrent");
    if (previous_ != wanted) {
      check(driver().ctx_set_current(wanted), "cuCtxSetCurrent");
      changed_ = true;
    }
  }
  ~ScopedContext() {
    if (changed_) driver().ctx_set_current(previous_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool changed_ = false;
};

//! launch.h's ScopedRelaxedCapture through the driver: this path makes no runtime call,
//! whose first use would set up the runtime inside the capture.
class ScopedRelaxedCaptureDriver {
 public:
  ScopedRelaxedCaptureDriver() {
    check(driver().exchange_capture_mode(&mode_), "cuThreadExchangeStreamCaptureMode");
  }
  ~ScopedRelaxedCaptureDriver() { driver().exchange_capture_mode(&mode_); }
  ScopedRelaxedCaptureDriver(const ScopedRelaxedCaptureDriver&) = delete;
  ScopedRelaxedCaptureDriver& operator=(const ScopedRelaxedCaptureDriver&) = delete;

 private:
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;  // then the mode to restore
};

std::string embedded_archs(const char* family) {
  std::string archs;
  for (int i = 0; i < kNumEmbeddedKernels; ++i) {
    const EmbeddedKernel& e = kEmbeddedKernels[i];
    if (std::strcmp(e.family, family) != 0 || archs.find(e.arch) != std::string::npos) {
      continue;
    }
    archs += (archs.empty() ? "" : ", ") + std::string(e.arch);
  }
  return archs.empty() ? "none" : archs;
}

// ---------------------------------------------------------------------------------------
// Per-process caches
// ---------------------------------------------------------------------------------------

struct Cache {
  std::mutex mutex;
  // (family, arch) -> kernel handles (context independent), one library per cubin.
  std::map<std::pair<std::string, std::string>, std::vector<LoadedKernel>> by_arch;
  // (family, device) -> the variants, with the device's context and attributes set up.
  std::map<std::pair<std::string, int>, std::vector<LoadedKernel>> by_device;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: kernels may launch during exit
  return *c;
}

std::vector<LoadedKernel> load_family(const char* family, const std::string& arch) {
  const Driver& d = driver();
  std::vector<LoadedKernel> kernels;
  for (int i = 0; i < kNumEmbeddedKernels; ++i) {
    const EmbeddedKernel& e = kEmbeddedKernels[i];
    if (std::strcmp(e.family, family) != 0 || arch != e.arch) continue;
    CUlibrary lib = nullptr;
    check(d.library_load_data(&lib, e.cubin, nullptr, nullptr, 0, nullptr, nullptr, 0),
          "cuLibraryLoadData");
    CUkernel kernel = nullptr;
    check(d.library_get_kernel(&kernel, lib, e.entry), "cuLibraryGetKernel");
    LoadedKernel k;
    k.kernel = kernel;
    k.info = &e;
    kernels.push_back(k);
  }
  return kernels;
}

}  // namespace

bool embedded_variant_exists(const char* family, const char* variant) {
  for (int i = 0; i < kNumEmbeddedKernels; ++i) {
    const EmbeddedKernel& e = kEmbeddedKernels[i];
    if (std::strcmp(e.family, family) == 0 && std::strcmp(e.variant, variant) == 0) return true;
  }
  return false;
}

const LoadedKernel* kernels_for_device(const char* family, int device, int* count) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto found = c.by_device.find({family, device});
  if (found == c.by_device.end()) {
    const Driver& d = driver();
    const ScopedRelaxedCaptureDriver setup_may_run_inside_a_capture;
    const std::string arch = arch_of(device);
    auto& per_arch = c.by_arch[{family, arch}];
    if (per_arch.empty()) per_arch = load_family(family, arch);
    if (per_arch.empty()) {
      c.by_arch.erase({family, arch});
      throw std::runtime_error(std::string("dsa_ext: this build has no ") + family +
                               " kernel for CUDA device " + std::to_string(device) + " (" +
                               arch + "); it has cubins for: " + embedded_archs(family));
    }
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    check(d.device_get(&dev, device), "cuDeviceGet");
    check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");  // kept for good
    std::vector<LoadedKernel> kernels = per_arch;
    int multiprocessors = 0;
    check(d.device_get_attribute(&multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                 dev),
          "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
    // Load every variant into the device's context now (not lazily at a first launch
    // that might happen during stream capture).
    const ScopedContext in_device_context(ctx);
    for (LoadedKernel& k : kernels) {
      k.context = ctx;
      k.multiprocessors = multiprocessors;
      CUkernel kernel = static_cast<CUkernel>(k.kernel);
      if (k.info->dynamic_smem > 48 * 1024) {
        check(d.kernel_set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     static_cast<int>(k.info->dynamic_smem), kernel, dev),
              "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
      }
      const unsigned* cl = k.info->cluster;
      if (cl[0] * cl[1] * cl[2] > 8) {
        check(d.kernel_set_attribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                                     kernel, dev),
              "cuKernelSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
      }
      CUfunction function = nullptr;
      check(d.kernel_get_function(&function, kernel), "cuKernelGetFunction");
      k.function = function;
    }
    found = c.by_device.emplace(std::make_pair(std::string(family), device), kernels).first;
  }
  *count = static_cast<int>(found->second.size());
  return found->second.data();  // stable: entries are never erased or modified
}

void launch_kernel(const LoadedKernel& k, unsigned grid_x, void* stream, void** params) {
  const Driver& d = driver();
  const EmbeddedKernel& e = *k.info;
  CUlaunchConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.gridDimX = grid_x;
  cfg.gridDimY = 1;
  cfg.gridDimZ = 1;
  cfg.blockDimX = e.block[0];
  cfg.blockDimY = e.block[1];
  cfg.blockDimZ = e.block[2];
  cfg.sharedMemBytes = e.dynamic_smem;
  cfg.hStream = static_cast<CUstream>(stream);
  CUlaunchAttribute attrs[2];
  std::memset(attrs, 0, sizeof(attrs));
  cfg.attrs = attrs;
  if (e.cluster[0] * e.cluster[1] * e.cluster[2] > 1) {
    CUlaunchAttribute& cluster = attrs[cfg.numAttrs++];
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = e.cluster[0];
    cluster.value.clusterDim.y = e.cluster[1];
    cluster.value.clusterDim.z = e.cluster[2];
  }
  if (programmatic_launch_enabled()) {  // the kernels start with griddepcontrol.wait
    CUlaunchAttribute& early = attrs[cfg.numAttrs++];
    early.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    early.value.programmaticStreamSerializationAllowed = 1;
  }
  // The caller's stream belongs to the device's primary context (torch uses those).
  const ScopedContext in_device_context(static_cast<CUcontext>(k.context));
  check(d.launch_kernel_ex(&cfg, static_cast<CUfunction>(k.function), params, nullptr),
        "cuLaunchKernelEx");
}

}  // namespace dsa
