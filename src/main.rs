use anyhow::Result;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use mlxbar::config::{Config, ServeArgs};
use mlxbar::{bench, doctor, model_store, Server};

#[derive(Parser)]
#[command(name = "mlxbar", version, about = "Run and watch local LLMs with MLX: an OpenAI-compatible server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible API (default model unless --model)
    Serve(ServeArgs),
    /// Measure TTFT and decode tok/s, beside peer servers measured in the same run (`bench soak`: a soak test)
    Bench(bench::BenchCli),
    /// Show the MLX build, device, BLAS and model cache in use
    Doctor,
    /// Download and verify the default model into the cache
    FetchModel,
    /// Download a model from Hugging Face into the hub cache (resumable; HF_ENDPOINT, HF_TOKEN honoured)
    Pull(mlxbar::library::pull::cli::PullArgs),
    /// List the local models (Hugging Face hub cache, LM Studio, mlxbar's models dir, models_dirs) and whether each can run
    Models(mlxbar::library::cli::ModelsArgs),
    /// The alert rules in force
    #[command(subcommand)]
    Alerts(AlertsCommand),
    /// Serve one model from several machines (MLX's ring or jaccl backend, tensor or pipeline parallel)
    #[command(subcommand)]
    Cluster(mlxbar::distributed::launch::ClusterCommand),
}

#[derive(Subcommand)]
enum AlertsCommand {
    /// Print them as a Prometheus rules file (dashboards/prometheus/alerts.yml is this with the defaults)
    PrometheusRules {
        /// Apply this config file's [alerts.*] overrides
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
}

fn main() -> Result<()> {
    // A rank restarted to rejoin its cluster: nothing of the old process stays open.
    mlxbar::distributed::rejoin::close_inherited();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("MLXBAR_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    #[cfg(feature = "test-hooks")]
    mlxbar::engine::faults::arm_from_env();
    let command = Cli::parse().command;
    // A rank of a cluster: MLX's backend reads its place from the environment, set here while
    // the process has one thread; ranks past 0 serve no HTTP.
    let mut config = None;
    if let Command::Serve(args) = &command {
        let c = Config::load(args)?;
        if let Some(spec) = &c.cluster {
            spec.export_env(&c.data_dir().join("cluster"))?;
            if spec.rank > 0 {
                return mlxbar::distributed::follower::run(spec, &c);
            }
        }
        config = Some(c);
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(command, config))
}

async fn run(command: Command, config: Option<Config>) -> Result<()> {
    match command {
        Command::Serve(_) => match serve(config.expect("loaded above")).await {
            // One line, not a backtrace-style report: the user only needs to pick a port.
            Err(e) if e.downcast_ref::<mlxbar::server::PortInUse>().is_some() => {
                eprintln!("mlxbar: {e}");
                std::process::exit(2);
            }
            other => other,
        },
        Command::Bench(args) => bench::cli(args).await,
        Command::Doctor => {
            print!("{}", doctor::report());
            Ok(())
        }
        Command::Alerts(AlertsCommand::PrometheusRules { config }) => {
            let config = match config {
                Some(path) => Config::from_file(&path)?,
                None => Config::default(),
            };
            print!("{}", mlxbar::alerts::rules::prometheus_rules(&mlxbar::alerts::rules::resolve(&config.alerts)?));
            Ok(())
        }
        Command::Pull(args) => {
            let path = tokio::task::spawn_blocking(move || mlxbar::library::pull::cli::run(args)).await??;
            println!("{}", path.display());
            Ok(())
        }
        Command::Models(args) => tokio::task::spawn_blocking(move || mlxbar::library::cli::run(&args)).await?,
        Command::Cluster(mlxbar::distributed::launch::ClusterCommand::Launch(args)) => {
            tokio::task::spawn_blocking(move || mlxbar::distributed::launch::run(args)).await?
        }
        Command::FetchModel => {
            let path = tokio::task::spawn_blocking(model_store::ensure_default_model).await??;
            println!("{}", path.display());
            Ok(())
        }
    }
}

async fn serve(config: Config) -> Result<()> {
    let mut term = term_signal();
    let server = Server::start(config).await?;
    let addr = server.local_addr();
    tracing::info!("listening on http://{addr} (loading the model)");
    tokio::select! {
        ready = server.wait_ready() => match ready {
            Ok(()) => {
                let models = server.models();
                tracing::info!("ready: model {} on {}; try:", models.default_id(), models.device().as_str());
                eprintln!(
                    "  curl http://{addr}/v1/chat/completions -H 'Content-Type: application/json' \\\n    -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"What is the capital of France?\"}}]}}'"
                );
            }
            // The server stays up: /health and /metrics say what failed, and a fixed model
            // file can be loaded with POST /api/engine/reload.
            Err(e) => tracing::error!("the model did not load: {e:#}; still serving /health and /metrics (POST /api/engine/reload retries)"),
        },
        _ = shutdown_signal(&mut term) => {
            mlxbar::distributed::rejoin::stop();
            server.shutdown().await;
            return Ok(());
        }
    }
    shutdown_signal(&mut term).await;
    // A cluster's rank 0 with --on-rank-lost rejoin stops rather than restarts from now on.
    mlxbar::distributed::rejoin::stop();
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

/// SIGTERM, registered when made: made before the server says anything, so a signal sent
/// as soon as a log line appears drains instead of killing the process.
#[cfg(unix)]
type Term = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Term = ();

fn term_signal() -> Term {
    #[cfg(unix)]
    return tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
}

async fn shutdown_signal(term: &mut Term) {
    #[cfg(unix)]
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    #[cfg(not(unix))]
    let _ = (term, tokio::signal::ctrl_c().await);
}
