// A prefill chunk's causal attention as an MLX primitive (see prefill_attention/mod.rs):
// inputs q `[1, heads, len, head_dim]` and the sequence's keys and values `[1, kv_heads,
// keys, head_dim]` (the cached prefix, then the chunk's own; any strides), output `[1,
// heads, len, head_dim]`, what `fast::scaled_dot_product_attention` with the causal mask
// gives. The work is a task on the CPU stream's queue, like MLX's own kernels. Built by
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

// The Rust side's `Params` (repr(C)).
struct Params {
  int64_t heads;
  int64_t kv_heads;
  int64_t len;
  int64_t keys;
  int64_t head_dim;
  float scale;

  bool operator==(const Params&) const = default;
};

// Each pointer comes with the number of elements it may be read for (see mlxbar::Dense);
// the Rust side checks them against the shapes before it reads.
extern "C" void mlxbar_prefill_attention_run(
    const Params* p,
    const float* q,
    int64_t q_len,
    const float* k,
    int64_t k_len,
    const float* v,
    int64_t v_len,
    float* out,
    int64_t out_len);

namespace {

class PrefillAttention : public mx::UnaryPrimitive {
 public:
  PrefillAttention(mx::Stream stream, Params p) : mx::UnaryPrimitive(stream), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) enc.set_input_array(in);
    enc.set_output_array(out);
    enc.dispatch([inputs, p = p_, op = out.data<float>(), out_len = static_cast<int64_t>(out.size())]() {
      // Row-major copies of strided views (q comes transposed from the projection; the
      // keys and values are slices of the cache's buffers).
      std::vector<float> qc, kc, vc;
      const auto q = mlxbar::dense(inputs[0], qc);
      const auto k = mlxbar::dense(inputs[1], kc);
      const auto v = mlxbar::dense(inputs[2], vc);
      mlxbar_prefill_attention_run(&p, q.ptr, q.len, k.ptr, k.len, v.ptr, v.len, op, out_len);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("PrefillAttention runs on the CPU only");
  }

  const char* name() const override {
    return "PrefillAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    return p_ == static_cast<const PrefillAttention&>(other).p_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  Params p_;
};

mx::array prefill_attention(const mx::array& q, const mx::array& keys, const mx::array& values, float scale, mx::Stream s) {
  if (q.dtype() != mx::float32 || keys.dtype() != mx::float32 || values.dtype() != mx::float32) {
    throw std::invalid_argument("prefill_attention: q, keys and values must be float32");
  }
  if (q.ndim() != 4 || keys.ndim() != 4 || keys.shape() != values.shape() || q.shape(0) != 1 || keys.shape(0) != 1 ||
      q.shape(3) != keys.shape(3) || keys.shape(1) < 1 || q.shape(1) % keys.shape(1) != 0 || q.shape(2) < 1 ||
      q.shape(2) > keys.shape(2) || q.shape(3) < 1) {
    throw std::invalid_argument(
        "prefill_attention: q [1, heads, len, head_dim] and keys, values [1, kv_heads, keys >= len, head_dim], heads a "
        "multiple of kv_heads");
  }
  Params p{q.shape(1), keys.shape(1), q.shape(2), keys.shape(2), q.shape(3), scale};
  return mx::array(q.shape(), mx::float32, std::make_shared<PrefillAttention>(s, p), {q, keys, values});
}

}  // namespace

// 0 on success; otherwise 1 and the reason in `err` (see mlxbar::guarded).
extern "C" int mlxbar_prefill_attention(
    mlx_array* res,
    mlx_array q,
    mlx_array keys,
    mlx_array values,
    float scale,
    mlx_stream stream,
    char* err,
    size_t err_len) {
  return mlxbar::guarded(res, err, err_len, [&] {
    return prefill_attention(
        mlx_array_get_(q), mlx_array_get_(keys), mlx_array_get_(values), scale, mlx_stream_get_(stream));
  });
}
