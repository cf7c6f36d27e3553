//! The GGUF-built tokenizer and chat template against the HF tokenizer mlx-lm used
//! (ids recorded in tests/data/reference.json), against llama.cpp's own tokenizer on the
//! reference prompts and hostile strings (tests/data/tokenizer_reference.json), gpt-oss's
//! harmony template against transformers (tests/data/harmony_template_reference.json),
//! SentencePiece GGUF vocabularies against llama.cpp's tokenizer test data and the official
//! sentencepiece library, and incremental decoding with stop strings.
mod common;

use mlxbar::engine::chat_template::ChatMessage;
use mlxbar::engine::text_stream::{Step, TextStream};
use mlxbar::engine::{loader, TextCodec, WeightFormat};

fn codec() -> TextCodec {
    // The codec comes with the model; the format does not matter for it.
    let (_, codec, _) = loader::load(&common::model_path(), WeightFormat::Float32).unwrap();
    codec
}

#[test]
fn encodes_like_the_hf_tokenizer_and_round_trips() {
    let codec = codec();
    for s in common::reference()["tokenizer_samples"].as_array().unwrap() {
        let text = s["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(s["ids"].clone()).unwrap();
        let ids = codec.encode(text).unwrap();
        assert_eq!(ids, want, "ids of {text:?}");
        // special tokens are dropped by decode, everything else comes back byte for byte
        let back = codec.tokenizer.decode(&ids, false).unwrap();
        assert_eq!(back, text);
    }
    // digits split one by one (pre-tokenizer "smollm")
    let ids = codec.encode("2026").unwrap();
    assert_eq!(ids.len(), 4);
}

/// llama.cpp's tokenizer (its C++ BPE and "smollm" pre-tokenizer, through llama-cpp-python
/// on the same GGUF: scripts/reference/make_tokenizer_reference.py) shares nothing with
/// mlxbar's, unlike reference.json's samples, made by a converter with mlxbar's recipe. The
/// same ids on the rendered reference prompts and on emoji, CJK and other scripts, combining
/// marks, digit runs, control characters, Unicode whitespace and special-token text; and the
/// ids decode back to the text.
#[test]
fn encodes_like_llama_cpp_on_prompts_and_hostile_strings() {
    let codec = codec();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tokenizer_reference.json");
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let samples = reference["samples"].as_array().unwrap();
    assert!(samples.len() >= 40, "{} samples", samples.len());
    let mut wrong = Vec::new();
    for s in samples {
        let text = s["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(s["ids"].clone()).unwrap();
        let ids = codec.encode(text).unwrap();
        if ids != want {
            wrong.push(format!("{text:?}: mlxbar {ids:?}, llama.cpp {want:?}"));
        }
        assert_eq!(codec.tokenizer.decode(&ids, false).unwrap(), text, "round trip of {text:?}");
    }
    assert!(wrong.is_empty(), "{} of {} differ:\n{}", wrong.len(), samples.len(), wrong.join("\n"));
}

#[test]
fn chat_template_renders_like_transformers() {
    let codec = codec();
    let template = codec.template.as_ref().expect("the GGUF carries a chat template");
    for case in common::reference()["prompts"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let text = template.render(&messages, &[], true).unwrap();
        assert_eq!(text, case["rendered"].as_str().unwrap());
        let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(codec.encode(&text).unwrap(), ids);
    }
    // <|im_end|> (the template's end of turn) ends generation, as EOS id 2 does
    let im_end = codec.tokenizer.token_to_id("<|im_end|>").unwrap();
    assert!(codec.stop_ids.contains(&im_end));
}

/// gpt-oss's real chat template (the harmony fixture's chat_template.jinja) renders, through
/// the loader, exactly as transformers' apply_chat_template renders it with Python jinja2
/// (scripts/reference/make_harmony_template_reference.py): tools as its TypeScript namespace,
/// system and developer messages, `reasoning_effort`, calls and tool results in history. Its
/// turn ends on `<|return|>` and `<|call|>`, never on `<|end|>`, which only closes a message.
#[test]
fn harmony_template_renders_like_transformers() {
    use mlxbar::engine::tools::ToolSpec;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let codec = mlxbar::engine::tokenizer::from_hf_dir(&root.join("tests/data/tiny/gpt-oss-harmony")).unwrap();
    let template = codec.template.as_ref().expect("chat_template.jinja");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tests/data/harmony_template_reference.json")).unwrap()).unwrap();
    let date = reference["date"].as_str().unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Vec<ToolSpec> = case["tools"]
            .as_array()
            .map(|t| t.iter().map(|t| &t["function"]))
            .into_iter()
            .flatten()
            .map(|f| ToolSpec {
                name: f["name"].as_str().unwrap().into(),
                description: f["description"].as_str().map(String::from),
                parameters: f["parameters"].clone(),
            })
            .collect();
        let text = template.render_with_effort(&messages, &tools, true, case["reasoning_effort"].as_str()).unwrap();
        // The template prints today's date; the reference has a placeholder there.
        let at = text.find("Current date: ").unwrap() + "Current date: ".len();
        let text = format!("{}{date}{}", &text[..at], &text[at + "YYYY-MM-DD".len()..]);
        assert_eq!(text, case["text"].as_str().unwrap(), "{}", case["name"]);
    }
    let id = |t: &str| codec.tokenizer.token_to_id(t).unwrap();
    assert!(codec.stop_ids.contains(&id("<|return|>")) && codec.stop_ids.contains(&id("<|call|>")));
    assert!(!codec.stop_ids.contains(&id("<|end|>")));
}

fn stream_all(codec: &TextCodec, text: &str, stops: &[&str]) -> (String, bool) {
    let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect(), false);
    let mut out = String::new();
    for id in codec.encode(text).unwrap() {
        match s.push(codec, id).unwrap() {
            Step::Text(t) => out.push_str(&t),
            Step::Stopped(t) => {
                out.push_str(&t);
                return (out, true);
            }
        }
    }
    out.push_str(&s.flush());
    (out, false)
}

