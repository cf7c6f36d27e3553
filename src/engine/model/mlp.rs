//! A layer's MLP: the dense SwiGLU (gate|up fused into one matmul, then down) or a sparse
//! mixture of experts ([`super::switch`]), as the family's config makes each layer.
use anyhow::{ensure, Result};
use mlx_rs::{fast, nn, Array};

use super::linear::{Linear, Weight};
use super::switch::{MoeConfig, SparseMoe, SwitchGlu, SwitchLinear};
use super::{Projections, TensorMap};

pub enum Mlp {
    Dense { gate_up: Projections, down: Linear },
    Sparse(SparseMoe),
}

impl Mlp {
    /// `h + mlp(rms_norm(h))`. Dense: two MLX ops when the CPU kernel fuses (gate|up with
    /// the norm, down with the SwiGLU and the residual), else seven.
    pub fn forward_add(&self, h: &Array, norm: &Array, eps: f32) -> Result<Array> {
        match self {
            Mlp::Dense { gate_up, down } => {
                if let Projections::Fused { linear, .. } = gate_up {
                    if linear.fuses() && down.fuses() {
                        return down.forward_swiglu_add(&linear.forward_normed(h, norm, eps)?, h);
                    }
                }
                let gu = gate_up.forward_normed(h, norm, eps)?;
                down.forward_add(&nn::silu(&gu[0])?.multiply(&gu[1])?, h)
            }
            Mlp::Sparse(moe) => Ok(h.add(&moe.forward(&fast::rms_norm(h, Some(norm), eps)?)?)?),
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            Mlp::Dense { gate_up, down } => gate_up.nbytes() + down.weight.nbytes(),
            Mlp::Sparse(moe) => moe.nbytes(),
        }
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match self {
            Mlp::Dense { gate_up, down } => {
                let mut all = gate_up.arrays();
                all.extend(down.weight.arrays());
                all
            }
            Mlp::Sparse(moe) => moe.arrays(),
        }
    }

    /// Layer `layer`'s sparse MLP from `layers.{layer}.router` and `.experts.{gate,up,down}`;
    /// `weight` converts the experts to the model's format, `router` the router.
    pub fn sparse(
        t: &mut TensorMap,
        layer: usize,
        moe: &MoeConfig,
        hidden: i32,
        weight: &dyn Fn(Weight) -> Result<Weight>,
        router: &dyn Fn(Weight) -> Result<Weight>,
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
        let mut experts = |name: &str, out: i32| -> Result<SwitchLinear> {
            let l = SwitchLinear(weight(t.take_weight(&p(name))?)?);
            let want = (moe.num_experts, out);
            ensure!(l.dims() == want, "{}: (experts, rows) {:?}, config says {want:?}", p(name), l.dims());
            Ok(l)
        };
        let experts = SwitchGlu {
            gate: experts("experts.gate", moe.expert_intermediate_size)?,
            up: experts("experts.up", moe.expert_intermediate_size)?,
            down: experts("experts.down", hidden)?,
        };
        Ok(Mlp::Sparse(SparseMoe { router, experts, top_k: moe.experts_per_token, routing: moe.routing }))
    }
}
