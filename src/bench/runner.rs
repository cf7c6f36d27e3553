//! Runs a plan against one or more OpenAI-compatible targets, interleaved cell by cell
//! (every target does cell 1, then every target does cell 2, ...) so drift on a shared
//! machine hits all of them alike. Progress goes out on a watch channel; dropping the
//! future cancels the requests in flight (the servers see the streams close).
//! Requests are the plan's workload: synthetic prompts, or the edit request, whose predicted
//! cells carry a `prediction`; a server that refuses the field (HTTP 400/422) gets the request
//! again without it and its row says so. A predicted cell's speed-up is against the same
//! target's cell without the prediction.
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use super::client::{timed_chat_predicted, HttpStatus, RunTiming, Target};
use super::plan::{CellSpec, Plan, Workload};
use super::quantile;
use super::record::{CellResult, PredictionUse, TargetInfo};
use super::{edit, prompt};
use crate::telemetry::power::monitor::PowerMonitor;

/// Live progress of a run, as `GET /api/bench/{id}` and the CLI's progress bar show it.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Progress {
    /// Cells finished, counting each target's run of a cell once.
    pub cells_done: usize,
    pub cells_total: usize,
    pub requests_done: usize,
    pub requests_total: usize,
    pub current: Option<CurrentCell>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CurrentCell {
    pub target: String,
    pub label: String,
    #[serde(flatten)]
    pub cell: CellSpec,
    /// "warmup" or "round 2/3".
    pub phase: String,
}

/// Asks a target what it is: its first model id, and for mlxbar its snapshot's
/// version, device, model and scheduler settings. Never fails: unknown stays None.
pub async fn describe(client: &reqwest::Client, t: &Target) -> TargetInfo {
    let get = |path: &str| {
        let url = format!("{}{path}", t.base_url);
        async move {
            let r = client.get(url).timeout(Duration::from_secs(10)).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            r.json::<Value>().await.ok()
        }
    };
    let model_id = get("/v1/models").await.and_then(|v| v.pointer("/data/0/id").and_then(Value::as_str).map(str::to_string));
    let mlxbar = get("/api/metrics/snapshot").await.filter(|s| s.get("version").is_some() && s.get("scheduler").is_some()).map(|s| {
        serde_json::json!({
            "version": s["version"], "device": s["device"],
            "model": s.pointer("/models/0/info").cloned().unwrap_or(Value::Null),
            "scheduler": s["scheduler"],
        })
    });
    TargetInfo { label: t.label.clone(), url: t.base_url.clone(), model: t.model.clone(), model_id, mlxbar }
}

/// Every cell of `plan` on every target; finished cells are pushed to `results` as they
/// complete, so a cancelled run keeps what it measured. `power` is this process's power
/// sampler: each cell's joules per token come from it, for every target alike.
pub async fn run_plan(
    client: &reqwest::Client,
    targets: &[TargetInfo],
    plan: &Plan,
    progress: &watch::Sender<Progress>,
    results: &mut Vec<CellResult>,
    power: &PowerMonitor,
) -> Result<()> {
    let cells = plan.cells();
    progress.send_modify(|p| {
        p.cells_total = cells.len() * targets.len();
        p.requests_total = plan.total_requests() * targets.len();
    });
    for (index, &cell) in cells.iter().enumerate() {
        for t in targets {
            let mut r = run_cell(client, t, plan, index, cell, progress, power).await;
            progress.send_modify(|p| p.cells_done += 1);
            if cell.prediction {
                let without = results.iter().find(|b| b.target == r.target && b.cell.spec() == cell.unpredicted());
                r.prediction_speedup = without.and_then(|w| prediction_speedup(w, &r));
            }
            results.push(r);
        }
    }
    progress.send_modify(|p| p.current = None);
    if results.iter().all(|c| c.errors == c.requests) {
        let first = results.iter().find_map(|c| c.error.clone()).unwrap_or_default();
        anyhow::bail!("every request failed; the first: {first}");
    }
    Ok(())
}