#[test]
fn text_stream_rebuilds_text_and_cuts_at_stop_strings() {
    let codec = codec();
    let text = "Unicode: café, 日本語 🚀 and the end.";
    assert_eq!(stream_all(&codec, text, &[]), (text.to_string(), false));
    // a stop string spanning several tokens cuts before it
    assert_eq!(stream_all(&codec, "one two three four", &["three f"]), ("one two ".to_string(), true));
    // a partial match that never completes is released at the end
    assert_eq!(stream_all(&codec, "one two thr", &["three"]), ("one two thr".to_string(), false));
    // multi-byte stop string
    assert_eq!(stream_all(&codec, "a 日本語 b", &["本"]), ("a 日".to_string(), true));
}

#[test]
fn text_stream_says_which_stop_string_ended_it() {
    let codec = codec();
    let mut s = TextStream::new(vec!["four".into(), "two".into(), "".into()], false);
    let mut sent = String::new();
    for id in codec.encode("one two three four").unwrap() {
        match s.push(&codec, id).unwrap() {
            Step::Text(t) => sent.push_str(&t),
            Step::Stopped(t) => {
                sent.push_str(&t);
                break;
            }
        }
    }
    assert_eq!(sent, "one ");
    // The earliest in the text, not the first in the list.
    assert_eq!(s.matched_stop(), Some("two"));
    let mut none = TextStream::new(vec!["zzz".into()], false);
    for id in codec.encode("one two").unwrap() {
        none.push(&codec, id).unwrap();
    }
    assert_eq!(none.matched_stop(), None);
}

#[test]
fn text_stream_never_sends_a_held_back_prefix() {
    let codec = codec();
    let mut s = TextStream::new(vec!["END".into()], false);
    let mut sent = String::new();
    for id in codec.encode("alpha EN").unwrap() {
        if let Step::Text(t) = s.push(&codec, id).unwrap() {
            sent.push_str(&t);
        }
    }
    assert!(!sent.contains("EN"), "held back: {sent:?}");
    assert_eq!(sent + &s.flush(), "alpha EN");
}

/// The tokenizer of a GGUF vocabulary alone (llama.cpp's `ggml-vocab-*.gguf` files carry no
/// tensors).
fn gguf_codec(path: &std::path::Path) -> TextCodec {
    mlxbar::engine::tokenizer::from_gguf_path(path).unwrap()
}

