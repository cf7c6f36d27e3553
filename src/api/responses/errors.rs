//! Errors on `/v1/responses`. They are OpenAI's shape already (`{"error": {"message", "type",
//! "param", "code"}}`, as every guard answers); what changes is the words: the core names
//! Chat Completions' fields, renamed here to the Responses fields the client sent. An error
//! mid-stream is the Response's own `error` (`{"code", "message"}`) in `response.failed`.
use serde_json::{json, Value};

use crate::api::error::ApiError;

/// The core speaks of Chat Completions' fields where the Responses API's differ.
pub fn responses_words(mut e: ApiError) -> ApiError {
    e.message = e
        .message
        .replace("response_format", "text.format")
        .replace("max_tokens", "max_output_tokens")
        .replace("'messages'", "'input'")
        .replace(".function.parameters", ".parameters")
        .replace(".function.name", ".name");
    e.param = e.param.map(|p| match p {
        "response_format" => "text.format",
        "max_tokens" => "max_output_tokens",
        "messages" | "prompt" => "input",
        other => other,
    });
    e
}

/// The Response's `error` (its `code` is one of the few the SDK knows).
pub fn response_error(e: &ApiError) -> Value {
    let code = match e.status.as_u16() {
        429 => "rate_limit_exceeded",
        400..=499 => "invalid_prompt",
        _ => "server_error",
    };
    json!({"code": code, "message": e.message, "param": e.param, "type": e.kind})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cores_words_become_the_responses_fields() {
        let e = responses_words(ApiError::bad_request("response_format together with tools").param("response_format"));
        assert_eq!((e.message.as_str(), e.param), ("text.format together with tools", Some("text.format")));
        let e = responses_words(ApiError::bad_request("max_tokens must be at least 1").param("max_tokens"));
        assert_eq!((e.message.as_str(), e.param), ("max_output_tokens must be at least 1", Some("max_output_tokens")));
        assert_eq!(responses_words(ApiError::bad_request("x").param("messages")).param, Some("input"));
        assert_eq!(response_error(&ApiError::internal("boom"))["code"], "server_error");
    }
}