async fn run_cell(
    client: &reqwest::Client,
    info: &TargetInfo,
    plan: &Plan,
    index: usize,
    cell: CellSpec,
    progress: &watch::Sender<Progress>,
    power: &PowerMonitor,
) -> CellResult {
    let t = Target { label: info.label.clone(), base_url: info.url.clone(), model: info.model.clone() };
    let set_phase = |phase: String| {
        progress.send_modify(|p| p.current = Some(CurrentCell { target: t.label.clone(), label: cell.label(), cell, phase }));
    };
    set_phase("warmup".into());
    for w in 0..plan.warmup {
        // Warm-ups use their own prompts (round numbers past the timed ones).
        let (messages, prediction) = request(plan, cell, index, 1000 + w, 0);
        let _ = chat(client, &t, &messages, cell.output_tokens.min(8), prediction.as_ref()).await;
        progress.send_modify(|p| p.requests_done += 1);
    }
    let mut peaks = Peaks::default();
    let mut rounds = vec![];
    let mut spans = vec![];
    let measure = async {
        for round in 0..plan.repetitions {
            set_phase(format!("round {}/{}", round + 1, plan.repetitions));
            let start = Instant::now();
            let start_at = power.now();
            let runs = futures::future::join_all((0..cell.concurrency).map(|s| {
                let (messages, prediction) = request(plan, cell, index, round, s);
                let t = &t;
                async move {
                    let r = chat(client, t, &messages, cell.output_tokens, prediction.as_ref()).await;
                    progress.send_modify(|p| p.requests_done += 1);
                    r
                }
            }))
            .await;
            let elapsed = start.elapsed();
            // prefill ends when the last stream has its first token
            let prefill = runs.iter().flatten().map(|r| r.ttft.as_secs_f64()).fold(0.0, f64::max).min(elapsed.as_secs_f64());
            spans.push(RoundSpan { start: start_at, prefill_end: start_at + prefill, end: start_at + elapsed.as_secs_f64() });
            rounds.push((elapsed, runs));
        }
    };
    if info.mlxbar.is_some() {
        tokio::select! {
            _ = measure => {},
            _ = peaks.follow(client, &t.base_url) => {},
        }
        peaks.sample(client, &t.base_url).await;
    } else {
        measure.await;
    }
    let energy = round_energy(power, &spans).await;
    let mut r = summarize(&t.label, cell, &rounds, peaks);
    r.set_energy(&energy);
    r
}

/// One request of a cell: its messages and, in a predicted cell, its `prediction`.
fn request(plan: &Plan, cell: CellSpec, index: usize, round: usize, stream: usize) -> (Value, Option<Value>) {
    match plan.workload {
        Workload::Synthetic => (prompt::messages(cell.prompt_tokens, index, round, stream), None),
        Workload::Edit => (edit::messages(index, round, stream), cell.prediction.then(edit::prediction)),
    }
}

/// [`timed_chat_predicted`], sent again without the `prediction` if the server refuses the request
/// with it (HTTP 400 or 422: a server that rejects fields it does not know).
async fn chat(client: &reqwest::Client, t: &Target, messages: &Value, max_tokens: usize, prediction: Option<&Value>) -> Result<RunTiming> {
    let first = timed_chat_predicted(client, t, messages, max_tokens, prediction).await;
    match first {
        Err(e) if prediction.is_some() && e.downcast_ref::<HttpStatus>().is_some_and(|h| matches!(h.status, 400 | 422)) => {
            let mut r = timed_chat_predicted(client, t, messages, max_tokens, None).await?;
            r.prediction_refused = true;
            Ok(r)
        }
        other => other,
    }
}

/// A predicted cell's speed-up: end-to-end p50 without the prediction over with it (above 1:
/// faster with it). None unless both cells had a request succeed.
fn prediction_speedup(without: &CellResult, with: &CellResult) -> Option<f64> {
    let ok = |c: &CellResult| c.requests > c.errors && c.e2e_p50 > 0.0;
    (ok(without) && ok(with)).then(|| without.e2e_p50 / with.e2e_p50)
}

/// A round on the power sampler's clock: start, end of prefill, end.
struct RoundSpan {
    start: f64,
    prefill_end: f64,
    end: f64,
}

