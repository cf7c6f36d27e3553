//! The quantized matmul as an MLX primitive (MLX's documented extension route, as its
//! "axpby" example): a node of MLX's lazy graph whose CPU evaluation is a task on the
//! stream's queue, like MLX's own kernels, that calls the Rust kernel
//! (`mlxbar_affine_qmm_run`, affine_qmm/mod.rs). One op per projection, no extra eval;
//! optionally with the RMS norm or SwiGLU before it and the residual add after it fused in
//! (see `Fusion` in mod.rs).
//! Built by build.rs on Linux against the mlx-cpu wheel's headers; exposed to Rust through
//! mlx-c's array handles (`mlxbar_affine_qmm`, used by affine_qmm/op.rs).

#include <cstdint>
#include <vector>

#include "../primitive.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// Each pointer comes with the number of elements it may be read for (see mlxbar::Dense);
// the Rust side checks them against the shapes before it reads.
extern "C" void mlxbar_affine_qmm_run(
    const float* x,
    int64_t x_len,
    int64_t rows,
    int64_t k,
    const uint32_t* packed,
    int64_t packed_len,
    const void* scales,
    int64_t scales_len,
    const void* biases,
    int64_t biases_len,
    int32_t scale_type,
    int64_t n,
    int32_t group_size,
    int32_t bits,
    int32_t strips,
    int32_t prologue,
    const float* norm,
    int64_t norm_len,
    float eps,
    const float* residual,
    int64_t residual_len,
    float* out,
    int64_t out_len);

// As in affine_qmm/mod.rs (the prologue codes).
constexpr int PROLOGUE_NONE = 0;
constexpr int PROLOGUE_RMS_NORM = 1;
constexpr int PROLOGUE_SWIGLU = 2;

namespace {

class AffineQmm : public mx::UnaryPrimitive {
 public:
  AffineQmm(mx::Stream stream, int group_size, int bits, bool strips, int prologue, float eps, bool residual)
      : mx::UnaryPrimitive(stream),
        group_size_(group_size),
        bits_(bits),
        strips_(strips),
        prologue_(prologue),
        eps_(eps),
        residual_(residual) {}

