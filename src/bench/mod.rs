//! `mlxbar bench`: mlxbar (in process, over HTTP like any client) beside peer servers
//! measured in the same run, with ratios. `--quick` (default): single-stream TTFT and
//! decode tok/s; `--concurrency 1,4,8`: aggregate throughput and latency percentiles with
//! that many streams at once.
pub mod client;
pub mod concurrency;

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::json;

use crate::config::Config;
use crate::engine::WeightFormat;
use crate::Server;
use client::{timed_chat, RunTiming, Target};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The single-stream profile (the only one so far)
    #[arg(long, default_value_t = true)]
    pub quick: bool,
    /// Measure this server instead of an in-process mlxbar: [LABEL=]URL[#MODEL]
    #[arg(long)]
    pub target: Option<String>,
    /// Also measure these servers, interleaved with the target: [LABEL=]URL[#MODEL] (repeatable)
    #[arg(long)]
    pub compare: Vec<String>,
    /// Model for the in-process mlxbar [default: the default model]
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Weight format for the in-process mlxbar
    #[arg(long, value_enum, default_value = "auto")]
    pub weight_format: WeightFormat,
    /// Measured runs per server (after one warm-up)
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens to generate per run
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Concurrent streams per level, e.g. 1,4,8 (instead of the single-stream profile)
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// ~65 prompt tokens; the number makes each run's prompt unique so no server can reuse a
/// cached prefix.
fn prompt(run: usize) -> serde_json::Value {
    json!([
        {"role": "system", "content": format!("You are a helpful assistant. Session {}.", 1000 + run)},
        {"role": "user", "content": "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle on a stormy night. Describe the sea, the weather, the keeper's daily routine, and what the message says, in at least three paragraphs."}
    ])
}

pub struct Summary {
    pub label: String,
    pub runs: Vec<RunTiming>,
}

impl Summary {
    pub fn median_ttft(&self) -> Duration {
        median(self.runs.iter().map(|r| r.ttft.as_secs_f64()).collect()).map(Duration::from_secs_f64).unwrap_or_default()
    }
    pub fn median_decode(&self) -> f64 {
        median(self.runs.iter().map(|r| r.decode_tok_s).collect()).unwrap_or(0.0)
    }
    pub fn median_tokens(&self) -> f64 {
        median(self.runs.iter().map(|r| r.completion_tokens as f64).collect()).unwrap_or(0.0)
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| quantile(&mut v, 0.5))
}

/// The `q` quantile of `v` (nearest rank; sorts `v`); 0 for no samples.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

pub async fn run(args: BenchArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let mut local = None;
    let main = match &args.target {
        Some(spec) => Target::parse(spec)?,
        None => {
            let config = Config { port: 0, model: args.model.clone(), weight_format: args.weight_format, ..Config::default() };
            let server = Server::start(config).await?;
            server.wait_ready().await?;
            let t = Target { label: "mlxbar".into(), base_url: format!("http://{}", server.local_addr()), model: "default".into() };
            local = Some(server);
            t
        }
    };
    let mut targets = vec![main];
    for c in &args.compare {
        targets.push(Target::parse(c)?);
    }
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build()?;
    if !args.concurrency.is_empty() {
        if args.concurrency.contains(&0) {
            bail!("--concurrency levels must be at least 1");
        }
        for t in &targets {
            eprintln!("warming up {}", t.label);
            timed_chat(&client, t, &prompt(0), 8).await?;
        }
        let cells = concurrency::run(&client, &targets, &args.concurrency, args.max_tokens).await?;
        if let Some(server) = local {
            server.shutdown().await;
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
        } else {
            print!("{}", concurrency::table(&cells));
        }
        return Ok(());
    }
    let mut summaries: Vec<Summary> = targets.iter().map(|t| Summary { label: t.label.clone(), runs: vec![] }).collect();
    for t in &targets {
        eprintln!("warming up {}", t.label);
        timed_chat(&client, t, &prompt(0), 8).await?;
    }
    // Interleaved, so drift on a shared machine hits every server alike.
    for run in 1..=args.runs {
        for (t, s) in targets.iter().zip(summaries.iter_mut()) {
            let r = timed_chat(&client, t, &prompt(run), args.max_tokens).await?;
            eprintln!("run {run}/{} {:<12} ttft {:>7.3}s  decode {:>6.1} tok/s  ({} tokens)", args.runs, t.label, r.ttft.as_secs_f64(), r.decode_tok_s, r.completion_tokens);
            s.runs.push(r);
        }
    }
    if let Some(server) = local {
        server.shutdown().await;
    }
    if args.json {
        let out: Vec<_> = summaries
            .iter()
            .map(|s| json!({"label": s.label, "ttft_seconds_median": s.median_ttft().as_secs_f64(), "decode_tok_s_median": s.median_decode(), "completion_tokens_median": s.median_tokens(), "runs": s.runs.len()}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", table(&summaries, args.max_tokens));
    }
    Ok(())
}

/// Markdown table; the first row is the reference for the ratio columns.
pub fn table(s: &[Summary], max_tokens: usize) -> String {
    let mut out = format!("\n| server | TTFT median | decode tok/s median | tokens | {} |\n|---|---|---|---|---|\n", "vs first: decode × / TTFT ×");
    let base = &s[0];
    for x in s {
        let ratio = if std::ptr::eq(x, base) {
            "1 / 1".to_string()
        } else {
            format!(
                "{:.2} / {:.2}",
                base.median_decode() / x.median_decode().max(1e-9),
                x.median_ttft().as_secs_f64() / base.median_ttft().as_secs_f64().max(1e-9)
            )
        };
        out += &format!(
            "| {} | {:.3} s | {:.1} | {:.0}/{max_tokens} | {} |\n",
            x.label,
            x.median_ttft().as_secs_f64(),
            x.median_decode(),
            x.median_tokens(),
            ratio
        );
    }
    out += "\nRatios: how many times faster the first row decodes, and how many times longer this row's TTFT is.\n";
    out
}
