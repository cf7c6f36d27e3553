//! What mlxbar's CPU primitives share: row-major data of an evaluated float32 array (the
//! kernels read rows, so a strided view, a transpose, is gathered into a copy first), and
//! the C entry points' convention (Rust side: cpu_backend/primitive_call.rs).
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "mlx/array.h"
#include "mlx/c/private/array.h"

namespace mlxbar {

inline const float* dense_data(const mlx::core::array& a, std::vector<float>& copy) {
  const float* src = a.data<float>();
  if (a.flags().row_contiguous) return src;
  copy.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = a.ndim();
  std::vector<int64_t> idx(nd, 0);
  for (size_t i = 0; i < a.size(); i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * strides[d];
    copy[i] = src[off];
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return copy.data();
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
