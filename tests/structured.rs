//! Constrained decoding inside a batch, on the real engine and default model: four requests
//! decoded together, two under different JSON Schemas and two free, each answer equal to
//! what it gets alone (greedy), the constrained ones valid against their schemas, and the
//! mask's time in `/metrics`. One test in this binary, so the batch figures are its own.
mod common;

use futures::StreamExt;
use serde_json::{json, Value};

fn request(prompt: &str, schema: Option<&Value>, stream: bool) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": 48, "stream": stream,
    });
    if let Some(schema) = schema {
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}});
    }
    body
}

async fn alone(client: &reqwest::Client, base: &str, body: &Value) -> String {
    let resp = client.post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_and_free_text_decode_together_as_they_do_alone() {
    let base = common::server();
    let client = reqwest::Client::new();
    let pet = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
        },
        "required": ["name", "kind", "age"], "additionalProperties": false,
    });
    let colours = json!({
        "type": "object",
        "properties": {"colours": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3}},
        "required": ["colours"], "additionalProperties": false,
    });
    let bodies = [
        request("Describe my pet: a four-year-old cat called Tom.", Some(&pet), true),
        request("Name some colours of the rainbow.", Some(&colours), true),
        request("Write a long story about a lighthouse keeper.", None, true),
        request("Explain in detail how bread is made.", None, true),
    ];
    // Each alone twice, keeping the second: the batch below finds each prompt in the prefix
    // cache, and so must the answer it is compared with (on Metal a prompt prefilled whole
    // and one whose prefix came from the cache can part at a near-tie: agreement.rs); here
    // only batching differs.
    let mut expected = vec![];
    for body in &bodies {
        let mut b = body.clone();
        b["stream"] = json!(false);
        alone(&client, base, &b).await;
        expected.push(alone(&client, base, &b).await);
    }
    for (text, schema) in expected.iter().zip([&pet, &colours]) {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(jsonschema::is_valid(schema, &value), "{text} does not match {schema}");
    }
    let wide_before = common::metric_sum(base, "mlxbar_batch_size_count", &[]).await
        - common::metric_sum(base, "mlxbar_batch_size_bucket", &["le=\"3\""]).await;
    let masks_before = common::metric_sum(base, "mlxbar_constrained_decoding_mask_seconds_count", &[]).await;

    // All four streams open and each has its first token before any is read further: they
    // are decoding in one batch.
    let mut streams = vec![];
    for body in &bodies {
        let resp = client.post(format!("{base}/v1/chat/completions")).json(body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        streams.push(common::sse(resp));
    }
    let mut texts = vec![];
    for s in &mut streams {
        texts.push(common::read_tokens(s, 1).await.iter().map(common::chunk_text).collect::<String>());
    }
    for (s, text) in streams.iter_mut().zip(&mut texts) {
        while let Some(event) = s.next().await {
            if event.data == "[DONE]" {
                break;
            }
            text.push_str(common::chunk_text(&serde_json::from_str(&event.data).unwrap()));
        }
    }
    assert_eq!(texts, expected, "each answer in the batch equals its answer alone");
    let wide = common::metric_sum(base, "mlxbar_batch_size_count", &[]).await
        - common::metric_sum(base, "mlxbar_batch_size_bucket", &["le=\"3\""]).await;
    assert!(wide > wide_before, "some decode steps ran all four together");
    let masks = common::metric_sum(base, "mlxbar_constrained_decoding_mask_seconds_count", &[]).await;
    assert!(masks > masks_before, "the mask time is measured");
}
