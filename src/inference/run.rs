//! Runs an [`InferenceRequest`]: checks it against the server's limits (its schemas before
//! any model loads), then against the model, builds the prompt and the grammar (on bounded
//! preparation threads, [`super::prepare`]), queues it, and turns the engine's token events into
//! [`Output`]s (tool calls parsed out of the text by the model family's parser).
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rand::Rng;

use super::output::{Answer, Finish, Output, TextLogprobs};
use super::prompt::{fitted_prompt_ids, prompt_ids, TextLimit};
use super::request::{Effort, InferenceRequest, Input, OutputFormat, Overflow, ToolSet};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::config::Speculative;
use crate::engine::constraint::schema::{self, MAX_SCHEMA_BYTES};
use crate::engine::constraint::validate_schema;
use crate::engine::draft::DraftSource;
use crate::engine::logprobs::TokenLogprobs;
use crate::engine::tools::{ToolCall, ToolCallStream, ToolDelta, ToolMode};
use crate::engine::{Constraint, Event, Events, FinishReason, Grammars, ModelInfo, SamplingParams, SubmitError};
use crate::metrics::inference::InferenceRecorder;
use crate::registry::{Lease, ModelError};

/// Longest stop string, in bytes: each is matched against the text on every token, on the
/// engine thread every request shares.
pub const MAX_STOP_BYTES: usize = 256;
/// Most alternatives `logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most tools one request may offer: each becomes a branch of the call grammar.
pub const MAX_TOOLS: usize = 128;

/// A queued request's answer as it comes.
pub struct Generation {
    /// The id of the model that answers.
    pub model: String,
    /// The prompt's length in tokens (those the prefix cache holds included).
    pub prompt_tokens: usize,
    /// Holds the model loaded (and not idle) until the answer is done.
    _lease: Lease,
    rx: Events,
    recorder: InferenceRecorder,
    grammars: Arc<Grammars>,
    /// Set when the request has tools or the model's answers have channels (harmony): splits
    /// calls and reasoning out of the text.
    tools: Option<ToolCallStream>,
    /// Calls begun so far.
    calls: usize,
    /// Logprobs of tokens whose text has not been released yet.
    logprobs: Vec<TextLogprobs>,
    queue: VecDeque<Output>,
    ended: bool,
}

