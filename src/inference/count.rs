//! A request's prompt length without generating (Anthropic's `/v1/messages/count_tokens`):
//! the same chat template, tools, output format and tokenizer a real request goes through,
//! on the model it names (loaded if it is not, as a request would load it).
use super::prompt::{prompt_ids, TextLimit};
use super::run::{checked_tools_and_format, lease_model};
use super::InferenceRequest;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::engine::SubmitError;

/// The model that would answer and the prompt's token count.
pub async fn prompt_tokens(state: &AppState, mut req: InferenceRequest) -> Result<(String, usize), ApiError> {
    let (format, tools) = checked_tools_and_format(state, &mut req).await?;
    let lease = lease_model(state, &req).await?;
    let loaded = lease.engine().loaded().ok_or_else(|| ApiError::from(SubmitError::Loading))?;
    let (codec, limit) =
        (loaded.codec.clone(), TextLimit { context: loaded.info.context_length, max_token_bytes: loaded.grammars.max_token_bytes() });
    let effort = super::run::checked_effort(&req, &loaded.info)?;
    let input = req.input;
    let ids = state
        .prepare
        .run(move || {
            let specs = tools.as_ref().map(|t| t.specs.as_slice()).unwrap_or_default();
            prompt_ids(&codec, input, specs, format.as_ref(), effort, limit)
        })
        .await??;
    Ok((loaded.info.id.clone(), ids.len()))
}