/// SentencePiece vocabularies as GGUF (`tokenizer.ggml.model = "llama"`): Llama 2's (space
/// prefix) and Phi-3's, from llama.cpp's own tokenizer tests (tests/data/vocab, copied from
/// the llama.cpp sources llama-cpp-python 0.3.36 vendors: `models/ggml-vocab-*.gguf` with the
/// `.inp` texts and the `.out` ids that `convert_hf_to_gguf_update.py` recorded from
/// transformers' tokenizer and llama.cpp's test-tokenizer-0 holds its own to). Every text
/// encodes to those ids, without BOS as the test asks, and decodes back.
#[test]
fn sentencepiece_ggufs_encode_as_llama_cpp_tests_record() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vocab");
    for name in ["ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"] {
        let codec = gguf_codec(&dir.join(name));
        let inputs = std::fs::read_to_string(dir.join(format!("{name}.inp"))).unwrap();
        let outputs = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
        // Texts end with the separator, as test-tokenizer-0 reads them.
        let texts: Vec<&str> = inputs.split_terminator("\n__ggml_vocab_test__\n").collect();
        let ids: Vec<Vec<u32>> = outputs.lines().map(|l| l.split_whitespace().map(|i| i.parse().unwrap()).collect()).collect();
        assert_eq!(texts.len(), ids.len(), "{name}");
        assert!(texts.len() >= 40, "{name}: {} texts", texts.len());
        let mut wrong = Vec::new();
        for (text, want) in texts.iter().zip(&ids) {
            let got = codec.tokenizer.encode_fast(*text, false).unwrap().get_ids().to_vec();
            if &got != want {
                wrong.push(format!("{text:?}: mlxbar {got:?}, reference {want:?}"));
            }
            assert_eq!(codec.decode_with(&got, false).unwrap(), *text, "{name}: round trip of {text:?}");
        }
        assert!(wrong.is_empty(), "{name}: {} of {} differ:\n{}", wrong.len(), texts.len(), wrong.join("\n"));
        // BOS leads a prompt (add_bos_token), once.
        let bos = codec.bos.as_ref().unwrap().0;
        assert_eq!(codec.encode("Hello world").unwrap()[0], bos, "{name}");
    }
}

/// Gemma 3's kind of SentencePiece vocabulary (no space prefix, byte fallback, turn markers
/// matched whole) in the gemma3-gguf fixture: the official sentencepiece library's ids and
/// text for the hostile strings of tokenizer_reference.json and a chat turn (recorded by
/// scripts/reference/make_tiny_models.py), Gemma 3's template, and `<end_of_turn>` ending
/// generation.
#[test]
fn gemma3_gguf_encodes_like_sentencepiece() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny/gemma3-gguf");
    let codec = gguf_codec(&dir.join("model.gguf"));
    let reference: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let samples = reference["tokenizer_samples"].as_array().unwrap();
    assert!(samples.len() >= 44, "{} samples", samples.len());
    let mut wrong = Vec::new();
    for s in samples {
        let text = s["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(s["ids"].clone()).unwrap();
        let got = codec.tokenizer.encode_fast(text, false).unwrap().get_ids().to_vec();
        if got != want {
            wrong.push(format!("{text:?}: mlxbar {got:?}, sentencepiece {want:?}"));
        }
        assert_eq!(codec.decode_with(&got, false).unwrap(), s["decoded"].as_str().unwrap(), "text of {text:?}");
    }
    assert!(wrong.is_empty(), "{} of {} differ:\n{}", wrong.len(), samples.len(), wrong.join("\n"));
    let template = codec.template.as_ref().expect("Gemma 3's chat template");
    let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there "}
    ]))
    .unwrap();
    let text = template.render(&messages, &[], true).unwrap();
    assert_eq!(text, "<s><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n");
    let ids = codec.encode(&text).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1, "one BOS (<s>, id 2): {ids:?}");
    let end = codec.tokenizer.token_to_id("<end_of_turn>").unwrap();
    assert!(codec.stop_ids.contains(&end) && codec.stop_ids.contains(&1), "{:?}", codec.stop_ids);
}