/// Validates and queues the request; its answer comes from [`Generation::next`].
pub async fn start(state: &AppState, mut req: InferenceRequest) -> Result<Generation, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    if state.paused.load(Ordering::Relaxed) {
        return Err(ApiError::paused());
    }
    // What can be checked without the model is checked before it may load.
    let stop = check_stop(std::mem::take(&mut req.stop))?;
    if let Some(n) = req.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        return Err(ApiError::bad_request(format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")).param("top_logprobs"));
    }
    let (format, tools) = checked_tools_and_format(state, &mut req).await?;
    let has_tools = tools.is_some();
    let lease = lease_model(state, &req).await?;
    let engine = lease.engine().clone();
    let loaded = engine.loaded().ok_or_else(|| ApiError::from(SubmitError::Loading))?;
    let sampling = sampling(state, &req, loaded.grammars.n_vocab())?;
    let format_of_calls = loaded.info.tool_format;
    let effort = checked_effort(&req, &loaded.info)?;
    // Harmony's answers are read whatever the request: their reasoning is apart from the text.
    // (A raw completion's text is the model's, markers and all: not read.)
    let read_answer = has_tools || (format_of_calls.has_channels() && matches!(req.input, Input::Chat(_)));
    let (codec, grammars, model_context) = (loaded.codec.clone(), loaded.grammars.clone(), loaded.info.context_length);
    let (context, overflow) = match req.overflow {
        Overflow::Trim { window: Some(window) } => (window.min(model_context), req.overflow),
        other => (model_context, other),
    };
    let limit = TextLimit { context, max_token_bytes: grammars.max_token_bytes() };
    let (input, requested, prediction) = (req.input, req.max_tokens, req.prediction);
    // The template, the tokenizer and the grammar: the request's heavy lifting before the
    // engine, bounded like the schema check.
    let (prompt, max_tokens, constraint, prediction) = state
        .prepare
        .run(move || -> Result<_, ApiError> {
            let specs = tools.as_ref().map(|t| t.specs.as_slice()).unwrap_or_default();
            let (prompt, max_tokens) = match overflow {
                Overflow::Refuse => {
                    let prompt = prompt_ids(&codec, input, specs, format.as_ref(), effort, limit)?;
                    let max_tokens = check_length(context, &prompt, requested)?;
                    (prompt, max_tokens)
                }
                Overflow::Trim { .. } => {
                    let prompt = fitted_prompt_ids(&codec, input, specs, format.as_ref(), effort, limit)?;
                    let max_tokens = window_budget(context, &prompt, requested)?;
                    (prompt, max_tokens)
                }
            };
            let constraint = match (format, &tools) {
                (Some(OutputFormat::JsonObject), _) => Some((Constraint::JsonObject, "response_format")),
                (Some(OutputFormat::JsonSchema(schema)), _) => Some((Constraint::JsonSchema(schema), "response_format")),
                (None, Some(tools)) => {
                    // A named function is called once, as OpenAI does.
                    let parallel = tools.parallel && !matches!(tools.mode, ToolMode::Named(_));
                    let grammar = format_of_calls.parser().grammar(&tools.specs, &tools.mode, parallel, &codec.tokenizer);
                    Some((Constraint::Lark(grammar), "tools"))
                }
                (None, None) => None,
            };
            let constraint = match constraint {
                None => None,
                Some((c, param)) => {
                    let state =
                        grammars.compile(&c).map_err(|e| ApiError::bad_request(e.message).param(param).code("unsupported_schema"))?;
                    // Calls: one `max_tokens` would cut is not started.
                    Some(if param == "tools" { state.with_token_budget(max_tokens) } else { state })
                }
            };
            // Tokenized alone; where its tokens split differently from the answer's, the
            // drafter finds its place again by n-grams.
            let prediction = match prediction.filter(|p| !p.is_empty()) {
                Some(text) => {
                    let bad = |why: String| ApiError::bad_request(format!("prediction: {why}")).param("prediction");
                    let mut ids = codec.tokenizer.encode_fast(text, false).map_err(|e| bad(e.to_string()))?.get_ids().to_vec();
                    // Only a hint: what no answer could reach is dropped.
                    ids.truncate(context);
                    Some(ids)
                }
                None => None,
            };
            Ok((prompt, max_tokens, constraint, prediction))
        })
        .await??;
    if state.config.admission == crate::config::Admission::Refuse && state.telemetry.pressure_critical() {
        state.metrics.admission_refused_total.with_label_values(&["memory_pressure"]).inc();
        return Err(ApiError::memory_pressure());
    }
    let prompt_tokens = prompt.len();
    let (mut engine_req, rx) = engine.new_request(prompt, max_tokens, sampling, stop);
    engine_req.constraint = constraint.map(Box::new);
    engine_req.logprobs = req.logprobs;
    // Call markers that are special tokens (`[TOOL_CALLS]`, `<|python_tag|>`, harmony's
    // `<|channel|>`) must reach the parser as text.
    engine_req.special_tokens_as_text = read_answer;
    engine_req.draft = match (prediction, state.config.speculative) {
        (Some(tokens), _) => Some(DraftSource::Prediction(tokens)),
        (None, Speculative::PromptLookup) => Some(DraftSource::PromptLookup),
        (None, Speculative::Off) => None,
    };
    engine.submit(engine_req)?;
    Ok(Generation {
        _lease: lease,
        recorder: InferenceRecorder::new(state.metrics.clone(), &loaded.info.id, req.endpoint, req.stream),
        model: loaded.info.id,
        prompt_tokens,
        rx,
        grammars: loaded.grammars,
        tools: read_answer.then(|| ToolCallStream::new(format_of_calls)),
        calls: 0,
        logprobs: vec![],
        queue: VecDeque::new(),
        ended: false,
    })
}

/// The request's tools and output format, taken out of it and checked without a model
/// (what can be checked before a model may load): the tools' count and names, not both at
/// once, and the schemas (size, keywords, llguidance's limits) on a preparation thread,
/// where they go and come back.
pub(super) async fn checked_tools_and_format(
    state: &AppState,
    req: &mut InferenceRequest,
) -> Result<(Option<OutputFormat>, Option<ToolSet>), ApiError> {
    if let Some(tools) = &mut req.tools {
        check_tools(tools)?;
        if req.format.is_some() {
            return Err(ApiError::bad_request(
                "response_format together with tools is not supported: send one, or set tool_choice to \"none\"",
            )
            .param("response_format"));
        }
    }
    let (format, tools) = (req.format.take(), req.tools.take());
    if matches!(format, Some(OutputFormat::JsonSchema(_))) || tools.is_some() {
        return state.prepare.run(move || check_schemas(format.as_ref(), tools.as_ref()).map(|()| (format, tools))).await?;
    }
    Ok((format, tools))
}

