//! JSON Schemas before llguidance sees them: every keyword checked against the ones it
//! honours (llguidance silently ignores keywords its drafts do not define, so a typo such as
//! `maxLenght` would otherwise loosen the constraint without a word), and our JSON layout
//! options attached.
use serde_json::{json, Map, Value};

use super::ConstraintError;

/// Keywords that constrain the output, all enforced by llguidance.
pub const SUPPORTED: &[&str] = &[
    // core
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    // arrays
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    // objects
    "properties",
    "additionalProperties",
    "patternProperties",
    "required",
    "minProperties",
    "maxProperties",
    // strings
    "minLength",
    "maxLength",
    "pattern",
    "format",
    // numbers
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// Keywords that only name, describe or hold definitions: accepted, they constrain nothing
/// by themselves. (`discriminator` is OpenAPI's, which pydantic emits beside `oneOf`.)
pub const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "id",
    "$anchor",
    "$defs",
    "definitions",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    "discriminator",
];

/// Longest JSON Schema a request may carry (serialized, all of a request's tools together):
/// compiling it costs time on a preparation thread, and llguidance's own limits
/// ([`super::limits`]) bound the grammar it becomes.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

/// `schema`'s length as compact JSON, or None once it passes `cap` (counted without
/// building the text).
pub fn serialized_len(schema: &Value, cap: usize) -> Option<usize> {
    struct Count(usize, usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            if self.0 > self.1 {
                return Err(std::io::Error::other("over the cap"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0, cap);
    serde_json::to_writer(&mut count, schema).ok().map(|_| count.0)
}

/// Our layout for JSON output (llguidance's `x-guidance` options): no free whitespace (the
/// default lets a model pad with newlines forever), a separator may be followed by one space
/// (models tend to write `"a": 1, "b": 2`), so the output stays short and bounded.
pub fn layout() -> Value {
    json!({ "whitespace_flexible": false, "item_separator": ", ?", "key_separator": ": ?" })
}

/// `schema` checked (see [`check`]) and with our layout options, ready for llguidance,
/// directly or embedded in a Lark grammar as `%json { ... }`.
pub fn prepare(schema: &Value) -> Result<Value, ConstraintError> {
    let mut root: Map<String, Value> = match schema {
        Value::Object(map) => map.clone(),
        Value::Bool(true) => Map::new(),
        Value::Bool(false) => return Err(ConstraintError::new("the JSON Schema `false` matches nothing")),
        _ => return Err(ConstraintError::new("a JSON Schema must be an object or a boolean")),
    };
    // Ours win over any `x-guidance` a client sent: they are not part of the API.
    root.remove("x-guidance");
    let root = Value::Object(root);
    check(&root)?;
    let mut prepared = root;
    prepared.as_object_mut().expect("an object").insert("x-guidance".into(), layout());
    Ok(prepared)
}

/// Err names the first keyword (in key order, depth first) that is neither in [`SUPPORTED`]
/// nor in [`ANNOTATIONS`], with where it is; `x-*` extension keys are ignored.
pub fn check(schema: &Value) -> Result<(), ConstraintError> {
    walk(schema, &mut String::new())
}

fn walk(schema: &Value, path: &mut String) -> Result<(), ConstraintError> {
    // Non-schema values (a number where a schema should be) are llguidance's to reject.
    let Value::Object(map) = schema else { return Ok(()) };
    for (key, value) in map {
        if key.starts_with("x-") {
            continue;
        }
        if !SUPPORTED.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
            let at = if path.is_empty() { String::new() } else { format!(" (at {path})") };
            return Err(ConstraintError::new(format!("unsupported JSON Schema keyword '{key}'{at}")));
        }
        let len = path.len();
        path.push('/');
        path.push_str(key);
        let r = match key.as_str() {
            // one schema (or, for `items` in older drafts, a list of them)
            "items" | "additionalItems" | "additionalProperties" => match value {
                Value::Array(list) => each(list, path),
                v => walk(v, path),
            },
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => match value {
                Value::Array(list) => each(list, path),
                _ => Ok(()),
            },
            // name -> schema
            "properties" | "patternProperties" | "$defs" | "definitions" => match value {
                Value::Object(named) => named.iter().try_for_each(|(name, s)| {
                    let len = path.len();
                    path.push('/');
                    path.push_str(name);
                    let r = walk(s, path);
                    path.truncate(len);
                    r
                }),
                _ => Ok(()),
            },
            // data (enum, const, default, examples) and scalars
            _ => Ok(()),
        };
        path.truncate(len);
        r?;
    }
    Ok(())
}

fn each(list: &[Value], path: &mut String) -> Result<(), ConstraintError> {
    list.iter().enumerate().try_for_each(|(i, s)| {
        let len = path.len();
        path.push_str(&format!("/{i}"));
        let r = walk(s, path);
        path.truncate(len);
        r
    })
}
