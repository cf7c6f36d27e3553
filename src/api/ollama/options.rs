//! Ollama's `options`: the sampling and length settings mlxbar honours (`temperature`,
//! `top_p`, `top_k`, `seed`, `num_predict`, `stop`, `presence_penalty`,
//! `frequency_penalty`, `num_ctx`), the ones it cannot honour refused by name unless they
//! hold the value that asks for nothing (`repeat_penalty: 1`, `mirostat: 0`…), and unknown
//! keys refused too. `num_ctx` is checked against the model's context by the handler.
use serde_json::{Map, Value};

use crate::api::error::ApiError;
use crate::inference::Sampling;

/// What `options` asks for, in the core's terms.
#[derive(Debug, Default, Clone)]
pub struct Options {
    pub sampling: Sampling,
    /// `num_predict`; None: up to the context's end (Ollama's -1 and -2).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// The context window asked for; at most the model's (checked once the model is known).
    pub num_ctx: Option<usize>,
}

/// Options Ollama knows that mlxbar does not do, with the value (if any) that asks for what
/// mlxbar does anyway.
const NOT_HONOURED: &[(&str, Option<f64>)] = &[
    ("numa", None),
    ("num_batch", None),
    ("num_gpu", None),
    ("main_gpu", None),
    ("low_vram", None),
    ("f16_kv", None),
    ("logits_all", None),
    ("vocab_only", None),
    ("use_mmap", None),
    ("use_mlock", None),
    ("embedding_only", None),
    ("num_thread", None),
    ("num_keep", None),
    ("tfs_z", Some(1.0)),
    ("typical_p", Some(1.0)),
    ("min_p", Some(0.0)),
    ("repeat_last_n", None),
    ("repeat_penalty", Some(1.0)),
    ("mirostat", Some(0.0)),
    ("mirostat_tau", None),
    ("mirostat_eta", None),
    ("penalize_newline", None),
];

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

fn number(key: &str, v: &Value) -> Result<f64, ApiError> {
    v.as_f64().ok_or_else(|| bad(format!("options.{key}: a number, got {v}")))
}

fn integer(key: &str, v: &Value) -> Result<i64, ApiError> {
    v.as_i64().ok_or_else(|| bad(format!("options.{key}: an integer, got {v}")))
}

pub fn parse(options: Option<Map<String, Value>>) -> Result<Options, ApiError> {
    let mut out = Options::default();
    for (key, v) in options.unwrap_or_default() {
        if v.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            "temperature" => out.sampling.temperature = Some(number(k, &v)? as f32),
            "top_p" => out.sampling.top_p = Some(number(k, &v)? as f32),
            "presence_penalty" => out.sampling.presence_penalty = Some(number(k, &v)? as f32),
            "frequency_penalty" => out.sampling.frequency_penalty = Some(number(k, &v)? as f32),
            // Ollama's 0 (and below) turns top-k off, as the core's 0 does.
            "top_k" => out.sampling.top_k = Some(integer(k, &v)?.max(0) as usize),
            // A negative seed is Ollama's "random".
            "seed" => out.sampling.seed = u64::try_from(integer(k, &v)?).ok(),
            "num_predict" => {
                out.max_tokens = match integer(k, &v)? {
                    n if n < 0 => None,
                    0 => return Err(bad("options.num_predict: must be at least 1 (or -1 for no limit)".into())),
                    n => Some(n as usize),
                }
            }
            "num_ctx" => match integer(k, &v)? {
                n if n >= 1 => out.num_ctx = Some(n as usize),
                n => return Err(bad(format!("options.num_ctx: must be at least 1, got {n}"))),
            },
            "stop" => {
                out.stop = match &v {
                    Value::String(s) => vec![s.clone()],
                    Value::Array(items) => items
                        .iter()
                        .map(|s| s.as_str().map(str::to_string).ok_or_else(|| bad("options.stop: a list of strings".into())))
                        .collect::<Result<_, _>>()?,
                    _ => return Err(bad("options.stop: a list of strings".into())),
                }
            }
            _ => match NOT_HONOURED.iter().find(|(name, _)| *name == k) {
                Some((_, Some(neutral))) if v.as_f64() == Some(*neutral) || v.as_bool() == Some(false) && *neutral == 0.0 => {}
                Some((_, neutral)) => {
                    let hint = neutral.map(|n| format!(" (only {n}, which asks for nothing, is accepted)")).unwrap_or_default();
                    return Err(bad(format!("options.{k}: not supported by mlxbar{hint}")));
                }
                None => return Err(bad(format!("options.{k}: unknown option"))),
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts(v: Value) -> Result<Options, String> {
        parse(v.as_object().cloned()).map_err(|e| e.message)
    }

    #[test]
    fn honoured_options_reach_the_core() {
        let o = opts(json!({"temperature": 0.5, "top_p": 0.9, "top_k": 20, "seed": 7, "num_predict": 12, "stop": ["\n"], "num_ctx": 2048}))
            .unwrap();
        assert_eq!((o.sampling.temperature, o.sampling.top_k, o.sampling.seed), (Some(0.5), Some(20), Some(7)));
        assert_eq!((o.max_tokens, o.stop, o.num_ctx), (Some(12), vec!["\n".to_string()], Some(2048)));
        assert_eq!(opts(json!({"num_predict": -1, "seed": -1})).unwrap().max_tokens, None);
    }

    #[test]
    fn what_is_not_honoured_is_named() {
        assert!(opts(json!({"mirostat": 2})).unwrap_err().contains("options.mirostat"));
        assert!(opts(json!({"repeat_penalty": 1.0, "mirostat": 0})).is_ok(), "values that ask for nothing pass");
        assert!(opts(json!({"num_gpu": 1})).unwrap_err().contains("options.num_gpu: not supported"));
        assert!(opts(json!({"flux": 1})).unwrap_err().contains("options.flux: unknown option"));
        assert!(opts(json!({"temperature": "hot"})).unwrap_err().contains("options.temperature: a number"));
        assert!(opts(json!({"num_predict": 0})).is_err());
        assert!(opts(json!({"num_ctx": 0})).is_err());
    }
}
