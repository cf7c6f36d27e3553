//! Every Prometheus metric mlxbar exports, defined in this one file with its help text.
//!
//! Names: `mlxbar_` prefix, base units (`_seconds`, `_bytes`), `_total` counters. Labels are
//! bounded: `route` is a route template (unknown paths are "unmatched"), `model` is the one
//! loaded model, `kind`/`endpoint`/`result`/`stream` take fixed values. The mapping from
//! MLX-Flash and vllm-mlx names is in dashboards/README.md.
pub mod batch_size;
pub mod cluster;
pub mod experts;
pub mod http;
pub mod inference;
pub mod live;
pub mod power;

use prometheus::{
    exponential_buckets, Counter, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::telemetry::SystemSample;

pub struct Metrics {
    registry: Registry,
    /// Per-request recording on (the default) or off.
    pub per_request: bool,
    /// Rolling windows for the live views.
    pub live: live::LiveStats,

    pub info: IntGaugeVec,
    pub uptime_seconds: Gauge,
    // HTTP
    pub http_requests_total: IntCounterVec,
    pub http_request_duration_seconds: HistogramVec,
    pub http_requests_in_flight: IntGaugeVec,
    /// Sockets being served (src/transport/).
    pub http_connections: IntGauge,
    /// Connections the server closed to stay within `max_connections`, by reason.
    pub http_connections_shed_total: IntCounterVec,
    // inference
    pub requests_total: IntCounterVec,
    pub request_duration_seconds: HistogramVec,
    pub time_to_first_token_seconds: HistogramVec,
    pub inter_token_latency_seconds: HistogramVec,
    pub queue_wait_seconds: HistogramVec,
    pub prefill_duration_seconds: HistogramVec,
    pub prompt_tokens_total: IntCounterVec,
    pub generation_tokens_total: IntCounterVec,
    pub tool_calls_cut_total: IntCounterVec,
    pub scheduler_waiting_requests: IntGauge,
    pub scheduler_running_requests: IntGauge,
    pub engine_steps_total: IntCounter,
    pub engine_failed_requests_total: IntCounter,
    pub engine_last_step_age_seconds: Gauge,
    pub engine_failed: IntGauge,
    pub engine_restart_required: IntGauge,
    // model
    pub model_loaded: IntGaugeVec,
    pub model_load_duration_seconds: GaugeVec,
    pub model_weight_bytes: IntGaugeVec,
    pub model_memory_bytes: IntGaugeVec,
    pub model_kv_bytes: IntGaugeVec,
    pub model_prefix_cache_bytes: IntGaugeVec,
    pub model_load_seconds: prometheus::Histogram,
    pub model_loads_total: IntCounterVec,
    pub model_unloads_total: IntCounterVec,
    // caches (filled by batching / prefix caching)
    pub kv_cache_tokens: IntGauge,
    pub kv_cache_bytes: IntGauge,
    pub kv_cache_budget_tokens: IntGauge,
    pub kv_cache_reserved_tokens: IntGauge,
    pub scheduler_max_batch: IntGauge,
    /// Decode steps by exact batch size, copied from the engine at scrape time and
    /// exported as the `batch_size` histogram.
    batch_size_counts: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    pub admission_blocked: IntGauge,
    pub admission_refused_total: IntCounterVec,
    // bench runs (src/bench/jobs.rs)
    pub bench_running: IntGauge,
    pub bench_waiting_requests: IntGauge,
    pub prefix_cache_entries: IntGauge,
    pub prefix_cache_bytes: IntGauge,
    pub prefix_cache_utilization_ratio: Gauge,
    pub prefix_cache_hits_total: IntCounter,
    pub prefix_cache_misses_total: IntCounter,
    pub prefix_cache_evictions_total: IntCounter,
    pub prefix_cache_tokens_saved_total: IntCounter,
    pub speculative_passes_total: IntCounter,
    pub speculative_draft_tokens_total: IntCounterVec,
    // memory
    pub mlx_memory_bytes: IntGaugeVec,
    pub mlx_cache_clears_total: IntCounterVec,
    pub memory_bytes: IntGaugeVec,
    pub memory_used_ratio: Gauge,
    pub swap_used_bytes: IntGauge,
    pub swap_total_bytes: IntGauge,
    pub swap_in_pages_total: IntCounter,
    pub swap_out_pages_total: IntCounter,
    pub memory_pressure_level: IntGauge,
    pub memory_pressure_raw: Gauge,
    pub memory_pressure_info: IntGaugeVec,
    // this process
    pub process_resident_memory_bytes: IntGauge,
    pub process_cpu_seconds_total: Counter,
    // alert engine
    pub alerts_firing: IntGaugeVec,
    /// A streamed mixture-of-experts model's expert cache.
    pub experts: experts::ExpertMetrics,
    /// The ranks of a cluster serving the default model.
    pub cluster: cluster::ClusterMetrics,
    /// GPU, power, temperatures, thermal pressure and energy per token.
    pub power: power::PowerMetrics,
}

/// Latency buckets from 1 ms to ~65 s (doubling).
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 17).unwrap()
}

