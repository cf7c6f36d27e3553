//! The OpenAI dialect: `/v1/chat/completions` and `/v1/completions`. Its typed request
//! bodies ([`request`]) translate into the neutral [`crate::inference::InferenceRequest`]
//! ([`chat`], [`completions`]); the answer is rendered as OpenAI's objects ([`response`]),
//! whole or as SSE chunks ([`stream`]). Errors are OpenAI's shape (`ApiError::body`).
pub mod chat;
pub mod completions;
pub mod request;
pub mod response;
pub mod stream;

pub use request::{ChatCompletionRequest, CompletionRequest};
