//! Server configuration: defaults, then the config file, then environment and flags.
//!
//! The file is TOML at `$XDG_CONFIG_HOME/mlxbar/config.toml` (macOS: `~/Library/Application
//! Support/mlxbar/config.toml`) or `--config PATH`; every key is optional:
//! ```toml
//! host = "127.0.0.1"
//! port = 8080
//! ollama_port = 11434             # also answer on 127.0.0.1:<port> (Ollama's address) for Ollama clients; off by default
//! model = "/path/to/model.gguf"   # or an MLX/HF folder; default: SmolLM2-135M-Instruct Q4_1
//! models_dirs = ["~/models"]      # more folders scanned for models (besides the hub cache, LM Studio's, mlxbar's)
//! weight_format = "auto"          # auto | float32 | native
//! queue_capacity = 64
//! max_body_bytes = 4194304
//! allowed_hosts = []              # extra Host names accepted besides loopback
//! cors_origins = []               # origins allowed to call from a browser; none by default
//! api_key = "..."                 # required when host is not loopback
//! default_temperature = 0.7
//! default_top_p = 0.95
//! metrics_enabled = true          # per-request instrumentation
//! power_sampler = true            # GPU, power, temperatures, thermal pressure (macmon on macOS, RAPL/hwmon on Linux); false: none read
//! grafana_url = "http://localhost:3000/d/mlxbar"   # linked from the popover
//! max_batch = 8                   # sequences decoded together (continuous batching)
//! kv_budget_tokens = 65536        # running requests × the longest prompt + max_tokens among them (the batch KV is padded); default: from the MLX memory limit
//! expert_cache_bytes = 2147483648 # mixture-of-experts models stream their experts from disk through a cache this big; default: only when they do not fit the budget, then sized by it
//! prefix_cache_bytes = 94371840   # KV kept for prompt-prefix reuse; 0 turns it off; default: 2048 tokens of the model's KV, at most RAM/32
//! mlx_memory_limit_bytes = ...    # default: MLX's, at most 75% of RAM
//! mlx_cache_limit_bytes = ...     # freed buffers MLX keeps for reuse; default: two engine steps' transient buffers of the largest loaded model, 32-512 MiB, at most RAM/16
//! mlx_cache_idle_seconds = 30     # no request running or queued for this long: MLX's buffer cache goes back to the system (0: as soon as work ends)
//! admission = "refuse"            # under critical memory pressure: refuse (503) | wait
//! speculative = "off"             # off | prompt_lookup: drafts from the prompt's own n-grams, verified a pass at a time (OpenAI's `prediction` drafts either way)
//! max_loaded_models = 2           # models kept loaded together (the least recently used idle one unloads first)
//! keep_alive = "15m"              # an idle model unloads after this ("30s", "1h"; -1: never; 0: after each answer)
//! memory_budget_bytes = ...       # what loaded models may take together; default: the MLX memory limit
//! pinned = ["org/name"]           # models never unloaded for idle time or LRU
//! [aliases]                       # extra names for models: `"model": "fast"` means this one
//! fast = "mlx-community/SmolLM2-135M-Instruct-4bit"
//! data_dir = "/path"              # bench runs, history and state.json (snoozes, pins, keep-alives set through the API); default: the user data dir + mlxbar
//! max_concurrent_pulls = 2        # model pulls (POST /api/models/pull) running at once; more get 429
//! bench_wait_seconds = 10         # while a bench run holds the engine, requests wait this long, then 503
//! stall_seconds = 30              # no engine step for this long with work waiting: /health says stalled
//! load_timeout_seconds = 900      # a model load that takes longer fails (its thread is left behind: restart required)
//! engine_stop_seconds = 30        # an unload, reload or shutdown waits this long for the engine's step; past it the engine is failed (restart required)
//! shutdown_grace_seconds = 10     # on SIGTERM / Quit, in-flight requests get this long to finish
//! max_connections = 96            # sockets served at once; past it one that only waits on its client gives way, else 503
//! header_read_timeout_seconds = 10 # a request's head (and a keep-alive connection's next one) must arrive within this
//! body_read_timeout_seconds = 30  # a request's whole body must arrive within this (408)
//! max_stream_subscribers = 16     # open GET /api/metrics/stream streams; past it 503
//! prepare_threads = 1             # requests' prompts rendered and tokenized, and grammars compiled, at once; default: half the cores, 1-4
//!
//! [alerts.queue_backlog]          # override a built-in alert rule (see src/alerts/rules.rs)
//! threshold = 4
//! for_seconds = 10
//! ```
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::alerts::RuleOverride;
use crate::engine::WeightFormat;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    /// Also serve the API on 127.0.0.1:<port> (Ollama's default is 11434) for clients that
    /// only know Ollama's address; None: off. 0 picks a free port (`/health` says which).
    pub ollama_port: Option<u16>,
    pub model: Option<PathBuf>,
    /// More folders the model library scans (`.gguf` files, MLX folders, hub-cache repos).
    pub models_dirs: Vec<PathBuf>,
    pub weight_format: WeightFormat,
    pub queue_capacity: usize,
    pub max_body_bytes: usize,
    pub allowed_hosts: Vec<String>,
    pub cors_origins: Vec<String>,
    pub api_key: Option<String>,
    /// Used when a request sets no temperature. OpenAI's default of 1.0 makes small models ramble.
    pub default_temperature: f32,
    pub default_top_p: f32,
    /// Per-request instrumentation (histograms, token counters, live views). /metrics still
    /// serves memory and scheduler gauges when off.
    pub metrics_enabled: bool,
    /// The power sampler's thread (GPU, power, temperatures, thermal pressure). Off, every
    /// such figure is unavailable with that reason (a way out should IOReport polling ever
    /// upset Metal, as exo#2088 suspected of macmon).
    pub power_sampler: bool,
    pub max_batch: usize,
    pub kv_budget_tokens: Option<usize>,
    /// None: sized from the model (`registry::budget::prefix_cache_for`).
    pub prefix_cache_bytes: Option<usize>,
    /// Some: every mixture-of-experts model streams its experts through a cache of at most
    /// this many bytes; None: only a model whose experts do not fit the budget streams,
    /// with the room it leaves ([`crate::engine::experts`]).
    pub expert_cache_bytes: Option<u64>,
    pub mlx_memory_limit_bytes: Option<usize>,
    /// None: sized from the loaded models (`registry::budget::Budget::cache_limit`).
    pub mlx_cache_limit_bytes: Option<usize>,
    /// With no request running or queued on any model for this long, MLX's buffer cache is
    /// cleared (once per quiet spell), so an idle server holds weights, KV and prefix cache only.
    pub mlx_cache_idle_seconds: f64,
    /// What new requests meet while memory pressure is critical.
    pub admission: Admission,
    /// Speculative decoding for requests that bring no `prediction` of their own.
    pub speculative: Speculative,
    /// Models kept loaded together.
    pub max_loaded_models: usize,
    /// How long an idle model stays loaded (a request's `keep_alive` overrides it).
    pub keep_alive: crate::registry::KeepAlive,
    /// What loaded models may take together; None: the MLX memory limit.
    pub memory_budget_bytes: Option<usize>,
    /// Ids of models kept loaded through idle time and LRU.
    pub pinned: Vec<String>,
    /// Extra names for models (name -> id).
    pub aliases: BTreeMap<String, String>,
    /// Bench runs, history and user plans live below `metrics/` here, and `state.json`
    /// (what the API set that survives a restart) [default: [`default_data_dir`]].
    pub data_dir: Option<PathBuf>,
    /// Pulls from Hugging Face running at once; a pull past it gets 429.
    pub max_concurrent_pulls: usize,
    /// While a bench run holds the engine, generation requests wait up to this long, then 503.
    pub bench_wait_seconds: f64,
    /// With work waiting and no engine step for this long, `/health` says `stalled` (503).
    pub stall_seconds: f64,
    /// On SIGTERM or Quit, in-flight requests may finish for this long; new ones get 503.
    pub shutdown_grace_seconds: f64,
    /// A load still running after this long fails ("restart required": its thread cannot be
    /// stopped), so a hung read cannot hold the registry for ever.
    pub load_timeout_seconds: f64,
    /// How long stopping an engine (unload, reload, shutdown) waits for its current step;
    /// past it the engine is left behind and marked failed ("restart required").
    pub engine_stop_seconds: f64,
    /// Where the user's Grafana dashboard lives; the popover links to it.
    pub grafana_url: Option<String>,
    /// Alert rule overrides by rule id, applied over the built-in defaults.
    pub alerts: BTreeMap<String, RuleOverride>,
    // Transport limits and bounded request preparation (src/transport/, src/inference/prepare.rs).
    /// Sockets served at once. Past it, the connection waiting longest on its client closes
    /// for the newcomer; if every one is busy the newcomer gets 503. Keeps descriptors
    /// bounded (macOS allows a program 256 by default).
    pub max_connections: usize,
    /// A request's head must arrive within this (also how long a keep-alive connection may idle).
    pub header_read_timeout_seconds: f64,
    /// A request's whole body must arrive within this from its head; otherwise 408.
    pub body_read_timeout_seconds: f64,
    /// Live snapshot streams (`GET /api/metrics/stream`) open at once; past it 503.
    pub max_stream_subscribers: usize,
    /// Requests prepared at once (chat template, tokenizing, grammar compilation) on
    /// blocking threads; None: half the cores, 1-4.
    pub prepare_threads: Option<usize>,
    /// This process's rank in a cluster serving the default model (`--hostfile`, `--rank`).
    #[serde(skip)]
    pub cluster: Option<crate::distributed::ClusterSpec>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            ollama_port: None,
            model: None,
            models_dirs: vec![],
            weight_format: WeightFormat::Auto,
            queue_capacity: 64,
            max_body_bytes: 4 * 1024 * 1024,
            allowed_hosts: vec![],
            cors_origins: vec![],
            api_key: None,
            default_temperature: 0.7,
            default_top_p: 0.95,
            metrics_enabled: true,
            power_sampler: true,
            grafana_url: None,
            max_batch: 8,
            kv_budget_tokens: None,
            prefix_cache_bytes: None,
            expert_cache_bytes: None,
            mlx_memory_limit_bytes: None,
            mlx_cache_limit_bytes: None,
            // Longer than a client's pause between requests under load (steady load never
            // clears, so never pays for refilling), short enough that memory comes back
            // soon after the load ends. A refill costs the next request a few ms of page faults.
            mlx_cache_idle_seconds: 30.0,
            admission: Admission::Refuse,
            speculative: Speculative::Off,
            max_loaded_models: 2,
            keep_alive: crate::registry::KeepAlive::DEFAULT,
            memory_budget_bytes: None,
            pinned: vec![],
            aliases: BTreeMap::new(),
            data_dir: None,
            max_concurrent_pulls: 2,
            bench_wait_seconds: 10.0,
            stall_seconds: 30.0,
            shutdown_grace_seconds: 10.0,
            // Generous: a large model from a slow disk takes minutes, a hung read for ever.
            load_timeout_seconds: 900.0,
            // Far above one step (a 512-token prefill chunk of a 70B model takes seconds).
            engine_stop_seconds: 30.0,
            cluster: None,
            alerts: BTreeMap::new(),
            // With the listener, refusals in flight, model files and the rest, well under
            // macOS's default 256 descriptors.
            max_connections: 96,
            header_read_timeout_seconds: 10.0,
            // A 4 MiB body needs ~1 Mbit/s to arrive in time.
            body_read_timeout_seconds: 30.0,
            max_stream_subscribers: 16,
            prepare_threads: None,
        }
    }
}

