//! Property tests (proptest) on what the outside world hands the server: model file headers
//! (GGUF, safetensors), request bodies, chat message content rendered by the template,
//! stop strings against generated text, and Host headers. Each property runs a bounded
//! number of small cases, so the whole file takes a few seconds.
mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use mlxbar::api::openai::{ChatCompletionRequest, CompletionRequest};
use mlxbar::api::security::host_allowed;
use mlxbar::engine::chat_template::{ChatMessage, ChatTemplate};
use mlxbar::engine::model::validate;
use mlxbar::engine::text_stream::{Step, TextStream};
use mlxbar::engine::{tokenizer, TextCodec};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

/// Bounded: few enough cases to stay fast, shrinking capped, no regression files written.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 2000, max_shrink_time: 10_000, failure_persistence: None, ..ProptestConfig::default() }
}

/// The default model's tokenizer and chat template (no weights are assembled).
fn codec() -> &'static TextCodec {
    static CODEC: OnceLock<TextCodec> = OnceLock::new();
    CODEC.get_or_init(|| tokenizer::from_gguf_path(&common::model_path()).unwrap())
}

// ------------------------------------------------------------------- model file headers

/// (GGML type id, block elements, block bytes) of the types the small GGUF uses.
const TYPES: &[(u32, u64, u64)] = &[(0, 1, 4), (1, 1, 2), (2, 32, 18), (3, 32, 20), (8, 32, 34), (30, 1, 2)];

/// Where one tensor info's fields sit in a built GGUF.
#[derive(Debug, Clone)]
struct InfoAt {
    dims: Vec<usize>,
    ty: usize,
    offset: usize,
}

