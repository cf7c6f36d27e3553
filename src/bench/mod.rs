//! Benchmarks: plans (grids of streams × prompt × output tokens, on synthetic prompts or
//! [`edit`]'s rewrite-a-file request with and without a predicted output), a runner that
//! measures any OpenAI-compatible server over HTTP, run records with history, and reports.
//! `mlxbar bench` runs a plan against an in-process mlxbar (or `--target`), optionally
//! interleaved with `--compare` servers, and prints ratios; [`jobs`] runs plans inside a
//! server for `POST /api/bench`. `mlxbar bench soak` ([`soak`]) keeps mixed load on a
//! server for minutes and checks that no request is lost and memory stays flat.
pub mod client;
pub mod edit;
pub mod jobs;
pub mod machine;
pub mod plan;
pub mod prompt;
pub mod record;
pub mod report;
pub mod runner;
pub mod soak;
pub mod store;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use crate::config::Config;
use crate::engine::WeightFormat;
use crate::Server;
use client::Target;
use plan::Plan;
use record::{new_run_id, now_unix, RunRecord, RunState};
use runner::Progress;
use store::BenchStore;

/// `mlxbar bench [PLAN FLAGS]` runs a plan; `mlxbar bench soak [...]` a soak run.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchCli {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub plan: BenchArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Minutes of mixed load (streams, disconnects, bursts past the queue, scrapes); fails if
    /// a request was lost or failed or memory grew past a bound
    Soak(soak::SoakArgs),
}

