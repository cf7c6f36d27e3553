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

// A decode step's attention shapes and constants, the Rust side's
// `decode_attention::StepParams` (repr(C)): decode_attention's op and decode_block's.
struct StepParams {
  int64_t rows;
  int64_t heads;
  int64_t kv_heads;
  int64_t capacity;
  int64_t head_dim;
  int64_t rope_dims;
  bool traditional;
  float base;
  float position_scale;
  float input_scale;
  float eps;
  float scale;

  bool operator==(const StepParams&) const = default;
};

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

// A cache buffer the op writes in place: its own memory (row-contiguous, checked when the op
// was built by `attention_step`).
inline Dense<float> cache_buffer(const mlx::core::array& a) {
  return {a.data<float>(), static_cast<int64_t>(a.data_size())};
}

// A quantized weight's scales and biases as row-major data in their stored type, with the
// type's code (affine_qmm's `Scale::CODE`: float32 0, float16 1, bfloat16 2); 16-bit ones
// are passed as their bits. Gathered into `copies` when a view is strided.
struct ScalesAndBiases {
  Dense<void> scales;
  Dense<void> biases;
  int32_t scale_type;
};

struct ScaleCopies {
  std::vector<float> s32, b32;
  std::vector<uint16_t> s16, b16;
};

inline ScalesAndBiases scales_and_biases(const mlx::core::array& scales, const mlx::core::array& biases, ScaleCopies& copies) {
  if (scales.dtype() == mlx::core::float32) {
    const auto s = dense(scales, copies.s32);
    const auto b = dense(biases, copies.b32);
    return {{s.ptr, s.len}, {b.ptr, b.len}, 0};
  }
  const auto s = dense(scales, copies.s16);
  const auto b = dense(biases, copies.b16);
  return {{s.ptr, s.len}, {b.ptr, b.len}, scales.dtype() == mlx::core::float16 ? 1 : 2};
}

// A dimension computed from others, checked to fit MLX's int32 shapes (an output shape is
// made of these; past 2^31 - 1 it would wrap).
inline int dim(int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(std::string(what) + ": a dimension of " + std::to_string(v) + " does not fit in int32");
  }
  return static_cast<int>(v);
}

// A decode step's attention inputs checked against `step`'s heads and RoPE, and the shapes
// filled in from the cache's: `keys` and `values` `[rows, kv_heads, capacity, head_dim]`,
// evaluated and dense (the ops write them in place), int32 `positions` `[rows]`, float32
// `periods` `[rope_dims/2]` and norms `[head_dim]` when present. `op` names the op in errors.
inline void attention_step(
    StepParams& step,
    const mlx::core::array& keys,
    const mlx::core::array& values,
    const mlx::core::array& positions,
    const mlx::core::array* periods,
    const mlx::core::array* q_norm,
    const mlx::core::array* k_norm,
    const std::string& op) {
  const bool float32 = keys.dtype() == mlx::core::float32 && values.dtype() == mlx::core::float32 &&
      (!periods || periods->dtype() == mlx::core::float32) && (!q_norm || q_norm->dtype() == mlx::core::float32) &&
      (!k_norm || k_norm->dtype() == mlx::core::float32);
  if (!float32 || positions.dtype() != mlx::core::int32) {
    throw std::invalid_argument(op + ": positions must be int32, the cache, periods and norms float32");
  }
  const int64_t rows = keys.ndim() == 4 ? keys.shape(0) : -1;
  const int64_t kv_heads = rows >= 0 ? keys.shape(1) : 0;
  const int64_t hd = rows >= 0 ? keys.shape(3) : 0;
  // int64: heads × head_dim is q's width, refused past int32.
  dim(step.heads * hd, op.c_str());
  if (rows < 1 || values.shape() != keys.shape() || kv_heads < 1 || step.heads % kv_heads != 0 || positions.ndim() != 1 ||
      positions.shape(0) != rows || step.rope_dims <= 0 || step.rope_dims % 2 != 0 || step.rope_dims > hd ||
      (periods && periods->size() != size_t(step.rope_dims / 2)) || (q_norm && q_norm->size() != size_t(hd)) ||
      (k_norm && k_norm->size() != size_t(hd))) {
    throw std::invalid_argument(op + ": shapes of the cache, positions, periods and norms disagree");
  }
  for (const auto* a : {&keys, &values}) {
    if (a->status() == mlx::core::array::Status::unscheduled || !a->flags().row_contiguous || a->data_size() != a->size()) {
      throw std::invalid_argument(
          op + ": the " + (a == &keys ? "keys" : "values") + " buffer must be evaluated and dense (it is written in place)");
    }
  }
  step.rows = rows;
  step.kv_heads = kv_heads;
  step.capacity = keys.shape(2);
  step.head_dim = hd;
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
