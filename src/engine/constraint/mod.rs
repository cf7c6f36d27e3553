//! Constrained decoding with llguidance: what the output must match ([`Constraint`]), the
//! per-model grammar compiler ([`Grammars`]) and one sequence's grammar state
//! ([`ConstraintState`]), which masks the logits before sampling and follows the tokens
//! sampled.
//!
//! JSON Schema support (draft 2020-12 as llguidance implements it):
//! - honoured: `type`, `enum`, `const`, `anyOf`, `allOf`, `oneOf` (only where llguidance can
//!   prove the branches disjoint, otherwise an error), `$ref` (local, e.g. to `$defs`),
//!   `items`, `prefixItems`, `additionalItems`, `minItems`, `maxItems`, `properties`,
//!   `additionalProperties`, `patternProperties`, `required`, `minProperties`/`maxProperties`
//!   (only when every listed property is required), `minLength`, `maxLength`, `pattern`,
//!   `format` (`date-time`, `date`, `time`, `duration`, `email`, `hostname`, `ipv4`, `ipv6`,
//!   `uuid`, `uri`, ...; an unknown format is an error; formats are llguidance's regexes,
//!   without RFC length limits such as 64 octets before an email's `@`), `minimum`, `maximum`,
//!   `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`;
//! - accepted as annotations: `$schema`, `$id`, `$anchor`, `$defs`, `definitions`, `$comment`,
//!   `title`, `description`, `default`, `examples`, `deprecated`, `readOnly`, `writeOnly`,
//!   `contentMediaType`, `contentEncoding`, `discriminator`, and any `x-*` key;
//! - refused with an error naming the keyword: everything else, e.g. `if`/`then`/`else`,
//!   `not`, `uniqueItems`, `contains`, `minContains`, `maxContains`, `propertyNames`,
//!   `dependentRequired`, `dependentSchemas`, `dependencies`, `unevaluatedProperties`,
//!   `unevaluatedItems`, `$dynamicRef`, `$recursiveRef`, and misspellings.
//!
//! JSON output is laid out compactly: no free whitespace, one optional space after `,` and
//! `:` ([`schema::layout`]).
pub mod schema;
#[cfg(test)]
mod tests;
pub mod tokens;

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};

use super::TextCodec;

/// What the output must match. Neutral: no dialect's field names.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI `json_object`).
    JsonObject,
    /// A JSON Schema (draft 2020-12 subset llguidance supports; see the module's note).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect (tool calls are built this way; may embed
    /// `%json {...}`: pass the schema through [`schema::prepare`] first).
    Lark(String),
}

/// A constraint that cannot be compiled; the message names the feature.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ConstraintError {
    pub message: String,
}

impl ConstraintError {
    pub fn new(message: impl Into<String>) -> Self {
        ConstraintError { message: message.into() }
    }
}

/// Built once per loaded model (from its TextCodec); `Send + Sync`, shared via Arc by the
/// HTTP side (which compiles constraints so a bad schema is a 400 before queueing).
pub struct Grammars {
    factory: Arc<ParserFactory>,
    stop_ids: Arc<[u32]>,
    /// Ids the tokenizer knows; logits past it are never allowed.
    tokenizer_vocab: usize,
    n_vocab: usize,
}

impl Grammars {
    /// `n_vocab`: width of the model's logits (may exceed the tokenizer's vocab; extra ids are
    /// never allowed).
    pub fn new(codec: &TextCodec, n_vocab: usize) -> Result<Grammars> {
        let env = tokens::tok_env(codec, n_vocab)?;
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        *factory.limits_mut() = limits();
        // (`vocab_size` builds the tokenizer's whole vocabulary map)
        let tokenizer_vocab = codec.vocab_size();
        let stop_ids: BTreeSet<u32> = codec.stop_ids.iter().copied().filter(|&id| (id as usize) < tokenizer_vocab).collect();
        Ok(Grammars {
            factory: Arc::new(factory),
            stop_ids: stop_ids.into_iter().collect(),
            tokenizer_vocab,
            n_vocab: n_vocab.max(tokenizer_vocab),
        })
    }

    /// Width of the masks (the logits) this was built for.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Compiles; an unsupported schema feature or a bad grammar is an Err naming it.
    pub fn compile(&self, c: &Constraint) -> Result<ConstraintState, ConstraintError> {
        let grammar = match c {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(schema::prepare(&serde_json::json!({"type": "object"}))?),
            Constraint::JsonSchema(s) => TopLevelGrammar::from_json_schema(schema::prepare(s)?),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| ConstraintError::new(compile_message(c, &e)))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::new(e));
        }
        Ok(ConstraintState { matcher, stop_ids: self.stop_ids.clone(), tokenizer_vocab: self.tokenizer_vocab, budget: None })
    }
}