pub async fn cli(cli: BenchCli) -> Result<()> {
    match cli.command {
        Some(BenchCommand::Soak(args)) => soak::run(args).await,
        None => run(cli.plan).await,
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Plan to run: quick, standard, concurrency-sweep, long-context, edit (a file rewrite
    /// without and with a Predicted Outputs `prediction`), or a user plan
    #[arg(long, default_value = "quick")]
    pub profile: String,
    /// List the plans and exit
    #[arg(long)]
    pub list_profiles: bool,
    /// Measure this OpenAI-compatible server instead of an in-process mlxbar: [LABEL=]URL[#MODEL]
    #[arg(long)]
    pub target: Option<String>,
    /// Also measure these servers, interleaved cell by cell, with ratios: [LABEL=]URL[#MODEL] (repeatable)
    #[arg(long)]
    pub compare: Vec<String>,
    /// With --target: the model name to request (default "default"). Without: a .gguf or
    /// MLX folder for the in-process mlxbar (default: the default model)
    #[arg(long)]
    pub model: Option<String>,
    /// Weight format for the in-process mlxbar
    #[arg(long, value_enum, default_value = "auto")]
    pub weight_format: WeightFormat,
    /// Override the plan's concurrent streams, e.g. 1,4,8
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Override the plan's prompt sizes (tokens), e.g. 128,1024
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Vec<usize>,
    /// Override the plan's output sizes (tokens), e.g. 64
    #[arg(long, alias = "output-tokens", value_delimiter = ',')]
    pub max_tokens: Vec<usize>,
    /// Override the plan's timed rounds per cell
    #[arg(long, alias = "runs")]
    pub repetitions: Option<usize>,
    /// Override the plan's warm-up requests per cell
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Where runs, reports and user plans are kept [default: the user data dir + mlxbar]
    #[arg(long, env = "MLXBAR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Print the full run record as JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

/// The `q` quantile of `v` (nearest rank; sorts `v`); 0 for no samples.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

impl BenchArgs {
    /// The named plan with the command line's overrides.
    fn plan(&self, store: &BenchStore) -> Result<Plan> {
        let mut plan = plan::find(&store.plans_dir(), &self.profile)
            .with_context(|| format!("no bench profile named '{}' (see --list-profiles)", self.profile))?;
        if !self.concurrency.is_empty() {
            plan.concurrency = self.concurrency.clone();
        }
        if !self.prompt_tokens.is_empty() {
            plan.prompt_tokens = self.prompt_tokens.clone();
        }
        if !self.max_tokens.is_empty() {
            plan.output_tokens = self.max_tokens.clone();
        }
        if let Some(r) = self.repetitions {
            plan.repetitions = r;
        }
        if let Some(w) = self.warmup {
            plan.warmup = w;
        }
        plan.validate()?;
        Ok(plan)
    }
}

pub async fn run(args: BenchArgs) -> Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(crate::config::default_data_dir);
    let store = BenchStore::new(&data_dir);
    if args.list_profiles {
        let (plans, warnings) = plan::available(&store.plans_dir());
        for p in plans {
            println!("{:<20} {:>3} cells  {}  [{}]", p.name, p.cells().len(), p.description, p.source);
        }
        for w in warnings {
            eprintln!("warning: {w}");
        }
        println!("\nuser plans: {}", store.plans_dir().display());
        return Ok(());
    }
    let plan = args.plan(&store)?;
    // Minutes of measuring are lost if the results cannot be saved: say so before.
    store.check_writable().with_context(|| format!("bench results go to {} (set --data-dir or MLXBAR_DATA_DIR)", data_dir.display()))?;
    let mut local = None;
    let main = match &args.target {
        Some(spec) => {
            let mut t = Target::parse(spec)?;
            if let Some(m) = &args.model {
                t.model = m.clone();
            }
            t
        }
        None => {
            let config = Config {
                port: 0,
                model: args.model.as_ref().map(PathBuf::from),
                weight_format: args.weight_format,
                data_dir: Some(data_dir.clone()),
                ..Config::default()
            };
            eprintln!("loading the model into an in-process mlxbar…");
            let server = Server::start(config).await?;
            server.wait_ready().await?;
            let t = Target { label: "mlxbar".into(), base_url: server.url(), model: "default".into() };
            local = Some(server);
            t
        }
    };
    let mut targets = vec![main];
    for c in &args.compare {
        targets.push(Target::parse(c)?);
    }
    let client = reqwest::Client::builder().timeout(Duration::from_secs(3600)).build()?;
    // One power sampler measures every target's cells alike (each cell's joules per token).
    let power = crate::telemetry::power::monitor::PowerMonitor::start(Duration::from_secs(1));
    let mut record = RunRecord::start(new_run_id(), &plan, now_unix());
    for t in &targets {
        let info = runner::describe(&client, t).await;
        if info.model_id.is_none() && info.mlxbar.is_none() {
            eprintln!("warning: {} answers neither /v1/models nor /api/metrics/snapshot; is it up?", t.label);
        }
        record.targets.push(info);
    }
    eprintln!("{}: {} cells × {} server(s), {} requests each", plan.name, plan.cells().len(), targets.len(), plan.total_requests());
    let (progress_tx, progress_rx) = watch::channel(Progress::default());
    let bar = progress_bar(progress_rx);
    let infos = record.targets.clone();
    let outcome = {
        let run = runner::run_plan(&client, &infos, &plan, &progress_tx, &mut record.cells, &power);
        tokio::select! {
            r = run => r.map(|()| RunState::Done),
            _ = tokio::signal::ctrl_c() => Ok(RunState::Cancelled),
        }
    };
    drop(progress_tx);
    let _ = bar.await;
    record.state = match outcome {
        Ok(s) => s,
        Err(e) => {
            record.error = Some(format!("{e:#}"));
            RunState::Failed
        }
    };
    record.finished_unix = Some(now_unix());
    if let Some(server) = local {
        server.shutdown().await;
    }
    store.save(&record, &report::html(&record))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        println!("\n{}", report::markdown(&record));
    }
    eprintln!("report: {}", store.report_path(&record.id).display());
    match record.state {
        RunState::Done => Ok(()),
        RunState::Cancelled => bail!("cancelled; the cells measured so far are in the report"),
        _ => bail!("bench failed: {}", record.error.unwrap_or_default()),
    }
}

/// Shows progress on stderr until the sender drops: a bar on a terminal, else one line as
/// each cell starts (for logs and CI).
fn progress_bar(mut rx: watch::Receiver<Progress>) -> tokio::task::JoinHandle<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    tokio::spawn(async move {
        let bar = if tty { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() };
        bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} requests  {msg}").unwrap());
        let mut announced = None;
        while rx.changed().await.is_ok() {
            let p = rx.borrow_and_update().clone();
            bar.set_length(p.requests_total as u64);
            bar.set_position(p.requests_done as u64);
            let Some(c) = &p.current else { continue };
            let cell = format!("cell {}/{} {} on {}", (p.cells_done + 1).min(p.cells_total), p.cells_total, c.label, c.target);
            bar.set_message(format!("{cell} ({})", c.phase));
            if !tty && announced.as_ref() != Some(&cell) {
                eprintln!("{cell}");
                announced = Some(cell);
            }
        }
        bar.finish_and_clear();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!((quantile(&mut v, 0.5), quantile(&mut v, 0.9)), (3.0, 5.0));
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }
}