/// Under critical memory pressure new work does not start, so the model does not push the
/// machine into swap: it is refused (503 with Retry-After) or waits in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    Refuse,
    Wait,
}

/// Where drafts come from for requests without a `prediction`: nowhere (one token a pass),
/// or the prompt and answer themselves (n-gram prompt lookup: quick on answers that quote
/// their prompt, as edits, extraction and summaries do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Speculative {
    Off,
    #[value(name = "prompt_lookup")]
    PromptLookup,
}

/// Flags of `mlxbar serve`; each overrides the config file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// A .gguf file or an MLX/HF model folder [default: the bundled SmolLM2-135M-Instruct]
    #[arg(long, env = "MLXBAR_MODEL")]
    pub model: Option<PathBuf>,
    /// Address to bind [default: 127.0.0.1]
    #[arg(long, env = "MLXBAR_HOST")]
    pub host: Option<IpAddr>,
    /// Port to bind [default: 8080]; 0 picks a free one
    #[arg(long, env = "MLXBAR_PORT")]
    pub port: Option<u16>,
    /// Also answer on 127.0.0.1:PORT for Ollama clients (Ollama's is 11434) [default: off]
    #[arg(long, env = "MLXBAR_OLLAMA_PORT")]
    pub ollama_port: Option<u16>,
    /// How weights are held: float32 is fastest on the CPU device, native (quantized) on Metal
    #[arg(long, value_enum)]
    pub weight_format: Option<WeightFormat>,
    /// Requests that may wait for the engine before new ones get 429
    #[arg(long)]
    pub queue_capacity: Option<usize>,
    /// Sequences decoded together in one batched step [default: 8]
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Stream mixture-of-experts models' experts from disk through a cache of this many
    /// bytes [default: only when they do not fit memory]
    #[arg(long)]
    pub expert_cache_bytes: Option<u64>,
    /// Under critical memory pressure, refuse new requests (503) or let them wait [default: refuse]
    #[arg(long, value_enum)]
    pub admission: Option<Admission>,
    /// Speculative decoding for requests without a `prediction`: off or prompt_lookup [default: off]
    #[arg(long, value_enum)]
    pub speculative: Option<Speculative>,
    /// Extra Host header names to accept (repeatable; "*" accepts any)
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call the API (repeatable)
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Require `Authorization: Bearer KEY` (mandatory when binding beyond loopback)
    #[arg(long, env = "MLXBAR_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Data dir for bench runs and history [default: the user data dir + mlxbar]
    #[arg(long, env = "MLXBAR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Config file [default: the user config dir's mlxbar/config.toml, if present]
    #[arg(long, env = "MLXBAR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Serve the model with the other ranks this host file names (MLX's format, as
    /// mlx.distributed_config writes it: {"backend": "ring", "hosts": [{"ssh": "host",
    /// "ips": ["10.0.0.1"]}, ...]}) over the MLX backend it names (ring or jaccl); needs --rank
    #[arg(long, requires = "rank")]
    pub hostfile: Option<PathBuf>,
    /// This process's rank in --hostfile: 0 serves HTTP, the others only compute
    #[arg(long, requires = "hostfile")]
    pub rank: Option<usize>,
    /// The ring's first port, one more per rank and IP (as mlx.launch counts them); jaccl's
    /// coordinator port on rank 0
    #[arg(long, default_value_t = crate::distributed::hostfile::RING_PORT)]
    pub ring_port: u16,
    /// Seconds every rank has to start and join the ring
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub join_timeout: u64,
    /// Seconds rank 0 waits for a model pass to come back round the ring before it gives
    /// the cluster up (a rank hung with its sockets open)
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub pass_timeout: u64,
    /// How the ranks split the model: tensor (a share of every layer's heads; llama-style
    /// models whose heads divide by the ranks), pipeline (runs of layers; any model), or
    /// auto (tensor where it can)
    #[arg(long, value_enum, default_value_t = crate::distributed::Parallel::Auto)]
    pub parallel: crate::distributed::Parallel,
    /// Once the cluster is lost (a rank died or hung, rank 0 stopped, the join timed out):
    /// exit, or restart this rank and wait for every rank to join again (rejoin; rank 0
    /// restarts its server too, answering 503 meanwhile)
    #[arg(long, value_enum, default_value_t = crate::distributed::rejoin::OnRankLost::Exit)]
    pub on_rank_lost: crate::distributed::rejoin::OnRankLost,
}

