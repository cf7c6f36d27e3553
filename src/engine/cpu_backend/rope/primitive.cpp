// RoPE as an MLX primitive (see rope/mod.rs): inputs x `[batch, heads, len, head_dim]`
// (float32, any strides), the rows' position offsets (int32 `[batch]` or `[1]`) and,
// optionally, per-pair periods (float32 `[dims/2]`); output x's shape, row-major. The work
// is a task on the CPU stream's queue, like MLX's own kernels. Built by build.rs on Linux.

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
// `periods` is null when absent. The Rust side checks them against the shape.
extern "C" void mlxbar_rope_run(
    const int64_t* shape,
    int64_t dims,
    bool traditional,
    float base,
    float position_scale,
    float input_scale,
    const float* x,
    int64_t x_len,
    const int32_t* offsets,
    int64_t offsets_len,
    const float* periods,
    int64_t periods_len,
    float* out,
    int64_t out_len);

namespace {

struct RopeParams {
  int dims;
  bool traditional;
  float base;
  float position_scale;
  float input_scale;

  bool operator==(const RopeParams&) const = default;
};

class Rope : public mx::UnaryPrimitive {
 public:
  Rope(mx::Stream stream, RopeParams p) : mx::UnaryPrimitive(stream), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    const auto& x = inputs[0];
    std::vector<int64_t> shape = {x.shape(0), x.shape(1), x.shape(2), x.shape(3)};
    enc.dispatch([inputs, shape, p = p_, op = out.data<float>(), out_len = static_cast<int64_t>(out.size())]() {
      // Row-major data of every input, gathered when it is a strided view (q and k arrive
      // transposed to `[batch, heads, len, head_dim]`).
      std::vector<float> xc, fc;
      std::vector<int32_t> oc;
      const auto x = mlxbar::dense(inputs[0], xc);
      const auto o = mlxbar::dense(inputs[1], oc);
      mlxbar::Dense<float> f = {nullptr, 0};
      if (inputs.size() == 3) f = mlxbar::dense(inputs[2], fc);
      mlxbar_rope_run(
          shape.data(), p.dims, p.traditional, p.base, p.position_scale, p.input_scale, x.ptr, x.len, o.ptr, o.len,
          f.ptr, f.len, op, out_len);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("Rope runs on the CPU only");
  }

  const char* name() const override {
    return "MlxbarRope";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return p_ == static_cast<const Rope&>(other).p_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  RopeParams p_;
};

mx::array rope(const mx::array& x, const mx::array& offsets, const mx::array* periods, RopeParams p, mx::Stream s) {
  if (x.dtype() != mx::float32 || offsets.dtype() != mx::int32 || (periods && periods->dtype() != mx::float32)) {
    throw std::invalid_argument("rope: x and periods must be float32, offsets int32");
  }
  if (x.ndim() != 4 || p.dims <= 0 || p.dims % 2 != 0 || p.dims > x.shape(3)) {
    throw std::invalid_argument("rope: x must be [batch, heads, len, head_dim] with an even dims of at most head_dim");
  }
  if (offsets.ndim() != 1 || (offsets.shape(0) != 1 && offsets.shape(0) != x.shape(0))) {
    throw std::invalid_argument("rope: one offset, or one per batch row");
  }
  if (periods && (periods->ndim() != 1 || periods->shape(0) != p.dims / 2)) {
    throw std::invalid_argument("rope: periods must be a vector of dims/2 values");
  }
  std::vector<mx::array> inputs = {x, offsets};
  if (periods) inputs.push_back(*periods);
  return mx::array(x.shape(), mx::float32, std::make_shared<Rope>(s, p), std::move(inputs));
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded). `periods` may be
// an empty handle (ctx null).
extern "C" int mlxbar_rope(
    mlx_array* res,
    mlx_array x,
    mlx_array offsets,
    mlx_array periods,
    int dims,
    bool traditional,
    float base,
    float position_scale,
    float input_scale,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    return rope(
        mlx_array_get_(x), mlx_array_get_(offsets), periods.ctx ? &mlx_array_get_(periods) : nullptr,
        RopeParams{dims, traditional, base, position_scale, input_scale}, mlx_stream_get_(stream));
  });
}
