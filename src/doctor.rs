//! `mlxbar doctor`: what this machine gives mlxbar (MLX build, device, BLAS, memory and its
//! cgroup limit, model cache).
use std::fmt::Write;

use crate::engine::DeviceKind;
use crate::model_store;

/// The MLX library version, as MLX reports it.
pub fn mlx_version() -> String {
    // SAFETY: the string is created, read while alive (mlx_version fills it; its data is
    // NUL-terminated) and freed here; nothing else holds it.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let v = if mlx_sys::mlx_version(&mut s) == 0 {
            std::ffi::CStr::from_ptr(mlx_sys::mlx_string_data(s)).to_string_lossy().into_owned()
        } else {
            "unknown".into()
        };
        mlx_sys::mlx_string_free(s);
        v
    }
}

/// The shared library that provides `cblas_sgemm` to MLX in this process (Linux: it must
/// be OpenBLAS; the wheel's bundled reference BLAS is ~18x slower).
#[cfg(target_os = "linux")]
pub fn blas_provider() -> Option<String> {
    // SAFETY: dlsym/dladdr take a NUL-terminated name and a live Dl_info (all-zero is a
    // valid one); dli_fname, when not null, points to a NUL-terminated string owned by the
    // dynamic linker for the life of the process.
    unsafe {
        // RTLD_NEXT: past our own executable, which exports a forwarding cblas_sgemm
        // (src/engine/cpu_backend/gemv_forward.rs), to the library that does the work.
        let sym = libc::dlsym(libc::RTLD_NEXT, c"cblas_sgemm".as_ptr());
        if sym.is_null() {
            return None;
        }
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(sym, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn blas_provider() -> Option<String> {
    Some("Accelerate (macOS)".into())
}

/// Which compute kernels a model runs here, and what `weight_format = "auto"` picks.
pub fn kernels(device: DeviceKind) -> String {
    use crate::engine::cpu_backend;
    if device == DeviceKind::Gpu {
        return "Metal (MLX's own); auto keeps quantized weights quantized".into();
    }
    let quantized = match cpu_backend::quantized_kernel(4, 64) {
        Some(k) if cpu_backend::quantized_is_faster() => {
            format!("quantized matmul: mlxbar {k}, 4/8-bit in groups of 32/64/128; auto keeps such weights packed")
        }
        Some(k) => format!("quantized matmul: mlxbar {k}, slower than float32 here; auto dequantizes to float32"),
        None => "quantized matmul: MLX's own; auto dequantizes to float32".into(),
    };
    let attention = if cpu_backend::has_decode_attention() { "decode attention: mlxbar's" } else { "attention: MLX's" };
    format!("{quantized}; float32 matmul: BLAS (1-16 rows: mlxbar's gemv/small-m routing); {attention}")
}

/// Whether this binary carries the fault-injection hooks (a `cargo test` build does: they
/// stay inert unless a test harness arms them; `make build` leaves them out).
pub fn test_hooks() -> &'static str {
    if cfg!(feature = "test-hooks") {
        "compiled in (a test build; inert unless a test harness arms them; `make build` makes a binary without them)"
    } else {
        "not compiled in"
    }
}

/// The memory the budget judges loads against: the machine's, or its cgroup's limit.
pub fn memory_line(m: Option<&crate::telemetry::memory::MemoryStats>) -> String {
    use crate::registry::budget::human;
    let Some(m) = m else { return "not readable".into() };
    match &m.cgroup {
        Some(c) => format!(
            "{} available of {}: cgroup v{} limit at {} ({} in use); loads are judged against it",
            human(m.available),
            human(c.limit),
            c.version,
            c.path,
            human(c.working_set)
        ),
        None => format!("{} available of {} (no cgroup memory limit)", human(m.available), human(m.total)),
    }
}

/// What the power sampler reads on this machine, figure by figure; an unreadable one with
/// the reason (so a dashboard's missing series can be explained).
pub fn power_lines(s: &crate::telemetry::power::PowerSample) -> Vec<String> {
    use crate::telemetry::power::Component;
    let mut out = vec![format!("power       source {} (one {:.2} s interval)", s.source, s.interval_seconds)];
    let why = |figure: &str| s.unavailable.iter().find(|u| u.figure == figure).map_or("not read".to_string(), |u| u.reason.clone());
    for c in Component::ALL {
        let line = match s.watts.get(c) {
            Some(w) => format!("{w:.2} W"),
            None => format!("unavailable: {}", why(c.as_str())),
        };
        out.push(format!("  {:<16}{line}", c.as_str()));
    }
    let busy = match (s.gpu_busy_ratio, s.gpu_frequency_hertz) {
        (Some(b), Some(f)) => format!("{:.0} % busy at {:.0} MHz", b * 100.0, f / 1e6),
        (Some(b), None) => format!("{:.0} % busy", b * 100.0),
        _ => format!("unavailable: {}", why("gpu_busy")),
    };
    out.push(format!("  {:<16}{busy}", "gpu busy"));
    let temps = if s.temperatures.is_empty() {
        format!("unavailable: {}", why("temperature"))
    } else {
        s.temperatures.iter().map(|t| format!("{} {:.1} °C", t.sensor, t.celsius)).collect::<Vec<_>>().join(", ")
    };
    out.push(format!("  {:<16}{temps}", "temperatures"));
    let thermal = s.thermal_pressure.map_or_else(|| format!("unavailable: {}", why("thermal_pressure")), |t| t.as_str().to_string());
    out.push(format!("  {:<16}{thermal}", "thermal"));
    out
}

pub fn report() -> String {
    let mut out = String::new();
    let device = DeviceKind::for_this_platform();
    let _ = writeln!(out, "mlxbar      {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(out, "platform    {} {}", std::env::consts::OS, std::env::consts::ARCH);
    let _ = writeln!(out, "MLX         {}", mlx_version());
    let _ = writeln!(out, "device      {} ({})", device.as_str(), if device == DeviceKind::Gpu { "Metal" } else { "MLX CPU backend" });
    let blas = blas_provider().unwrap_or_else(|| "not found".into());
    let verdict = if cfg!(target_os = "linux") && !blas.contains("openblas") {
        "  <- slow reference BLAS: apt-get install libopenblas0-pthread and rebuild"
    } else {
        ""
    };
    let _ = writeln!(out, "BLAS        {blas}{verdict}");
    let _ = writeln!(out, "cpus        {}", std::thread::available_parallelism().map_or(0, |n| n.get()));
    let _ = writeln!(out, "kernels     {}", kernels(device));
    let _ = writeln!(out, "test hooks  {}", test_hooks());
    let _ = writeln!(out, "memory      {}", memory_line(crate::telemetry::memory::read().ok().as_ref()));
    for line in power_lines(&crate::telemetry::power::probe(std::time::Duration::from_millis(250))) {
        let _ = writeln!(out, "{line}");
    }
    let model = model_store::default_model_path();
    let _ = writeln!(
        out,
        "model cache {} ({})",
        model.display(),
        if model.exists() { "present" } else { "not fetched yet: `mlxbar fetch-model`" }
    );
    out
}

#[cfg(test)]
mod tests {
    use crate::telemetry::power::{Interval, PowerSample};

    #[test]
    fn power_lines_give_each_unreadable_figure_its_reason() {
        let mut iv = Interval::nothing(0.25, "no /sys/class/powercap");
        iv.joules.cpu = Some(5.0);
        iv.unavailable.retain(|u| u.figure != "cpu");
        let lines = super::power_lines(&PowerSample::default().advance("sysfs", iv));
        assert!(lines[0].starts_with("power       source sysfs"), "{lines:?}");
        assert!(lines.iter().any(|l| l.trim_start().starts_with("cpu") && l.ends_with("20.00 W")), "{lines:?}");
        assert!(lines.iter().any(|l| l.trim_start().starts_with("gpu ") && l.contains("unavailable: no /sys/class/powercap")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("temperatures") && l.contains("unavailable")), "{lines:?}");
    }
}
