//! The dialect-neutral core every API speaks through. A dialect (today OpenAI's, in
//! `src/api/openai/`; beside it Anthropic Messages, OpenAI Responses and Ollama, each a folder of `src/api/`) translates its
//! request into an [`InferenceRequest`] — messages made of content parts, tools and what to
//! do with them, an output constraint, sampling — and renders the [`Output`] stream (text
//! deltas, reasoning deltas, tool-call deltas, one done event) in its own shape. What a request means is
//! decided here once: defaults, validation, the prompt (chat template, tools), the grammar
//! (response format, forced tool calls) and the tool-call parsing of the answer.
pub mod count;
pub mod output;
pub mod prepare;
pub mod prompt;
pub mod request;
pub mod run;

pub use output::{arguments_object, Answer, Finish, Output, TextLogprobs};
pub use request::{Effort, InferenceRequest, Input, Message, OutputFormat, Overflow, Part, ReasoningEffort, Role, Sampling, ToolSet};
pub use run::{start, Generation};