#[derive(Debug, Clone)]
struct BuiltGguf {
    bytes: Vec<u8>,
    infos: Vec<InfoAt>,
    data_start: u64,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A small valid GGUF v3: a few metadata kinds (string, u32, arrays of strings and f32)
/// and tensors of several types, data aligned to 32 and ending exactly at the file's end.
fn build_gguf() -> BuiltGguf {
    let tensors: &[(&str, &[u64], u32)] = &[
        ("token_embd.weight", &[8, 3], 0),
        ("blk.0.attn_q.weight", &[32, 2], 2),
        ("blk.0.attn_k.weight", &[32, 1], 3),
        ("output_norm.weight", &[8], 1),
        ("blk.0.ffn_up.weight", &[64, 1], 8),
        ("blk.0.attn_norm.weight", &[4], 30),
    ];
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend(5u64.to_le_bytes());
    put_str(&mut out, "general.architecture");
    out.extend(8u32.to_le_bytes());
    put_str(&mut out, "llama");
    put_str(&mut out, "general.alignment");
    out.extend(4u32.to_le_bytes());
    out.extend(32u32.to_le_bytes());
    put_str(&mut out, "llama.block_count");
    out.extend(4u32.to_le_bytes());
    out.extend(1u32.to_le_bytes());
    put_str(&mut out, "tokenizer.ggml.tokens");
    out.extend(9u32.to_le_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend(3u64.to_le_bytes());
    for t in ["a", "b", "<s>"] {
        put_str(&mut out, t);
    }
    put_str(&mut out, "tokenizer.ggml.scores");
    out.extend(9u32.to_le_bytes());
    out.extend(6u32.to_le_bytes());
    out.extend(3u64.to_le_bytes());
    out.extend([0u8; 12]);

    let mut infos = vec![];
    let mut offset = 0u64;
    for (name, dims, ty) in tensors {
        put_str(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        let mut at = InfoAt { dims: vec![], ty: 0, offset: 0 };
        for d in *dims {
            at.dims.push(out.len());
            out.extend(d.to_le_bytes());
        }
        at.ty = out.len();
        out.extend(ty.to_le_bytes());
        at.offset = out.len();
        out.extend(offset.to_le_bytes());
        infos.push(at);
        offset = (offset + tensor_bytes(dims, *ty).unwrap()).div_ceil(32) * 32;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    let data_start = out.len() as u64;
    // The last tensor ends the file (no padding after it).
    let &(_, dims, ty) = tensors.last().unwrap();
    let last_offset = u64::from_le_bytes(out[infos.last().unwrap().offset..][..8].try_into().unwrap());
    out.resize((data_start + last_offset + tensor_bytes(dims, ty).unwrap()) as usize, 0x5a);
    BuiltGguf { bytes: out, infos, data_start }
}

/// Bytes of a tensor in the file, by the test's own table; None for a type it does not know
/// or a row that is not whole blocks.
fn tensor_bytes(dims: &[u64], ty: u32) -> Option<u64> {
    let &(_, block, bytes) = TYPES.iter().find(|t| t.0 == ty)?;
    if dims.first().is_some_and(|d| d % block != 0) {
        return None;
    }
    let numel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    (numel / block).checked_mul(bytes)
}

fn check_gguf(b: &[u8]) -> anyhow::Result<validate::GgufSummary> {
    validate::gguf(b, b.len() as u64)
}

/// Whatever validation accepts must not bring MLX's reader down: open it for real (an
/// error is fine, a crash fails the whole test binary).
fn mlx_opens_gguf_without_crashing(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    let _ = mlx_rs::io::GgufFile::load(&p);
}

#[test]
fn the_default_model_and_the_built_gguf_pass() {
    let started = std::time::Instant::now();
    let s = validate::gguf_file(&common::model_path()).unwrap();
    assert_eq!(s.version, 3);
    assert!(s.tensors > 200, "{s:?}");
    assert!(started.elapsed().as_secs_f64() < 2.0, "checking the header reads no tensor data");
    let built = build_gguf();
    let s = check_gguf(&built.bytes).unwrap();
    assert_eq!((s.tensors, s.metadata_entries, s.data_start), (6, 5, built.data_start));
    mlx_opens_gguf_without_crashing(&built.bytes);
}

#[test]
fn safetensors_written_by_mlx_pass() {
    use mlx_rs::Array;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = Array::from_slice(&[7i32, 8], &[2]);
    Array::save_safetensors([("a", &a), ("b", &b)], None, &p).unwrap();
    let raw = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let s = validate::safetensors_file(&p).unwrap_or_else(|e| panic!("{e:#}: {}", String::from_utf8_lossy(&raw[8..8 + n])));
    assert_eq!((s.tensors, s.data_bytes), (2, 32));
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn random_bytes_never_panic_the_checks(mut bytes in prop::collection::vec(any::<u8>(), 0..1024), gguf_head in any::<bool>()) {
        if gguf_head {
            // Past the magic and version, so the walk goes deeper.
            bytes.splice(0..0, b"GGUF\x03\0\0\0".iter().copied());
        }
        if check_gguf(&bytes).is_ok() {
            mlx_opens_gguf_without_crashing(&bytes);
        }
        let _ = validate::safetensors(&bytes[..], bytes.len() as u64);
    }

    #[test]
    fn a_truncated_gguf_is_always_refused(cut in any::<Index>()) {
        let built = build_gguf();
        let cut = cut.index(built.bytes.len());
        let err = check_gguf(&built.bytes[..cut]).unwrap_err().to_string();
        if cut as u64 > built.data_start {
            prop_assert!(err.starts_with("GGUF truncated: tensor "), "{err}");
        }
    }

    #[test]
    fn byte_mutations_of_a_gguf_never_panic(edits in prop::collection::vec((any::<Index>(), any::<u8>()), 1..6)) {
        let mut bytes = build_gguf().bytes;
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if check_gguf(&bytes).is_ok() {
            mlx_opens_gguf_without_crashing(&bytes);
        }
    }

    /// One tensor gets random dims, type and offset: validation accepts exactly when the
    /// test's own arithmetic says the tensor is whole-block, aligned, inside the file and
    /// clear of the others.
    #[test]
    fn a_tensor_info_is_accepted_only_when_it_fits(
        which in any::<Index>(),
        dims in prop::collection::vec(prop_oneof![0u64..80, any::<u64>()], 2),
        ty in prop_oneof![prop::sample::select(vec![0u32, 1, 2, 3, 8, 30]), 0u32..48],
        offset in prop_oneof![(0u64..12).prop_map(|k| k * 32), 0u64..400, any::<u64>()],
    ) {
        let built = build_gguf();
        let t = which.index(built.infos.len());
        let mut bytes = built.bytes.clone();
        let at = &built.infos[t];
        let dims = &dims[..at.dims.len()];
        for (pos, d) in at.dims.iter().zip(dims) {
            bytes[*pos..pos + 8].copy_from_slice(&d.to_le_bytes());
        }
        bytes[at.ty..at.ty + 4].copy_from_slice(&ty.to_le_bytes());
        bytes[at.offset..at.offset + 8].copy_from_slice(&offset.to_le_bytes());
        let result = check_gguf(&bytes);
        if !TYPES.iter().any(|k| k.0 == ty) {
            // Types outside the test's table: only "no panic, nothing past the end".
            if result.is_ok() {
                mlx_opens_gguf_without_crashing(&bytes);
            }
            return Ok(());
        }
        // Every tensor's byte range by the test's own reading of the built file.
        let ranges: Vec<Option<(u64, u64)>> = built.infos.iter().map(|info| {
            let read = |p: usize| u64::from_le_bytes(bytes[p..p + 8].try_into().unwrap());
            let ds: Vec<u64> = info.dims.iter().map(|&p| read(p)).collect();
            if ds.iter().any(|&d| d > i64::MAX as u64) {
                return None;
            }
            let ty = u32::from_le_bytes(bytes[info.ty..info.ty + 4].try_into().unwrap());
            let off = read(info.offset);
            let n = tensor_bytes(&ds, ty)?;
            let start = built.data_start.checked_add(off)?;
            (off % 32 == 0).then_some((start, start.checked_add(n)?))
        }).collect();
        let mut fits = ranges.iter().all(|r| r.is_some_and(|(_, e)| e <= bytes.len() as u64));
        if fits {
            let mut sorted: Vec<(u64, u64)> = ranges.iter().map(|r| r.unwrap()).collect();
            sorted.sort();
            fits = sorted.windows(2).all(|w| w[0].1 <= w[1].0);
        }
        prop_assert_eq!(result.is_ok(), fits, "{:?}", result.err());
        if fits {
            mlx_opens_gguf_without_crashing(&bytes);
        }
    }

    /// Random safetensors headers: accepted exactly when every entry's dtype is known, its
    /// byte count matches its shape, it lies inside the data and overlaps no other.
    #[test]
    fn a_safetensors_header_is_accepted_only_when_it_is_consistent(
        entries in prop::collection::vec((
            prop::sample::select(vec!["F32", "F16", "BF16", "U8", "I64", "BOOL", "Q4", "f32"]),
            prop::collection::vec(0u64..6, 0..3),
            0u64..64,
            prop_oneof![Just(None), (0u64..64).prop_map(Some)],
        ), 0..5),
        data_len in 0usize..200,
    ) {
        let size = |d: &str| match d { "F32" => Some(4), "F16" | "BF16" => Some(2), "U8" | "BOOL" => Some(1), "I64" => Some(8), _ => None };
        let mut header = BTreeMap::new();
        let mut expect_ok = true;
        let mut ranges = vec![];
        for (i, (dtype, shape, begin, len)) in entries.iter().enumerate() {
            let numel: u64 = shape.iter().product();
            // Mostly consistent lengths, sometimes a lie.
            let nbytes = size(dtype).map(|s| s * numel);
            let span = len.or(nbytes).unwrap_or(4);
            header.insert(format!("t{i}"), json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + span]}));
            expect_ok &= nbytes == Some(span) && begin + span <= data_len as u64;
            ranges.push((*begin, begin + span));
        }
        ranges.sort();
        expect_ok &= ranges.windows(2).all(|w| w[0].1 <= w[1].0);
        let text = serde_json::to_string(&header).unwrap();
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend(text.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        let result = validate::safetensors(&bytes[..], bytes.len() as u64);
        prop_assert_eq!(result.is_ok(), expect_ok, "{} {:?}", text, result.err());
        if expect_ok {
            // MLX reads what passes (unsupported dtypes may be refused, never a crash).
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("t.safetensors");
            std::fs::write(&p, &bytes).unwrap();
            if let Ok(arrays) = mlx_rs::Array::load_safetensors(&p) {
                for a in arrays.values() {
                    let _ = a.eval();
                }
            }
        }
    }
}

// ----------------------------------------------------------------------- request parsing

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
            "top_k", "seed", "stop", "stream", "stream_options", "include_usage", "n", "role", "content",
            "type", "text",
        ]).prop_map(str::to_string),
        1 => ".{0,8}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        (0u64..10).prop_map(Value::from),
        ".{0,16}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A request that is mostly well-formed: real field names, values of any type.
