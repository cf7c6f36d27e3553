//! Constraint tests on real tokenizers (the default model's 49k vocabulary, a tiny model's
//! 320): schemas compile or are refused by keyword, and seeded random walks over the allowed
//! tokens always end in output that parses and validates.
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Constraint, ConstraintState, Grammars};
use crate::engine::{tokenizer, TextCodec};

fn default_codec() -> &'static TextCodec {
    static CODEC: OnceLock<TextCodec> = OnceLock::new();
    CODEC.get_or_init(|| {
        crate::engine::cpu_backend::install();
        let path = crate::model_store::ensure_default_model().expect("default model (run `mlxbar fetch-model`)");
        tokenizer::from_gguf_path(&path).unwrap()
    })
}

fn default_grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let codec = default_codec();
        let started = Instant::now();
        super::tokens::tok_env(codec, codec.vocab_size()).unwrap();
        let env = started.elapsed();
        let started = Instant::now();
        let g = Grammars::new(codec, codec.vocab_size()).unwrap();
        eprintln!("for {} tokens: TokEnv {env:?}, Grammars::new (TokEnv and ParserFactory) {:?}", codec.vocab_size(), started.elapsed());
        g
    })
}

fn tiny_codec() -> TextCodec {
    tokenizer::from_hf_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny/llama3-rope")).unwrap()
}

/// splitmix64: seeded, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

struct Walk {
    text: String,
    steps: usize,
    mask_time: Duration,
}

/// Picks a random allowed token each step (a stop id most of the time once allowed, and
/// often a closing `"`, `}` or `]`, so strings and containers end) until the grammar ends.
fn walk(g: &Grammars, codec: &TextCodec, state: &mut ConstraintState, seed: u64, budget: usize) -> Walk {
    let mut rng = Rng(seed);
    let closers: Vec<u32> = ["\"", "}", "]"].iter().filter_map(|t| codec.tokenizer.token_to_id(t)).collect();
    let mut logits = vec![0f32; g.n_vocab()];
    // (`vocab_size` builds the whole vocabulary map: once, not per step)
    let vocab = codec.vocab_size();
    let (mut out, mut mask_time) = (Vec::new(), Duration::ZERO);
    for _ in 0..budget {
        if state.is_finished() {
            break;
        }
        logits.fill(0.0);
        let t = Instant::now();
        state.mask(&mut logits).unwrap();
        mask_time += t.elapsed();
        assert!(logits[vocab..].iter().all(|l| *l == f32::NEG_INFINITY), "ids past the tokenizer are forbidden");
        let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        assert!(!allowed.is_empty(), "the mask allows something");
        let stops: Vec<u32> = codec.stop_ids.iter().copied().filter(|id| logits[*id as usize].is_finite()).collect();
        assert!(stops.is_empty() || stops.len() == codec.stop_ids.len(), "stop ids are allowed together: {stops:?}");
        let closing: Vec<u32> = closers.iter().copied().filter(|id| logits[*id as usize].is_finite()).collect();
        let token = if !stops.is_empty() && rng.chance(0.8) {
            stops[rng.below(stops.len())]
        } else if !closing.is_empty() && rng.chance(0.4) {
            closing[rng.below(closing.len())]
        } else {
            allowed[rng.below(allowed.len())]
        };
        state.commit(token).unwrap();
        if codec.stop_ids.contains(&token) {
            assert!(state.is_finished(), "a stop token ends the grammar");
            break;
        }
        out.push(token);
    }
    assert!(state.is_finished(), "the walk ended within {budget} tokens: {:?}", codec.tokenizer.decode(&out, false));
    Walk { text: codec.tokenizer.decode(&out, false).unwrap(), steps: out.len() + 1, mask_time }
}

fn assert_valid(schema: &Value, text: &str) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let validator = jsonschema::options().should_validate_formats(true).build(schema).unwrap();
    if let Err(e) = validator.validate(&value) {
        panic!("{text} does not match {schema}: {e}");
    }
}