/// The request's reasoning effort, for a model that has the control (harmony's
/// `reasoning_effort`); asked of any other model, a 400 naming the dialect's field.
pub(super) fn checked_effort(req: &InferenceRequest, model: &ModelInfo) -> Result<Option<Effort>, ApiError> {
    match req.reasoning_effort {
        Some(r) if !model.tool_format.has_channels() => Err(ApiError::bad_request(format!(
            "'{}' is not supported: the model '{}' has no reasoning-effort control (only gpt-oss's harmony models have one)",
            r.param, model.id
        ))
        .param(r.param)),
        r => Ok(r.map(|r| r.level)),
    }
}

/// The model the request names, leased (loaded if it is not); a name that is unknown or not
/// runnable is the `model` field's error.
pub(super) async fn lease_model(state: &AppState, req: &InferenceRequest) -> Result<Lease, ApiError> {
    state.models.acquire(req.model.as_deref(), req.keep_alive).await.map_err(|e| match e {
        ModelError::NotFound(_) | ModelError::NotRunnable { .. } => ApiError::from(e).param("model"),
        other => ApiError::from(other),
    })
}

/// The request's schemas checked without a model ([`crate::engine::constraint::validate_schema`]):
/// at most [`MAX_SCHEMA_BYTES`] together, supported keywords, within llguidance's limits.
fn check_schemas(format: Option<&OutputFormat>, tools: Option<&ToolSet>) -> Result<(), ApiError> {
    let refuse = |message: String, param: &'static str| Err(ApiError::bad_request(message).param(param).code("unsupported_schema"));
    if let Some(OutputFormat::JsonSchema(schema)) = format {
        if schema::serialized_len(schema, MAX_SCHEMA_BYTES).is_none() {
            return refuse(format!("response_format's JSON Schema is larger than {MAX_SCHEMA_BYTES} bytes"), "response_format");
        }
        if let Err(e) = validate_schema(schema) {
            return refuse(e.message, "response_format");
        }
    }
    let Some(tools) = tools else { return Ok(()) };
    let mut left = MAX_SCHEMA_BYTES;
    for (i, t) in tools.specs.iter().enumerate() {
        let Some(len) = schema::serialized_len(&t.parameters, left) else {
            return refuse(
                format!("the tools' parameter schemas together are larger than {MAX_SCHEMA_BYTES} bytes (at tools[{i}])"),
                "tools",
            );
        };
        left -= len;
        // Calls are decoded against the parameters: a keyword the grammar cannot honour is refused.
        if let Err(e) = validate_schema(&t.parameters) {
            return refuse(format!("tools[{i}].function.parameters: {}", e.message), "tools");
        }
    }
    Ok(())
}

fn sampling(state: &AppState, req: &InferenceRequest, vocab: usize) -> Result<SamplingParams, ApiError> {
    let s = &req.sampling;
    let temperature = s.temperature.unwrap_or(state.config.default_temperature);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(format!("temperature must be between 0 and 2, got {temperature}")).param("temperature"));
    }
    let top_p = s.top_p.unwrap_or(state.config.default_top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(format!("top_p must be in (0, 1], got {top_p}")).param("top_p"));
    }
    let penalty = |v: Option<f32>, name: &'static str| match v.unwrap_or(0.0) {
        p if (-2.0..=2.0).contains(&p) => Ok(p),
        p => Err(ApiError::bad_request(format!("{name} must be between -2 and 2, got {p}")).param(name)),
    };
    for &(id, bias) in &s.logit_bias {
        if id as usize >= vocab {
            return Err(
                ApiError::bad_request(format!("logit_bias names token {id}, outside the vocabulary (size {vocab})")).param("logit_bias")
            );
        }
        if !(-100.0..=100.0).contains(&bias) {
            return Err(ApiError::bad_request(format!("logit_bias values must be between -100 and 100, got {bias}")).param("logit_bias"));
        }
    }
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k: s.top_k.unwrap_or(0),
        seed: s.seed,
        presence_penalty: penalty(s.presence_penalty, "presence_penalty")?,
        frequency_penalty: penalty(s.frequency_penalty, "frequency_penalty")?,
        logit_bias: s.logit_bias.clone(),
    })
}

