//! The official openai Python SDK's Responses API (pinned in scripts/sdk-venv.sh) against the
//! real server and default model, through `POST /v1/responses` (tests/sdk/openai_responses.py):
//! plain (the same greedy answer as `/v1/chat/completions`), streamed, a function tool round
//! trip, `text.format` through `responses.parse`, logprobs, `max_output_tokens`, the
//! stateless refusals, the SDK's own errors and `response.failed` mid-stream. One server,
//! decoding greedily by default (`default_temperature = 0`), so every run answers the same.
mod common;

use std::process::Command;

#[test]
fn the_openai_sdk_creates_streams_calls_functions_and_parses_responses() {
    // With an API key, as the SDK sends it (`Authorization: Bearer`): the route is guarded like the others.
    let key = "openai-responses-test-key";
    let base = common::start_server(mlxbar::Config { default_temperature: 0.0, api_key: Some(key.into()), ..common::test_config() });
    let root = env!("CARGO_MANIFEST_DIR");
    let python = common::sdk_python();
    let run = Command::new(&python)
        .arg(format!("{root}/tests/sdk/openai_responses.py"))
        .args([&base, common::QUESTION, common::ANSWER, common::FAIL_MARKER, key])
        .output()
        .expect("running the SDK checks");
    common::assert_sdk_checks_passed(&run);
}
