// Strided views of raw device or host memory, the only "tensor" the C++ side knows.
//
// The Python layer validates torch tensors and passes (data_ptr, sizes..., strides...) as
// plain integers; there is no libtorch at link time. Strides are in elements and all
// offsets are 64-bit (rows x stride may exceed 2^31).
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "dcp_math.h"  // DSA_HD

namespace dsa {

//! What Python passes for a 1-D tensor: (data_ptr, size, stride); data_ptr 0 = absent.
using Desc1 = std::array<int64_t, 3>;
//! What Python passes for a 2-D tensor: (data_ptr, rows, cols, row_stride, col_stride).
using Desc2 = std::array<int64_t, 5>;
//! What Python passes for a 3-D tensor: (data_ptr, size0, size1, size2, stride0..2).
using Desc3 = std::array<int64_t, 7>;
//! What Python passes for a 4-D tensor: (data_ptr, size0..3, stride0..3).
using Desc4 = std::array<int64_t, 9>;

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
  //! A read-only view of a writable one (Strided2D<const T> from Strided2D<T>).
  template <typename U, typename = std::enable_if_t<std::is_same<const U, T>::value &&
                                                    !std::is_same<U, T>::value>>
  DSA_HD Strided2D(const Strided2D<U>& v)  // implicit, as T* converts to const T*
      : data(v.data), rows(v.rows), cols(v.cols), row_stride(v.row_stride),
        col_stride(v.col_stride) {}

  DSA_HD bool present() const { return data != nullptr; }
  DSA_HD T* row(int64_t r) const { return data + r * row_stride; }
  DSA_HD T& operator()(int64_t r, int64_t c) const {
    return data[r * row_stride + c * col_stride];
  }
  //! cols clamped below 2^32: exact for a caller whose column indices are < 2^31, which
  //! then bounds them with one 32-bit compare.
  DSA_HD uint32_t cols_u32() const {
    return static_cast<uint32_t>(cols < UINT32_MAX ? cols : UINT32_MAX);
  }
  //! Rows are dense and every row starts on a 16-byte boundary: vector accesses are safe.
  bool rows_vectorizable() const {
    return col_stride == 1 && reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
           (row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  }
};

//! N-D strided view (N = 3, 4); the last dimension is the innermost loop in kernels.
template <typename T, int N>
struct StridedND {
  T* data = nullptr;
  int64_t size[N] = {}, stride[N] = {};

  StridedND() = default;
  explicit StridedND(const std::array<int64_t, 1 + 2 * N>& d)
      : data(reinterpret_cast<T*>(static_cast<uintptr_t>(d[0]))) {
    for (int i = 0; i < N; ++i) {
      size[i] = d[1 + i];
      stride[i] = d[1 + N + i];
    }
  }

  DSA_HD bool present() const { return data != nullptr; }
  //! Element offset of the index prefix (i0, i1, ...); missing trailing indices are 0.
  template <typename... I>
  DSA_HD int64_t offset(I... idx) const {
    const int64_t ix[] = {static_cast<int64_t>(idx)...};
    int64_t off = 0;
    for (int i = 0; i < static_cast<int>(sizeof...(I)); ++i) off += ix[i] * stride[i];
    return off;
  }
  template <typename... I>
  DSA_HD T& operator()(I... idx) const {
    static_assert(sizeof...(I) == N, "one index per dimension");
    return data[offset(idx...)];
  }
  //! The innermost dimension is dense and 16-byte aligned at every index prefix.
  bool inner_vectorizable() const {
    if (stride[N - 1] != 1 && size[N - 1] > 1) return false;
    if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
    if ((size[N - 1] * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
    for (int i = 0; i < N - 1; ++i) {
      if (size[i] > 1 && (stride[i] * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
    }
    return true;
  }
};

template <typename T>
using Strided3D = StridedND<T, 3>;
template <typename T>
using Strided4D = StridedND<T, 4>;

}  // namespace dsa