/// Checks a JSON Schema without a model, so a bad one is refused before a model loads (or
/// another is evicted for it): its keywords ([`schema::check`]) and that llguidance builds
/// its grammar within our [`limits`], against a byte vocabulary (what depends on the
/// model's tokens is checked when the request's grammar is compiled). The caller bounds
/// its size first ([`schema::MAX_SCHEMA_BYTES`]).
pub fn validate_schema(s: &serde_json::Value) -> Result<(), ConstraintError> {
    static BYTES: std::sync::OnceLock<ParserFactory> = std::sync::OnceLock::new();
    let factory = BYTES.get_or_init(|| {
        let mut f = ParserFactory::new_simple(&toktrie::ApproximateTokEnv::single_byte_env()).expect("a byte vocabulary's parser factory");
        f.quiet();
        *f.limits_mut() = limits();
        f
    });
    let grammar = TopLevelGrammar::from_json_schema(schema::prepare(s)?);
    let parser = factory.create_parser(grammar).map_err(|e| ConstraintError::new(format!("invalid JSON Schema: {e}")))?;
    let mut matcher = Matcher::new(Ok(parser));
    // The first mask too: some limits (items in an Earley row: a few thousand properties
    // side by side) only trip there, and would otherwise fail on the engine thread.
    let failed = match matcher.get_error() {
        Some(e) => Some(e),
        None => matcher.compute_mask().err().map(|e| e.to_string()),
    };
    match failed {
        Some(e) => Err(ConstraintError::new(format!("the JSON Schema is beyond the grammar engine's limits: {e}"))),
        None => Ok(()),
    }
}

/// How a grammar's failure while generating begins (the engine reports it as
/// [`crate::engine::ErrorKind::Grammar`]: the request's fault, not the server's).
pub const RUNTIME_ERROR: &str = "constraint: ";

/// llguidance's defaults, except that errors do not carry the parser state and grammar (they
/// become API error messages).
fn limits() -> ParserLimits {
    ParserLimits { verbose_errors: false, ..ParserLimits::default() }
}

fn compile_message(c: &Constraint, e: &anyhow::Error) -> String {
    let what = match c {
        Constraint::JsonObject | Constraint::JsonSchema(_) => "JSON Schema",
        Constraint::Lark(_) => "grammar",
    };
    format!("invalid {what}: {e}")
}

/// One sequence's grammar state: `Send` (moves to the engine thread inside GenerationRequest).
pub struct ConstraintState {
    matcher: Matcher,
    stop_ids: Arc<[u32]>,
    tokenizer_vocab: usize,
    budget: Option<Budget>,
}

/// See [`ConstraintState::with_token_budget`].
#[derive(Debug)]
struct Budget {
    max_tokens: usize,
    /// Tokens committed so far.
    taken: usize,
    /// Where (in tokens) the grammar could last end.
    last_end: usize,
    /// The fewest tokens between two places where it could end, counting only gaps of at
    /// least 2 (free text may end after any token; a call cannot).
    shortest: Option<usize>,
}

impl Budget {
    /// At a place where the grammar may end: whether it must, the tokens left being fewer
    /// than the shortest piece so far took.
    fn must_end(&mut self) -> bool {
        let gap = self.taken - self.last_end;
        if gap >= 2 {
            self.shortest = Some(self.shortest.map_or(gap, |s| s.min(gap)));
        }
        self.last_end = self.taken;
        self.shortest.is_some_and(|s| self.max_tokens.saturating_sub(self.taken) < s)
    }
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState").field("finished", &self.is_finished()).finish_non_exhaustive()
    }
}

impl ConstraintState {
    /// For answers made of repeated pieces (tool calls): where the grammar may end after a
    /// piece and fewer than the shortest piece's tokens are left of `max_tokens`, it ends,
    /// instead of starting a piece `max_tokens` would cut.
    pub fn with_token_budget(mut self, max_tokens: usize) -> Self {
        self.budget = Some(Budget { max_tokens, taken: 0, last_end: 0, shortest: None });
        self
    }

    /// Sets every logit the grammar forbids to -inf (the model's stop ids are allowed exactly
    /// when the grammar may end). Returns Err if the grammar is in an error state.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        if let Some(e) = self.matcher.get_error() {
            bail!("{RUNTIME_ERROR}{e}");
        }
        let allowed = if self.matcher.is_stopped() {
            // Finished: only a stop token can follow.
            let mut none = toktrie::SimpleVob::alloc(self.tokenizer_vocab);
            self.stop_ids.iter().for_each(|&id| none.allow_token(id));
            none
        } else {
            let mut allowed = self.matcher.compute_mask().map_err(|e| anyhow!("{RUNTIME_ERROR}{e}"))?;
            // The TokEnv's EOS set is the stop ids, so llguidance allows them together; kept
            // explicit in case a grammar names one of them.
            if self.stop_ids.iter().any(|&id| allowed.is_allowed(id)) {
                if self.budget.as_mut().is_some_and(Budget::must_end) {
                    allowed.set_all(false);
                }
                self.stop_ids.iter().for_each(|&id| allowed.allow_token(id));
            }
            allowed
        };
        let words = allowed.as_slice();
        let known = logits.len().min(self.tokenizer_vocab);
        let (inside, beyond) = logits.split_at_mut(known);
        for (i, chunk) in inside.chunks_mut(32).enumerate() {
            match words.get(i).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (bit, l) in chunk.iter_mut().enumerate() {
                        if w & (1 << bit) == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        beyond.fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Advances by the sampled token (a stop id is accepted when the grammar may end).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if let Some(b) = &mut self.budget {
            b.taken += 1;
        }
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            if self.stop_ids.contains(&token) {
                return Ok(());
            }
            bail!("the constraint got token {token} after the grammar finished");
        }
        self.matcher.consume_token(token).map_err(|e| anyhow!("{RUNTIME_ERROR}{e}"))
    }

    /// The grammar is complete and allows nothing more: generation must end (FinishReason::Stop).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

// The engine thread takes states across threads; the HTTP side shares Grammars.
const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync<T: Send + Sync>() {}
    send::<ConstraintState>();
    send_sync::<Grammars>();
};