impl Config {
    pub fn default_path() -> Option<PathBuf> {
        dirs::config_dir().map(|d| d.join("mlxbar").join("config.toml"))
    }

    /// Defaults <- file <- flags, then validated.
    pub fn load(args: &ServeArgs) -> Result<Config> {
        let mut config = match &args.config {
            Some(path) => Self::from_file(path)?,
            None => match Self::default_path().filter(|p| p.exists()) {
                Some(path) => Self::from_file(&path)?,
                None => Config::default(),
            },
        };
        if let Some(v) = &args.model {
            config.model = Some(v.clone());
        }
        if let Some(v) = args.host {
            config.host = v;
        }
        if let Some(v) = args.port {
            config.port = v;
        }
        if let Some(v) = args.ollama_port {
            config.ollama_port = Some(v);
        }
        if let Some(v) = args.weight_format {
            config.weight_format = v;
        }
        if let Some(v) = args.queue_capacity {
            config.queue_capacity = v;
        }
        if let Some(v) = args.max_batch {
            config.max_batch = v;
        }
        if let Some(v) = args.expert_cache_bytes {
            config.expert_cache_bytes = Some(v);
        }
        if let Some(v) = args.admission {
            config.admission = v;
        }
        if let Some(v) = args.speculative {
            config.speculative = v;
        }
        if let Some(v) = &args.data_dir {
            config.data_dir = Some(v.clone());
        }
        if let (Some(hostfile), Some(rank)) = (&args.hostfile, args.rank) {
            let (join, pass) = (Duration::from_secs(args.join_timeout), Duration::from_secs(args.pass_timeout));
            config.cluster =
                Some(crate::distributed::ClusterSpec::new(hostfile, rank, args.ring_port, [join, pass], args.parallel, args.on_rank_lost)?);
        }
        config.allowed_hosts.extend(args.allowed_hosts.iter().cloned());
        config.cors_origins.extend(args.cors_origins.iter().cloned());
        if args.api_key.is_some() {
            config.api_key = args.api_key.clone();
        } else if std::env::var_os("MLXBAR_API_KEY").is_some_and(|v| v.is_empty()) {
            // clap reads an empty variable as unset; a user who exported it meant a key.
            config.api_key = Some(String::new());
        }
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn validate(&self) -> Result<()> {
        // An empty key would be a key every request without one matches, and a configured
        // key turns the Host check off: together, a DNS-rebinding page could read and act.
        if let Some(key) = &self.api_key {
            if key.trim().is_empty() {
                bail!("the API key is empty (api_key in the config file, --api-key or MLXBAR_API_KEY): set a non-empty key, or remove it to serve loopback without one");
            }
        }
        if self.api_key.is_none() && self.allowed_hosts.iter().any(|h| h.trim() == "*") {
            bail!("allowed_hosts = [\"*\"] (or --allowed-host '*') turns the DNS-rebinding check off: list the host names, or set an API key (--api-key or MLXBAR_API_KEY), which then guards every request");
        }
        if !self.host.is_loopback() && self.api_key.is_none() {
            bail!("binding to {} exposes the server beyond this machine: set an API key (--api-key or MLXBAR_API_KEY)", self.host);
        }
        if self.cors_origins.iter().any(|o| o.trim() == "*") {
            bail!("a wildcard CORS origin is not allowed; list the origins");
        }
        crate::alerts::rules::resolve(&self.alerts).context("alert rules")?;
        if self.max_batch == 0 || self.max_batch > 256 {
            bail!("max_batch must be between 1 and 256");
        }
        if !(0.0..=3600.0).contains(&self.bench_wait_seconds) {
            bail!("bench_wait_seconds must be between 0 and 3600");
        }
        if self.max_loaded_models == 0 || self.max_loaded_models > 64 {
            bail!("max_loaded_models must be between 1 and 64");
        }
        if !(1..=16).contains(&self.max_concurrent_pulls) {
            bail!("max_concurrent_pulls must be between 1 and 16");
        }
        if self.queue_capacity == 0 {
            bail!("queue_capacity must be at least 1");
        }
        if !(self.stall_seconds > 0.0 && self.stall_seconds <= 86400.0) {
            bail!("stall_seconds must be in (0, 86400]");
        }
        if !(0.0..=86400.0).contains(&self.mlx_cache_idle_seconds) {
            bail!("mlx_cache_idle_seconds must be between 0 and 86400");
        }
        if !(0.0..=3600.0).contains(&self.shutdown_grace_seconds) {
            bail!("shutdown_grace_seconds must be between 0 and 3600");
        }
        if !(self.load_timeout_seconds > 0.0 && self.load_timeout_seconds <= 86400.0) {
            bail!("load_timeout_seconds must be in (0, 86400]");
        }
        if !(self.engine_stop_seconds > 0.0 && self.engine_stop_seconds <= 3600.0) {
            bail!("engine_stop_seconds must be in (0, 3600]");
        }
        if !(1..=16384).contains(&self.max_connections) {
            bail!("max_connections must be between 1 and 16384");
        }
        if !(self.header_read_timeout_seconds > 0.0 && self.header_read_timeout_seconds <= 60.0) {
            bail!("header_read_timeout_seconds must be in (0, 60]");
        }
        if !(self.body_read_timeout_seconds > 0.0 && self.body_read_timeout_seconds <= 3600.0) {
            bail!("body_read_timeout_seconds must be in (0, 3600]");
        }
        if !(1..=1024).contains(&self.max_stream_subscribers) {
            bail!("max_stream_subscribers must be between 1 and 1024");
        }
        if self.prepare_threads.is_some_and(|n| !(1..=64).contains(&n)) {
            bail!("prepare_threads must be between 1 and 64");
        }
        Ok(())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(default_data_dir)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.port)
    }

