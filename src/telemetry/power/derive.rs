//! The arithmetic of the power readers, as pure functions: energy counter deltas with
//! wrap-around (RAPL), watts, the chip's sum, macmon's figures into an [`Interval`],
//! temperatures and sensor labels (hwmon), thermal levels (macOS' notify key). The unit
//! tests feed values recorded on real machines; each names where it comes from.
use super::{Component, Interval, PerComponent, Temperature, ThermalPressure, Unavailable};

/// Temperature sensors exported at most (`mlxbar_temperature_celsius{sensor}` stays bounded).
pub const MAX_SENSORS: usize = 16;

/// Energy used between two readings of a cumulative counter that restarts at 0 after
/// `range` (RAPL's `max_energy_range_uj`). None when it went down and the range is unknown
/// (a reset, or a wrap we cannot size): that interval is skipped, not guessed.
pub fn counter_delta(prev: u64, cur: u64, range: Option<u64>) -> Option<u64> {
    if cur >= prev {
        return Some(cur - prev);
    }
    // Wrapped once: up to the top of the range, then from 0 to `cur`. (A counter that
    // wraps more than once between two 1 s reads would need ~262 kW: not a CPU.)
    range.filter(|r| *r >= prev).map(|r| r - prev + cur)
}

/// Mean power over an interval; None for an empty interval or a negative energy.
pub fn watts(joules: f64, seconds: f64) -> Option<f64> {
    (seconds > 0.0 && joules >= 0.0 && joules.is_finite()).then(|| joules / seconds)
}

/// The sum of the readable CPU, GPU, ANE and DRAM figures; None when none is readable.
pub fn chip_sum(v: &PerComponent<Option<f64>>) -> Option<f64> {
    Component::CHIP.iter().filter_map(|c| v.get(*c)).fold(None, |acc, x| Some(acc.unwrap_or(0.0) + x))
}

/// macOS' `com.apple.system.thermalpressurelevel` notify state (OSThermalPressureLevel: 0
/// nominal, 1 moderate, 2 heavy, 3 trapping, 4 sleeping) as NSProcessInfo's thermal
/// state names it (moderate → fair, heavy → serious, trapping and sleeping → critical).
/// None for a level Apple has not defined.
pub fn thermal_from_notify_level(level: u64) -> Option<ThermalPressure> {
    match level {
        0 => Some(ThermalPressure::Nominal),
        1 => Some(ThermalPressure::Fair),
        2 => Some(ThermalPressure::Serious),
        3 | 4 => Some(ThermalPressure::Critical),
        _ => None,
    }
}

/// A plausible die temperature (as macmon accepts them: above 0, at most 150 °C).
pub fn valid_celsius(c: f64) -> Option<f64> {
    (c > 0.0 && c <= 150.0).then_some(c)
}

/// hwmon's `temp*_input` (millidegrees Celsius) in degrees, when plausible.
pub fn celsius_from_millidegrees(text: &str) -> Option<f64> {
    text.trim().parse::<i64>().ok().and_then(|m| valid_celsius(m as f64 / 1000.0))
}

/// A sensor's label: `<hwmon name>_<temp label>` (or `_temp<N>` without a label), lower
/// case, anything but letters and digits as `_`.
pub fn sensor_label(hwmon_name: &str, label: Option<&str>, index: u32) -> String {
    let raw = match label {
        Some(l) if !l.trim().is_empty() => format!("{}_{}", hwmon_name.trim(), l.trim()),
        _ => format!("{}_temp{index}", hwmon_name.trim()),
    };
    let mut out = String::with_capacity(raw.len());
    for ch in raw.chars() {
        let ch = if ch.is_ascii_alphanumeric() { ch.to_ascii_lowercase() } else { '_' };
        if !(ch == '_' && out.ends_with('_')) {
            out.push(ch);
        }
    }
    out.trim_matches('_').to_string()
}

