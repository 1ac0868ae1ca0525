// Host-side helpers for launchers: where an op runs, CUDA error checks, device guard.
//
// Argument validation lives in the Python layer (it names the argument); the C++ side
// only reports CUDA failures and internal invariant violations, as exceptions that
// pybind11 turns into RuntimeError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

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

//! Grid dimension x is limited to 2^31 - 1 blocks, y (and z) to 65535.
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridY = 65535;

}  // namespace dsa