/// Each round's (prefill joules, decode joules); empty where there is no power source. Waits
/// (at most 3 s) for the sampler's interval that covers the last round's end.
async fn round_energy(power: &PowerMonitor, spans: &[RoundSpan]) -> Vec<(f64, f64)> {
    let Some(last) = spans.last() else { return vec![] };
    if power.latest().chip_watts.is_none() {
        return vec![];
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while power.energy_between(last.start, last.end).is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    spans.iter().map_while(|s| Some((power.energy_between(s.start, s.prefill_end)?, power.energy_between(s.prefill_end, s.end)?))).collect()
}

impl CellResult {
    /// Joules per token from each round's (prefill, decode) joules; left null unless every
    /// round was measured.
    fn set_energy(&mut self, rounds: &[(f64, f64)]) {
        if rounds.is_empty() || self.requests == self.errors {
            return;
        }
        let (prefill, decode) = rounds.iter().fold((0.0, 0.0), |(p, d), r| (p + r.0, d + r.1));
        let ok = self.requests - self.errors;
        let prompt = self.prompt_tokens_counted.unwrap_or(self.cell.prompt_tokens) * ok;
        let after_first = self.completion_tokens.saturating_sub(ok);
        let per = |j: f64, n: usize| (n > 0 && j > 0.0).then(|| j / n as f64);
        self.prefill_joules_per_token = per(prefill, prompt);
        self.decode_joules_per_token = per(decode, after_first);
        self.tokens_per_joule =
            (prefill + decode > 0.0 && self.completion_tokens > 0).then(|| self.completion_tokens as f64 / (prefill + decode));
    }
}

/// Figures of one cell from its rounds: (wall time, each stream's outcome).
fn summarize(target: &str, cell: CellSpec, rounds: &[(Duration, Vec<Result<RunTiming>>)], peaks: Peaks) -> CellResult {
    let (mut ttft, mut itl, mut tpot, mut e2e, mut stream_tok_s, mut prompt_tok_s, mut counted, mut aggregate) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let (mut requests, mut errors, mut error, mut tokens, mut wall) = (0, 0, None, 0, 0.0);
    let (mut accepted, mut rejected, mut refused, mut uncounted) = (vec![], vec![], false, false);
    for (elapsed, runs) in rounds {
        let mut round_tokens = 0;
        for r in runs {
            requests += 1;
            match r {
                Ok(r) => {
                    let first = r.ttft.as_secs_f64();
                    ttft.push(first);
                    itl.extend(r.gaps.iter().map(Duration::as_secs_f64));
                    e2e.push(r.total.as_secs_f64());
                    if r.completion_tokens > 1 {
                        tpot.push((r.total.as_secs_f64() - first) / (r.completion_tokens - 1) as f64);
                    }
                    stream_tok_s.push(r.decode_tok_s);
                    if let Some(n) = r.prompt_tokens {
                        counted.push(n as f64);
                    }
                    prompt_tok_s.push(r.prompt_tokens.unwrap_or(cell.prompt_tokens) as f64 / first.max(1e-9));
                    round_tokens += r.completion_tokens;
                    accepted.extend(r.accepted_prediction_tokens.map(|n| n as f64));
                    rejected.extend(r.rejected_prediction_tokens.map(|n| n as f64));
                    refused |= r.prediction_refused;
                    uncounted |= r.accepted_prediction_tokens.is_none() && !r.prediction_refused;
                }
                Err(e) => {
                    errors += 1;
                    error.get_or_insert_with(|| format!("{e:#}"));
                }
            }
        }
        tokens += round_tokens;
        wall += elapsed.as_secs_f64();
        aggregate.push(round_tokens as f64 / elapsed.as_secs_f64().max(1e-9));
    }
    let median = |v: &mut Vec<f64>| (!v.is_empty()).then(|| quantile(v, 0.5) as usize);
    // A cell's worst case names it: one refusal, or one request without counts, is the row's.
    let prediction = (cell.prediction && requests > errors).then_some(if refused {
        PredictionUse::Refused
    } else if uncounted {
        PredictionUse::Uncounted
    } else {
        PredictionUse::Counted
    });
    CellResult {
        target: target.to_string(),
        cell: cell.into(),
        prediction_use: prediction,
        accepted_prediction_tokens: median(&mut accepted),
        rejected_prediction_tokens: median(&mut rejected),
        requests,
        errors,
        error,
        prompt_tokens_counted: (!counted.is_empty()).then(|| quantile(&mut counted, 0.5) as usize),
        completion_tokens: tokens,
        ttft_p50: quantile(&mut ttft, 0.5),
        ttft_p90: quantile(&mut ttft, 0.9),
        itl_p50: quantile(&mut itl, 0.5),
        itl_p90: quantile(&mut itl, 0.9),
        tpot_p50: quantile(&mut tpot, 0.5),
        e2e_p50: quantile(&mut e2e, 0.5),
        e2e_p90: quantile(&mut e2e, 0.9),
        stream_tok_s_p50: quantile(&mut stream_tok_s, 0.5),
        aggregate_tok_s: quantile(&mut aggregate, 0.5),
        prompt_tok_s_p50: quantile(&mut prompt_tok_s, 0.5),
        peak_mlx_bytes: peaks.mlx,
        peak_rss_bytes: peaks.rss,
        pressure_max: peaks.pressure.map(|(_, name)| name),
        wall_seconds: wall,
        ..Default::default()
    }
}

/// Highest memory figures an mlxbar target's snapshot showed while a cell ran.
#[derive(Default)]
struct Peaks {
    mlx: Option<u64>,
    rss: Option<u64>,
    /// (rank, name): normal < warn < critical; unknown ranks lowest.
    pressure: Option<(u8, String)>,
}

impl Peaks {
    /// The server samples memory once a second; polling twice as often catches each sample.
    async fn follow(&mut self, client: &reqwest::Client, base: &str) {
        loop {
            self.sample(client, base).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn sample(&mut self, client: &reqwest::Client, base: &str) {
        let Ok(r) = client.get(format!("{base}/api/metrics/snapshot")).timeout(Duration::from_secs(5)).send().await else { return };
        let Ok(s) = r.json::<Value>().await else { return };
        let max = |a: Option<u64>, b: Option<u64>| a.max(b);
        self.mlx = max(self.mlx, s.pointer("/memory/mlx/active").and_then(Value::as_u64));
        self.rss = max(self.rss, s.pointer("/memory/process/resident_bytes").and_then(Value::as_u64));
        if let Some(name) = s.pointer("/memory/system/pressure").and_then(Value::as_str) {
            let rank = match name {
                "normal" => 1,
                "warn" => 2,
                "critical" => 3,
                _ => 0,
            };
            if self.pressure.as_ref().is_none_or(|(r, _)| rank > *r) {
                self.pressure = Some((rank, name.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::RunTiming;

    fn timing(ttft: f64, tokens: usize, total: f64) -> Result<RunTiming> {
        Ok(RunTiming {
            ttft: Duration::from_secs_f64(ttft),
            completion_tokens: tokens,
            prompt_tokens: Some(100),
            decode_tok_s: (tokens - 1) as f64 / (total - ttft),
            total: Duration::from_secs_f64(total),
            gaps: vec![Duration::from_millis(50); tokens - 1],
            accepted_prediction_tokens: None,
            rejected_prediction_tokens: None,
            prediction_refused: false,
        })
    }

    #[test]
    fn summarizes_rounds() {
        let cell = CellSpec { concurrency: 2, prompt_tokens: 128, output_tokens: 11, prediction: false };
        let rounds = vec![
            (Duration::from_secs(2), vec![timing(0.5, 11, 1.0), timing(1.0, 11, 1.5)]),
            (Duration::from_secs(1), vec![timing(0.5, 11, 1.0), Err(anyhow::anyhow!("HTTP 503"))]),
        ];
        let r = summarize("x", cell, &rounds, Peaks::default());
        assert_eq!((r.requests, r.errors, r.completion_tokens), (4, 1, 33));
        assert_eq!(r.error.as_deref(), Some("HTTP 503"));
        assert_eq!(r.prompt_tokens_counted, Some(100));
        assert_eq!((r.ttft_p50, r.ttft_p90), (0.5, 1.0));
        assert!((r.tpot_p50 - 0.05).abs() < 1e-9);
        // Rounds: 22 tokens / 2 s and 11 tokens / 1 s: median (nearest rank) of [11, 11].
        assert_eq!(r.aggregate_tok_s, 11.0);
        assert_eq!(r.prompt_tok_s_p50, 200.0);
        assert_eq!(r.wall_seconds, 3.0);
        assert_eq!(r.tokens_per_joule, None, "no power source: null, never 0");
    }

    #[test]
    fn joules_per_token_split_prefill_and_decode() {
        let cell = CellSpec { concurrency: 1, prompt_tokens: 128, output_tokens: 11, prediction: false };
        let rounds = vec![(Duration::from_secs(1), vec![timing(0.5, 11, 1.0)]), (Duration::from_secs(1), vec![timing(0.5, 11, 1.0)])];
        let mut r = summarize("x", cell, &rounds, Peaks::default());
        // 20 W through each round: 10 J of prefill and 10 J of decode per round
        r.set_energy(&[(10.0, 10.0), (10.0, 10.0)]);
        assert_eq!(r.prefill_joules_per_token, Some(20.0 / 200.0), "100 counted prompt tokens a request");
        assert_eq!(r.decode_joules_per_token, Some(1.0), "20 J over the 20 tokens after the first");
        assert_eq!(r.tokens_per_joule, Some(22.0 / 40.0));
    }

    fn edit_plan() -> Plan {
        Plan::builtins().into_iter().find(|p| p.name == "edit").unwrap()
    }

    #[test]
    fn edit_requests_carry_the_prediction_only_in_the_predicted_cell() {
        let plan = edit_plan();
        let [without, with] = plan.cells()[..] else { panic!("two cells") };
        let (messages, prediction) = request(&plan, without, 0, 0, 0);
        assert_eq!((messages, prediction), (edit::messages(0, 0, 0), None));
        let (messages, prediction) = request(&plan, with, 1, 0, 0);
        assert_eq!(messages, edit::messages(1, 0, 0));
        assert_eq!(prediction.unwrap()["content"], edit::FILE);
        // A synthetic plan never sends one.
        let quick = Plan::builtins().remove(0);
        assert_eq!(request(&quick, quick.cells()[0], 0, 0, 0).1, None);
    }

    #[test]
    fn predicted_cells_report_counts_and_say_when_the_server_did_not_take_the_field() {
        let with = edit_plan().cells()[1];
        let counted = |accepted, rejected| {
            timing(0.5, 11, 1.0).map(|r| RunTiming {
                accepted_prediction_tokens: Some(accepted),
                rejected_prediction_tokens: Some(rejected),
                ..r
            })
        };
        let rounds = vec![
            (Duration::from_secs(1), vec![counted(8, 1)]),
            (Duration::from_secs(1), vec![counted(9, 2)]),
            (Duration::from_secs(1), vec![counted(10, 0)]),
        ];
        let r = summarize("x", with, &rounds, Peaks::default());
        assert_eq!(
            (r.prediction_use, r.accepted_prediction_tokens, r.rejected_prediction_tokens),
            (Some(PredictionUse::Counted), Some(9), Some(1))
        );
        let r = summarize("x", with, &[(Duration::from_secs(1), vec![timing(0.5, 11, 1.0)])], Peaks::default());
        assert_eq!((r.prediction_use, r.accepted_prediction_tokens), (Some(PredictionUse::Uncounted), None));
        let refused = timing(0.5, 11, 1.0).map(|r| RunTiming { prediction_refused: true, ..r });
        let r = summarize("x", with, &[(Duration::from_secs(1), vec![refused])], Peaks::default());
        assert_eq!(r.prediction_use, Some(PredictionUse::Refused));
        let without = summarize("x", with.unpredicted(), &[(Duration::from_secs(1), vec![timing(0.5, 11, 1.0)])], Peaks::default());
        assert_eq!(without.prediction_use, None, "nothing to say about a cell that sent no prediction");
    }

    #[test]
    fn the_speed_up_is_the_unpredicted_rows_e2e_over_the_predicted_ones() {
        let [without, with] = edit_plan().cells()[..] else { panic!("two cells") };
        let slow = summarize("x", without, &[(Duration::from_secs(6), vec![timing(0.5, 450, 6.0)])], Peaks::default());
        let fast = summarize("x", with, &[(Duration::from_secs(2), vec![timing(0.5, 450, 2.0)])], Peaks::default());
        assert_eq!(prediction_speedup(&slow, &fast), Some(3.0));
        let failed = summarize("x", with, &[(Duration::from_secs(1), vec![Err(anyhow::anyhow!("HTTP 500"))])], Peaks::default());
        assert_eq!(prediction_speedup(&slow, &failed), None, "no ratio against a cell that measured nothing");
    }
}
