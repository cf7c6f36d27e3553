//! The GPU, power, thermal and energy-per-token series, copied from the power sampler at
//! scrape time. A figure this machine cannot read has no sample (an empty family is left
//! out of the exposition); `mlxbar_power_available{component}` tells a dashboard which.
//! Their macmon and asitop equivalents are in dashboards/README.md.
use prometheus::{CounterVec, GaugeVec, IntGaugeVec, Opts, Registry};

use crate::telemetry::power::attribution::EnergyView;
use crate::telemetry::power::{Component, PowerSample};

pub struct PowerMetrics {
    pub gpu_busy_ratio: GaugeVec,
    pub gpu_frequency_hertz: GaugeVec,
    pub power_watts: GaugeVec,
    pub energy_joules_total: CounterVec,
    pub temperature_celsius: GaugeVec,
    pub thermal_pressure: GaugeVec,
    pub power_available: IntGaugeVec,
    pub generation_joules_total: CounterVec,
    pub generation_tokens_per_joule: GaugeVec,
    pub idle_power_watts: GaugeVec,
}

/// Sets an unlabelled series to `v`, or leaves it without a sample.
fn set_or_drop(g: &GaugeVec, v: Option<f64>) {
    match v {
        Some(v) => g.with_label_values::<&str>(&[]).set(v),
        None => g.reset(),
    }
}

/// Moves a counter up to a cumulative figure kept elsewhere.
fn advance(c: &prometheus::Counter, total: f64) {
    let d = total - c.get();
    if d > 0.0 {
        c.inc_by(d);
    }
}

impl PowerMetrics {
    pub fn register(r: &Registry) -> PowerMetrics {
        fn reg<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: prometheus::Result<M>) -> M {
            let m = m.unwrap();
            r.register(Box::new(m.clone())).unwrap();
            m
        }
        let gauge = |name: &str, help: &str, labels: &[&str]| reg(r, GaugeVec::new(Opts::new(name, help), labels));
        let counter = |name: &str, help: &str, labels: &[&str]| reg(r, CounterVec::new(Opts::new(name, help), labels));
        PowerMetrics {
            gpu_busy_ratio: gauge("gpu_busy_ratio", "Share of the last second the GPU was active (0-1; macOS: IOReport GPU residency via macmon). No sample where unreadable.", &[]),
            gpu_frequency_hertz: gauge("gpu_frequency_hertz", "GPU frequency averaged over its active time in the last second. No sample while the GPU is idle or where unreadable.", &[]),
            power_watts: gauge(
                "power_watts",
                "Mean power over the last second by component: cpu, gpu, ane, dram (macOS: IOReport Energy Model; Linux: RAPL package and dram), system (macOS: SMC PSTR; Linux: RAPL psys). No sample where unreadable.",
                &["component"],
            ),
            energy_joules_total: counter("energy_joules_total", "Energy used since mlxbar started, by component (rate() of it is the power).", &["component"]),
            temperature_celsius: gauge(
                "temperature_celsius",
                "Temperatures: sensor cpu and gpu on macOS (macmon's die averages), <hwmon chip>_<label> on Linux (at most 16).",
                &["sensor"],
            ),
            thermal_pressure: gauge("thermal_pressure", "macOS thermal pressure: 0 nominal, 1 fair, 2 serious, 3 critical. No sample where the OS has no such level (Linux).", &[]),
            power_available: reg(
                r,
                IntGaugeVec::new(
                    Opts::new("power_available", "1 when this machine can read the component's power, 0 when it cannot (its other series then have no sample; `mlxbar doctor` says why)."),
                    &["component"],
                ),
            ),
            generation_joules_total: counter(
                "generation_joules_total",
                "Chip energy (cpu+gpu+ane+dram where readable) spent in the seconds the engine was generating, since start. No sample without a power source.",
                &[],
            ),
            generation_tokens_per_joule: gauge("generation_tokens_per_joule", "Tokens generated per joule of chip energy over the generating seconds of the last minute.", &[]),
            idle_power_watts: gauge("idle_power_watts", "Mean chip power in the last minute's worth of seconds the engine was idle.", &[]),
        }
    }

    pub fn observe(&self, s: &PowerSample, e: &EnergyView) {
        set_or_drop(&self.gpu_busy_ratio, s.gpu_busy_ratio);
        set_or_drop(&self.gpu_frequency_hertz, s.gpu_frequency_hertz);
        set_or_drop(&self.thermal_pressure, s.thermal_pressure.map(|p| f64::from(p.as_number())));
        for c in Component::ALL {
            let label = [c.as_str()];
            self.power_available.with_label_values(&label).set(i64::from(s.available(c)));
            match s.watts.get(c) {
                Some(w) => self.power_watts.with_label_values(&label).set(w),
                None => {
                    let _ = self.power_watts.remove_label_values(&label);
                }
            }
            if let Some(total) = s.energy_joules_total.get(c) {
                advance(&self.energy_joules_total.with_label_values(&label), total);
            }
        }
        self.temperature_celsius.reset();
        for t in &s.temperatures {
            self.temperature_celsius.with_label_values(&[t.sensor.as_str()]).set(t.celsius);
        }
        if let Some(total) = e.generation_joules_total {
            advance(&self.generation_joules_total.with_label_values::<&str>(&[]), total);
        }
        set_or_drop(&self.generation_tokens_per_joule, e.tokens_per_joule_last_minute);
        set_or_drop(&self.idle_power_watts, e.idle_watts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::power::{Interval, Temperature};
    use prometheus::Encoder;

    #[test]
    fn unreadable_figures_have_no_sample_and_available_says_so() {
        let r = Registry::new_custom(Some("mlxbar".into()), None).unwrap();
        let m = PowerMetrics::register(&r);
        let mut iv = Interval { seconds: 1.0, ..Default::default() };
        iv.joules.cpu = Some(12.5);
        iv.temperatures.push(Temperature { sensor: "coretemp_package_id_0".into(), celsius: 45.0 });
        let s = PowerSample::default().advance("sysfs", iv);
        m.observe(&s, &EnergyView::default());
        let mut buf = vec![];
        prometheus::TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("mlxbar_power_watts{component=\"cpu\"} 12.5"), "{text}");
        assert!(text.contains("mlxbar_energy_joules_total{component=\"cpu\"} 12.5"));
        assert!(text.contains("mlxbar_power_available{component=\"gpu\"} 0"));
        assert!(text.contains("mlxbar_power_available{component=\"cpu\"} 1"));
        assert!(text.contains("mlxbar_temperature_celsius{sensor=\"coretemp_package_id_0\"} 45"));
        for absent in
            ["mlxbar_gpu_busy_ratio", "mlxbar_thermal_pressure", "mlxbar_generation_joules_total", "power_watts{component=\"gpu\""]
        {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
    }
}
