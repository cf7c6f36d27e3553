//! macOS reader: the `macmon` crate as a library (IOReport's Energy Model and GPU Stats
//! channels, SMC, HID sensors; no sudo), plus the thermal pressure notify key. Thin: macmon's
//! figures are copied into [`MacmonRaw`] and turned into an interval by `derive`.
//!
//! `Sampler::get_metrics` blocks for the interval it measures; it runs on the power
//! monitor's own thread (see `monitor.rs`), never on an engine thread or inside an MLX call.
use std::ffi::{c_char, c_int};
use std::time::{Duration, Instant};

use super::derive::{from_macmon, thermal_from_notify_level, MacmonRaw};
use super::{Interval, ThermalPressure, Unavailable};

pub const SOURCE: &str = "macmon";

// libnotify, part of libSystem (<notify.h>).
extern "C" {
    fn notify_register_check(name: *const c_char, out_token: *mut c_int) -> u32;
    fn notify_get_state(token: c_int, state64: *mut u64) -> u32;
}

/// `com.apple.system.thermalpressurelevel`, registered once: the level macOS itself acts on
/// (NSProcessInfo.thermalState is derived from it), readable without Foundation.
struct ThermalKey {
    token: Option<c_int>,
}

impl ThermalKey {
    fn register() -> ThermalKey {
        let mut token: c_int = 0;
        // SAFETY: the name is a NUL-terminated literal; `token` is a live c_int the call
        // writes the registration's token to.
        let status = unsafe { notify_register_check(c"com.apple.system.thermalpressurelevel".as_ptr(), &mut token) };
        ThermalKey { token: (status == 0).then_some(token) }
    }

    fn read(&self) -> Option<ThermalPressure> {
        let token = self.token?;
        let mut state: u64 = 0;
        // SAFETY: `token` came from a successful notify_register_check; `state` is a live
        // u64 the call writes the key's state to.
        let status = unsafe { notify_get_state(token, &mut state) };
        if status == 0 {
            thermal_from_notify_level(state)
        } else {
            None
        }
    }
}

pub struct Reader {
    sampler: Result<macmon::Sampler, String>,
    thermal: ThermalKey,
    last: Instant,
}

impl Reader {
    pub fn open() -> Reader {
        let sampler = macmon::Sampler::new().map_err(|e| format!("macmon could not open IOReport/SMC: {e}"));
        Reader { sampler, thermal: ThermalKey::register(), last: Instant::now() }
    }

    /// One interval of `interval` (macmon measures it between two IOReport samples).
    pub fn next(&mut self, interval: Duration) -> Interval {
        let ms = interval.as_millis().clamp(1, u32::MAX as u128) as u32;
        let mut iv = match &mut self.sampler {
            Ok(s) => match s.get_metrics(ms) {
                Ok(m) => {
                    let soc = s.get_soc_info();
                    let raw = MacmonRaw {
                        vm: soc.vm,
                        gpu_table: soc.gpu_freqs.len() > 1,
                        cpu_power: m.cpu_power,
                        gpu_power: m.gpu_power,
                        ane_power: m.ane_power,
                        ram_power: m.ram_power,
                        sys_power: m.sys_power,
                        gpu_freq_mhz: m.gpu_freq_mhz,
                        gpu_active_ratio: m.gpu_active_ratio,
                        cpu_temp_avg: m.temp.cpu_temp_avg,
                        gpu_temp_avg: m.temp.gpu_temp_avg,
                    };
                    from_macmon(&raw, self.last.elapsed().as_secs_f64())
                }
                Err(e) => Interval::nothing(self.last.elapsed().as_secs_f64(), &format!("macmon: {e}")),
            },
            Err(reason) => {
                std::thread::sleep(interval);
                Interval::nothing(self.last.elapsed().as_secs_f64(), reason)
            }
        };
        self.last = Instant::now();
        iv.unavailable.retain(|u| u.figure != "thermal_pressure");
        iv.thermal_pressure = self.thermal.read();
        if iv.thermal_pressure.is_none() {
            iv.unavailable
                .push(Unavailable { figure: "thermal_pressure".into(), reason: "the thermal pressure notify key did not answer".into() });
        }
        iv
    }
}