fn near_request() -> impl Strategy<Value = Value> {
    let message = prop::collection::btree_map(prop::sample::select(vec!["role", "content", "name"]), json_value(), 0..3);
    (prop::collection::vec(message, 0..3), json_value(), prop::collection::btree_map(field_name(), json_value(), 0..5)).prop_map(
        |(messages, prompt, rest)| {
            let mut o: serde_json::Map<String, Value> = rest.into_iter().collect();
            o.insert("messages".into(), json!(messages));
            o.insert("prompt".into(), prompt);
            Value::Object(o)
        },
    )
}

/// Parses as the server does (serde_path_to_error over the raw bytes) and as a value.
fn parse_both(v: &Value) {
    let bytes = serde_json::to_vec(v).unwrap();
    let chat: Result<ChatCompletionRequest, _> = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes));
    let completion: Result<CompletionRequest, _> = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes));
    if let (Ok(c), Some(n)) = (&chat, v.get("max_tokens").and_then(Value::as_u64)) {
        assert_eq!(c.max_tokens, Some(n as u32));
    }
    let _ =
        (completion, serde_json::from_value::<ChatCompletionRequest>(v.clone()), serde_json::from_value::<CompletionRequest>(v.clone()));
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn any_json_parses_or_errors(v in prop_oneof![json_value(), near_request()]) {
        parse_both(&v);
    }

    #[test]
    fn any_bytes_parse_or_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _: Result<ChatCompletionRequest, _> = serde_json::from_slice(&bytes);
        let _: Result<CompletionRequest, _> = serde_json::from_slice(&bytes);
    }
}

// ------------------------------------------------------------------ chat template content

fn hostile_text() -> impl Strategy<Value = String> {
    let fragment = prop::sample::select(vec![
        "{{",
        "}}",
        "{%",
        "%}",
        "{#",
        "#}",
        "{{ 7*7 }}",
        "{% for x in range(999999999) %}",
        "{% raw %}",
        "{{ raise_exception('boom') }}",
        "{% set messages = [] %}",
        "{{ messages }}",
        "<|im_end|>",
        "<|im_start|>",
        "\0",
        "\u{202e}",
        "\u{feff}",
        "é",
        "😀",
        "\\",
        "'",
        "\"",
        "\n",
        "\r\n",
        "{{'",
        "'}}",
        " ",
    ]);
    prop_oneof![
        4 => prop::collection::vec(fragment.clone(), 0..12).prop_map(|f| f.concat()),
        2 => any::<String>(),
        1 => (fragment, 1000usize..20000).prop_map(|(f, n)| f.repeat(n)),
    ]
}