impl Metrics {
    pub fn new() -> Metrics {
        Self::with_per_request(true)
    }

    /// Exports a histogram the engine observes itself (the grammar-mask time).
    pub fn register_engine_histogram(&self, h: prometheus::Histogram) {
        if let Err(e) = self.registry.register(Box::new(h)) {
            tracing::warn!("registering an engine histogram: {e}");
        }
    }

    pub fn with_per_request(per_request: bool) -> Metrics {
        let r = Registry::new_custom(Some("mlxbar".into()), None).unwrap();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.unwrap();
                r.register(Box::new(m.clone())).unwrap();
                m
            }};
        }
        let (batch_size, batch_size_counts) = batch_size::BatchSizeHistogram::new();
        r.register(Box::new(batch_size)).unwrap();
        let hist = |name: &str, help: &str, labels: &[&str]| {
            reg!(HistogramVec::new(HistogramOpts::new(name, help).buckets(latency_buckets()), labels))
        };
        Metrics {
            info: reg!(IntGaugeVec::new(Opts::new("info", "Always 1; labels say which mlxbar, model and device serve."), &["version", "model", "device"])),
            uptime_seconds: reg!(Gauge::new("uptime_seconds", "Seconds since the server started.")),
            http_requests_total: reg!(IntCounterVec::new(Opts::new("http_requests_total", "HTTP requests answered, by route template and status (the /metrics scrape is not counted)."), &["method", "route", "status"])),
            http_request_duration_seconds: hist("http_request_duration_seconds", "Time to the HTTP response head (a stream's first bytes), by route template.", &["method", "route"]),
            http_requests_in_flight: reg!(IntGaugeVec::new(Opts::new("http_requests_in_flight", "HTTP requests being handled now."), &["method", "route"])),
            http_connections: reg!(IntGauge::new("http_connections", "HTTP connections open now (at most max_connections).")),
            http_connections_shed_total: reg!(IntCounterVec::new(Opts::new("http_connections_shed_total", "Connections closed to stay within max_connections: evicted (it waited longest on its client; a newcomer took its place) or refused (503: every connection was busy)."), &["reason"])),
            requests_total: reg!(IntCounterVec::new(Opts::new("requests_total", "Inference requests finished, by endpoint (chat|completions|responses|messages|ollama_chat|ollama_generate), stream (true|false) and result (stop|length|cancelled|error)."), &["model", "endpoint", "stream", "result"])),
            request_duration_seconds: hist("request_duration_seconds", "End-to-end inference time: queued to last token.", &["model"]),
            time_to_first_token_seconds: hist("time_to_first_token_seconds", "Queued to first generated token (includes queue wait and prefill).", &["model"]),
            inter_token_latency_seconds: hist("inter_token_latency_seconds", "Time between consecutive generated tokens of one request.", &["model"]),
            queue_wait_seconds: hist("queue_wait_seconds", "Time a request waited before the engine took it.", &["model"]),
            prefill_duration_seconds: hist("prefill_duration_seconds", "Prompt processing time.", &["model"]),
            prompt_tokens_total: reg!(IntCounterVec::new(Opts::new("prompt_tokens_total", "Prompt tokens processed."), &["model"])),
            generation_tokens_total: reg!(IntCounterVec::new(Opts::new("generation_tokens_total", "Tokens generated."), &["model"])),
            tool_calls_cut_total: reg!(IntCounterVec::new(
                Opts::new("tool_calls_cut_total", "Tool calls max_tokens cut short (the answer keeps the complete calls, finish_reason length)."),
                &["model"]
            )),
            scheduler_waiting_requests: reg!(IntGauge::new("scheduler_waiting_requests", "Requests queued, not yet taken by the engine.")),
            scheduler_running_requests: reg!(IntGauge::new("scheduler_running_requests", "Requests being generated.")),
            engine_steps_total: reg!(IntCounter::new("engine_steps_total", "Engine steps run (each steps every running request once).")),
            engine_failed_requests_total: reg!(IntCounter::new("engine_failed_requests_total", "Requests the engine ended with an error (counted even with metrics_enabled = false).")),
            engine_last_step_age_seconds: reg!(Gauge::new("engine_last_step_age_seconds", "Seconds since the engine last finished a step while work waits or runs; 0 when idle. At stall_seconds /health says stalled.")),
            engine_failed: reg!(IntGauge::new("engine_failed", "1 when the engine has failed (the model did not load, or the engine thread died), else 0.")),
            engine_restart_required: reg!(IntGauge::new(
                "engine_restart_required",
                "1 once an engine thread was stuck past engine_stop_seconds or load_timeout_seconds and left behind (it holds its memory until mlxbar restarts), else 0."
            )),
            model_loaded: reg!(IntGaugeVec::new(Opts::new("model_loaded", "1 when the model is loaded and serving."), &["model"])),
            model_load_duration_seconds: reg!(GaugeVec::new(Opts::new("model_load_duration_seconds", "How long loading the model took."), &["model"])),
            model_weight_bytes: reg!(IntGaugeVec::new(Opts::new("model_weight_bytes", "Bytes of model weights as held in memory."), &["model"])),
            model_memory_bytes: reg!(IntGaugeVec::new(
                Opts::new("model_memory_bytes", "Bytes a loaded model holds as the memory budget counts it: weights + its KV budget; 0 once unloaded."),
                &["model"]
            )),
            model_kv_bytes: reg!(IntGaugeVec::new(
                Opts::new("model_kv_bytes", "Bytes of KV buffers a loaded model's running requests hold now (the decoding batch is padded to its longest row); 0 when idle or unloaded."),
                &["model"]
            )),
            model_prefix_cache_bytes: reg!(IntGaugeVec::new(
                Opts::new("model_prefix_cache_bytes", "Bytes of KV a loaded model's prefix cache holds; 0 once unloaded."),
                &["model"]
            )),
            model_load_seconds: reg!(prometheus::Histogram::with_opts(
                HistogramOpts::new("model_load_seconds", "Time to load a model, from the engine's start to ready (or failed).")
                    .buckets(exponential_buckets(0.25, 2.0, 10).unwrap())
            )),
            model_loads_total: reg!(IntCounterVec::new(
                Opts::new("model_loads_total", "Model loads by result: ok, failed, refused (did not fit the memory budget, or pressure)."),
                &["model", "result"]
            )),
            model_unloads_total: reg!(IntCounterVec::new(
                Opts::new("model_unloads_total", "Model unloads by reason: idle (keep-alive ran out), lru, memory (room for another), request."),
                &["model", "reason"]
            )),
            kv_cache_tokens: reg!(IntGauge::new("kv_cache_tokens", "Tokens held in KV caches of running requests.")),
            kv_cache_bytes: reg!(IntGauge::new("kv_cache_bytes", "Bytes of KV cache buffers of running requests.")),
            kv_cache_budget_tokens: reg!(IntGauge::new("kv_cache_budget_tokens", "KV tokens (prompt + max_tokens) running requests may claim together; more wait.")),
            kv_cache_reserved_tokens: reg!(IntGauge::new("kv_cache_reserved_tokens", "KV tokens claimed by running requests.")),
            scheduler_max_batch: reg!(IntGauge::new("scheduler_max_batch", "Sequences decoded together in one batched step, at most.")),
            batch_size_counts,
            admission_blocked: reg!(IntGauge::new("admission_blocked", "1 while waiting requests are held back because memory pressure is critical.")),
            admission_refused_total: reg!(IntCounterVec::new(Opts::new("admission_refused_total", "Requests refused (503) before starting, by reason."), &["reason"])),
            bench_running: reg!(IntGauge::new("bench_running", "1 while a bench run holds the engine exclusively; other generation requests wait or get 503.")),
            bench_waiting_requests: reg!(IntGauge::new("bench_waiting_requests", "Generation requests waiting for a bench run to end.")),
            prefix_cache_entries: reg!(IntGauge::new("prefix_cache_entries", "Prefixes held by the prefix cache.")),
            prefix_cache_bytes: reg!(IntGauge::new("prefix_cache_bytes", "Bytes of KV held by the prefix cache.")),
            prefix_cache_utilization_ratio: reg!(Gauge::new("prefix_cache_utilization_ratio", "Prefix cache bytes over its budget (0-1).")),
            prefix_cache_hits_total: reg!(IntCounter::new("prefix_cache_hits_total", "Requests that reused a cached prefix.")),
            prefix_cache_misses_total: reg!(IntCounter::new("prefix_cache_misses_total", "Requests that found no cached prefix.")),
            prefix_cache_evictions_total: reg!(IntCounter::new("prefix_cache_evictions_total", "Prefixes evicted from the prefix cache.")),
            prefix_cache_tokens_saved_total: reg!(IntCounter::new("prefix_cache_tokens_saved_total", "Prompt tokens not recomputed thanks to the prefix cache.")),
            speculative_passes_total: reg!(IntCounter::new("speculative_passes_total", "Forward passes that verified a draft (Predicted Outputs, prompt lookup).")),
            speculative_draft_tokens_total: reg!(IntCounterVec::new(
                Opts::new("speculative_draft_tokens_total", "Draft tokens verified, by result: accepted (taken into the answer without a pass of their own), rejected."),
                &["result"]
            )),
            mlx_memory_bytes: reg!(IntGaugeVec::new(Opts::new("mlx_memory_bytes", "MLX allocator memory: active (live arrays), peak, cache (reusable buffers), limit, cache_limit."), &["kind"])),
            mlx_cache_clears_total: reg!(IntCounterVec::new(
                Opts::new("mlx_cache_clears_total", "Times MLX's buffer cache was given back to the system, by reason: idle (no work for mlx_cache_idle_seconds), unload (a model unloaded)."),
                &["reason"]
            )),
            memory_bytes: reg!(IntGaugeVec::new(Opts::new("memory_bytes", "System memory by kind: total, free, available, used, active, inactive, wired, compressed, app, cached_files (Activity Monitor's terms on macOS)."), &["kind"])),
            memory_used_ratio: reg!(Gauge::new("memory_used_ratio", "Used system memory over total (0-1).")),
            swap_used_bytes: reg!(IntGauge::new("swap_used_bytes", "Swap in use.")),
            swap_total_bytes: reg!(IntGauge::new("swap_total_bytes", "Swap size.")),
            swap_in_pages_total: reg!(IntCounter::new("swap_in_pages_total", "Pages swapped in (the kernel's count since boot).")),
            swap_out_pages_total: reg!(IntCounter::new("swap_out_pages_total", "Pages swapped out (the kernel's count since boot).")),
            memory_pressure_level: reg!(IntGauge::new("memory_pressure_level", "Memory pressure: 0 normal, 1 warn, 2 critical, -1 unknown (see mlxbar_memory_pressure_info)." )),
            memory_pressure_raw: reg!(Gauge::new("memory_pressure_raw", "The raw pressure signal: macOS kern.memorystatus_vm_pressure_level (1, 2, 4) or Linux PSI some avg10 (percent).")),
            memory_pressure_info: reg!(IntGaugeVec::new(Opts::new("memory_pressure_info", "Always 1; source says where the pressure level comes from (kernel, psi, unknown)."), &["source"])),
            process_resident_memory_bytes: reg!(IntGauge::new("process_resident_memory_bytes", "Resident memory of the mlxbar process.")),
            process_cpu_seconds_total: reg!(Counter::new("process_cpu_seconds_total", "CPU time used by the mlxbar process.")),
            alerts_firing: reg!(IntGaugeVec::new(Opts::new("alerts_firing", "1 while the alert (a rule id of the alert engine, see /api/alerts) is firing."), &["alert"])),
            experts: experts::ExpertMetrics::register(&r),
            cluster: cluster::ClusterMetrics::register(&r),
            power: power::PowerMetrics::register(&r),
            registry: r,
            per_request,
            live: Default::default(),

        }
    }

    /// Creates every model-labelled series at zero, so queries see 0 rather than nothing
    /// before the first request. Idempotent; the label sets are fixed and small.
    pub fn init_model(&self, model: &str) {
        self.admission_refused_total.with_label_values(&["memory_pressure"]);
        self.admission_refused_total.with_label_values(&["bench_running"]);
        let endpoints = [
            "chat",
            "completions",
            crate::api::responses::ENDPOINT,
            crate::api::anthropic::ENDPOINT,
            crate::api::ollama::CHAT,
            crate::api::ollama::GENERATE,
        ];
        for endpoint in endpoints {
            for stream in ["true", "false"] {
                for result in ["stop", "length", "cancelled", "error"] {
                    self.requests_total.with_label_values(&[model, endpoint, stream, result]);
                }
            }
        }
        for h in [
            &self.request_duration_seconds,
            &self.time_to_first_token_seconds,
            &self.inter_token_latency_seconds,
            &self.queue_wait_seconds,
            &self.prefill_duration_seconds,
        ] {
            h.with_label_values(&[model]);
        }
        self.prompt_tokens_total.with_label_values(&[model]);
        self.generation_tokens_total.with_label_values(&[model]);
    }

    /// Copies the latest system sample into the gauges (done at scrape time).
    /// Copies the engine's cache, batch and admission figures.
    pub fn observe_engine(&self, e: &crate::engine::StatsView) {
        self.kv_cache_tokens.set(e.kv_tokens as i64);
        self.kv_cache_bytes.set(e.kv_bytes as i64);
        self.kv_cache_budget_tokens.set(e.kv_budget_tokens as i64);
        self.kv_cache_reserved_tokens.set(e.kv_reserved_tokens as i64);
        self.scheduler_max_batch.set(e.max_batch as i64);
        self.admission_blocked.set(e.admission_blocked as i64);
        advance_to(&self.engine_failed_requests_total, e.failed_requests);
        self.prefix_cache_entries.set(e.prefix_entries as i64);
        self.prefix_cache_bytes.set(e.prefix_bytes as i64);
        self.prefix_cache_utilization_ratio.set(if e.prefix_budget_bytes > 0 {
            e.prefix_bytes as f64 / e.prefix_budget_bytes as f64
        } else {
            0.0
        });
        advance_to(&self.prefix_cache_hits_total, e.prefix_hits);
        advance_to(&self.prefix_cache_misses_total, e.prefix_misses);
        advance_to(&self.prefix_cache_evictions_total, e.prefix_evictions);
        advance_to(&self.prefix_cache_tokens_saved_total, e.prefix_tokens_saved);
        advance_to(&self.speculative_passes_total, e.draft_passes);
        advance_to(&self.speculative_draft_tokens_total.with_label_values(&["accepted"]), e.draft_accepted);
        advance_to(&self.speculative_draft_tokens_total.with_label_values(&["rejected"]), e.draft_rejected);
    }

    /// Copies the engine's decode steps per batch size (index = size).
    pub fn observe_batch_sizes(&self, steps_by_size: Vec<u64>) {
        *self.batch_size_counts.lock().unwrap_or_else(|e| e.into_inner()) = steps_by_size;
    }

    pub fn observe_system(&self, s: &SystemSample) {
        advance_to(&self.mlx_cache_clears_total.with_label_values(&["idle"]), s.mlx.idle_clears);
        advance_to(&self.mlx_cache_clears_total.with_label_values(&["unload"]), s.mlx.unload_clears);
        for (kind, v) in [
            ("active", s.mlx.active),
            ("peak", s.mlx.peak),
            ("cache", s.mlx.cache),
            ("limit", s.mlx.limit),
            ("cache_limit", s.mlx.cache_limit),
        ] {
            self.mlx_memory_bytes.with_label_values(&[kind]).set(v as i64);
        }
        self.process_resident_memory_bytes.set(s.process.resident_bytes as i64);
        // Counters follow cumulative readings: add what was counted since the last scrape.
        let cpu = &self.process_cpu_seconds_total;
        cpu.inc_by((s.process.cpu_seconds - cpu.get()).max(0.0));
        let source = s.memory.as_ref().map_or("unknown", |m| m.pressure_source.as_str());
        for src in ["kernel", "psi", "unknown"] {
            self.memory_pressure_info.with_label_values(&[src]).set(i64::from(src == source));
        }
        let Some(m) = &s.memory else {
            self.memory_pressure_level.set(-1);
            return;
        };
        for (kind, v) in [
            ("total", m.total),
            ("free", m.free),
            ("available", m.available),
            ("used", m.used),
            ("active", m.active),
            ("inactive", m.inactive),
            ("wired", m.wired),
            ("compressed", m.compressed),
            ("app", m.app),
            ("cached_files", m.cached_files),
        ] {
            self.memory_bytes.with_label_values(&[kind]).set(v as i64);
        }
        self.memory_used_ratio.set(m.used_ratio());
        self.swap_used_bytes.set(m.swap_used as i64);
        self.swap_total_bytes.set(m.swap_total as i64);
        advance_to(&self.swap_in_pages_total, m.swap_ins);
        advance_to(&self.swap_out_pages_total, m.swap_outs);
        self.memory_pressure_level.set(m.pressure.as_number().map_or(-1, i64::from));
        self.memory_pressure_raw.set(m.pressure_raw.unwrap_or(f64::NAN));
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding");
        String::from_utf8(buf).expect("utf-8 metrics")
    }
}

/// Moves a counter up to a cumulative reading kept elsewhere (the kernel's, the engine's).
pub fn advance_to(counter: &IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