/// Schemas using every honoured keyword, each meant to end quickly under the walk's bias.
fn supported_schemas() -> Vec<Value> {
    vec![
        // llguidance's email regex has no length limits (RFC 5321: 64 octets before the `@`)
        json!({"type": "string", "format": "email", "maxLength": 24}),
        json!({"type": "string", "format": "date"}),
        json!({"type": "object", "patternProperties": {"^[a-c]$": {"type": "integer"}}, "additionalProperties": false, "maxProperties": 2}),
        // (unbounded numbers may take exponents past f64, which serde_json will not read)
        json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -1e3, "maximum": 1e3}, "y": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["x", "y"], "additionalProperties": false}},
               "type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 3}),
        json!({"type": "integer", "minimum": -5, "maximum": 12}),
        json!({"type": "number", "exclusiveMinimum": 0.5, "maximum": 3}),
        json!({"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 100}),
        json!({"enum": ["red", "green", 3, null, true]}),
        json!({"const": {"k": [1, 2]}}),
        json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}]}),
        json!({"type": "string", "pattern": "^[a-z]{2,4}-[0-9]{1,3}$"}),
        json!({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4}),
        json!({"type": "string", "minLength": 2, "maxLength": 5}),
        json!({"type": "array", "prefixItems": [{"type": "string", "maxLength": 2}, {"type": "null"}], "items": false}),
        json!({"title": "person", "description": "d", "x-vendor": 1, "type": "object",
               "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                              "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}},
               "required": ["name", "age"], "additionalProperties": false}),
        json!({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "boolean"}]}),
        json!({"allOf": [{"type": "integer"}, {"minimum": 3, "maximum": 4}]}),
    ]
}

#[test]
fn walks_under_supported_schemas_produce_valid_json_on_the_default_vocabulary() {
    let (g, codec) = (default_grammars(), default_codec());
    let (mut steps, mut time, mut compiles, mut compile_time) = (0, Duration::ZERO, 0u32, Duration::ZERO);
    for (i, schema) in supported_schemas().into_iter().enumerate() {
        for seed in 0..3 {
            let t = Instant::now();
            let mut state = g.compile(&Constraint::JsonSchema(schema.clone())).unwrap_or_else(|e| panic!("{schema}: {e}"));
            compile_time += t.elapsed();
            compiles += 1;
            let w = walk(g, codec, &mut state, seed * 1000 + i as u64, 400);
            assert_valid(&schema, &w.text);
            steps += w.steps;
            time += w.mask_time;
        }
    }
    eprintln!(
        "on {} tokens: mask {:?} per step over {steps} steps, compile {:?} per schema",
        codec.vocab_size(),
        time / steps as u32,
        compile_time / compiles
    );
}

#[test]
fn refused_keywords_are_named() {
    let g = default_grammars();
    let cases = [
        (json!({"type": "integer", "if": {"minimum": 0}, "then": {"maximum": 3}, "else": {"maximum": 9}}), "keyword 'if'"),
        (json!({"type": "array", "uniqueItems": true}), "keyword 'uniqueItems'"),
        (json!({"not": {"type": "string"}}), "keyword 'not'"),
        (json!({"type": "array", "contains": {"type": "integer"}}), "keyword 'contains'"),
        (json!({"type": "object", "propertyNames": {"maxLength": 3}}), "keyword 'propertyNames'"),
        (json!({"type": "object", "dependentRequired": {"a": ["b"]}}), "keyword 'dependentRequired'"),
        (json!({"type": "object", "unevaluatedProperties": false}), "keyword 'unevaluatedProperties'"),
        // a misspelling deep inside is found, with where it is
        (
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string", "maxLenght": 3}}}}),
            "keyword 'maxLenght' (at /properties/a/items)",
        ),
        (json!({"$defs": {"d": {"type": "string", "nullable": true}}, "$ref": "#/$defs/d"}), "keyword 'nullable' (at /$defs/d)"),
        // llguidance's own refusals come through
        (json!({"type": "string", "format": "colour"}), "colour"),
        (json!({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}), "oneOf"),
        (json!({"$ref": "#/$defs/missing"}), "missing"),
        (json!(false), "matches nothing"),
        (json!(3), "must be an object"),
    ];
    for (schema, want) in cases {
        let Err(e) = g.compile(&Constraint::JsonSchema(schema.clone())) else { panic!("{schema} compiled") };
        assert!(e.message.contains(want), "{schema}: {:?} should contain {want:?}", e.message);
    }
    let Err(e) = g.compile(&Constraint::Lark("start: foo".into())) else { panic!("an undefined rule compiled") };
    assert!(e.message.contains("foo"), "{}", e.message);
}

#[test]
fn json_object_is_any_object_laid_out_compactly() {
    let (g, codec) = (default_grammars(), default_codec());
    for seed in 0..8 {
        let mut state = g.compile(&Constraint::JsonObject).unwrap();
        let w = walk(g, codec, &mut state, seed, 600);
        let v: Value = serde_json::from_str(&w.text).unwrap_or_else(|e| panic!("{:?}: {e}", w.text));
        assert!(v.is_object(), "{}", w.text);
        assert!(!w.text.contains('\n') && !w.text.starts_with(' '), "no free whitespace: {:?}", w.text);
    }
    // a client's own layout options are replaced by ours
    let mut state = g.compile(&Constraint::JsonSchema(json!({"type": "object", "x-guidance": {"whitespace_flexible": true}}))).unwrap();
    let mut logits = vec![0f32; g.n_vocab()];
    state.mask(&mut logits).unwrap();
    let newline = codec.tokenizer.token_to_id("Ċ").expect("a newline token");
    assert_eq!(logits[newline as usize], f32::NEG_INFINITY, "no newline before the object");
}

