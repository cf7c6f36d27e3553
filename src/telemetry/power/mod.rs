//! What the chip draws and how hot it runs: GPU busy ratio and frequency, CPU/GPU/ANE/DRAM
//! and system power, temperatures and thermal pressure, read without root.
//!
//! One reader per platform behind one cfg switch (as in `memory/`): macOS through the
//! `macmon` crate (IOReport's Energy Model channels, SMC, the thermal pressure notify key),
//! Linux through RAPL and hwmon in sysfs. Each turns one interval into an [`Interval`]; the
//! arithmetic (counter wrap-around, watts, sums, thermal levels) is in [`derive`], and the
//! energy-per-token bookkeeping in [`attribution`], pure functions that unit tests feed
//! values recorded on real machines. [`monitor`] runs the reader on a thread of its own,
//! never inside an MLX call (exo#2088: see README's telemetry section).
//!
//! A figure this machine cannot read is `None` with a reason in [`PowerSample::unavailable`]:
//! never a zero.
pub mod attribution;
pub mod derive;
#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
use macos as platform;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    pub const SOURCE: &str = "none";
    /// No power source on this OS.
    pub struct Reader;
    impl Reader {
        pub fn open() -> Reader {
            Reader
        }
        pub fn next(&mut self, interval: std::time::Duration) -> super::Interval {
            std::thread::sleep(interval);
            super::Interval::nothing(interval.as_secs_f64(), "no power sampler for this OS")
        }
    }
}
pub mod monitor;

use serde::Serialize;

/// A part of the machine whose power is reported (`component` label of the series).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    Cpu,
    Gpu,
    /// Apple's Neural Engine.
    Ane,
    Dram,
    /// The whole machine (macOS SMC `PSTR`, Linux RAPL `psys`).
    System,
}

impl Component {
    pub const ALL: [Component; 5] = [Component::Cpu, Component::Gpu, Component::Ane, Component::Dram, Component::System];
    /// The parts whose sum is "the chip" that energy per token is counted from: the system
    /// figure also holds the display, fans and chargers, which generation does not move.
    pub const CHIP: [Component; 4] = [Component::Cpu, Component::Gpu, Component::Ane, Component::Dram];

    pub fn as_str(self) -> &'static str {
        match self {
            Component::Cpu => "cpu",
            Component::Gpu => "gpu",
            Component::Ane => "ane",
            Component::Dram => "dram",
            Component::System => "system",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One value per [`Component`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PerComponent<T> {
    pub cpu: T,
    pub gpu: T,
    pub ane: T,
    pub dram: T,
    pub system: T,
}

impl<T: Copy> PerComponent<T> {
    pub fn get(&self, c: Component) -> T {
        [self.cpu, self.gpu, self.ane, self.dram, self.system][c.index()]
    }

    pub fn set(&mut self, c: Component, v: T) {
        *[&mut self.cpu, &mut self.gpu, &mut self.ane, &mut self.dram, &mut self.system][c.index()] = v;
    }
}

/// Thermal pressure as macOS names it (`NSProcessInfo.thermalState`); Linux has no such
/// level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ThermalPressure {
    Nominal,
    Fair,
    Serious,
    Critical,
}

impl ThermalPressure {
    /// 0 nominal, 1 fair, 2 serious, 3 critical (`mlxbar_thermal_pressure`).
    pub fn as_number(self) -> u8 {
        self as u8
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ThermalPressure::Nominal => "nominal",
            ThermalPressure::Fair => "fair",
            ThermalPressure::Serious => "serious",
            ThermalPressure::Critical => "critical",
        }
    }
}

/// One temperature sensor. `sensor` is a bounded label: "cpu" and "gpu" on macOS (macmon's
/// averages of the die sensors), `<hwmon name>_<label>` on Linux (at most
/// [`derive::MAX_SENSORS`]).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Temperature {
    pub sensor: String,
    pub celsius: f64,
}

/// Why a figure is missing on this machine (shown by `mlxbar doctor` and the snapshot).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Unavailable {
    /// A component ("cpu" … "system"), or "gpu_busy", "temperature", "thermal_pressure".
    pub figure: String,
    pub reason: String,
}