fn check_stop(stop: Vec<String>) -> Result<Vec<String>, ApiError> {
    if stop.len() > 4 {
        return Err(ApiError::bad_request("At most 4 stop sequences are allowed").param("stop"));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad_request(format!(
            "A stop sequence may be at most {MAX_STOP_BYTES} bytes long; one is {} bytes",
            long.len()
        ))
        .param("stop"));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request("A stop sequence must not be empty").param("stop"));
    }
    Ok(stop)
}

fn check_tools(tools: &mut ToolSet) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m).param("tools"));
    if tools.specs.is_empty() {
        return bad("'tools' must list at least one function (or leave it out)".into());
    }
    if tools.specs.len() > MAX_TOOLS {
        return bad(format!("At most {MAX_TOOLS} tools are supported, got {}", tools.specs.len()));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, t) in tools.specs.iter().enumerate() {
        let valid = !t.name.is_empty() && t.name.len() <= 64 && t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return bad(format!("tools[{i}].function.name '{}' must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'", t.name));
        }
        if !names.insert(t.name.as_str()) {
            return bad(format!("tools[{i}]: the function name '{}' appears twice", t.name));
        }
        if !t.parameters.is_object() {
            return bad(format!("tools[{i}].function.parameters must be a JSON Schema object"));
        }
    }
    if let ToolMode::Named(name) = &tools.mode {
        if !names.contains(name.as_str()) {
            return Err(
                ApiError::bad_request(format!("tool_choice names the function '{name}', which is not in 'tools'")).param("tool_choice")
            );
        }
    }
    for (i, t) in tools.specs.iter_mut().enumerate() {
        object_arguments(&mut t.parameters).map_err(|got| {
            ApiError::bad_request(format!(
                "tools[{i}]: a function's parameters must be a JSON Schema of type \"object\" (its arguments are named values), got type {got}"
            ))
            .param("tools")
        })?;
    }
    Ok(())
}

/// Every dialect carries a call's arguments as an object of named values (OpenAI's as its
/// JSON text), so the arguments are decoded as one: parameters that name no type get type
/// "object" (an empty schema already means any object), and any other type is refused (as
/// OpenAI and Anthropic refuse it), giving its JSON.
fn object_arguments(parameters: &mut serde_json::Value) -> Result<(), String> {
    let Some(schema) = parameters.as_object_mut().filter(|s| !s.is_empty()) else { return Ok(()) };
    match schema.get("type") {
        None => {
            schema.insert("type".into(), "object".into());
            Ok(())
        }
        Some(t) if t == "object" => Ok(()),
        Some(other) => Err(other.to_string()),
    }
}

/// The completion's token budget: as asked, or what the model's `context` leaves.
fn check_length(context: usize, prompt: &[u32], requested: Option<usize>) -> Result<usize, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("The prompt is empty").param("prompt"));
    }
    if requested == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1").param("max_tokens"));
    }
    let prompt_len = prompt.len();
    let max_tokens = requested.unwrap_or(context.saturating_sub(prompt_len));
    if prompt_len + max_tokens > context || prompt_len >= context {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.",
            prompt_len + max_tokens
        ))
        .param("messages")
        .code("context_length_exceeded"));
    }
    Ok(max_tokens)
}

/// The completion's token budget within a window the prompt fits ([`fitted_prompt_ids`]): as
/// asked, but never past the window's end.
fn window_budget(context: usize, prompt: &[u32], requested: Option<usize>) -> Result<usize, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("The prompt is empty").param("prompt"));
    }
    if requested == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1").param("max_tokens"));
    }
    let room = context.saturating_sub(prompt.len());
    Ok(requested.map_or(room, |r| r.min(room)))
}

