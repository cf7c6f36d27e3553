//! A decode step's attention as an MLX primitive (see decode_attention/mod.rs): inputs the
//! new token's q|k|v projection `[1, rows, (heads + 2·kv_heads)·head_dim]` (q, then k, then
//! v in each row; any strides), the layer's key and value buffers `[rows, kv_heads, capacity, head_dim]`
//! (evaluated and dense: they are written in place), each row's position (int32 `[rows]`)
//! and, optionally, RoPE's periods `[dims/2]` and the q and k norms' weights
//! `[head_dim]`; output `[1, rows, heads·head_dim]`, the layout the output projection
//! takes. The work is a task on the CPU stream's queue, like MLX's own kernels. Built by
//! build.rs on Linux.

#include <cstdint>
#include <vector>

#include "../primitive.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// Each buffer comes with the number of elements it may be read for (see mlxbar::Dense); an
// absent one is null. The Rust side checks them against the shapes before it reads.
extern "C" void mlxbar_decode_attention_run(
    const StepParams* p,
    mlxbar::Dense<float> qkv,
    mlxbar::Dense<int32_t> positions,
    mlxbar::Dense<float> periods,
    mlxbar::Dense<float> q_norm,
    mlxbar::Dense<float> k_norm,
    mlxbar::Dense<float> keys,
    mlxbar::Dense<float> values,
    mlxbar::Dense<float> out);

namespace {

// What the op is built with besides its inputs: the step's parameters (its shapes filled in
// from the cache buffers') and which optional inputs follow.
struct Config {
  StepParams step;
  bool has_periods;
  bool has_q_norm;
  bool has_k_norm;

  bool operator==(const Config&) const = default;
};

// Inputs in order: qkv, keys, values, positions, then periods, q_norm, k_norm as present.
class DecodeAttention : public mx::UnaryPrimitive {
 public:
  DecodeAttention(mx::Stream stream, Config c) : mx::UnaryPrimitive(stream), c_(c) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    enc.dispatch([inputs, c = c_, op = out.data<float>(), out_len = static_cast<int64_t>(out.size())]() {
      // Row-major data of the inputs read, gathered when a view is strided.
      std::vector<float> qkvc, fc, qnc, knc;
      std::vector<int32_t> pc;
      size_t next = 4;
      auto optional = [&](bool present, std::vector<float>& copy) {
        return present ? mlxbar::dense(inputs[next++], copy) : mlxbar::Dense<float>{nullptr, 0};
      };
      const auto periods = optional(c.has_periods, fc);
      const auto q_norm = optional(c.has_q_norm, qnc);
      const auto k_norm = optional(c.has_k_norm, knc);
      mlxbar_decode_attention_run(
          &c.step, mlxbar::dense(inputs[0], qkvc), mlxbar::dense(inputs[3], pc), periods, q_norm, k_norm,
          mlxbar::cache_buffer(inputs[1]), mlxbar::cache_buffer(inputs[2]), mlxbar::Dense<float>{op, out_len});
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("DecodeAttention runs on the CPU only");
  }

  const char* name() const override {
    return "DecodeAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const DecodeAttention&>(other).c_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{1, inputs[0].shape(1), static_cast<int>(c_.step.heads * c_.step.head_dim)}};
  }

 private:
  Config c_;
};

mx::array decode_attention(
    const mx::array& qkv,
    const mx::array& keys,
    const mx::array& values,
    const mx::array& positions,
    const mx::array* periods,
    const mx::array* q_norm,
    const mx::array* k_norm,
    Config c,
    mx::Stream s) {
  std::vector<mx::array> inputs = {qkv, keys, values, positions};
  for (const auto* a : {periods, q_norm, k_norm}) {
    if (a) inputs.push_back(*a);
  }
  mlxbar::attention_step(c.step, keys, values, positions, periods, q_norm, k_norm, "decode_attention");
  const int64_t rows = c.step.rows, width = c.step.heads * c.step.head_dim;
  if (qkv.dtype() != mx::float32 || qkv.ndim() != 3 || qkv.shape(0) != 1 || qkv.shape(1) != rows ||
      qkv.shape(2) != width + 2 * c.step.kv_heads * c.step.head_dim) {
    throw std::invalid_argument("decode_attention: q|k|v must be float32 [1, rows, (heads + 2·kv_heads)·head_dim] for the cache's shapes");
  }
  c.has_periods = periods != nullptr;
  c.has_q_norm = q_norm != nullptr;
  c.has_k_norm = k_norm != nullptr;
  return mx::array({1, static_cast<int>(rows), static_cast<int>(width)}, mx::float32, std::make_shared<DecodeAttention>(s, c), std::move(inputs));
}

const mx::array* optional(const mlx_array& a) {
  return a.ctx ? &mlx_array_get_(a) : nullptr;
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded). `periods`,
// `q_norm` and `k_norm` may be empty handles (ctx null); `step`'s shapes are ignored (taken
// from the cache's).
extern "C" int mlxbar_decode_attention(
    mlx_array* res,
    mlx_array qkv,
    mlx_array keys,
    mlx_array values,
    mlx_array positions,
    mlx_array periods,
    mlx_array q_norm,
    mlx_array k_norm,
    const StepParams* step,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    // The shapes are filled in from the cache buffers'.
    Config c = {*step, false, false, false};
    return decode_attention(
        mlx_array_get_(qkv), mlx_array_get_(keys), mlx_array_get_(values),
        mlx_array_get_(positions), optional(periods), optional(q_norm), optional(k_norm), c, mlx_stream_get_(stream));
  });
}
