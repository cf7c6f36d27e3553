//! Row-major data of an evaluated float32 MLX array, for mlxbar's CPU primitives: the
//! kernels read rows, so a strided view (a transpose) is gathered into a copy first.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"

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

}  // namespace mlxbar