  // inputs: x, w, scales, biases, then the norm's weight (RMS norm) and the residual.
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    const auto& w = inputs[1];
    // int64: w.shape(1) * 32 overflows int from 2^26 packed words a row.
    const int64_t k = static_cast<int64_t>(w.shape(1)) * 32 / bits_;
    const int64_t n = w.shape(0);
    const int64_t rows = n > 0 ? static_cast<int64_t>(out.size()) / n : 0;
    enc.dispatch([inputs, out_ptr = out.data<float>(), out_len = static_cast<int64_t>(out.size()), rows, k, n,
                  gs = group_size_, bits = bits_, strips = strips_, prologue = prologue_, eps = eps_, has_res = residual_]() {
      if (rows == 0) return;
      // Every input is read as row-major data: gathered here when it is not (a strided or
      // broadcast view; weights come contiguous, so only x and the residual ever are).
      std::vector<float> xc, nc, rc;
      std::vector<uint32_t> wc;
      mlxbar::ScaleCopies sbc;
      const auto x = mlxbar::dense(inputs[0], xc);
      const auto w = mlxbar::dense(inputs[1], wc);
      const auto sb = mlxbar::scales_and_biases(inputs[2], inputs[3], sbc);
      const auto &s = sb.scales, &b = sb.biases;
      const auto scale_type = sb.scale_type;
      const mlxbar::Dense<float> none{nullptr, 0};
      const auto nm = prologue == PROLOGUE_RMS_NORM ? mlxbar::dense(inputs[4], nc) : none;
      const auto r = has_res ? mlxbar::dense(inputs.back(), rc) : none;
      mlxbar_affine_qmm_run(
          x.ptr, x.len, rows, k, w.ptr, w.len, s.ptr, s.len, b.ptr, b.len, scale_type, n, gs, bits, strips, prologue, nm.ptr, nm.len, eps,
          r.ptr, r.len, out_ptr, out_len);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("AffineQmm runs on the CPU only (on the GPU use quantized_matmul)");
  }

  const char* name() const override {
    return "AffineQmm";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const AffineQmm&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && strips_ == o.strips_ && prologue_ == o.prologue_ && eps_ == o.eps_ &&
        residual_ == o.residual_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
  // The weights in strips of 16 columns (affine_qmm/strips.rs), not MLX's rows.
  bool strips_;
  int prologue_;
  float eps_;
  bool residual_;
};

mx::array affine_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits,
    bool strips,
    int prologue,
    const mx::array* norm,
    float eps,
    const mx::array* residual,
    mx::Stream s) {
  if ((bits != 4 && bits != 8) || (group_size != 32 && group_size != 64 && group_size != 128)) {
    throw std::invalid_argument("affine_qmm: 4 or 8 bits in groups of 32, 64 or 128 only");
  }
  auto f32 = [](const mx::array* a) { return !a || a->dtype() == mx::float32; };
  if (!f32(&x) || !f32(norm) || !f32(residual) || w.dtype() != mx::uint32) {
    throw std::invalid_argument("affine_qmm: x, norm and residual must be float32 and w uint32");
  }
  const auto st = scales.dtype();
  if ((st != mx::float32 && st != mx::float16 && st != mx::bfloat16) || biases.dtype() != st) {
    throw std::invalid_argument("affine_qmm: scales and biases must share one type: float32, float16 or bfloat16");
  }
  if (x.ndim() < 1 || w.ndim() != 2 || scales.ndim() != 2 || biases.shape() != scales.shape()) {
    throw std::invalid_argument("affine_qmm: w, scales and biases must be matrices of matching shapes");
  }
  const int64_t k = static_cast<int64_t>(w.shape(1)) * 32 / bits;
  const int64_t x_cols = prologue == PROLOGUE_SWIGLU ? 2 * k : k;
  if (static_cast<int64_t>(w.shape(1)) * 32 != k * bits || x.shape(-1) != x_cols || k % group_size != 0 ||
      scales.shape(0) != w.shape(0) || scales.shape(1) != k / group_size) {
    throw std::invalid_argument("affine_qmm: shapes of x, w and scales disagree");
  }
  if (strips && w.shape(0) % 16 != 0) {
    throw std::invalid_argument("affine_qmm: weights in strips of 16 columns need a multiple of 16 columns");
  }
  auto shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs = {x, w, scales, biases};
  if (prologue == PROLOGUE_RMS_NORM) {
    if (!norm || norm->ndim() != 1 || norm->shape(0) != k) {
      throw std::invalid_argument("affine_qmm: the RMS norm's weight must be a vector of k values");
    }
    inputs.push_back(*norm);
  } else if (prologue != PROLOGUE_NONE && prologue != PROLOGUE_SWIGLU) {
    throw std::invalid_argument("affine_qmm: unknown prologue");
  }
  if (residual) {
    if (residual->shape() != shape) {
      throw std::invalid_argument("affine_qmm: the residual must have the output's shape");
    }
    inputs.push_back(*residual);
  }
  return mx::array(
      shape,
      mx::float32,
      std::make_shared<AffineQmm>(s, group_size, bits, strips, prologue, eps, residual != nullptr),
      std::move(inputs));
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded).
// `norm` and `residual` may be empty handles (ctx null).
extern "C" int mlxbar_affine_qmm(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits,
    int strips,
    int prologue,
    mlx_array norm,
    float eps,
    mlx_array residual,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    return affine_qmm(
            mlx_array_get_(x),
            mlx_array_get_(w),
            mlx_array_get_(scales),
            mlx_array_get_(biases),
            group_size,
            bits,
            strips != 0,
            prologue,
            norm.ctx ? &mlx_array_get_(norm) : nullptr,
            eps,
            residual.ctx ? &mlx_array_get_(residual) : nullptr,
            mlx_stream_get_(stream));
  });
}
