//! The families beyond llama's, served: one server lists the tiny fixtures
//! (tests/data/tiny, whose logits tests/architectures.rs checks against mlx-lm's classes) as
//! runnable with their architecture, loads each on request, and a greedy chat through
//! `/v1/chat/completions` (its chat template, the engine's batched decode) answers what the
//! model computes step by step on the rendered prompt: a mixture of experts (qwen3_moe),
//! phi3, gemma3 from a multimodal checkpoint and from a GGUF (Gemma 3's template and
//! SentencePiece vocabulary) and gpt_oss (local attention: the prompt passes
//! their windows); and gpt-oss in its own chat format, harmony (reasoning apart from the
//! answer in every dialect, forced calls, the reasoning effort).
use std::path::Path;

mod common;

use mlxbar::engine::WeightFormat;
use mlxbar::{Config, Server};
use serde_json::{json, Value};

const MAX_TOKENS: usize = 12;

/// Model id, its path under tests/data/tiny, and the architecture the library must report.
/// The GGUF is listed by its file's stem from its folder, which [`serve`] adds.
const FAMILIES: [(&str, &str, &str); 5] = [
    ("qwen3-moe", "qwen3-moe", "qwen3_moe"),
    ("phi3", "phi3", "phi3"),
    ("gemma3-multimodal", "gemma3-multimodal", "gemma3"),
    ("model", "gemma3-gguf/model.gguf", "gemma3"),
    ("gpt-oss", "gpt-oss", "gpt_oss"),
];