/// A template that calls Python-style methods on the role and loops with filters.
const METHOD_TEMPLATE: &str = "{% for m in messages %}[{{ m.role.upper() }}|{{ loop.index }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}";

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn message_content_is_rendered_literally(
        contents in prop::collection::vec(hostile_text(), 1..4),
        roles in prop::collection::vec(prop_oneof![prop::sample::select(vec!["user", "assistant", "system"]).prop_map(str::to_string), hostile_text()], 4),
    ) {
        let messages: Vec<ChatMessage> = contents.iter().zip(&roles).map(|(c, r)| ChatMessage::new(r.clone(), c.clone())).collect();
        let model = codec().template.as_ref().expect("the default model has a chat template");
        let local = ChatTemplate::new(METHOD_TEMPLATE.into(), None, None).unwrap();
        for (name, template) in [("model", model), ("local", &local)] {
            let out = template.render(&messages, &[], true).map_err(|e| TestCaseError::fail(format!("{name}: {e:#}")))?;
            for m in &messages {
                prop_assert!(out.contains(&m.content), "{} template dropped or changed content {:?}", name, m.content);
            }
        }
    }
}

// --------------------------------------------------------------------------- stop strings

#[derive(Debug, Clone)]
enum StopPick {
    /// A piece of the generated text itself, so stops do occur.
    Inside(Index, usize),
    Literal(String),
}

proptest! {
    #![proptest_config(config(256))]

    /// Generated text never contains a stop string; what was sent plus what is held is a
    /// prefix of the whole decoded text; a stop ends the text exactly where it begins.
    #[test]
    fn stop_strings_never_leak(
        ids in prop::collection::vec(prop_oneof![3 => 0u32..2000, 1 => 0u32..49152], 1..40),
        picks in prop::collection::vec(prop_oneof![
            2 => (any::<Index>(), 1usize..8).prop_map(|(i, n)| StopPick::Inside(i, n)),
            1 => prop_oneof![Just(String::new()), "[a-z ]{1,3}", ".{1,2}"].prop_map(StopPick::Literal),
        ], 0..3),
    ) {
        let codec = codec();
        let full = codec.decode(&ids).unwrap();
        let chars: Vec<(usize, char)> = full.char_indices().collect();
        let stops: Vec<String> = picks.iter().map(|p| match p {
            StopPick::Literal(s) => s.clone(),
            StopPick::Inside(_, _) if chars.is_empty() => "x".into(),
            StopPick::Inside(i, n) => {
                let start = i.index(chars.len());
                let end = chars.get(start + n).map_or(full.len(), |c| c.0);
                full[chars[start].0..end].to_string()
            }
        }).collect();
        let live: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();

        let mut stream = TextStream::new(stops.clone(), false);
        let mut sent = String::new();
        let mut stopped = false;
        for &id in &ids {
            let step = stream.push(codec, id).unwrap();
            let (Step::Text(t) | Step::Stopped(t)) = &step;
            sent.push_str(t);
            prop_assert!(full.starts_with(&sent), "sent {:?} is not a prefix of {:?}", sent, full);
            for s in &live {
                prop_assert!(!sent.contains(s.as_str()), "stop {:?} leaked into {:?}", s, sent);
            }
            if matches!(step, Step::Stopped(_)) {
                stopped = true;
                break;
            }
        }
        if stopped {
            let rest = &full[sent.len()..];
            prop_assert!(live.iter().any(|s| rest.starts_with(s.as_str())), "stopped at {:?} before no stop {:?}", rest, live);
        } else {
            sent.push_str(&stream.flush());
            prop_assert!(full.starts_with(&sent), "sent + held {:?} is not a prefix of {:?}", sent, full);
            for s in &live {
                prop_assert!(!sent.contains(s.as_str()), "stop {:?} in {:?} was never reported", s, sent);
            }
        }
    }
}

// ---------------------------------------------------------------------------- Host check

const LOOPBACK: &[&str] = &["localhost", "127.0.0.1", "[::1]", "::1"];