#[test]
fn a_lark_grammar_ends_by_itself_and_then_allows_only_stop_tokens() {
    let codec = tiny_codec();
    let g = Grammars::new(&codec, codec.vocab_size() + 64).unwrap();
    assert_eq!(g.n_vocab(), 384);
    for seed in 0..6 {
        let mut state = g
            .compile(&Constraint::Lark(r#"start: "yes" | "no" | "maybe " NUM  %import common.NUMBER -> NUM"#.replace("  %", "\n%")))
            .unwrap_or_else(|e| panic!("{e}"));
        let w = walk(&g, &codec, &mut state, seed, 50);
        assert!(w.text == "yes" || w.text == "no" || w.text.starts_with("maybe "), "{:?}", w.text);
    }
    // `true` leaves nothing to add: finished without a stop token
    let mut state = g.compile(&Constraint::JsonSchema(json!({"type": "boolean"}))).unwrap();
    for id in codec.encode("true").unwrap() {
        state.commit(id).unwrap();
    }
    assert!(state.is_finished());
    let mut logits = vec![1f32; 384];
    state.mask(&mut logits).unwrap();
    let allowed: Vec<u32> = (0..384u32).filter(|&i| logits[i as usize].is_finite()).collect();
    assert_eq!(allowed, codec.stop_ids.iter().copied().collect::<Vec<_>>());
    assert_eq!(logits[allowed[0] as usize], 1.0, "allowed logits keep their value");
    state.commit(allowed[0]).unwrap();
    assert!(state.commit(codec.encode("x").unwrap()[0]).is_err());
}

#[test]
fn a_forbidden_token_is_an_error_and_leaves_the_state_in_error() {
    let codec = tiny_codec();
    let g = Grammars::new(&codec, codec.vocab_size()).unwrap();
    let mut state = g.compile(&Constraint::JsonSchema(json!({"type": "integer"}))).unwrap();
    let letter = codec.encode("a").unwrap()[0];
    assert!(state.commit(letter).is_err());
    assert!(!state.is_finished());
    assert!(state.mask(&mut vec![0f32; g.n_vocab()]).is_err());
}

#[test]
fn walks_on_a_tiny_vocabulary_validate_too() {
    let codec = tiny_codec();
    let g = Grammars::new(&codec, codec.vocab_size()).unwrap();
    for (i, schema) in supported_schemas().into_iter().enumerate() {
        let mut state = g.compile(&Constraint::JsonSchema(schema.clone())).unwrap();
        let w = walk(&g, &codec, &mut state, i as u64, 400);
        assert_valid(&schema, &w.text);
    }
}

/// With a token budget, a grammar of repeated pieces (as tool calls are) ends once fewer
/// tokens are left than a piece took: only the stop ids are allowed there, where without the
/// budget the next piece may start.
#[test]
fn a_token_budget_ends_before_a_piece_it_could_not_finish() {
    let codec = tiny_codec();
    let g = Grammars::new(&codec, codec.vocab_size()).unwrap();
    let piece = codec.encode("[one two]").unwrap();
    let n = piece.len();
    assert!(n >= 2, "{piece:?}");
    let grammar = Constraint::Lark("start: piece+\npiece: \"[one two]\"\n".into());
    let only_stops = |logits: &[f32]| {
        let allowed: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        allowed == codec.stop_ids.iter().copied().collect::<Vec<_>>()
    };
    // Room for 2 pieces and part of a third, or for exactly 3.
    for (max_tokens, pieces) in [(3 * n - 1, 2), (3 * n, 3)] {
        let mut budgeted = g.compile(&grammar).unwrap().with_token_budget(max_tokens);
        let mut free = g.compile(&grammar).unwrap();
        let mut logits = vec![0f32; g.n_vocab()];
        let mut taken = 0;
        loop {
            logits.fill(0.0);
            budgeted.mask(&mut logits).unwrap();
            if only_stops(&logits) {
                break;
            }
            assert!(taken < max_tokens, "the budget of {max_tokens} ran out inside a piece");
            let token = piece[taken % n];
            assert!(logits[token as usize].is_finite(), "the piece's token {taken} is allowed");
            budgeted.commit(token).unwrap();
            free.commit(token).unwrap();
            taken += 1;
        }
        assert_eq!(taken, pieces * n, "max_tokens {max_tokens}");
        logits.fill(0.0);
        free.mask(&mut logits).unwrap();
        assert!(logits[piece[0] as usize].is_finite() && !only_stops(&logits), "without a budget another piece may start");
    }
}
