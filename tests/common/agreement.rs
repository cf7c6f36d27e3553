//! Two serving paths that should give the same greedy answer (batched and alone, with and
//! without a reused prefix, with and without a prediction), compared as closely as the
//! weights' path allows:
//! - Where the default format keeps the weights packed on the CPU (Linux, with mlxbar's
//!   quantized kernel: always with AVX2) and the CPU has no AMX, they must match bit for
//!   bit, tokens and logprobs ([`exact`]): that kernel gives a row the same result
//!   whatever rows share its call (`every_kernel_equals_scalar` checks each SIMD kernel;
//!   the portable one works row by row), and attention works per query, so neither a
//!   batch nor a prefill's shape may move a logit.
//! - Elsewhere the matmuls' arithmetic depends on the call's shape: float32 goes through
//!   BLAS (gemv for one row, other blockings for more), MLX's Metal kernels differ by
//!   shape too, and with AMX products of 16 rows or more (a prefill) run on its tiles, in
//!   another summation order than the VNNI kernel that takes fewer (a decode step). With
//!   the default weight format a different prefill shape moved one token's logprob by up
//!   to ~0.11 (measured on the CPU before its kernel was made shape-independent), enough
//!   to flip a near-tie. There the paths must agree token by
//!   token, with logprobs within [`LOGPROB_TOLERANCE`], until a step where the reference's
//!   top two tokens are within [`TIE_MARGIN`] and the other path took the second one; from
//!   there they may part. The second one may be the end of the turn: one path then stops
//!   where the other goes on.
use serde_json::Value;

/// Whether the paths must match exactly (see the module's note): the default format runs
/// packed weights on the CPU (decided once per process, as the in-process servers decide)
/// through a kernel whose rows do not depend on the call's row count.
pub fn exact() -> bool {
    mlxbar::engine::cpu_backend::quantized_is_faster() && mlxbar::engine::cpu_backend::quantized_rows_independent()
}
/// How far one token's logprob may move between paths (measured max 0.11; see above).
pub const LOGPROB_TOLERANCE: f64 = 0.3;
/// Paths may part only where the reference's top two are closer than this (reference.rs
/// allows the same between packed and float32 weights).
pub const TIE_MARGIN: f64 = 0.5;

/// One generated token with its logprob and the runner-up the model gave at that step.
#[derive(Debug, Clone)]
pub struct Step {
    pub token: String,
    pub logprob: f64,
    pub runner_up: Option<(String, f64)>,
}

/// A greedy answer, step by step.
#[derive(Debug, Clone, Default)]
pub struct Traced {
    pub text: String,
    pub steps: Vec<Step>,
    /// Why the answer ended (`stop`, `length`, …), where known.
    pub finish_reason: Option<String>,
}

impl Traced {
    /// Appends the steps of an OpenAI `logprobs.content` array (a whole answer's or one
    /// stream chunk's), asked with `top_logprobs` ≥ 2.
    pub fn push_logprobs(&mut self, content: &Value) {
        for t in content.as_array().into_iter().flatten() {
            let top = t["top_logprobs"].as_array().cloned().unwrap_or_default();
            let runner_up = top
                .iter()
                .find(|c| c["token"] != t["token"])
                .map(|c| (c["token"].as_str().unwrap_or_default().to_string(), c["logprob"].as_f64().unwrap()));
            self.steps.push(Step { token: t["token"].as_str().unwrap().to_string(), logprob: t["logprob"].as_f64().unwrap(), runner_up });
        }
    }

    /// From a non-streamed chat completion.
    pub fn from_answer(answer: &Value) -> Traced {
        let choice = &answer["choices"][0];
        let mut t = Traced {
            text: choice["message"]["content"].as_str().unwrap_or_default().to_string(),
            steps: vec![],
            finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        };
        t.push_logprobs(&choice["logprobs"]["content"]);
        t
    }
}

/// `body` (a chat completion request) made greedy and traced: temperature 0, two top
/// logprobs per step.
pub fn traced_body(body: &Value) -> Value {
    let mut body = body.clone();
    body["temperature"] = 0.into();
    body["logprobs"] = true.into();
    body["top_logprobs"] = 2.into();
    body
}

/// Asserts `got` agrees with `want` as the module says; returns the step where they parted
/// at a near-tie, if they did (the caller prints it). Where not [`exact`], equal texts
/// always pass.
pub fn assert_agree(got: &Traced, want: &Traced, what: &str) -> Option<usize> {
    if exact() {
        assert_eq!(got.text, want.text, "{what}: the texts differ");
        assert_eq!(got.steps.len(), want.steps.len(), "{what}: the step counts differ");
        for (i, (g, w)) in got.steps.iter().zip(&want.steps).enumerate() {
            assert!(
                g.token == w.token && g.logprob.to_bits() == w.logprob.to_bits() && g.runner_up == w.runner_up,
                "{what}: step {i} differs: {g:?} vs {w:?}"
            );
        }
        return None;
    }
    if got.text == want.text {
        return None;
    }
    for (i, (g, w)) in got.steps.iter().zip(&want.steps).enumerate() {
        if g.token == w.token {
            let moved = (g.logprob - w.logprob).abs();
            assert!(
                moved <= LOGPROB_TOLERANCE,
                "{what}: step {i} ({:?}) logprob {} vs {} (tolerance {LOGPROB_TOLERANCE})",
                w.token,
                g.logprob,
                w.logprob
            );
            continue;
        }
        let (second, second_logprob) =
            w.runner_up.clone().unwrap_or_else(|| panic!("{what}: step {i} has no runner-up to compare (ask top_logprobs ≥ 2)"));
        let gap = w.logprob - second_logprob;
        assert!(
            gap < TIE_MARGIN && g.token == second,
            "{what}: the paths part at step {i} where the reference's top two ({:?}, {second:?}) are {gap:.3} apart (a near-tie is < {TIE_MARGIN}) and this path took {:?}\n  reference: {:?}\n  this path: {:?}",
            w.token,
            g.token,
            want.text,
            got.text
        );
        println!("{what}: parted at step {i}, a near-tie ({:?} vs {second:?}, {gap:.3} apart)", w.token);
        return Some(i);
    }
    // One path ended where the other went on: the shorter answer stopped (an end of turn,
    // which logprobs do not list as a step) and is the start of the longer, and at the
    // step after its last the longer path's top two were its own token and an end of turn
    // within the near-tie margin (the reference's figures where it is the longer; where
    // the reference ended, this path's, the only ones there are).
    let (short, long) = if got.steps.len() < want.steps.len() { (got, want) } else { (want, got) };
    let i = short.steps.len();
    if short.finish_reason.as_deref() == Some("stop") && long.text.starts_with(&short.text) {
        if let Some(Step { token, logprob, runner_up: Some((second, second_logprob)) }) = long.steps.get(i) {
            let gap = logprob - second_logprob;
            if gap < TIE_MARGIN && is_end_token(second) {
                println!("{what}: parted at step {i}, one path ending at a near-tie ({token:?} vs {second:?}, {gap:.3} apart)");
                return Some(i);
            }
        }
    }
    panic!("{what}: the texts differ but every compared step agrees:\n  reference: {:?}\n  this path: {:?}", want.text, got.text)
}

/// Whether a token's text is an end of turn as the served families report it.
fn is_end_token(text: &str) -> bool {
    ["<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<|return|>"].contains(&text)
}
