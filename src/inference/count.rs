//! A request's prompt length without generating (Anthropic's `/v1/messages/count_tokens`):
//! the same chat template, tools, output format and tokenizer a real request goes through,
//! on the model it names (loaded if it is not, as a request would load it).
use super::prompt::{prompt_ids, TextLimit};
use super::run::{check_schemas, check_tools};
use super::InferenceRequest;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::registry::ModelError;

/// The model that would answer and the prompt's token count.
pub async fn prompt_tokens(state: &AppState, mut req: InferenceRequest) -> Result<(String, usize), ApiError> {
    if let Some(tools) = &req.tools {
        check_tools(tools)?;
    }
    let (format, tools) = (req.format.take(), req.tools.take());
    let (format, tools) = state.prepare.run(move || check_schemas(format.as_ref(), tools.as_ref()).map(|()| (format, tools))).await??;
    let lease = state.models.acquire(req.model.as_deref(), req.keep_alive).await.map_err(|e| match e {
        ModelError::NotFound(_) | ModelError::NotRunnable { .. } => ApiError::from(e).param("model"),
        other => ApiError::from(other),
    })?;
    let loaded = lease.engine().loaded().ok_or_else(|| ApiError::unavailable("The model is still loading; retry shortly"))?;
    let (codec, limit) =
        (loaded.codec.clone(), TextLimit { context: loaded.info.context_length, max_token_bytes: loaded.grammars.max_token_bytes() });
    let input = req.input;
    let ids = state
        .prepare
        .run(move || {
            let specs = tools.as_ref().map(|t| t.specs.as_slice()).unwrap_or_default();
            prompt_ids(&codec, input, specs, format.as_ref(), limit)
        })
        .await??;
    Ok((loaded.info.id.clone(), ids.len()))
}
