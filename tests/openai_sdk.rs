//! The official openai Python SDK (pinned in scripts/sdk-venv.sh) against the real server
//! and default model: tool calling, structured output and logprobs as agents and apps use
//! them, including the SDK's own documented examples (tests/sdk/openai_agents.py). The
//! server of this binary decodes greedily by default (`default_temperature = 0`): the examples
//! set no temperature, and the test must give the same answer on every run.
mod common;

use std::process::Command;

#[test]
fn the_openai_sdk_calls_tools_parses_structured_output_and_reads_logprobs() {
    let base = common::start_server(mlxbar::Config { default_temperature: 0.0, ..common::test_config() });
    let root = env!("CARGO_MANIFEST_DIR");
    let python = common::sdk_python();
    let run = Command::new(&python).arg(format!("{root}/tests/sdk/openai_agents.py")).arg(&base).output().expect("running the SDK checks");
    common::assert_sdk_checks_passed(&run);
}