/// What a platform reader measured over one interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Interval {
    pub seconds: f64,
    /// Energy each component used in the interval; None: not readable here.
    pub joules: PerComponent<Option<f64>>,
    pub gpu_busy_ratio: Option<f64>,
    pub gpu_frequency_hz: Option<f64>,
    pub temperatures: Vec<Temperature>,
    pub thermal_pressure: Option<ThermalPressure>,
    pub unavailable: Vec<Unavailable>,
}

impl Interval {
    /// An interval in which nothing could be read, for `reason`.
    pub fn nothing(seconds: f64, reason: &str) -> Interval {
        let mut unavailable: Vec<Unavailable> =
            Component::ALL.iter().map(|c| Unavailable { figure: c.as_str().into(), reason: reason.into() }).collect();
        for figure in ["gpu_busy", "temperature", "thermal_pressure"] {
            unavailable.push(Unavailable { figure: figure.into(), reason: reason.into() });
        }
        Interval { seconds, unavailable, ..Default::default() }
    }
}

/// The latest reading, as `/metrics`, the snapshot and the alert engine see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PowerSample {
    /// Where the figures come from: "macmon", "sysfs" (RAPL/hwmon) or "none".
    pub source: &'static str,
    /// Length of the interval the watts are averaged over; 0 before the first.
    pub interval_seconds: f64,
    /// Mean power over the last interval, by component; null where not readable.
    pub watts: PerComponent<Option<f64>>,
    /// The sum of the readable CPU, GPU, ANE and DRAM figures (energy per token is counted
    /// from it); null when none is readable.
    pub chip_watts: Option<f64>,
    /// Energy since mlxbar started, by component (counters).
    pub energy_joules_total: PerComponent<Option<f64>>,
    pub chip_joules_total: Option<f64>,
    /// Share of the last interval the GPU was active (0–1).
    pub gpu_busy_ratio: Option<f64>,
    pub gpu_frequency_hertz: Option<f64>,
    pub temperatures: Vec<Temperature>,
    pub thermal_pressure: Option<ThermalPressure>,
    /// Every figure above that is null, and why.
    pub unavailable: Vec<Unavailable>,
}

impl PowerSample {
    /// Whether the component's power is readable here (`mlxbar_power_available`).
    pub fn available(&self, c: Component) -> bool {
        self.energy_joules_total.get(c).is_some()
    }

    /// Adds one interval to this sample's totals and takes its figures.
    pub fn advance(&self, source: &'static str, iv: Interval) -> PowerSample {
        let mut watts = PerComponent::default();
        let mut totals = self.energy_joules_total;
        for c in Component::ALL {
            let j = iv.joules.get(c);
            watts.set(c, j.and_then(|j| derive::watts(j, iv.seconds)));
            totals.set(c, j.map(|j| totals.get(c).unwrap_or(0.0) + j));
        }
        PowerSample {
            source,
            interval_seconds: iv.seconds,
            chip_watts: derive::chip_sum(&watts),
            chip_joules_total: derive::chip_sum(&totals),
            watts,
            energy_joules_total: totals,
            gpu_busy_ratio: iv.gpu_busy_ratio,
            gpu_frequency_hertz: iv.gpu_frequency_hz,
            temperatures: iv.temperatures,
            thermal_pressure: iv.thermal_pressure,
            unavailable: iv.unavailable,
        }
    }
}

/// One reading now, for `mlxbar doctor`: on Linux two reads a short interval apart (RAPL
/// needs two to give a rate), on macOS one macmon interval.
pub fn probe(interval: std::time::Duration) -> PowerSample {
    let mut reader = platform::Reader::open();
    PowerSample::default().advance(platform::SOURCE, reader.next(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_grow_by_each_interval_and_missing_stays_missing() {
        let mut iv = Interval { seconds: 2.0, ..Default::default() };
        iv.joules.cpu = Some(10.0);
        iv.joules.dram = Some(1.0);
        let s = PowerSample::default().advance("sysfs", iv.clone()).advance("sysfs", iv);
        assert_eq!(s.watts.cpu, Some(5.0));
        assert_eq!(s.energy_joules_total.cpu, Some(20.0));
        assert_eq!(s.chip_watts, Some(5.5));
        assert_eq!(s.chip_joules_total, Some(22.0));
        assert_eq!((s.watts.gpu, s.energy_joules_total.system), (None, None), "unreadable is null, never 0");
        assert!(s.available(Component::Cpu) && !s.available(Component::Gpu));
    }
}