/// What macmon's `Metrics` and `SocInfo` say of one interval (copied field by field by the
/// macOS reader, so this file builds and is tested everywhere).
#[derive(Debug, Clone, Default)]
pub struct MacmonRaw {
    /// `SocInfo::vm`: a macOS VM has no power counters, frequency tables or sensors.
    pub vm: bool,
    /// `SocInfo::gpu_freqs.len() > 1`: the GPU has a frequency table (residencies are read).
    pub gpu_table: bool,
    pub cpu_power: f32,
    pub gpu_power: f32,
    pub ane_power: f32,
    pub ram_power: f32,
    /// 0 when SMC's `PSTR` was not readable (macmon's own convention).
    pub sys_power: f32,
    pub gpu_freq_mhz: u32,
    pub gpu_active_ratio: f32,
    pub cpu_temp_avg: Option<f32>,
    pub gpu_temp_avg: Option<f32>,
}

/// One macmon interval of `seconds` as an [`Interval`] (thermal pressure is read apart).
pub fn from_macmon(raw: &MacmonRaw, seconds: f64) -> Interval {
    let mut iv = Interval { seconds, ..Default::default() };
    let mut missing = |figure: &str, reason: &str| iv.unavailable.push(Unavailable { figure: figure.into(), reason: reason.into() });
    if raw.vm {
        for c in Component::ALL {
            missing(c.as_str(), "a virtual machine: IOReport has no energy channels");
        }
        missing("gpu_busy", "a virtual machine: no GPU frequency table");
        missing("temperature", "a virtual machine: no temperature sensors");
        return iv;
    }
    let joules = |w: f32| Some(f64::from(w) * seconds);
    iv.joules.cpu = joules(raw.cpu_power);
    iv.joules.gpu = joules(raw.gpu_power);
    iv.joules.ane = joules(raw.ane_power);
    iv.joules.dram = joules(raw.ram_power);
    if raw.sys_power > 0.0 {
        iv.joules.system = joules(raw.sys_power);
    } else {
        missing("system", "SMC key PSTR (system power) is not readable on this Mac");
    }
    if raw.gpu_table {
        iv.gpu_busy_ratio = Some(f64::from(raw.gpu_active_ratio).clamp(0.0, 1.0));
        // macmon averages the frequency over active residency: an idle GPU has none.
        iv.gpu_frequency_hz = (raw.gpu_freq_mhz > 0).then(|| f64::from(raw.gpu_freq_mhz) * 1e6);
    } else {
        missing("gpu_busy", "IOReport has no GPU frequency table on this Mac");
    }
    for (sensor, t) in [("cpu", raw.cpu_temp_avg), ("gpu", raw.gpu_temp_avg)] {
        if let Some(c) = t.and_then(|t| valid_celsius(f64::from(t))) {
            iv.temperatures.push(Temperature { sensor: sensor.into(), celsius: c });
        }
    }
    if iv.temperatures.is_empty() {
        missing("temperature", "neither SMC nor HID temperature sensors answered");
    }
    iv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rapl_counters_wrap_at_their_range() {
        // intel/thermal_daemon#45 (i7-4770S, Haswell): a DRAM zone's recorded
        // max_energy_range_uj 262143999938 and energy_uj 2469474853.
        let range = 262_143_999_938;
        assert_eq!(counter_delta(2_469_474_853, 2_470_474_853, Some(range)), Some(1_000_000));
        // 1.5 J before the top, 2.5 J after it: 4 J in the interval.
        assert_eq!(counter_delta(range - 1_500_000, 2_500_000, Some(range)), Some(4_000_000));
        assert_eq!(counter_delta(5_000_000, 1_000, None), None, "a fall without a known range is skipped");
        assert_eq!(counter_delta(range + 10, 5, Some(range)), None, "a reading above the range is not a wrap");
    }

    #[test]
    fn watts_from_a_recorded_rapl_second() {
        // icl-utk-edu/papi#635 (Xeon 6767P, Granite Rapids): PACKAGE0 190.462097 J in
        // 1.001 s, which PAPI reports as 190.3 W.
        let w = watts(190.462097, 1.001).unwrap();
        assert!((w - 190.3).abs() < 0.05, "{w}");
        assert_eq!(watts(1.0, 0.0), None);
        assert_eq!(watts(-1.0, 1.0), None);
    }

    #[test]
    fn macmon_readme_sample_becomes_an_interval() {
        // macmon 0.10.0 readme.md, its JSON example (an idle M-series Mac).
        let raw = MacmonRaw {
            gpu_table: true,
            cpu_power: 0.20486385,
            gpu_power: 0.017451683,
            ane_power: 0.0,
            ram_power: 0.11635789,
            sys_power: 5.876533,
            gpu_freq_mhz: 461,
            gpu_active_ratio: 0.09,
            cpu_temp_avg: Some(43.73614),
            gpu_temp_avg: Some(36.95167),
            ..Default::default()
        };
        let iv = from_macmon(&raw, 1.0);
        assert!(iv.unavailable.is_empty(), "{:?}", iv.unavailable);
        assert_eq!(iv.joules.ane, Some(0.0), "an idle ANE draws 0 W: a reading, not a gap");
        let chip = chip_sum(&iv.joules).unwrap();
        assert!((chip - (0.20486385 + 0.017451683 + 0.11635789)).abs() < 1e-6, "{chip}");
        assert!((iv.joules.system.unwrap() - 5.876533).abs() < 1e-6);
        assert_eq!(iv.gpu_frequency_hz, Some(461e6));
        assert!((iv.gpu_busy_ratio.unwrap() - 0.09).abs() < 1e-6);
        assert_eq!(iv.temperatures.iter().map(|t| t.sensor.as_str()).collect::<Vec<_>>(), ["cpu", "gpu"]);
        // Two seconds at the same draw: twice the energy.
        assert!((from_macmon(&raw, 2.0).joules.cpu.unwrap() - 2.0 * 0.20486385).abs() < 1e-6);
    }

    #[test]
    fn macmon_zeros_that_mean_unreadable_are_gaps() {
        // macmon readme: "In a macOS VM power and frequencies read 0, temperatures null";
        // metrics.rs: sys_power is 0.0 when SMC's PSTR read fails.
        let vm = from_macmon(&MacmonRaw { vm: true, ..Default::default() }, 1.0);
        assert_eq!(vm.joules, PerComponent::default());
        assert!(vm.unavailable.iter().any(|u| u.figure == "gpu_busy"));
        let no_smc = from_macmon(&MacmonRaw { gpu_table: true, cpu_power: 3.0, ..Default::default() }, 1.0);
        assert_eq!(no_smc.joules.system, None);
        assert_eq!(no_smc.joules.cpu, Some(3.0));
        assert_eq!(no_smc.gpu_busy_ratio, Some(0.0), "an idle GPU is 0 % busy: a reading");
        assert_eq!(no_smc.gpu_frequency_hz, None, "no active residency, no frequency");
        assert_eq!(no_smc.unavailable.iter().map(|u| u.figure.as_str()).collect::<Vec<_>>(), ["system", "temperature"]);
    }

    #[test]
    fn thermal_levels_and_temperatures() {
        assert_eq!(thermal_from_notify_level(0), Some(ThermalPressure::Nominal));
        assert_eq!(thermal_from_notify_level(2), Some(ThermalPressure::Serious));
        assert_eq!(thermal_from_notify_level(4), Some(ThermalPressure::Critical));
        assert_eq!(thermal_from_notify_level(9), None);
        assert_eq!(ThermalPressure::Serious.as_number(), 2);
        assert_eq!(celsius_from_millidegrees("45000\n"), Some(45.0));
        assert_eq!(celsius_from_millidegrees("-273150"), None, "a sensor that is not there");
        assert_eq!(celsius_from_millidegrees("x"), None);
        assert_eq!(sensor_label("coretemp", Some("Package id 0"), 1), "coretemp_package_id_0");
        assert_eq!(sensor_label("k10temp", Some("Tctl"), 1), "k10temp_tctl");
        assert_eq!(sensor_label("acpitz", None, 2), "acpitz_temp2");
    }
}
