//! Model names between Ollama's `name:tag` and the library's ids. The listing
//! (`/api/tags`, `/api/ps`) shows each id with Ollama's default tag, `<id>:latest` (an id
//! that already holds a ':' is shown as it is). A request's name is looked up exactly first
//! (an id, an alias, "default"), then, ending in `:latest`, without that tag; any other tag
//! names no model here (404).
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::registry::ModelError;

const LATEST: &str = ":latest";

/// How the listing names the model `id`.
pub fn ollama_name(id: &str) -> String {
    if id.contains(':') {
        id.to_string()
    } else {
        format!("{id}{LATEST}")
    }
}

/// The library id (or alias) the Ollama name `name` stands for, as the registry resolves it.
pub async fn model_id(state: &AppState, name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(ApiError::bad_request("model is required"));
    }
    match state.models.find(Some(name)).await {
        Err(ModelError::NotFound(_)) => match name.strip_suffix(LATEST) {
            Some(base) if !base.is_empty() => state.models.find(Some(base)).await.map_err(|_| not_found(name)),
            _ => Err(not_found(name)),
        },
        found => found.map_err(ApiError::from),
    }
}

/// Ollama's words for it; the status is what clients look at.
pub fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "model '{name}' not found; GET /api/tags lists the models this server has (POST /api/pull fetches one from Hugging Face)"
    ))
    .param("model")
    .code("model_not_found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_listed_with_the_default_tag() {
        assert_eq!(ollama_name("HuggingFaceTB/SmolLM2-135M-Instruct"), "HuggingFaceTB/SmolLM2-135M-Instruct:latest");
        assert_eq!(ollama_name("qwen:7b"), "qwen:7b");
    }
}