    /// `prepare_threads`, or half the cores (1-4): the engine and the async workers keep the rest.
    pub fn prepare_threads(&self) -> usize {
        self.prepare_threads.unwrap_or_else(|| (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).clamp(1, 4))
    }
}

/// `$MLXBAR_DATA_DIR`, else the platform data dir (`~/.local/share`, `~/Library/Application
/// Support`) + `mlxbar`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("MLXBAR_DATA_DIR")
        .map(PathBuf::from)
        .or_else(|| dirs::data_dir().map(|d| d.join("mlxbar")))
        .unwrap_or_else(|| PathBuf::from(".mlxbar"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_needs_an_api_key() {
        let mut c = Config { host: "0.0.0.0".parse().unwrap(), ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("API key"));
        c.api_key = Some("secret".into());
        c.validate().unwrap();
    }

    #[test]
    fn an_empty_key_is_refused_wherever_it_is_set() {
        for key in ["", "  "] {
            let c = Config { api_key: Some(key.into()), ..Config::default() };
            assert!(c.validate().unwrap_err().to_string().contains("API key is empty"), "{key:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "api_key = \"\"\n").unwrap();
        let err = Config::load(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("API key is empty"), "{err}");
        let err = Config::load(&ServeArgs { api_key: Some(String::new()), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("API key is empty"), "{err}");
    }

    #[test]
    fn any_host_needs_a_key() {
        let mut c = Config { allowed_hosts: vec!["*".into()], ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("DNS-rebinding"));
        c.api_key = Some("secret".into());
        c.validate().unwrap();
    }

    #[test]
    fn transport_limits_default_and_bounds() {
        let c = Config::default();
        assert!(c.header_read_timeout_seconds <= 10.0, "a request head gets 10 s at most by default");
        assert!(c.max_connections + crate::transport::REFUSING <= 128, "descriptors stay well under macOS's 256");
        assert!(c.max_stream_subscribers < c.max_connections);
        assert!((1..=4).contains(&c.prepare_threads()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "max_connections = 8\nheader_read_timeout_seconds = 2.5\nbody_read_timeout_seconds = 5\nmax_stream_subscribers = 2\nprepare_threads = 3\n").unwrap();
        let c = Config::load(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
        assert_eq!((c.max_connections, c.header_read_timeout_seconds, c.body_read_timeout_seconds), (8, 2.5, 5.0));
        assert_eq!((c.max_stream_subscribers, c.prepare_threads()), (2, 3));
        for bad in [
            "max_connections = 0",
            "header_read_timeout_seconds = 0",
            "header_read_timeout_seconds = 61",
            "body_read_timeout_seconds = -1",
            "max_stream_subscribers = 0",
            "prepare_threads = 0",
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = Config::load(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap_err();
            assert!(err.to_string().contains(bad.split(' ').next().unwrap()), "{bad}: {err}");
        }
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "port = 9000\nqueue_capacity = 3\nallowed_hosts = [\"mac.local\"]\n").unwrap();
        let args = ServeArgs { config: Some(path.clone()), port: Some(9100), ..Default::default() };
        let c = Config::load(&args).unwrap();
        assert_eq!((c.port, c.queue_capacity), (9100, 3));
        assert_eq!(c.allowed_hosts, vec!["mac.local".to_string()]);
        std::fs::write(&path, "cors_origins = [\"*\"]\n").unwrap();
        assert!(Config::load(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err());
        std::fs::write(&path, "prot = 1\n").unwrap();
        assert!(Config::load(&ServeArgs { config: Some(path), ..Default::default() }).is_err(), "unknown keys are errors");
    }
}
