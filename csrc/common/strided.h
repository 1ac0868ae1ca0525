// Strided views of raw device or host memory, the only "tensor" the C++ side knows.
//
// The Python layer validates torch tensors and passes (data_ptr, sizes..., strides...) as
// plain integers; there is no libtorch at link time. Strides are in elements and all
// offsets are 64-bit (rows x stride may exceed 2^31).
#pragma once

#include <array>
#include <cstdint>

#include "dcp_math.h"  // DSA_HD

namespace dsa {

//! What Python passes for a 1-D tensor: (data_ptr, size, stride); data_ptr 0 = absent.
using Desc1 = std::array<int64_t, 3>;
//! What Python passes for a 2-D tensor: (data_ptr, rows, cols, row_stride, col_stride).
using Desc2 = std::array<int64_t, 5>;

template <typename T>
struct Strided1D {
  T* data = nullptr;
  int64_t size = 0, stride = 0;

  Strided1D() = default;
  explicit Strided1D(const Desc1& d)
      : data(reinterpret_cast<T*>(static_cast<uintptr_t>(d[0]))), size(d[1]), stride(d[2]) {}

  DSA_HD bool present() const { return data != nullptr; }
  DSA_HD T& operator[](int64_t i) const { return data[i * stride]; }
};

template <typename T>
struct Strided2D {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;

  Strided2D() = default;
  explicit Strided2D(const Desc2& d)
      : data(reinterpret_cast<T*>(static_cast<uintptr_t>(d[0]))), rows(d[1]), cols(d[2]),
        row_stride(d[3]), col_stride(d[4]) {}

  DSA_HD bool present() const { return data != nullptr; }
  DSA_HD T* row(int64_t r) const { return data + r * row_stride; }
  DSA_HD T& operator()(int64_t r, int64_t c) const {
    return data[r * row_stride + c * col_stride];
  }
  //! Rows are dense and every row starts on a 16-byte boundary: vector accesses are safe.
  bool rows_vectorizable() const {
    return col_stride == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
           (row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  }
};

}  // namespace dsa
