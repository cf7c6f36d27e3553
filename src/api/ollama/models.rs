//! Ollama's model routes over the library and the registry: `GET /api/tags` (every model
//! this server can run), `POST /api/show` (one model's details, its chat template once it
//! is loaded, `model_info` in Ollama's keys), `GET /api/ps` (the loaded models, their
//! memory, `size_vram` 0 on the CPU device, `expires_at` from their keep-alive) and
//! `GET /api/version`. Names are shown as [`super::names`] says; `digest` is a stable
//! identifier of the model's files (id, path, size, revision), not a hash of their bytes.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::names::{model_id, ollama_name};
use super::request::ShowRequest;
use crate::api::error::ApiError;
use crate::api::json::OpenAiJson;
use crate::api::AppState;
use crate::engine::DeviceKind;
use crate::library::ModelEntry;
use crate::registry::{ModelView, SlotState};

/// How long the listing may wait for the model files' modification times (a models
/// folder on a network drive that does not answer leaves them out).
const STAT_WAIT: Duration = Duration::from_secs(5);
/// `expires_at` of a model kept loaded until unloaded by hand.
const NEVER: &str = "9999-12-31T23:59:59Z";

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn digest(e: &ModelEntry) -> String {
    let key = format!("{}\0{}\0{}\0{}", e.id, e.path.display(), e.size_bytes, e.revision.as_deref().unwrap_or(""));
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// "135M", "7.6B": the parameter count as Ollama writes it.
pub fn parameter_size(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    }
}

fn details(e: &ModelEntry) -> Value {
    let family = e.architecture.clone().unwrap_or_default();
    json!({
        "parent_model": "",
        "format": e.format.as_str(),
        "family": family,
        "families": [family],
        "parameter_size": e.parameters.map(parameter_size).unwrap_or_default(),
        "quantization_level": e.quantization.map_or_else(|| "unquantized".to_string(), |q| format!("Q{}", q.bits)),
    })
}

/// The models' files' modification times, read off the runtime with a deadline.
async fn modified(entries: Vec<std::path::PathBuf>) -> Vec<Option<String>> {
    let n = entries.len();
    let read = tokio::task::spawn_blocking(move || {
        entries.iter().map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok().map(rfc3339)).collect::<Vec<_>>()
    });
    match tokio::time::timeout(STAT_WAIT, read).await {
        Ok(Ok(times)) => times,
        _ => vec![None; n],
    }
}

/// `GET /api/tags`.
pub async fn tags(State(state): State<AppState>) -> Json<Value> {
    let views: Vec<ModelView> = state.models.list().into_iter().filter(|m| m.entry.runnable || m.state == SlotState::Loaded).collect();
    let times = modified(views.iter().map(|v| v.entry.path.clone()).collect()).await;
    let models: Vec<Value> = views
        .iter()
        .zip(times)
        .map(|(v, modified_at)| {
            let name = ollama_name(&v.entry.id);
            json!({"name": name, "model": name, "modified_at": modified_at, "size": v.entry.size_bytes, "digest": digest(&v.entry), "details": details(&v.entry)})
        })
        .collect();
    Json(json!({"models": models}))
}

/// `POST /api/show`.
pub async fn show(State(state): State<AppState>, OpenAiJson(req): OpenAiJson<ShowRequest>) -> Result<Json<Value>, ApiError> {
    if req.verbose == Some(true) {
        return Err(ApiError::bad_request("verbose: the tokenizer's vocabulary is not listed by mlxbar; leave verbose out"));
    }
    let name = req.model.or(req.name).ok_or_else(|| ApiError::bad_request("model is required"))?;
    let id = model_id(&state, &name).await?;
    let view = state.models.view(&id)?;
    let e = &view.entry;
    let loaded = state.models.engine(&id).and_then(|engine| engine.loaded());
    let template = loaded.as_ref().and_then(|l| l.codec.template.as_ref());
    let context = view.info.as_ref().map(|i| i.context_length).or(e.context_length);
    let arch = e.architecture.clone().unwrap_or_else(|| "unknown".into());
    let mut info = Map::new();
    info.insert("general.architecture".into(), json!(arch));
    info.insert("general.parameter_count".into(), json!(e.parameters));
    info.insert(format!("{arch}.context_length"), json!(context));
    if let Some(s) = e.shape {
        info.insert(format!("{arch}.block_count"), json!(s.layers));
        info.insert(format!("{arch}.embedding_length"), json!(s.hidden_size));
        info.insert(format!("{arch}.feed_forward_length"), json!(s.intermediate_size));
        info.insert(format!("{arch}.attention.head_count"), json!(s.num_heads));
        info.insert(format!("{arch}.attention.head_count_kv"), json!(s.num_kv_heads));
        info.insert(format!("{arch}.vocab_size"), json!(s.vocab_size));
    }
    if let Some(q) = e.quantization {
        info.insert("mlxbar.quantization.bits".into(), json!(q.bits));
        info.insert("mlxbar.quantization.group_size".into(), json!(q.group_size));
    }
    info.insert("mlxbar.source".into(), json!(e.source.as_str()));
    let parameters = format!("temperature {}\ntop_p {}", state.config.default_temperature, state.config.default_top_p);
    let tools = template.map_or(e.chat_template, |t| t.supports_tools());
    let mut capabilities = vec!["completion"];
    if tools {
        capabilities.push("tools");
    }
    let modified_at = modified(vec![e.path.clone()]).await.pop().flatten();
    Ok(Json(json!({
        "modelfile": format!("# Modelfile of {} (mlxbar serves it from disk)\nFROM {}\n\n{}\n", ollama_name(&id), e.path.display(),
            parameters.lines().map(|l| format!("PARAMETER {l}")).collect::<Vec<_>>().join("\n")),
        "parameters": parameters,
        // The model's own chat template (Jinja, not Go's template language), once loaded.
        "template": template.map(|t| t.source().to_string()).unwrap_or_default(),
        "details": details(e),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": modified_at,
    })))
}

/// `GET /api/ps`.
pub async fn ps(State(state): State<AppState>) -> Json<Value> {
    let on_gpu = state.models.device() == DeviceKind::Gpu;
    let models: Vec<Value> = state
        .models
        .active_views()
        .into_iter()
        .filter(|v| v.state == SlotState::Loaded)
        .map(|v| {
            let size = v.memory_bytes.unwrap_or(0);
            let expires_at = match (v.last_used_unix, v.keep_alive_seconds) {
                (_, None) => NEVER.to_string(),
                (last, Some(secs)) => {
                    let last = last.map_or_else(SystemTime::now, |s| UNIX_EPOCH + Duration::from_secs(s));
                    rfc3339(last + Duration::from_secs_f64(secs))
                }
            };
            let name = ollama_name(&v.entry.id);
            json!({
                "name": name, "model": name, "size": size, "digest": digest(&v.entry), "details": details(&v.entry),
                "expires_at": expires_at, "size_vram": if on_gpu { size } else { 0 },
                "context_length": v.info.as_ref().map(|i| i.context_length).or(v.entry.context_length),
            })
        })
        .collect();
    Json(json!({"models": models}))
}

/// `GET /api/version`: mlxbar's own version (it is not Ollama, and says which it is).
pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_sizes_read_as_ollamas() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(7_615_616_512), "7.6B");
    }
}
