//! A layer's MLP: the dense gated one (gate|up fused into one matmul, `act(gate) * up`, then
//! down; SiLU, or Gemma's GELU) or a sparse mixture of experts ([`super::switch`]), as the
//! family's config makes each layer.
use std::rc::Rc;

use anyhow::{ensure, Result};
use mlx_rs::{fast, nn, ops, Array};

use super::config::Activation;
use super::linear::{Linear, Weight};
use super::switch::{Experts, MoeConfig, SparseMoe, SwitchGlu, SwitchLinear};
use super::{Projections, TensorMap};
use crate::engine::experts::ExpertStore;

pub enum Mlp {
    Dense { gate_up: Projections, down: Linear, activation: Activation },
    Sparse(SparseMoe),
}

impl Mlp {
    /// `h + mlp(rms_norm(h))`. Dense: two MLX ops when the CPU kernel fuses (gate|up with
    /// the norm, down with the SwiGLU and the residual), else seven.
    pub fn forward_add(&self, h: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self {
            Mlp::Dense { gate_up, down, activation } => {
                if let (Projections::Fused { linear, .. }, Activation::Silu) = (gate_up, activation) {
                    if linear.fuses() && down.fuses() {
                        return down.forward_swiglu_add(&linear.forward_normed(h, norm, eps)?, h);
                    }
                }
                down.forward_add(&Self::gated(gate_up, *activation, h, norm, eps)?, h)
            }
            Mlp::Sparse(moe) => Ok(h.add(&moe.forward(&fast::rms_norm(h, Some(norm), eps)?)?)?),
        }
    }

    /// `mlp(rms_norm(h))`, without the residual (for norms on the output: Gemma's).
    pub fn forward_normed(&self, h: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self {
            Mlp::Dense { gate_up, down, activation } => down.forward(&Self::gated(gate_up, *activation, h, norm, eps)?),
            Mlp::Sparse(moe) => moe.forward(&fast::rms_norm(h, Some(norm), eps)?),
        }
    }

    /// The gated product of `rms_norm(h)`'s gate and up projections.
    fn gated(gate_up: &Projections, activation: Activation, h: &Array, norm: &Array, eps: f32) -> Result<Array> {
        let gu = gate_up.forward_normed(h, norm, eps)?;
        gated(activation, &gu[0], &gu[1])
    }

    pub fn nbytes(&self) -> usize {
        match self {
            Mlp::Dense { gate_up, down, .. } => gate_up.nbytes() + down.weight.nbytes(),
            Mlp::Sparse(moe) => moe.nbytes(),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Mlp::Dense { gate_up, down, .. } => {
                let mut all = gate_up.arrays();
                all.extend(down.weight.arrays());
                all
            }
            Mlp::Sparse(moe) => moe.arrays(),
        }
    }

    /// Layer `layer`'s sparse MLP from `layers.{layer}.router` and `.experts.{gate,up,down}`,
    /// or with its experts in `streamed`'s cache; `weight` converts the experts to the
    /// model's format, `router` the router.
    pub fn sparse(
        t: &mut TensorMap,
        layer: usize,
        moe: &MoeConfig,
        hidden: i32,
        weight: &dyn Fn(Weight) -> Result<Weight>,
        router: &dyn Fn(Weight) -> Result<Weight>,
        streamed: Option<&Rc<ExpertStore>>,
    ) -> Result<Mlp> {
        let p = |s: &str| format!("layers.{layer}.{s}");
        let router = router(t.take_weight(&p("router"))?)?;
        ensure!(
            router.out_features() == moe.num_experts,
            "{}: {} experts, config says {}",
            p("router"),
            router.out_features(),
            moe.num_experts
        );
        let router_bias = t.vectors.remove(&p("router.bias"));
        let mut experts = |name: &str, out: i32| -> Result<SwitchLinear> {
            let bias = t.vectors.remove(&format!("{}.bias", p(name)));
            let l = SwitchLinear(weight(t.take_weight(&p(name))?)?, bias);
            let want = (moe.num_experts, out);
            ensure!(l.dims() == want, "{}: (experts, rows) {:?}, config says {want:?}", p(name), l.dims());
            Ok(l)
        };
        let experts = match streamed {
            Some(store) => {
                ensure!(store.has((layer as u32, 0)), "{}: no experts in the files", p("experts"));
                Experts::Streamed { layer: layer as u32, store: store.clone() }
            }
            None => Experts::Resident(SwitchGlu {
                gate: experts("experts.gate", moe.expert_intermediate_size)?,
                up: experts("experts.up", moe.expert_intermediate_size)?,
                down: experts("experts.down", hidden)?,
                activation: moe.activation,
            }),
        };
        Ok(Mlp::Sparse(SparseMoe { router, router_bias, experts, top_k: moe.experts_per_token, routing: moe.routing }))
    }
}

/// How a gated MLP combines its gate and up projections ([`Activation`]), dense or expert.
pub fn gated(activation: Activation, gate: &Array, up: &Array) -> Result<Array> {
    Ok(match activation {
        Activation::Silu => nn::silu(gate)?.multiply(up)?,
        Activation::GeluApprox => nn::gelu_approximate(gate)?.multiply(up)?,
        Activation::SwigluOai => {
            // mlx-lm's swiglu_oai: the gate clipped from above only, 1 added to the linear part.
            const ALPHA: f32 = 1.702;
            const LIMIT: f32 = 7.0;
            let g = ops::minimum(gate, Array::from_f32(LIMIT))?;
            let u = ops::clip(up, (-LIMIT, LIMIT))?;
            let glu = g.multiply(nn::sigmoid(g.multiply(Array::from_f32(ALPHA))?)?)?;
            u.add(Array::from_f32(1.0))?.multiply(&glu)?
        }
    })
}
