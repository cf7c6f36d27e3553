//! Property test of constrained decoding: for random JSON Schemas (nested objects with
//! required fields, bounded arrays and strings, enums, consts, bounded integers and numbers,
//! booleans, nulls, anyOf of two), a seeded random walk over the tokens each mask allows
//! always ends within a token budget, and what it wrote parses and validates against the
//! schema. Run on a tiny model's 320-token vocabulary and on the default model's 49k.
mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use mlxbar::engine::constraint::{Constraint, Grammars};
use mlxbar::engine::{tokenizer, TextCodec};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Bounded: few cases, shrinking capped, no regression files written.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 200, max_shrink_time: 10_000, failure_persistence: None, ..ProptestConfig::default() }
}

fn tiny() -> &'static (TextCodec, Grammars) {
    static T: OnceLock<(TextCodec, Grammars)> = OnceLock::new();
    T.get_or_init(|| {
        let codec = tokenizer::from_hf_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny/llama3-rope")).unwrap();
        let g = Grammars::new(&codec, codec.vocab_size()).unwrap();
        (codec, g)
    })
}

fn default_model() -> &'static (TextCodec, Grammars) {
    static D: OnceLock<(TextCodec, Grammars)> = OnceLock::new();
    D.get_or_init(|| {
        let codec = tokenizer::from_gguf_path(&common::model_path()).unwrap();
        let g = Grammars::new(&codec, codec.vocab_size()).unwrap();
        (codec, g)
    })
}

/// splitmix64, seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn pick(&mut self, ids: &[u32]) -> u32 {
        ids[(self.next() % ids.len() as u64) as usize]
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

fn leaf() -> impl Strategy<Value = Value> {
    let small = prop_oneof![
        "[a-z]{0,3}".prop_map(Value::from),
        (-20i64..20).prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null)
    ];
    prop_oneof![
        (-50i64..50, 0i64..30).prop_map(|(lo, k)| json!({"type": "integer", "minimum": lo, "maximum": lo + k})),
        // quarters: exact in binary, so the bounds mean the same to both sides
        (-40i64..40, 0i64..20).prop_map(|(lo, k)| json!({"type": "number", "minimum": lo as f64 / 4.0, "maximum": (lo + k) as f64 / 4.0})),
        (0u64..6, 0u64..4).prop_map(|(min, k)| json!({"type": "string", "minLength": min, "maxLength": min + k})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": "null"})),
        prop::collection::vec(small.clone(), 1..4).prop_map(|mut v| {
            v.dedup();
            json!({ "enum": v })
        }),
        small.prop_map(|v| json!({ "const": v })),
    ]
}

fn schema() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(("[a-z]{1,4}", inner.clone(), any::<bool>()), 0..4).prop_map(|fields| {
                let fields: BTreeMap<String, (Value, bool)> = fields.into_iter().map(|(k, s, r)| (k, (s, r))).collect();
                let required: Vec<&String> = fields.iter().filter(|(_, (_, r))| *r).map(|(k, _)| k).collect();
                let properties: serde_json::Map<String, Value> = fields.iter().map(|(k, (s, _))| (k.clone(), s.clone())).collect();
                json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
            }),
            (inner.clone(), 0u64..3, 0u64..3)
                .prop_map(|(items, min, k)| json!({"type": "array", "items": items, "minItems": min, "maxItems": min + k})),
            (inner.clone(), inner).prop_map(|(a, b)| json!({ "anyOf": [a, b] })),
        ]
    })
}

/// A random allowed token each step: a stop id most of the time once allowed, often a
/// closing `"`, `}` or `]` (so strings and containers end). None: over budget.
fn walk(codec: &TextCodec, g: &Grammars, schema: &Value, rng: &mut Rng, budget: usize) -> Option<String> {
    let mut state = g.compile(&Constraint::JsonSchema(schema.clone())).unwrap_or_else(|e| panic!("{schema}: {e}"));
    let closers: Vec<u32> = ["\"", "}", "]"].iter().filter_map(|t| codec.tokenizer.token_to_id(t)).collect();
    let mut logits = vec![0f32; g.n_vocab()];
    let mut out = Vec::new();
    for _ in 0..budget {
        if state.is_finished() {
            return Some(codec.tokenizer.decode(&out, false).unwrap());
        }
        logits.fill(0.0);
        state.mask(&mut logits).unwrap();
        let allowed = |ids: &mut dyn Iterator<Item = u32>| -> Vec<u32> { ids.filter(|&i| logits[i as usize].is_finite()).collect() };
        let stops = allowed(&mut codec.stop_ids.iter().copied());
        let closing = allowed(&mut closers.iter().copied());
        let token = if !stops.is_empty() && rng.chance(0.8) {
            rng.pick(&stops)
        } else if !closing.is_empty() && rng.chance(0.4) {
            rng.pick(&closing)
        } else {
            let any = allowed(&mut (0..logits.len() as u32));
            rng.pick(&any)
        };
        state.commit(token).unwrap();
        if codec.stop_ids.contains(&token) {
            assert!(state.is_finished());
            return Some(codec.tokenizer.decode(&out, false).unwrap());
        }
        out.push(token);
    }
    None
}

fn check(codec: &TextCodec, g: &Grammars, schema: &Value, rng: &mut Rng) -> Result<(), TestCaseError> {
    let text = walk(codec, g, schema, rng, 1500);
    prop_assert!(text.is_some(), "the walk did not end within the budget for {}", schema);
    let text = text.unwrap();
    let value: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{text:?} is not JSON: {e}")))?;
    let validator = jsonschema::validator_for(schema).unwrap();
    prop_assert!(
        validator.is_valid(&value),
        "{} does not match {}: {:?}",
        text,
        schema,
        validator.validate(&value).err().map(|e| e.to_string())
    );
    Ok(())
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn random_walks_match_random_schemas_on_a_tiny_vocabulary(schema in schema(), seed in any::<u64>()) {
        let (codec, g) = tiny();
        let mut rng = Rng(seed);
        check(codec, g, &schema, &mut rng)?;
    }
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn random_walks_match_random_schemas_on_the_default_vocabulary(schema in schema(), seed in any::<u64>()) {
        let (codec, g) = default_model();
        let mut rng = Rng(seed);
        check(codec, g, &schema, &mut rng)?;
    }
}
