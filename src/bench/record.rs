//! What a bench run leaves behind: the full [`RunRecord`] (plan, machine, targets, every
//! cell's figures) and the compact [`HistoryEntry`] (per-cell medians) that history lists.
//! Predicted cells (edit plans) add how the server took the `prediction`, its accepted and
//! rejected tokens, and the speed-up over the same cell without it.
use serde::{Deserialize, Serialize};

use super::machine::Machine;
use super::plan::{CellSpec, Plan};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Done,
    Cancelled,
    Failed,
}

/// A server a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    pub label: String,
    pub url: String,
    /// The model name sent in requests.
    pub model: String,
    /// What the server's /v1/models reported first, when it answered.
    pub model_id: Option<String>,
    /// For mlxbar servers: version, device, model and scheduler settings from its snapshot.
    pub mlxbar: Option<serde_json::Value>,
}

/// One cell of the grid on one target. Latencies in seconds; medians and p90s are over all
/// requests of all rounds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellResult {
    pub target: String,
    #[serde(flatten)]
    pub cell: CellSpecField,
    pub requests: usize,
    pub errors: usize,
    /// First error message, if any request failed.
    pub error: Option<String>,
    /// Prompt tokens as the server counted them (median), when it reports usage.
    pub prompt_tokens_counted: Option<usize>,
    pub completion_tokens: usize,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
    /// Inter-token latency: gaps between streamed tokens.
    pub itl_p50: f64,
    pub itl_p90: f64,
    /// Time per output token after the first, per request.
    pub tpot_p50: f64,
    pub e2e_p50: f64,
    pub e2e_p90: f64,
    /// Decode tok/s one stream saw (median over streams).
    pub stream_tok_s_p50: f64,
    /// All completion tokens of a round over its wall time (median over rounds).
    pub aggregate_tok_s: f64,
    /// Prompt tokens per second of TTFT (median over requests).
    pub prompt_tok_s_p50: f64,
    /// Highest MLX active memory and server RSS seen during the cell (mlxbar targets only).
    pub peak_mlx_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    /// Worst memory pressure level seen during the cell (mlxbar targets only).
    pub pressure_max: Option<String>,
    pub wall_seconds: f64,
    /// Chip joules per prompt token over the rounds' prefill spans (round start to the last
    /// stream's first token), from the bench process's own power sampler, the same for every
    /// target; null where this machine has no power source.
    #[serde(default)]
    pub prefill_joules_per_token: Option<f64>,
    /// Chip joules per generated token after the first, over the rest of each round.
    #[serde(default)]
    pub decode_joules_per_token: Option<f64>,
    /// Completion tokens over the chip joules of the whole rounds.
    #[serde(default)]
    pub tokens_per_joule: Option<f64>,
    /// Predicted cells only: how the server took the `prediction`.
    #[serde(default)]
    pub prediction_use: Option<PredictionUse>,
    /// Median per request of `usage.completion_tokens_details.accepted_prediction_tokens`
    /// and `rejected_prediction_tokens`, where the server reports them.
    #[serde(default)]
    pub accepted_prediction_tokens: Option<usize>,
    #[serde(default)]
    pub rejected_prediction_tokens: Option<usize>,
    /// Predicted cells: the same target's e2e p50 without the prediction over this cell's
    /// (above 1: the prediction made the edit faster).
    #[serde(default)]
    pub prediction_speedup: Option<f64>,
}

/// How a server took a request's `prediction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PredictionUse {
    /// Taken, with accepted/rejected counts in usage.
    Counted,
    /// Taken without an error but no counts came back: a server that ignores the field (or
    /// one that uses it and does not say).
    Uncounted,
    /// Refused (HTTP 400/422); the request went again without it.
    Refused,
}

impl PredictionUse {
    /// For tables: what the server did with the field.
    pub fn describe(self) -> &'static str {
        match self {
            PredictionUse::Counted => "counted",
            PredictionUse::Uncounted => "sent, not counted",
            PredictionUse::Refused => "refused, sent without",
        }
    }
}

/// [`CellSpec`] flattened into [`CellResult`] (serde cannot flatten a Copy struct with a
/// default otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellSpecField {
    pub concurrency: usize,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    #[serde(default)]
    pub prediction: bool,
}

