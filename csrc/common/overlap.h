// The contract's "outputs never share memory with the inputs or with each other" (docs/ops.md,
// conventions), checked at each op's entry: a partial overlap would have a kernel read what
// another thread already overwrote, or two outputs' writes land on one element in an order
// that changes from run to run.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "strided.h"

namespace dsa {

//! The bytes [begin, end) a strided view spans (begin == end: absent or no elements), and
//! whether its elements fill them (no gaps: then two such views share an element exactly
//! where their spans intersect).
struct Footprint {
  uintptr_t begin = 0, end = 0;
  bool dense = false;
};

//! The footprint of `n` dimensions of sizes `size` and strides `stride` (elements of
//! `bytes` bytes) from the address `data`.
inline Footprint footprint_of(const void* data, const int64_t* size, const int64_t* stride,
                              int n, int64_t bytes) {
  Footprint f;
  if (data == nullptr) return f;
  int64_t low = 0, high = 0, elements = 1;
  for (int i = 0; i < n; ++i) {
    if (size[i] <= 0) return f;
    const int64_t reach = (size[i] - 1) * stride[i];
    (reach < 0 ? low : high) += reach;
    elements *= size[i];
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(data);
  f.begin = base + static_cast<uintptr_t>(low * bytes);  // low <= 0: wraps to below base
  f.end = base + static_cast<uintptr_t>((high + 1) * bytes);
  f.dense = high - low + 1 == elements;
  return f;
}

template <typename T>
Footprint footprint(const Strided1D<T>& v) {
  return footprint_of(v.data, &v.size, &v.stride, 1, sizeof(T));
}

template <typename T>
Footprint footprint(const Strided2D<T>& v) {
  const int64_t size[2] = {v.rows, v.cols}, stride[2] = {v.row_stride, v.col_stride};
  return footprint_of(v.data, size, stride, 2, sizeof(T));
}

template <typename T, int N>
Footprint footprint(const StridedND<T, N>& v) {
  return footprint_of(v.data, v.size, v.stride, N, sizeof(T));
}

/*!
 * \brief Throws std::invalid_argument (Python: ValueError) naming both views where the
 *        output `out` shares memory with the input `in`. Checked where both are dense:
 *        views with gaps (a column of a matrix, every other element) may interleave
 *        without sharing an element, which their spans cannot tell, so those pass.
 */
template <typename Out, typename In>
void require_apart(const char* out_name, const Out& out, const char* in_name, const In& in) {
  const Footprint o = footprint(out), i = footprint(in);
  if (o.begin == o.end || i.begin == i.end || !o.dense || !i.dense) return;
  if (o.begin < i.end && i.begin < o.end) {
    throw std::invalid_argument(
        std::string(out_name) + " must not share memory with " + in_name + ", got " +
        out_name + " at bytes [" + std::to_string(o.begin) + ", " + std::to_string(o.end) +
        ") and " + in_name + " at [" + std::to_string(i.begin) + ", " +
        std::to_string(i.end) + ")");
  }
}

//! require_apart of `out` and each (name, view) pair of the inputs that follow.
template <typename Out, typename In, typename... More>
void require_apart(const char* out_name, const Out& out, const char* in_name, const In& in,
                   const More&... more) {
  require_apart(out_name, out, in_name, in);
  if constexpr (sizeof...(More) > 0) require_apart(out_name, out, more...);
}

//! require_apart of every pair of the (name, view) outputs given.
template <typename Out, typename... More>
void require_outputs_apart(const char* out_name, const Out& out, const More&... more) {
  if constexpr (sizeof...(More) > 0) {
    require_apart(out_name, out, more...);
    require_outputs_apart(more...);
  }
}

}  // namespace dsa
