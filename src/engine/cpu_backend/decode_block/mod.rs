//! A decode step's whole transformer block on the CPU as one MLX op (primitive.cpp): the
//! attention's RMS norm and q|k|v projection, [`decode_attention::step`], the output
//! projection plus the residual, the MLP's RMS norm and gate|up projection, SwiGLU and the
//! down projection plus the residual; a dense block (Llama, Qwen, SmolLM, Mistral) whose four
//! projections run [`affine_qmm`].
//!
//! Why one op: each MLX op costs a dispatch on the CPU stream and a node to build, and at
//! one row a block's five ops (four matmuls and the attention) cost more in those than the
//! norms and activations they carry: `decode_profile` counts a step's ops. The work and its
//! order are the five ops' own (the same kernel calls with the same fusions, in the same
//! order), so a row's output is the same bit for bit either way; tests/quantized_kernel.rs
//! holds the op to the five.
pub mod op;

use std::ffi::c_void;

use super::affine_qmm::{self, AnyWeights, Fusion, Prologue};
use super::decode_attention::{self, Cache, Prep, Shape, StepParams};
use super::primitive_call::{count, elems, Buffer};

/// A projection's data as primitive.cpp passes it (`QuantizedWeight` there).
#[repr(C)]
pub struct QuantizedWeight {
    pub packed: Buffer<u32>,
    pub scales: Buffer<c_void>,
    pub biases: Buffer<c_void>,
    /// [`affine_qmm::Scale::CODE`] of the scales' and biases' type.
    pub scale_type: i32,
    pub bits: i32,
    pub group_size: i32,
    /// Non-zero: in [`affine_qmm::strips`].
    pub strips: i32,
    pub n: i64,
    pub k: i64,
}

impl QuantizedWeight {
    /// # Safety
    /// Its buffers are valid for reads of their stated lengths for `'a`, the scales and
    /// biases of the type `scale_type` names.
    unsafe fn weights<'a>(&self) -> AnyWeights<'a> {
        let shape = (count(self.n), count(self.k), count(self.group_size.into()), count(self.bits.into()));
        let raw = |b: &Buffer<c_void>| (b.ptr, b.len);
        AnyWeights::from_raw(
            (self.packed.ptr, self.packed.len),
            raw(&self.scales),
            raw(&self.biases),
            self.scale_type,
            self.strips != 0,
            shape,
        )
    }
}

/// A block's weights besides the attention's.
pub struct Block<'a> {
    pub attn_norm: &'a [f32],
    pub mlp_norm: &'a [f32],
    /// `[(heads + 2·kv_heads)·head_dim, hidden]`, `[hidden, heads·head_dim]`,
    /// `[2·ff, hidden]` (`[gate | up]`), `[hidden, ff]`.
    pub qkv: AnyWeights<'a>,
    pub o: AnyWeights<'a>,
    pub gate_up: AnyWeights<'a>,
    pub down: AnyWeights<'a>,
    /// The two RMS norms' epsilon.
    pub eps: f32,
}

/// `out = h' + down(swiglu(gate_up(rms_norm(h'))))` with `h' = h + o(attention(qkv(rms_norm(h))))`
/// for each of the step's rows (`h` and `out` `[rows, hidden]`), each row's new k and v
/// written into its slot of `cache` as [`decode_attention::step`] does.
///
/// # Panics
/// On inconsistent shapes (checked by the kernels before they read).
#[allow(clippy::too_many_arguments)]
pub fn step(b: &Block, s: Shape, prep: Prep, h: &[f32], positions: &[i32], scale: f32, cache: Cache, out: &mut [f32]) {
    let kernel = affine_qmm::kernel();
    let rows = s.rows;
    let normed = |weight| Fusion { prologue: Prologue::RmsNorm { weight, eps: b.eps }, residual: None };
    let mut qkv = vec![0f32; rows * b.qkv.n()];
    b.qkv.matmul(kernel, h, rows, normed(b.attn_norm), &mut qkv);
    let mut attention = vec![0f32; rows * s.heads * s.head_dim];
    decode_attention::step(s, prep, &qkv, positions, scale, cache, &mut attention);
    let mut h1 = vec![0f32; rows * b.o.n()];
    b.o.matmul(kernel, &attention, rows, Fusion { prologue: Prologue::None, residual: Some(h) }, &mut h1);
    let mut gate_up = vec![0f32; rows * b.gate_up.n()];
    b.gate_up.matmul(kernel, &h1, rows, normed(b.mlp_norm), &mut gate_up);
    b.down.matmul(kernel, &gate_up, rows, Fusion { prologue: Prologue::SwiGlu, residual: Some(&h1) }, out);
}

/// Called by the MLX primitive's CPU task (primitive.cpp) with the evaluated arrays.
///
/// # Safety
/// Each buffer (the weights' too) is valid for reads of its stated length for the call
/// (`keys`, `values` and `out` for writes too), and nothing else reads or writes `keys`,
/// `values` or `out` meanwhile. Shapes are not trusted: every slice is checked against its
/// buffer's length first.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxbar_decode_block_run(
    p: &StepParams,
    h: Buffer<f32>,
    attn_norm: Buffer<f32>,
    mlp_norm: Buffer<f32>,
    qkv: &QuantizedWeight,
    o: &QuantizedWeight,
    gate_up: &QuantizedWeight,
    down: &QuantizedWeight,
    positions: Buffer<i32>,
    periods: Buffer<f32>,
    q_norm: Buffer<f32>,
    k_norm: Buffer<f32>,
    keys: Buffer<f32>,
    values: Buffer<f32>,
    out: Buffer<f32>,
) {
    let run = || {
        let (s, prep, cache) = p.parts(&periods, &q_norm, &k_norm, &keys, &values);
        let hidden = count(o.n);
        let block = Block {
            attn_norm: attn_norm.input(hidden, "attn_norm"),
            mlp_norm: mlp_norm.input(hidden, "mlp_norm"),
            qkv: qkv.weights(),
            o: o.weights(),
            gate_up: gate_up.weights(),
            down: down.weights(),
            eps: p.eps,
        };
        let n = elems(&[s.rows, hidden]);
        step(&block, s, prep, h.input(n, "h"), positions.input(s.rows, "positions"), p.scale, cache, out.output(n, "out"));
    };
    // A panic must not unwind into MLX's C++ scheduler thread.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
        eprintln!("mlxbar: the decode block kernel panicked");
        std::process::abort();
    }
}
