//! What mlxbar's CPU primitives share: the row-major data of an evaluated array with the
//! length of the buffer it sits in (the kernels read rows, so a strided view, a transpose or
//! a broadcast, is gathered into a copy first; the Rust kernels check the length against the
//! shapes they read before they make slices), and the C entry points' convention (Rust side:
//! cpu_backend/primitive_call.rs).
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/c/private/array.h"

namespace mlxbar {

// Row-major data and how many elements of T the pointer may be read for.
template <class T>
struct Dense {
  const T* ptr;
  int64_t len;
};

// Only called inside a primitive's CPU task, once `a` has been computed: its flags, strides
// and data are then final (an array that is not evaluated yet reports itself contiguous).
template <class T>
Dense<T> dense(const mlx::core::array& a, std::vector<T>& copy) {
  const T* src = a.data<T>();
  // data_size: the elements of the buffer this array reaches from its data pointer (MLX's
  // own contiguous kernels read exactly this many).
  if (a.flags().row_contiguous) return {src, static_cast<int64_t>(a.data_size())};
  copy.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = a.ndim();
  // Nothing to copy (and a zero-length last dimension would make the loop below step by 0).
  if (a.size() == 0) return {copy.data(), 0};
  // A run of the last dimension is contiguous when its stride is 1 (a slice of columns,
  // such as q, k and v split from one projection's rows): copied a run at a time.
  const bool runs = nd > 0 && strides[nd - 1] == 1;
  const int64_t run = runs ? shape[nd - 1] : 1;
  const int outer = runs ? nd - 1 : nd;
  std::vector<int64_t> idx(outer, 0);
  for (size_t i = 0; i < a.size(); i += run) {
    int64_t off = 0;
    for (int d = 0; d < outer; d++) off += idx[d] * strides[d];
    std::memcpy(copy.data() + i, src + off, run * sizeof(T));
    for (int d = outer - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return {copy.data(), static_cast<int64_t>(copy.size())};
}

// A dimension computed from others, checked to fit MLX's int32 shapes (an output shape is
// made of these; past 2^31 - 1 it would wrap).
inline int dim(int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(std::string(what) + ": a dimension of " + std::to_string(v) + " does not fit in int32");
  }
  return static_cast<int>(v);
}

// Runs `build` (which returns the op's array) into `*res`: 0 on success; otherwise 1 and
// the exception's message in `err` (NUL-terminated, truncated).
template <class F>
int guarded(mlx_array* res, char* err, size_t err_len, F&& build) {
  try {
    mlx_array_set_(*res, build());
    return 0;
  } catch (const std::exception& e) {
    if (err_len > 0) {
      std::strncpy(err, e.what(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return 1;
  }
}

}  // namespace mlxbar
