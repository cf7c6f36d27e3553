//! What the machine and this process are doing: memory (OS and MLX), swap activity and
//! pressure, resident size and CPU. A sampler thread reads everything once a second and
//! publishes the latest [`SystemSample`] behind a short lock. Power, GPU and thermals
//! ([`power`]) have a sampler thread of their own (macmon blocks for its interval).
pub mod memory;
pub mod mlx_memory;
pub mod power;
pub mod process;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use memory::MemoryStats;
use mlx_memory::MlxMemory;
use process::ProcessStats;

#[derive(Debug, Clone, Default, Serialize)]
pub struct SystemSample {
    /// None when the OS reader failed (logged once).
    pub memory: Option<MemoryStats>,
    pub mlx: MlxMemory,
    pub process: ProcessStats,
    /// Pages per second over the last sampling interval.
    pub swap_in_rate: f64,
    pub swap_out_rate: f64,
    /// This process's CPU use over the last interval, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
}

pub struct Telemetry {
    latest: RwLock<Arc<SystemSample>>,
    /// GPU, power, temperatures and thermal pressure, and energy per token.
    pub power: Arc<power::monitor::PowerMonitor>,
    stop: AtomicBool,
    /// Test hook: a pressure level that replaces the measured one.
    #[cfg(feature = "test-hooks")]
    forced_pressure: RwLock<Option<memory::PressureLevel>>,
}

impl Telemetry {
    /// Starts sampling every `interval` on a thread of its own, and the power sampler on
    /// another unless `power_sampler` is false.
    pub fn start(interval: Duration, power_sampler: bool) -> Arc<Telemetry> {
        let t = Arc::new(Telemetry {
            latest: RwLock::new(Arc::new(sample(None, Duration::ZERO))),
            power: if power_sampler {
                power::monitor::PowerMonitor::start(interval)
            } else {
                Arc::new(power::monitor::PowerMonitor::disabled("power_sampler = false in the config"))
            },
            stop: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            forced_pressure: RwLock::new(None),
        });
        let weak = Arc::downgrade(&t);
        std::thread::Builder::new()
            .name("mlxbar-telemetry".into())
            .spawn(move || {
                let mut last = Instant::now();
                loop {
                    std::thread::sleep(interval);
                    let Some(t) = weak.upgrade() else { return };
                    if t.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let prev = t.latest();
                    let now = Instant::now();
                    let s = sample(Some(&prev), now - last);
                    last = now;
                    *t.latest.write().unwrap() = Arc::new(s);
                }
            })
            .expect("telemetry thread");
        t
    }

    pub fn latest(&self) -> Arc<SystemSample> {
        let s = self.latest.read().unwrap().clone();
        #[cfg(not(feature = "test-hooks"))]
        return s;
        #[cfg(feature = "test-hooks")]
        match *self.forced_pressure.read().unwrap() {
            Some(level) => {
                let mut s = (*s).clone();
                let m = s.memory.get_or_insert_with(Default::default);
                m.pressure = level;
                Arc::new(s)
            }
            None => s,
        }
    }

    /// Test hook: report `level` as the memory pressure until called with None.
    #[cfg(feature = "test-hooks")]
    pub fn force_pressure(&self, level: Option<memory::PressureLevel>) {
        assert!(crate::engine::faults::armed(), "test hooks are not armed (crate::engine::faults::arm)");
        *self.forced_pressure.write().unwrap() = level;
    }

    /// True while the pressure level is critical: new work must not start.
    pub fn pressure_critical(&self) -> bool {
        self.latest().memory.as_ref().is_some_and(|m| m.pressure == memory::PressureLevel::Critical)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.power.stop();
    }
}

/// One full reading (what the sampler thread does each second); public for the cost benchmark.
pub fn sample(prev: Option<&SystemSample>, elapsed: Duration) -> SystemSample {
    let memory = match memory::read() {
        Ok(m) => Some(m),
        Err(e) => {
            if prev.is_none_or(|p| p.memory.is_some()) {
                tracing::warn!("memory sampler: {e:#}");
            }
            None
        }
    };
    let process = process::read().unwrap_or_default();
    let secs = elapsed.as_secs_f64();
    let (swap_in_rate, swap_out_rate) = match (prev.and_then(|p| p.memory.as_ref()), &memory) {
        (Some(a), Some(b)) => (memory::derive::rate(a.swap_ins, b.swap_ins, secs), memory::derive::rate(a.swap_outs, b.swap_outs, secs)),
        _ => (0.0, 0.0),
    };
    let cpu_cores = match prev {
        Some(p) if secs > 0.0 => ((process.cpu_seconds - p.process.cpu_seconds) / secs).max(0.0),
        _ => 0.0,
    };
    SystemSample { memory, mlx: mlx_memory::read(), process, swap_in_rate, swap_out_rate, cpu_cores }
}
