//! The official anthropic Python SDK (pinned in scripts/sdk-venv.sh) against the real server
//! and default model, through `/v1/messages` and `/v1/messages/count_tokens`
//! (tests/sdk/anthropic_messages.py): plain, streamed, tools, structured output, token
//! counts and errors, with the API key sent as the SDK sends it (`x-api-key`). The SDK has
//! no `temperature`: this server decodes greedily by default (`default_temperature = 0`).
mod common;

use std::process::Command;

#[test]
fn the_anthropic_sdk_creates_streams_calls_tools_and_counts_tokens() {
    let key = "anthropic-sdk-test-key";
    let base = common::start_server(mlxbar::Config { default_temperature: 0.0, api_key: Some(key.into()), ..common::test_config() });
    let root = env!("CARGO_MANIFEST_DIR");
    let python = common::sdk_python();
    let run = Command::new(&python)
        .arg(format!("{root}/tests/sdk/anthropic_messages.py"))
        .args([&base, key])
        .output()
        .expect("running the SDK checks");
    common::assert_sdk_checks_passed(&run);
}
