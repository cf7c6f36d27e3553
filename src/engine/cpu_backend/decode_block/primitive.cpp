//! A decode step's whole transformer block as one MLX primitive (see decode_block/mod.rs):
//! inputs the step's hidden state `[1, rows, hidden]`, the layer's key and value buffers
//! `[rows, kv_heads, capacity, head_dim]` (evaluated and dense: written in place), each
//! row's position (int32 `[rows]`), the two RMS norms' weights `[hidden]`, the four
//! projections' packed weights, scales and biases (q|k|v, o, gate|up, down), then,
//! optionally, RoPE's periods `[dims/2]` and the q and k norms' weights `[head_dim]`; output
//! the block's output `[1, rows, hidden]`. One op where the same work as separate ops is
//! five (four quantized matmuls and the attention), each a dispatch on the CPU stream.
//! Built by build.rs on Linux.

#include <cstdint>
#include <vector>

#include "../primitive.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// A quantized weight's data, the Rust side's `decode_block::QuantizedWeight` (repr(C)):
// scales and biases in their stored type, `scale_type` its code (affine_qmm's `Scale::CODE`).
struct QuantizedWeight {
  mlxbar::Dense<uint32_t> packed;
  mlxbar::Dense<void> scales;
  mlxbar::Dense<void> biases;
  int32_t scale_type;
  int32_t bits;
  int32_t group_size;
  // In strips of 16 columns (affine_qmm/strips.rs), not MLX's rows.
  int32_t strips;
  int64_t n;
  int64_t k;
};

// Each buffer comes with the number of elements it may be read for (see mlxbar::Dense); an
// absent one is null. The Rust side checks them against the shapes before it reads.
extern "C" void mlxbar_decode_block_run(
    const StepParams* p,
    mlxbar::Dense<float> h,
    mlxbar::Dense<float> attn_norm,
    mlxbar::Dense<float> mlp_norm,
    const QuantizedWeight* qkv,
    const QuantizedWeight* o,
    const QuantizedWeight* gate_up,
    const QuantizedWeight* down,
    mlxbar::Dense<int32_t> positions,
    mlxbar::Dense<float> periods,
    mlxbar::Dense<float> q_norm,
    mlxbar::Dense<float> k_norm,
    mlxbar::Dense<float> keys,
    mlxbar::Dense<float> values,
    mlxbar::Dense<float> out);

namespace {

// The projections in input order.
constexpr int QKV = 0, O = 1, GATE_UP = 2, DOWN = 3;
// Inputs before the weights: h, keys, values, positions, attn_norm, mlp_norm.
constexpr size_t FIRST_WEIGHT = 6;

// What the op is built with besides its inputs: the attention's parameters (shapes filled
// in from the inputs'), each projection's format, which optional inputs follow.
struct Config {
  StepParams step;
  int bits[4];
  int group_size[4];
  int strips[4];
  bool has_periods;
  bool has_q_norm;
  bool has_k_norm;