/// A server on the tiny fixtures (float32), `model` loaded; its address.
async fn serve(tiny: &Path, model: &str) -> (Server, String) {
    let config = Config {
        port: 0,
        model: Some(tiny.join(model)),
        models_dirs: vec![tiny.to_path_buf(), tiny.join("gemma3-gguf")],
        weight_format: WeightFormat::Float32,
        data_dir: Some(tempfile::tempdir().unwrap().keep()),
        ..Config::default()
    };
    let server = Server::start(config).await.unwrap();
    server.wait_ready().await.unwrap();
    let base = format!("http://{}", server.local_addr());
    (server, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_family_chats_through_the_server() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    let content = "Tell me about the lighthouse keeper.";
    let (server, base) = serve(&tiny, "qwen3-moe").await;
    let models: Value = reqwest::get(format!("{base}/api/models")).await.unwrap().json().await.unwrap();
    for (id, path, arch) in FAMILIES {
        let entry = models["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap_or_else(|| panic!("{id} listed")).clone();
        assert_eq!((entry["architecture"].as_str(), entry["runnable"].as_bool()), (Some(arch), Some(true)), "{entry}");

        let (prompt_tokens, want) = tokio::task::spawn_blocking({
            let path = tiny.join(path);
            move || common::engine_greedy(&path, WeightFormat::Float32, content, MAX_TOKENS)
        })
        .await
        .unwrap();
        assert!(!want.is_empty());
        let body = json!({"model": id, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, "temperature": 0});
        let r = reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{id}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens as u64), "{id}: {v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(want.as_str()), "{id}: {v}");
    }
    server.shutdown().await;
}

/// gpt-oss's harmony format, served (tests/data/tiny/gpt-oss-harmony: gpt-oss's tokens and
/// real chat template on the tiny random weights): the official SDKs' checks of
/// tests/sdk/harmony.py (forced calls as `tool_calls`, reasoning apart from content in the
/// OpenAI, Anthropic, Responses and Ollama dialects), then the reasoning effort of each
/// dialect reaching the template (the prompt's token count is the count of the template's
/// rendering at that effort), and refused by name for a model without one; reasoning sent
/// back in each dialect reaching the template as the calling turn's analysis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpt_oss_speaks_harmony() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny");
    // The scripted answers of the SDK checks come through the engine's test hook.
    mlxbar::engine::faults::arm();
    let (server, base) = serve(&tiny, "gpt-oss-harmony").await;
    let run = tokio::task::spawn_blocking({
        let base = base.clone();
        move || {
            let root = env!("CARGO_MANIFEST_DIR");
            std::process::Command::new(common::sdk_python())
                .arg(format!("{root}/tests/sdk/harmony.py"))
                .args([&base, "gpt-oss-harmony"])
                .output()
                .expect("running the SDK checks")
        }
    })
    .await
    .unwrap();
    common::assert_sdk_checks_passed(&run);

    let codec = mlxbar::engine::tokenizer::from_hf_dir(&tiny.join("gpt-oss-harmony")).unwrap();
    let content = "Hi";
    let tokens = |effort: &str| {
        let messages = [mlxbar::engine::chat_template::ChatMessage::new("user", content)];
        let text = codec.template.as_ref().unwrap().render_with_effort(&messages, &[], true, Some(effort)).unwrap();
        codec.encode(&text).unwrap().len() as u64
    };
    assert_ne!(tokens("low"), tokens("medium"), "the efforts' prompts must differ in length for this check to tell them apart");
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| client.post(format!("{base}{path}")).json(&body).send();
    let ask = json!([{"role": "user", "content": content}]);
    for effort in ["low", "medium", "high"] {
        let body = json!({"model": "gpt-oss-harmony", "messages": ask, "max_tokens": 1, "reasoning_effort": effort});
        let v: Value = post("/v1/chat/completions", body).await.unwrap().json().await.unwrap();
        assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(tokens(effort)), "{effort}: {v}");
        let body = json!({"model": "gpt-oss-harmony", "input": content, "max_output_tokens": 16, "reasoning": {"effort": effort}});
        let v: Value = post("/v1/responses", body).await.unwrap().json().await.unwrap();
        assert_eq!(v["usage"]["input_tokens"].as_u64(), Some(tokens(effort)), "{effort}: {v}");
        assert_eq!(v["reasoning"]["effort"], effort, "{v}");
        let body = json!({"model": "gpt-oss-harmony", "messages": ask, "think": effort, "stream": false, "options": {"num_predict": 1}});
        let v: Value = post("/api/chat", body).await.unwrap().json().await.unwrap();
        assert_eq!(v["prompt_eval_count"].as_u64(), Some(tokens(effort)), "{effort}: {v}");
    }
    // think: true is gpt-oss's default effort
    let body = json!({"model": "gpt-oss-harmony", "messages": ask, "think": true, "stream": false, "options": {"num_predict": 1}});
    let v: Value = post("/api/chat", body).await.unwrap().json().await.unwrap();
    assert_eq!(v["prompt_eval_count"].as_u64(), Some(tokens("medium")), "{v}");

    // Reasoning sent back reaches the template as the turn's `thinking`: each dialect's field
    // carries the analysis of the reference case `tool_call_with_analysis`
    // (tests/data/harmony_template_reference.json, transformers' rendering, where that text
    // came as the calling turn's content, which the template renders where it renders
    // `thinking`), and the prompt has the reference's token count.
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(tiny.join("../harmony_template_reference.json")).unwrap()).unwrap();
    let case = reference["cases"].as_array().unwrap().iter().find(|c| c["name"] == "tool_call_with_analysis").unwrap().clone();
    let today = {
        let text = codec.template.as_ref().unwrap().render(&[mlxbar::engine::chat_template::ChatMessage::new("user", "x")], &[], true);
        let text = text.unwrap();
        let at = text.find("Current date: ").unwrap() + "Current date: ".len();
        text[at..at + "YYYY-MM-DD".len()].to_string()
    };
    let want = codec.encode(&case["text"].as_str().unwrap().replace(reference["date"].as_str().unwrap(), &today)).unwrap().len() as u64;
    let m = case["messages"].as_array().unwrap();
    let (system, question, analysis, result) = (&m[0]["content"], &m[1]["content"], &m[2]["content"], &m[3]["content"]);
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get_time", "{case}");
    let tools = case["tools"].as_array().unwrap();
    let functions: Vec<&Value> = tools.iter().map(|t| &t["function"]).collect();
    let chat = json!({"model": "gpt-oss-harmony", "max_tokens": 1, "tools": tools, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question},
        {"role": "assistant", "content": null, "reasoning_content": analysis,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]});
    let v: Value = post("/v1/chat/completions", chat).await.unwrap().json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"].as_u64(), Some(want), "{v}");
    let anthropic_tools: Vec<Value> =
        functions.iter().map(|f| json!({"name": f["name"], "description": f["description"], "input_schema": f["parameters"]})).collect();
    let anthropic = json!({"model": "gpt-oss-harmony", "max_tokens": 1, "system": system, "tools": anthropic_tools, "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": analysis, "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]},
    ]});
    let v: Value = post("/v1/messages", anthropic).await.unwrap().json().await.unwrap();
    // Anthropic counts the tokens read from the prefix cache apart.
    let usage = &v["usage"];
    assert_eq!(usage["input_tokens"].as_u64().zip(usage["cache_read_input_tokens"].as_u64()).map(|(a, b)| a + b), Some(want), "{v}");
    let responses_tools: Vec<Value> = functions
        .iter()
        .map(|f| json!({"type": "function", "name": f["name"], "description": f["description"], "parameters": f["parameters"]}))
        .collect();
    let responses = json!({"model": "gpt-oss-harmony", "max_output_tokens": 16, "instructions": system, "tools": responses_tools, "input": [
        {"role": "user", "content": question},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": analysis}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": result},
    ]});
    let v: Value = post("/v1/responses", responses).await.unwrap().json().await.unwrap();
    assert_eq!(v["usage"]["input_tokens"].as_u64(), Some(want), "{v}");
    let ollama = json!({"model": "gpt-oss-harmony", "stream": false, "options": {"num_predict": 1}, "tools": tools, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question},
        {"role": "assistant", "content": "", "thinking": analysis, "tool_calls": [{"function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "content": result, "tool_name": "get_time"},
    ]});
    let v: Value = post("/api/chat", ollama).await.unwrap().json().await.unwrap();
    assert_eq!(v["prompt_eval_count"].as_u64(), Some(want), "{v}");

    // A model without the control refuses each dialect's field by name; a level that is not
    // one is refused for any model.
    let refusals = [
        ("/v1/chat/completions", json!({"model": "gpt-oss", "messages": ask, "reasoning_effort": "low"}), "reasoning_effort"),
        ("/v1/chat/completions", json!({"model": "gpt-oss-harmony", "messages": ask, "reasoning_effort": "extreme"}), "reasoning_effort"),
        ("/v1/responses", json!({"model": "gpt-oss", "input": content, "reasoning": {"effort": "high"}}), "reasoning"),
        (
            "/v1/responses",
            json!({"model": "gpt-oss-harmony", "input": content, "reasoning": {"effort": "low", "summary": "verbose"}}),
            "reasoning",
        ),
        ("/api/chat", json!({"model": "gpt-oss", "messages": ask, "think": true, "stream": false}), "think"),
        ("/api/chat", json!({"model": "gpt-oss-harmony", "messages": ask, "think": "extreme", "stream": false}), "think"),
    ];
    for (path, body, field) in refusals {
        let r = post(path, body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{path} {body}");
        let v: Value = r.json().await.unwrap();
        let said = v["error"]["message"].as_str().or(v["error"].as_str()).unwrap_or_default().to_string();
        assert!(said.contains(field), "{path} {body}: {v}");
        if let Some(param) = v["error"]["param"].as_str() {
            assert_eq!(param, field, "{v}");
        }
    }
    server.shutdown().await;
}
