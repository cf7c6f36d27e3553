// A decode step's attention as an MLX primitive (see decode_attention/mod.rs): inputs the
// new token's q|k|v projection `[1, rows, (heads + 2·kv_heads)·head_dim]` (q, then k, then
// v in each row; any strides), the layer's key and value buffers `[rows, kv_heads, capacity, head_dim]`
// (evaluated and dense: they are written in place), each row's position (int32 `[rows]`)
// and, optionally, RoPE's periods `[dims/2]` and the q and k norms' weights
// `[head_dim]`; output `[1, rows, heads·head_dim]`, the layout the output projection
// takes. The work is a task on the CPU stream's queue, like MLX's own kernels. Built by
// build.rs on Linux.

#include <cstdint>
#include <vector>

#include "../primitive.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// The Rust side's `StepParams` (repr(C)).
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
      // The cache buffers are row-contiguous (checked when the op was built): their own
      // memory, written in place.
      auto buffer = [](const mx::array& a) {
        return mlxbar::Dense<float>{a.data<float>(), static_cast<int64_t>(a.data_size())};
      };
      mlxbar_decode_attention_run(
          &c.step, mlxbar::dense(inputs[0], qkvc), mlxbar::dense(inputs[3], pc), periods, q_norm, k_norm,
          buffer(inputs[1]), buffer(inputs[2]), mlxbar::Dense<float>{op, out_len});
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

// A cache buffer the op may write: evaluated (its layout is final) and row-contiguous.
void check_buffer(const mx::array& a, const char* what) {
  if (a.status() == mx::array::Status::unscheduled || !a.flags().row_contiguous || a.data_size() != a.size()) {
    throw std::invalid_argument(
        std::string("decode_attention: the ") + what + " buffer must be evaluated and dense (it is written in place)");
  }
}

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
  for (const auto& a : inputs) {
    if (a.dtype() != (&a == &inputs[3] ? mx::int32 : mx::float32)) {
      throw std::invalid_argument("decode_attention: positions must be int32, every other input float32");
    }
  }
  const int64_t rows = keys.ndim() == 4 ? keys.shape(0) : -1;
  const int64_t kv_heads = rows >= 0 ? keys.shape(1) : 0;
  const int64_t hd = rows >= 0 ? keys.shape(3) : 0;
  // int64: heads × head_dim is q's width, refused past int32.
  const int64_t width = c.step.heads * hd;
  mlxbar::dim(width, "decode_attention");
  const auto is_token = [&](const mx::array& a, int64_t w) {
    return a.ndim() == 3 && a.shape(0) == 1 && a.shape(1) == rows && a.shape(2) == w;
  };
  if (rows < 1 || values.shape() != keys.shape() || kv_heads < 1 || c.step.heads % kv_heads != 0 ||
      !is_token(qkv, width + 2 * kv_heads * hd) || positions.ndim() != 1 || positions.shape(0) != rows ||
      c.step.rope_dims <= 0 || c.step.rope_dims % 2 != 0 || c.step.rope_dims > hd ||
      (periods && periods->size() != size_t(c.step.rope_dims / 2)) ||
      (q_norm && q_norm->size() != size_t(hd)) || (k_norm && k_norm->size() != size_t(hd))) {
    throw std::invalid_argument("decode_attention: shapes of q|k|v, the cache, positions, periods and norms disagree");
  }
  check_buffer(keys, "keys");
  check_buffer(values, "values");
  c.step.rows = rows;
  c.step.kv_heads = kv_heads;
  c.step.capacity = keys.shape(2);
  c.step.head_dim = hd;
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
// `q_norm` and `k_norm` may be empty handles (ctx null).
extern "C" int mlxbar_decode_attention(
    mlx_array* res,
    mlx_array qkv,
    mlx_array keys,
    mlx_array values,
    mlx_array positions,
    mlx_array periods,
    mlx_array q_norm,
    mlx_array k_norm,
    int heads,
    int rope_dims,
    bool traditional,
    float base,
    float position_scale,
    float input_scale,
    float eps,
    float scale,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    // The shapes are filled in from the cache buffers'.
    Config c = {{0, heads, 0, 0, 0, rope_dims, traditional, base, position_scale, input_scale, eps, scale}, false, false, false};
    return decode_attention(
        mlx_array_get_(qkv), mlx_array_get_(keys), mlx_array_get_(values),
        mlx_array_get_(positions), optional(periods), optional(q_norm), optional(k_norm), c, mlx_stream_get_(stream));
  });
}