impl Generation {
    /// The next piece of the answer; None after `Done` or an error.
    pub async fn next(&mut self) -> Option<Result<Output, ApiError>> {
        loop {
            if let Some(out) = self.queue.pop_front() {
                return Some(Ok(out));
            }
            if self.ended {
                return None;
            }
            let ev = self.rx.recv().await;
            self.recorder.observe(ev.as_ref());
            match ev {
                Some(Event::Token { text, logprobs }) => {
                    if let Some(lp) = logprobs {
                        let described = self.describe(&lp);
                        self.logprobs.push(described);
                    }
                    self.text(text);
                }
                Some(Event::Text(text)) => self.text(text),
                Some(Event::Done(usage)) => {
                    self.ended = true;
                    if let Err(e) = self.flush_tools(usage.finish_reason) {
                        return Some(Err(e));
                    }
                    let finish = match usage.finish_reason {
                        FinishReason::Length => Finish::Length,
                        FinishReason::Stop if self.calls > 0 => Finish::ToolCalls,
                        FinishReason::Stop => Finish::Stop,
                    };
                    self.queue.push_back(Output::Done { finish, usage });
                }
                Some(Event::Error(e)) => {
                    self.ended = true;
                    return Some(Err(ApiError::from(e)));
                }
                None => {
                    self.ended = true;
                    return Some(Err(ApiError::internal("The engine stopped before finishing this request")));
                }
            }
        }
    }

    /// The whole answer.
    pub async fn collect(mut self) -> Result<Answer, ApiError> {
        let (mut text, mut reasoning, mut tool_calls, mut logprobs) = (String::new(), String::new(), Vec::<ToolCall>::new(), Vec::new());
        while let Some(out) = self.next().await {
            match out? {
                Output::Text { text: t, logprobs: lp } => {
                    text.push_str(&t);
                    logprobs.extend(lp);
                }
                Output::Reasoning { text: r } => reasoning.push_str(&r),
                Output::ToolCallStart { id, name, .. } => tool_calls.push(ToolCall { id, name, arguments: String::new() }),
                Output::ToolCallArguments { index, fragment } => {
                    if let Some(call) = tool_calls.get_mut(index) {
                        call.arguments.push_str(&fragment);
                    }
                }
                Output::Done { finish, usage } => {
                    // A call `max_tokens` cut short is not a call.
                    tool_calls.retain(|c| serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok());
                    return Ok(Answer { text, reasoning, tool_calls, logprobs, finish, usage });
                }
            }
        }
        Err(ApiError::internal("The engine stopped before finishing this request"))
    }

    fn text(&mut self, text: String) {
        let Some(stream) = &mut self.tools else {
            if !text.is_empty() || !self.logprobs.is_empty() {
                let logprobs = std::mem::take(&mut self.logprobs);
                self.queue.push_back(Output::Text { text, logprobs });
            }
            return;
        };
        let deltas = stream.push(&text);
        self.tool_deltas(deltas);
    }

    fn tool_deltas(&mut self, deltas: Vec<ToolDelta>) {
        for d in deltas {
            let out = match d {
                ToolDelta::Text(text) if text.is_empty() => continue,
                ToolDelta::Text(text) => Output::Text { text, logprobs: std::mem::take(&mut self.logprobs) },
                ToolDelta::Reasoning(text) if text.is_empty() => continue,
                ToolDelta::Reasoning(text) => Output::Reasoning { text },
                ToolDelta::CallStart { index, name } => {
                    self.calls = self.calls.max(index + 1);
                    Output::ToolCallStart { index, id: call_id(), name }
                }
                ToolDelta::CallArguments { index, fragment } => Output::ToolCallArguments { index, fragment },
            };
            self.queue.push_back(out);
        }
    }

    /// Releases what the tool parser held; a call cut short by `max_tokens` stays unfinished
    /// (streamed, its start has gone out; [`Generation::collect`] drops it) and is counted.
    fn flush_tools(&mut self, reason: FinishReason) -> Result<(), ApiError> {
        let Some(stream) = &mut self.tools else { return Ok(()) };
        if reason == FinishReason::Length {
            let (deltas, cut) = stream.finish_cut();
            self.tool_deltas(deltas);
            if cut {
                self.recorder.tool_call_cut();
            }
            return Ok(());
        }
        match stream.finish() {
            Ok(deltas) => {
                self.tool_deltas(deltas);
                Ok(())
            }
            Err(e) => Err(ApiError::internal(format!("The model's tool call could not be parsed: {e}"))),
        }
    }

    fn describe(&self, lp: &TokenLogprobs) -> TextLogprobs {
        let piece = |id: u32| {
            let bytes = self.grammars.token_bytes(id);
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        };
        let (token, bytes) = piece(lp.id);
        TextLogprobs {
            token,
            bytes,
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(id, l)| {
                    let (t, b) = piece(id);
                    (t, b, l)
                })
                .collect(),
        }
    }
}

/// OpenAI-style call id: `call_` and 24 random alphanumerics.
fn call_id() -> String {
    let suffix: String = rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect();
    format!("call_{suffix}")
}