/// `name`, or `name:` followed by digits (a port), ASCII case aside.
fn is_name_with_port(host: &str, name: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let name = name.to_ascii_lowercase();
    host == name || host.strip_prefix(&format!("{name}:")).is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

fn host_header() -> impl Strategy<Value = String> {
    let base = prop::sample::select(vec![
        "localhost",
        "LocalHost",
        "127.0.0.1",
        "[::1]",
        "::1",
        "evil.example",
        "127.0.0.1.evil",
        "localhost.evil",
        "user@localhost",
        "localhost@evil.example",
        "127.0.0.1@evil",
        "mac.local",
        "MAC.LOCAL",
        "0.0.0.0",
        "127.1",
        "",
    ]);
    let tail = prop::sample::select(vec![
        "", ":80", ":8080", ":", ":abc", ".", ".evil", "@evil", "%00", "\0", " ", "/x", "#", ":80@evil", "]", "[", ":80:80",
    ]);
    prop_oneof![
        3 => (base.clone(), tail.clone()).prop_map(|(b, t)| format!("{b}{t}")),
        1 => (tail, base).prop_map(|(t, b)| format!("{t}{b}")),
        1 => ".{0,24}",
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn only_loopback_or_configured_hosts_pass(host in host_header()) {
        let loopback = LOOPBACK.iter().any(|n| is_name_with_port(&host, n));
        prop_assert!(!host_allowed(&host, &[]) || loopback, "accepted {:?}", host);
        let configured = ["mac.local".to_string()];
        let ok = loopback || is_name_with_port(&host, "mac.local");
        prop_assert!(!host_allowed(&host, &configured) || ok, "accepted {:?} with mac.local configured", host);
    }
}

/// Origins a page could send: foreign sites, other ports of loopback, lookalikes.
fn origin_header() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec!["http://", "https://", "tauri://", "file://", "", "null"]);
    let host =
        prop::sample::select(vec!["127.0.0.1", "localhost", "evil.example", "127.0.0.1.evil", "localhost", "tauri.localhost", "[::1]"]);
    let port = prop::sample::select(vec!["", ":8080", ":8081", ":80", ":18080", ":8080/", ":8080.evil"]);
    prop_oneof![
        4 => (scheme, host, port).prop_map(|(s, h, p)| format!("{s}{h}{p}")),
        1 => "[ -~]{0,30}",
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    /// A state-changing request with an Origin passes only from this server's own page
    /// (http:// + its Host), the Tauri app, or a configured origin; never when the
    /// browser says cross-site, unless configured.
    #[test]
    fn only_own_app_or_configured_origins_change_state(origin in origin_header(), cross_site in any::<bool>(), configure in any::<bool>()) {
        use axum::http::{HeaderMap, HeaderValue, Method};
        let Ok(value) = HeaderValue::from_str(&origin) else { return Ok(()) };
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:8080"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("origin", value);
        if cross_site {
            h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        }
        let configured: Vec<String> = if configure { vec!["https://evil.example".into()] } else { vec![] };
        let passed = mlxbar::api::cross_site::verdict(&Method::POST, &h, &configured).is_ok();
        let is_configured = configure && origin.eq_ignore_ascii_case("https://evil.example");
        let own = origin.eq_ignore_ascii_case("http://127.0.0.1:8080");
        let app = ["tauri://localhost", "http://tauri.localhost", "https://tauri.localhost"].contains(&origin.as_str());
        let allowed = is_configured || (!cross_site && (own || app));
        prop_assert_eq!(passed, allowed, "origin {:?} cross-site {} configured {}", origin, cross_site, configure);
    }
}

// ------------------------------------------------------------ the Anthropic translator

/// A well-formed Anthropic turn: (role, blocks) where user turns carry text and tool
/// results and assistant turns text and tool uses.
fn anthropic_turn(user: bool) -> impl Strategy<Value = Value> {
    let text = any::<String>().prop_map(|t| json!({"type": "text", "text": t}));
    let cached = any::<String>().prop_map(|t| json!({"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}));
    let block = if user {
        let result = ("[a-zA-Z0-9_]{1,12}", any::<String>(), any::<bool>()).prop_map(
            |(id, content, err)| json!({"type": "tool_result", "tool_use_id": format!("toolu_{id}"), "content": content, "is_error": err}),
        );
        prop_oneof![text, cached, result].boxed()
    } else {
        let call = ("[a-zA-Z0-9_]{1,12}", "[a-z_]{1,12}", any::<i64>())
            .prop_map(|(id, name, n)| json!({"type": "tool_use", "id": format!("toolu_{id}"), "name": name, "input": {"n": n}}));
        prop_oneof![text, call].boxed()
    };
    prop_oneof![any::<String>().prop_map(Value::String), prop::collection::vec(block, 1..5).prop_map(Value::Array),]
}

fn anthropic_request() -> impl Strategy<Value = Value> {
    let turns = prop::collection::vec((anthropic_turn(true), anthropic_turn(false)), 0..4);
    (
        turns,
        anthropic_turn(true),
        prop::option::of(any::<String>()),
        1u32..4096,
        prop::option::of(prop::sample::select(vec!["auto", "any", "none"])),
    )
        .prop_map(|(turns, last, system, max_tokens, choice)| {
            let mut messages = vec![];
            for (u, a) in turns {
                messages.push(json!({"role": "user", "content": u}));
                messages.push(json!({"role": "assistant", "content": a}));
            }
            messages.push(json!({"role": "user", "content": last}));
            let mut req = json!({"model": "default", "max_tokens": max_tokens, "messages": messages});
            if let Some(s) = system {
                req["system"] = json!(s);
            }
            if let Some(c) = choice {
                req["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
                req["tool_choice"] = json!({"type": c});
            }
            req
        })
}

/// What the core should receive from a request: per message (role, its text, its calls'
/// (id, name, input), the call it answers).
type Kept = Vec<(String, String, Vec<(String, String, Value)>, Option<String>)>;

/// What a translator kept of each message: role, text, calls (id, name, arguments), and the
/// call a tool result answers.
fn kept(messages: &[mlxbar::inference::Message]) -> Kept {
    messages
        .iter()
        .map(|m| {
            let calls = m.tool_calls.iter().map(|c| (c.id.clone(), c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect();
            (m.role.as_str().to_string(), m.text(), calls, m.tool_call_id.clone())
        })
        .collect()
}

fn expected(req: &Value) -> Kept {
    let text_of = |v: &Value| v.as_str().map(str::to_string);
    let mut out: Kept = vec![];
    if let Some(s) = req.get("system").and_then(text_of) {
        out.push(("system".into(), s, vec![], None));
    }
    for m in req["messages"].as_array().unwrap() {
        let (role, content) = (m["role"].as_str().unwrap(), &m["content"]);
        let Some(blocks) = content.as_array() else {
            out.push((role.into(), content.as_str().unwrap().into(), vec![], None));
            continue;
        };
        let (mut text, mut calls) = (String::new(), vec![]);
        for b in blocks {
            match b["type"].as_str().unwrap() {
                "text" => text.push_str(b["text"].as_str().unwrap()),
                "tool_use" => calls.push((b["id"].as_str().unwrap().into(), b["name"].as_str().unwrap().into(), b["input"].clone())),
                _ => {
                    let body = b["content"].as_str().unwrap();
                    let body = if b["is_error"] == true { format!("Error: {body}") } else { body.to_string() };
                    out.push(("tool".into(), body, vec![], Some(b["tool_use_id"].as_str().unwrap().into())));
                }
            }
        }
        // A user turn of only tool results leaves no user message; an assistant turn always is one.
        if role == "assistant" || blocks.iter().any(|b| b["type"] == "text") {
            out.push((role.into(), text, calls, None));
        }
    }
    out
}

proptest! {
    #![proptest_config(config(256))]

    /// Every well-formed request translates, keeping each message's role, text, calls
    /// (ids, names, inputs) and the call each tool result answers, in order; max_tokens and
    /// the tool choice come through.
    #[test]
    fn anthropic_requests_translate_keeping_what_they_say(req in anthropic_request()) {
        use mlxbar::api::anthropic::{request::MessagesRequest, translate};
        use mlxbar::inference::Input;
        let parsed: MessagesRequest = serde_json::from_value(req.clone()).unwrap();
        let core = translate::messages(parsed).unwrap();
        prop_assert_eq!(core.max_tokens, req["max_tokens"].as_u64().map(|n| n as usize));
        prop_assert_eq!(core.tools.is_some(), req.get("tool_choice").is_some_and(|c| c["type"] != "none"));
        let Input::Chat(messages) = core.input else { panic!("a chat") };
        let got = kept(&messages);
        prop_assert_eq!(got, expected(&req));
    }

    /// Any JSON at all: a request or an error, never a panic.
    #[test]
    fn any_json_is_an_anthropic_request_or_an_error(v in prop_oneof![json_value(), anthropic_request()]) {
        use mlxbar::api::anthropic::{request::MessagesRequest, translate};
        if let Ok(parsed) = serde_json::from_value::<MessagesRequest>(v) {
            let _ = translate::messages(parsed);
        }
    }
}

// ------------------------------------------------------------ the Responses translator

/// A well-formed Responses input item: a message (a string or text parts), a function call
/// or a call's output.
fn responses_item() -> impl Strategy<Value = Value> {
    let role = prop::sample::select(vec!["user", "system", "developer", "assistant"]);
    let message = (role, prop::option::of(prop::collection::vec(any::<String>(), 1..4)), any::<String>(), any::<bool>()).prop_map(
        |(role, parts, text, typed)| {
            let kind = if role == "assistant" { "output_text" } else { "input_text" };
            let content = match parts {
                Some(parts) => Value::Array(parts.into_iter().map(|t| json!({"type": kind, "text": t})).collect()),
                None => json!(text),
            };
            let mut m = json!({"role": role, "content": content});
            if typed {
                m["type"] = json!("message");
            }
            m
        },
    );
    let call = ("[a-zA-Z0-9]{1,12}", "[a-z_]{1,12}", any::<i64>()).prop_map(|(id, name, n)| {
        json!({"type": "function_call", "call_id": format!("call_{id}"), "name": name, "arguments": json!({"n": n}).to_string()})
    });
    let output = ("[a-zA-Z0-9]{1,12}", any::<String>())
        .prop_map(|(id, out)| json!({"type": "function_call_output", "call_id": format!("call_{id}"), "output": out}));
    prop_oneof![3 => message, 1 => call, 1 => output]
}

fn responses_request() -> impl Strategy<Value = Value> {
    let input = prop_oneof![any::<String>().prop_map(Value::String), prop::collection::vec(responses_item(), 1..6).prop_map(Value::Array)];
    let choice = prop::option::of(prop_oneof![
        prop::sample::select(vec!["auto", "required", "none"]).prop_map(Value::from),
        Just(json!({"type": "function", "name": "f"})),
    ]);
    let format = prop::option::of(prop_oneof![
        Just(json!({"type": "text"})),
        Just(json!({"type": "json_object"})),
        Just(json!({"type": "json_schema", "name": "s", "strict": true, "schema": {"type": "object"}})),
    ]);
    (input, prop::option::of(any::<String>()), prop::option::of(1u32..4096), prop::option::of(0u32..=20), choice, format, any::<bool>())
        .prop_map(|(input, instructions, max, top_logprobs, choice, format, stream)| {
            let mut req = json!({"model": "default", "input": input, "stream": stream});
            if let Some(i) = instructions {
                req["instructions"] = json!(i);
            }
            if let Some(m) = max {
                req["max_output_tokens"] = json!(m);
            }
            if let Some(n) = top_logprobs {
                req["include"] = json!(["message.output_text.logprobs"]);
                req["top_logprobs"] = json!(n);
            }
            if let Some(c) = choice {
                req["tools"] = json!([{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": null}]);
                req["tool_choice"] = c;
            }
            if let Some(f) = format {
                req["text"] = json!({"format": f});
            }
            req
        })
}

/// What the core should receive from a Responses request (as [`Kept`]): instructions first,
/// developer as system, each call joined to the assistant turn before it.
fn responses_expected(req: &Value) -> Kept {
    let mut out: Kept = vec![];
    if let Some(s) = req.get("instructions").and_then(Value::as_str) {
        out.push(("system".into(), s.into(), vec![], None));
    }
    let Some(items) = req["input"].as_array() else {
        out.push(("user".into(), req["input"].as_str().unwrap().into(), vec![], None));
        return out;
    };
    for item in items {
        match item.get("type").and_then(Value::as_str).unwrap_or("message") {
            "function_call" => {
                let call = (
                    item["call_id"].as_str().unwrap().into(),
                    item["name"].as_str().unwrap().into(),
                    serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap(),
                );
                match out.last_mut() {
                    Some(last) if last.0 == "assistant" => last.2.push(call),
                    _ => out.push(("assistant".into(), String::new(), vec![call], None)),
                }
            }
            "function_call_output" => {
                out.push(("tool".into(), item["output"].as_str().unwrap().into(), vec![], Some(item["call_id"].as_str().unwrap().into())))
            }
            _ => {
                let role = match item["role"].as_str().unwrap() {
                    "developer" => "system",
                    r => r,
                };
                let text = match &item["content"] {
                    Value::Array(parts) => parts.iter().map(|p| p["text"].as_str().unwrap()).collect(),
                    t => t.as_str().unwrap().to_string(),
                };
                out.push((role.into(), text, vec![], None));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(config(256))]

    /// Every well-formed request translates, keeping each message's role, text, calls and
    /// the call each output answers, in order; max_output_tokens, the tools' mode, the
    /// format, logprobs and stream come through, and the Response repeats tool_choice and text.
    #[test]
    fn responses_requests_translate_keeping_what_they_say(req in responses_request()) {
        use mlxbar::api::responses::{request::ResponsesRequest, translate};
        use mlxbar::engine::tools::ToolMode;
        use mlxbar::inference::{Input, OutputFormat};
        let parsed: ResponsesRequest = serde_json::from_value(req.clone()).unwrap();
        let (core, echo) = translate::translate(parsed).unwrap();
        prop_assert_eq!(core.max_tokens, req["max_output_tokens"].as_u64().map(|n| n as usize));
        prop_assert_eq!(core.stream, req["stream"] == true);
        prop_assert_eq!(core.logprobs, req["top_logprobs"].as_u64().map(|n| n as usize));
        prop_assert_eq!(echo.logprobs, core.logprobs.is_some());
        let mode = core.tools.as_ref().map(|t| t.mode.clone());
        let expected_mode = match &req["tool_choice"] {
            Value::Null => None,
            Value::String(s) if s == "none" => None,
            Value::String(s) if s == "required" => Some(ToolMode::Required),
            Value::String(_) => Some(ToolMode::Auto),
            _ => Some(ToolMode::Named("f".into())),
        };
        prop_assert_eq!(mode, expected_mode);
        let format = match req["text"]["format"]["type"].as_str() {
            Some("json_object") => Some(OutputFormat::JsonObject),
            Some("json_schema") => Some(OutputFormat::JsonSchema(json!({"type": "object"}))),
            _ => None,
        };
        prop_assert_eq!(core.format, format);
        let (auto, text) = (json!("auto"), json!({"type": "text"}));
        prop_assert_eq!(&echo.params["tool_choice"], req.get("tool_choice").unwrap_or(&auto));
        prop_assert_eq!(&echo.params["text"]["format"], req["text"].get("format").unwrap_or(&text));
        let Input::Chat(messages) = core.input else { panic!("a chat") };
        let got = kept(&messages);
        prop_assert_eq!(got, responses_expected(&req));
    }

    /// Any JSON at all: a request or an error, never a panic.
    #[test]
    fn any_json_is_a_responses_request_or_an_error(v in prop_oneof![json_value(), responses_request()]) {
        use mlxbar::api::responses::{request::ResponsesRequest, translate};
        if let Ok(parsed) = serde_json::from_value::<ResponsesRequest>(v) {
            let _ = translate::translate(parsed);
        }
    }
}

// ------------------------------------------------------------ the Ollama translator

/// A well-formed Ollama chat: turns of user text, assistant text with calls (arguments as
/// objects), tool messages naming a call's function; options and format.
fn ollama_request() -> impl Strategy<Value = Value> {
    let call = ("[a-z_]{1,12}", any::<i64>()).prop_map(|(name, n)| json!({"function": {"name": name, "arguments": {"n": n}}}));
    let turn = (any::<String>(), any::<String>(), prop::collection::vec(call, 0..3), any::<String>());
    (
        prop::collection::vec(turn, 0..4),
        any::<String>(),
        prop::option::of(any::<String>()),
        prop::option::of((0.0f32..2.0, 1i64..4096, -1i64..100, prop::collection::vec("[a-z]{1,8}", 0..3))),
        prop::option::of(prop::sample::select(vec!["json", ""])),
        any::<bool>(),
    )
        .prop_map(|(turns, last, system, options, format, stream)| {
            let mut messages = vec![];
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            for (u, a, calls, result) in turns {
                messages.push(json!({"role": "user", "content": u}));
                let names: Vec<Value> = calls.iter().map(|c| c["function"]["name"].clone()).collect();
                messages.push(json!({"role": "assistant", "content": a, "tool_calls": calls}));
                for name in names {
                    messages.push(json!({"role": "tool", "content": result, "tool_name": name}));
                }
            }
            messages.push(json!({"role": "user", "content": last}));
            let mut req = json!({"model": "m", "messages": messages, "stream": stream});
            if let Some((temperature, num_predict, top_k, stop)) = options {
                req["options"] = json!({"temperature": temperature, "num_predict": num_predict, "top_k": top_k, "stop": stop});
            }
            if let Some(f) = format {
                req["format"] = json!(f);
            }
            req
        })
}

proptest! {
    #![proptest_config(config(256))]

    /// Every well-formed chat translates keeping each message's role and text in order, the
    /// calls (names, arguments) of assistant turns, each tool message linked to a call of
    /// its function in the turn before, and the options and format as asked.
    #[test]
    fn ollama_chats_translate_keeping_what_they_say(req in ollama_request()) {
        use mlxbar::api::ollama::{request::ChatRequest, translate};
        use mlxbar::inference::{Input, OutputFormat};
        let parsed: ChatRequest = serde_json::from_value(req.clone()).unwrap();
        let t = translate::chat(parsed, "m".into()).unwrap();
        prop_assert_eq!(t.core.stream, req["stream"] == true);
        prop_assert_eq!(t.core.model.as_deref(), Some("m"));
        prop_assert_eq!(t.core.max_tokens, req["options"]["num_predict"].as_u64().map(|n| n as usize));
        prop_assert_eq!(t.core.sampling.temperature, req["options"]["temperature"].as_f64().map(|f| f as f32));
        let stop: Vec<String> = req["options"]["stop"].as_array().map(|s| s.iter().map(|v| v.as_str().unwrap().to_string()).collect()).unwrap_or_default();
        prop_assert_eq!(&t.core.stop, &stop);
        prop_assert_eq!(t.core.format.clone(), (req["format"] == "json").then_some(OutputFormat::JsonObject));
        let Input::Chat(messages) = t.core.input else { panic!("a chat") };
        let sent = req["messages"].as_array().unwrap();
        prop_assert_eq!(messages.len(), sent.len());
        let mut last_calls: Vec<(String, String)> = vec![];
        for (m, s) in messages.iter().zip(sent) {
            prop_assert_eq!(m.role.as_str(), s["role"].as_str().unwrap());
            prop_assert_eq!(m.text(), s["content"].as_str().unwrap());
            let calls: Vec<(String, Value)> = m.tool_calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect();
            let want: Vec<(String, Value)> = s["tool_calls"].as_array().map(|c| c.iter().map(|c| (c["function"]["name"].as_str().unwrap().to_string(), c["function"]["arguments"].clone())).collect()).unwrap_or_default();
            prop_assert_eq!(calls, want);
            if m.role.as_str() == "assistant" {
                last_calls = m.tool_calls.iter().map(|c| (c.id.clone(), c.name.clone())).collect();
            }
            if m.role.as_str() == "tool" {
                let id = m.tool_call_id.clone().expect("a tool message answers a call");
                let answered = last_calls.iter().find(|(i, _)| *i == id).map(|(_, n)| n.as_str());
                prop_assert_eq!(answered, s["tool_name"].as_str());
            }
        }
    }

    /// Any JSON at all: a request or an error, never a panic.
    #[test]
    fn any_json_is_an_ollama_request_or_an_error(v in prop_oneof![json_value(), ollama_request()]) {
        use mlxbar::api::ollama::{request::ChatRequest, translate};
        if let Ok(parsed) = serde_json::from_value::<ChatRequest>(v) {
            let _ = translate::chat(parsed, "m".into());
        }
    }
}
