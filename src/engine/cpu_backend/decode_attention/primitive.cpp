//! Decode-step attention as an MLX primitive (see decode_attention/mod.rs): inputs q
//! `[rows, heads, 1, head_dim]` (after RoPE), the layer's key and value buffers
//! `[rows, kv_heads, capacity, head_dim]` and each row's position (int32 `[rows]`); output
//! `[1, rows, heads·head_dim]`, the layout the output projection takes. The work is a task
//! on the CPU stream's queue, like MLX's own kernels. Built by build.rs on Linux.

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
extern "C" void mlxbar_decode_attention_run(
    int64_t rows,
    int64_t heads,
    int64_t kv_heads,
    int64_t capacity,
    int64_t head_dim,
    const float* q,
    int64_t q_len,
    const float* keys,
    int64_t keys_len,
    const float* values,
    int64_t values_len,
    const int32_t* positions,
    int64_t positions_len,
    float scale,
    float* out,
    int64_t out_len);

namespace {

class DecodeAttention : public mx::UnaryPrimitive {
 public:
  DecodeAttention(mx::Stream stream, float scale) : mx::UnaryPrimitive(stream), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    const auto& k = inputs[1];
    enc.dispatch([inputs, op = out.data<float>(), out_len = static_cast<int64_t>(out.size()),
                  rows = int64_t{k.shape(0)}, heads = int64_t{inputs[0].shape(1)}, kv_heads = int64_t{k.shape(1)},
                  capacity = int64_t{k.shape(2)}, head_dim = int64_t{k.shape(3)}, scale = scale_]() {
      // Row-major data of every input, gathered when it is a strided view (positions too:
      // a column of a larger array is one).
      std::vector<float> qc, kc, vc;
      std::vector<int32_t> pc;
      const auto q = mlxbar::dense(inputs[0], qc);
      const auto k = mlxbar::dense(inputs[1], kc);
      const auto v = mlxbar::dense(inputs[2], vc);
      const auto p = mlxbar::dense(inputs[3], pc);
      mlxbar_decode_attention_run(
          rows, heads, kv_heads, capacity, head_dim, q.ptr, q.len, k.ptr, k.len, v.ptr, v.len, p.ptr, p.len, scale,
          op, out_len);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("DecodeAttention runs on the CPU only");
  }

  const char* name() const override {
    return "DecodeAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const DecodeAttention&>(other).scale_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& q = inputs[0];
    return {{1, q.shape(0), mlxbar::dim(int64_t{q.shape(1)} * q.shape(3), "decode_attention")}};
  }

 private:
  float scale_;
};

mx::array decode_attention(
    const mx::array& q,
    const mx::array& keys,
    const mx::array& values,
    const mx::array& positions,
    float scale,
    mx::Stream s) {
  if (q.dtype() != mx::float32 || keys.dtype() != mx::float32 || values.dtype() != mx::float32 ||
      positions.dtype() != mx::int32) {
    throw std::invalid_argument("decode_attention: q, keys and values must be float32, positions int32");
  }
  if (q.ndim() != 4 || q.shape(2) != 1 || keys.ndim() != 4 || keys.shape() != values.shape() ||
      keys.shape(0) != q.shape(0) || keys.shape(3) != q.shape(3) || keys.shape(1) == 0 ||
      q.shape(1) % keys.shape(1) != 0 || positions.ndim() != 1 || positions.shape(0) != q.shape(0)) {
    throw std::invalid_argument("decode_attention: shapes of q, keys, values and positions disagree");
  }
  // int64: heads × head_dim is one dimension of the output, refused past int32.
  const int width = mlxbar::dim(int64_t{q.shape(1)} * q.shape(3), "decode_attention");
  return mx::array(
      {1, q.shape(0), width},
      mx::float32,
      std::make_shared<DecodeAttention>(s, scale),
      {q, keys, values, positions});
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded).
extern "C" int mlxbar_decode_attention(
    mlx_array* res,
    mlx_array q,
    mlx_array keys,
    mlx_array values,
    mlx_array positions,
    float scale,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    return decode_attention(
            mlx_array_get_(q), mlx_array_get_(keys), mlx_array_get_(values), mlx_array_get_(positions), scale,
            mlx_stream_get_(stream));
  });
}