  bool operator==(const Config&) const = default;
};

// A projection's arrays as row-major data, gathered into `copies` when a view is strided
// (weights come contiguous, so they never are).
struct WeightCopies {
  std::vector<uint32_t> packed;
  mlxbar::ScaleCopies scales;
};

QuantizedWeight quantized_weight(const std::vector<mx::array>& inputs, int which, const Config& c, WeightCopies& copies) {
  const auto& w = inputs[FIRST_WEIGHT + 3 * which];
  const auto sb = mlxbar::scales_and_biases(inputs[FIRST_WEIGHT + 3 * which + 1], inputs[FIRST_WEIGHT + 3 * which + 2], copies.scales);
  QuantizedWeight q{};
  q.packed = mlxbar::dense(w, copies.packed);
  q.scales = sb.scales;
  q.biases = sb.biases;
  q.scale_type = sb.scale_type;
  q.bits = c.bits[which];
  q.group_size = c.group_size[which];
  q.strips = c.strips[which];
  q.n = w.shape(0);
  q.k = static_cast<int64_t>(w.shape(1)) * 32 / c.bits[which];
  return q;
}

class DecodeBlock : public mx::UnaryPrimitive {
 public:
  DecodeBlock(mx::Stream stream, Config c) : mx::UnaryPrimitive(stream), c_(c) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    enc.dispatch([inputs, c = c_, op = out.data<float>(), out_len = static_cast<int64_t>(out.size())]() {
      std::vector<float> hc, anc, mnc, fc, qnc, knc;
      std::vector<int32_t> pc;
      WeightCopies copies[4];
      QuantizedWeight w[4];
      for (int i = 0; i < 4; i++) w[i] = quantized_weight(inputs, i, c, copies[i]);
      size_t next = FIRST_WEIGHT + 12;
      auto optional = [&](bool present, std::vector<float>& copy) {
        return present ? mlxbar::dense(inputs[next++], copy) : mlxbar::Dense<float>{nullptr, 0};
      };
      const auto periods = optional(c.has_periods, fc);
      const auto q_norm = optional(c.has_q_norm, qnc);
      const auto k_norm = optional(c.has_k_norm, knc);
      mlxbar_decode_block_run(
          &c.step, mlxbar::dense(inputs[0], hc), mlxbar::dense(inputs[4], anc), mlxbar::dense(inputs[5], mnc), &w[QKV], &w[O],
          &w[GATE_UP], &w[DOWN], mlxbar::dense(inputs[3], pc), periods, q_norm, k_norm, mlxbar::cache_buffer(inputs[1]), mlxbar::cache_buffer(inputs[2]),
          mlxbar::Dense<float>{op, out_len});
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("DecodeBlock runs on the CPU only");
  }

  const char* name() const override {
    return "DecodeBlock";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return c_ == static_cast<const DecodeBlock&>(other).c_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  Config c_;
};

// A projection of `k` inputs to `n` outputs as affine_qmm takes it.
void check_weight(
    const mx::array& w, const mx::array& scales, const mx::array& biases, int bits, int gs, bool strips, int64_t n, int64_t k,
    const char* what) {
  const auto st = scales.dtype();
  const bool ok = (bits == 4 || bits == 8) && (gs == 32 || gs == 64 || gs == 128) && (!strips || n % 16 == 0) &&
      w.dtype() == mx::uint32 &&
      (st == mx::float32 || st == mx::float16 || st == mx::bfloat16) && biases.dtype() == st && w.ndim() == 2 &&
      scales.ndim() == 2 && biases.shape() == scales.shape() && w.shape(0) == n &&
      static_cast<int64_t>(w.shape(1)) * 32 == k * bits && k % gs == 0 && scales.shape(0) == n && scales.shape(1) == k / gs;
  if (!ok) {
    throw std::invalid_argument(std::string("decode_block: the ") + what + " projection's weight, scales or biases do not fit the block");
  }
}

mx::array decode_block(std::vector<mx::array> inputs, const mx::array* periods, const mx::array* q_norm, const mx::array* k_norm, Config c, mx::Stream s) {
  const auto& h = inputs[0];
  mlxbar::attention_step(c.step, inputs[1], inputs[2], inputs[3], periods, q_norm, k_norm, "decode_block");
  const int64_t rows = c.step.rows, kv_heads = c.step.kv_heads, hd = c.step.head_dim;
  const int64_t width = c.step.heads * hd;
  const int64_t hidden = h.ndim() == 3 ? h.shape(2) : -1;
  const mx::Shape norm{static_cast<int>(hidden)};
  if (h.dtype() != mx::float32 || h.ndim() != 3 || h.shape(0) != 1 || h.shape(1) != rows || hidden < 1 ||
      inputs[4].dtype() != mx::float32 || inputs[5].dtype() != mx::float32 || inputs[4].shape() != norm || inputs[5].shape() != norm) {
    throw std::invalid_argument("decode_block: the hidden state must be float32 [1, rows, hidden], the norms float32 [hidden]");
  }
  auto weight = [&](int which) -> const mx::array& { return inputs[FIRST_WEIGHT + 3 * which]; };
  // The MLP's width from gate|up's rows: twice the down projection's inputs.
  const int64_t ff = weight(GATE_UP).ndim() == 2 ? weight(GATE_UP).shape(0) / 2 : 0;
  const int64_t shapes[4][2] = {{width + 2 * kv_heads * hd, hidden}, {hidden, width}, {2 * ff, hidden}, {hidden, ff}};
  const char* names[4] = {"q|k|v", "o", "gate|up", "down"};
  for (int i = 0; i < 4; i++) {
    const auto base = FIRST_WEIGHT + 3 * i;
    check_weight(inputs[base], inputs[base + 1], inputs[base + 2], c.bits[i], c.group_size[i], c.strips[i] != 0, shapes[i][0], shapes[i][1], names[i]);
  }
  c.has_periods = periods != nullptr;
  c.has_q_norm = q_norm != nullptr;
  c.has_k_norm = k_norm != nullptr;
  // Taken before the pushes below, which may move `inputs` (and `h` with it).
  const auto shape = h.shape();
  for (const auto* a : {periods, q_norm, k_norm}) {
    if (a) inputs.push_back(*a);
  }
  return mx::array(shape, mx::float32, std::make_shared<DecodeBlock>(s, c), std::move(inputs));
}

const mx::array* optional(const mlx_array& a) {
  return a.ctx ? &mlx_array_get_(a) : nullptr;
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded). `weights` holds
// the four projections' packed weights, scales and biases (q|k|v, o, gate|up, down: twelve
// handles), `bits`, `group_sizes` and `strips` their formats; `periods`, `q_norm` and `k_norm` may be
// empty handles (ctx null); `step`'s shapes are ignored (taken from the inputs').
extern "C" int mlxbar_decode_block(
    mlx_array* res,
    mlx_array h,
    mlx_array keys,
    mlx_array values,
    mlx_array positions,
    mlx_array attn_norm,
    mlx_array mlp_norm,
    const mlx_array* weights,
    const int* bits,
    const int* group_sizes,
    const int* strips,
    mlx_array periods,
    mlx_array q_norm,
    mlx_array k_norm,
    const StepParams* step,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    // The shapes are filled in from the inputs'.
    Config c = {*step, {}, {}, {}, false, false, false};
    std::vector<mx::array> inputs = {mlx_array_get_(h),         mlx_array_get_(keys),      mlx_array_get_(values),
                                     mlx_array_get_(positions), mlx_array_get_(attn_norm), mlx_array_get_(mlp_norm)};
    for (int i = 0; i < 4; i++) {
      c.bits[i] = bits[i];
      c.group_size[i] = group_sizes[i];
      c.strips[i] = strips[i];
      for (int j = 0; j < 3; j++) inputs.push_back(mlx_array_get_(weights[3 * i + j]));
    }
    return decode_block(std::move(inputs), optional(periods), optional(q_norm), optional(k_norm), c, mlx_stream_get_(stream));
  });
}