impl From<CellSpec> for CellSpecField {
    fn from(c: CellSpec) -> Self {
        CellSpecField {
            concurrency: c.concurrency,
            prompt_tokens: c.prompt_tokens,
            output_tokens: c.output_tokens,
            prediction: c.prediction,
        }
    }
}

impl CellSpecField {
    pub fn spec(&self) -> CellSpec {
        CellSpec {
            concurrency: self.concurrency,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            prediction: self.prediction,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub profile: String,
    pub plan: Plan,
    pub state: RunState,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    pub mlxbar_version: String,
    pub machine: Machine,
    pub targets: Vec<TargetInfo>,
    /// Cell by cell, target by target within a cell (the order they ran in).
    pub cells: Vec<CellResult>,
    pub error: Option<String>,
}

/// One finished run in `metrics/history/`: enough to compare runs without the full record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub id: String,
    pub profile: String,
    pub started_unix: u64,
    pub finished_unix: u64,
    pub mlxbar_version: String,
    pub machine: Machine,
    pub targets: Vec<HistoryTarget>,
    pub cells: Vec<HistoryCell>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryTarget {
    pub label: String,
    pub model: Option<String>,
    pub device: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryCell {
    pub target: String,
    #[serde(flatten)]
    pub cell: CellSpecField,
    pub aggregate_tok_s: f64,
    pub stream_tok_s_p50: f64,
    pub ttft_p50: f64,
    pub itl_p50: f64,
    pub e2e_p50: f64,
    pub errors: usize,
    /// Tokens per joule where the run read power (the popover's Bench table shows them).
    #[serde(default)]
    pub tokens_per_joule: Option<f64>,
    /// Predicted cells: see [`CellResult`]'s fields of the same names.
    #[serde(default)]
    pub accepted_prediction_tokens: Option<usize>,
    #[serde(default)]
    pub rejected_prediction_tokens: Option<usize>,
    #[serde(default)]
    pub prediction_speedup: Option<f64>,
}

impl RunRecord {
    /// A run of `plan` starting now on this machine, before any target is described.
    pub fn start(id: String, plan: &Plan, started_unix: u64) -> RunRecord {
        RunRecord {
            id,
            profile: plan.name.clone(),
            plan: plan.clone(),
            state: RunState::Running,
            started_unix,
            finished_unix: None,
            mlxbar_version: env!("CARGO_PKG_VERSION").into(),
            machine: Machine::this(),
            targets: vec![],
            cells: vec![],
            error: None,
        }
    }

    pub fn history_entry(&self) -> HistoryEntry {
        HistoryEntry {
            id: self.id.clone(),
            profile: self.profile.clone(),
            started_unix: self.started_unix,
            finished_unix: self.finished_unix.unwrap_or(self.started_unix),
            mlxbar_version: self.mlxbar_version.clone(),
            machine: self.machine.clone(),
            targets: self
                .targets
                .iter()
                .map(|t| HistoryTarget {
                    label: t.label.clone(),
                    model: t.model_id.clone(),
                    device: t.mlxbar.as_ref().and_then(|m| m["device"].as_str()).map(str::to_string),
                })
                .collect(),
            cells: self
                .cells
                .iter()
                .map(|c| HistoryCell {
                    target: c.target.clone(),
                    cell: c.cell,
                    aggregate_tok_s: c.aggregate_tok_s,
                    stream_tok_s_p50: c.stream_tok_s_p50,
                    ttft_p50: c.ttft_p50,
                    itl_p50: c.itl_p50,
                    e2e_p50: c.e2e_p50,
                    errors: c.errors,
                    tokens_per_joule: c.tokens_per_joule,
                    accepted_prediction_tokens: c.accepted_prediction_tokens,
                    rejected_prediction_tokens: c.rejected_prediction_tokens,
                    prediction_speedup: c.prediction_speedup,
                })
                .collect(),
        }
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Sortable and readable: `20261130-125300-3f9a` (UTC time, then 4 random hex digits).
pub fn new_run_id() -> String {
    let suffix: u16 = rand::random();
    format!("{}-{suffix:04x}", chrono::Utc::now().format("%Y%m%d-%H%M%S"))
}

/// Run ids name files: only the characters [`new_run_id`] produces are accepted back.
pub fn is_valid_run_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}
