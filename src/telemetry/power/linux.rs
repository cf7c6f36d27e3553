//! Linux reader: what sysfs offers without root. CPU package, DRAM and platform (`psys`)
//! energy from RAPL (`class/powercap/intel-rapl:*/energy_uj`, which AMD's Zen also
//! exposes; the older `amd_energy` hwmon driver where RAPL is absent), temperatures from
//! hwmon (`class/hwmon/*/temp*_input` with their labels). A file that cannot be read makes
//! its figure unavailable with the reason, never zero.
//!
//! The sysfs root is injectable ([`Reader::at`]; `MLXBAR_SYSFS_ROOT` for the server, as
//! node_exporter's `--path.sysfs`), so tests read a fixture tree.
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::derive::{celsius_from_millidegrees, counter_delta, sensor_label, MAX_SENSORS};
use super::{Component, Interval, Temperature, Unavailable};

pub const SOURCE: &str = "sysfs";

/// One energy counter and the component it measures.
#[derive(Debug, Clone)]
struct Counter {
    component: Component,
    /// The counter file (`energy_uj`, or `energyN_input` of amd_energy), microjoules.
    file: PathBuf,
    /// `max_energy_range_uj`: where the counter wraps (amd_energy's do not).
    range: Option<u64>,
}

pub struct Reader {
    root: PathBuf,
    counters: Vec<Counter>,
    /// Why a component has no counter (found once, at open).
    missing: Vec<Unavailable>,
    /// Each counter's last reading (None: it failed) and when it was taken.
    last: Vec<Option<u64>>,
    last_at: Instant,
}

/// The sysfs root: `MLXBAR_SYSFS_ROOT` when set (a container with the host's /sys elsewhere).
pub fn sysfs_root() -> PathBuf {
    std::env::var_os("MLXBAR_SYSFS_ROOT").map_or_else(|| PathBuf::from("/sys"), PathBuf::from)
}

fn read_text(p: &Path) -> std::io::Result<String> {
    fs::read_to_string(p).map(|s| s.trim().to_string())
}

fn read_u64(p: &Path) -> std::io::Result<u64> {
    read_text(p)?.parse().map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("{}: {e}", p.display())))
}

/// Why a counter file could not be read, in words for `mlxbar doctor`.
pub fn reason(file: &Path, e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::PermissionDenied => format!(
            "{} is readable by root only (kernels since 5.10 close RAPL to users, CVE-2020-8694): run as root, or `chmod o+r` it",
            file.display()
        ),
        _ => format!("{}: {e}", file.display()),
    }
}

/// Sorted entries of a directory (empty when it is missing).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    v.sort();
    v
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// RAPL zones: `package-N` is the CPU package (its `core`/`uncore` subzones are inside it),
/// `dram` the memory, `psys` the platform. `intel-rapl-mmio` repeats the package: skipped.
fn rapl_counters(root: &Path) -> Vec<Counter> {
    let mut out = vec![];
    for zone in entries(&root.join("class/powercap")) {
        if !file_name(&zone).starts_with("intel-rapl:") {
            continue;
        }
        let component = match read_text(&zone.join("name")).as_deref() {
            Ok(n) if n.starts_with("package") => Component::Cpu,
            Ok("dram") => Component::Dram,
            Ok("psys") => Component::System,
            _ => continue,
        };
        out.push(Counter { component, file: zone.join("energy_uj"), range: read_u64(&zone.join("max_energy_range_uj")).ok() });
    }
    out
}

/// amd_energy's per-socket counters (`energyN_label` "Esocket<N>"), microjoules.
fn amd_energy_counters(root: &Path) -> Vec<Counter> {
    let mut out = vec![];
    for dir in entries(&root.join("class/hwmon")) {
        if read_text(&dir.join("name")).ok().as_deref() != Some("amd_energy") {
            continue;
        }
        for f in entries(&dir) {
            let name = file_name(&f);
            if let Some(n) = name.strip_prefix("energy").and_then(|r| r.strip_suffix("_label")) {
                if read_text(&f).is_ok_and(|l| l.starts_with("Esocket")) {
                    out.push(Counter { component: Component::Cpu, file: dir.join(format!("energy{n}_input")), range: None });
                }
            }
        }
    }
    out
}

/// hwmon temperatures, at most [`MAX_SENSORS`], labels made unique.
pub fn temperatures(root: &Path) -> Vec<Temperature> {
    let mut out: Vec<Temperature> = vec![];
    for dir in entries(&root.join("class/hwmon")) {
        let hwmon = read_text(&dir.join("name")).unwrap_or_else(|_| file_name(&dir).to_string());
        let mut inputs: Vec<(u32, PathBuf)> = entries(&dir)
            .into_iter()
            .filter_map(|f| {
                let n = file_name(&f).strip_prefix("temp")?.strip_suffix("_input")?.parse().ok()?;
                Some((n, f))
            })
            .collect();
        inputs.sort();
        for (n, f) in inputs {
            let Some(celsius) = read_text(&f).ok().and_then(|t| celsius_from_millidegrees(&t)) else { continue };
            let label = read_text(&dir.join(format!("temp{n}_label"))).ok();
            let mut sensor = sensor_label(&hwmon, label.as_deref(), n);
            if out.iter().any(|t| t.sensor == sensor) {
                sensor = format!("{sensor}_{}", out.len());
            }
            out.push(Temperature { sensor, celsius });
            if out.len() == MAX_SENSORS {
                return out;
            }
        }
    }
    out
}

impl Reader {
    pub fn open() -> Reader {
        Reader::at(&sysfs_root())
    }

    /// A reader of the sysfs tree at `root`; its first [`Reader::read`] gives the energy
    /// since this call.
    pub fn at(root: &Path) -> Reader {
        let mut counters = rapl_counters(root);
        if !counters.iter().any(|c| c.component == Component::Cpu) {
            counters.extend(amd_energy_counters(root));
        }
        let powercap = root.join("class/powercap");
        let mut missing = vec![];
        for c in [Component::Cpu, Component::Dram, Component::System] {
            if !counters.iter().any(|k| k.component == c) {
                let why = if powercap.is_dir() {
                    format!("no RAPL {} zone in {}", if c == Component::Cpu { "package" } else { c.as_str() }, powercap.display())
                } else {
                    format!(
                        "no {} (not an Intel or AMD host, a VM without RAPL, or the intel_rapl module is not loaded)",
                        powercap.display()
                    )
                };
                missing.push(Unavailable { figure: c.as_str().into(), reason: why });
            }
        }
        for (figure, reason) in [
            ("gpu", "Linux: MLX runs on the CPU here; there is no GPU power source"),
            ("ane", "Linux: no Neural Engine"),
            ("gpu_busy", "Linux: MLX runs on the CPU here; there is no GPU to be busy"),
            ("thermal_pressure", "Linux has no thermal pressure level (see the temperatures)"),
        ] {
            missing.push(Unavailable { figure: figure.into(), reason: reason.into() });
        }
        let last = counters.iter().map(|c| read_u64(&c.file).ok()).collect();
        Reader { root: root.to_path_buf(), counters, missing, last, last_at: Instant::now() }
    }

    /// Sleeps `interval`, then reads.
    pub fn next(&mut self, interval: Duration) -> Interval {
        std::thread::sleep(interval);
        let seconds = self.last_at.elapsed().as_secs_f64();
        self.read(seconds)
    }

    /// The energy since the last read, which was `seconds` ago, and the temperatures now.
    pub fn read(&mut self, seconds: f64) -> Interval {
        self.last_at = Instant::now();
        let mut iv = Interval { seconds, unavailable: self.missing.clone(), ..Default::default() };
        let mut failed: Vec<Component> = vec![];
        for (c, last) in self.counters.iter().zip(self.last.iter_mut()) {
            let now = match read_u64(&c.file) {
                Ok(v) => v,
                Err(e) => {
                    if !failed.contains(&c.component) {
                        failed.push(c.component);
                        iv.unavailable.push(Unavailable { figure: c.component.as_str().into(), reason: reason(&c.file, &e) });
                    }
                    *last = None;
                    continue;
                }
            };
            let delta = last.and_then(|prev| counter_delta(prev, now, c.range));
            *last = Some(now);
            match delta {
                Some(uj) => {
                    let j = iv.joules.get(c.component).unwrap_or(0.0) + uj as f64 / 1e6;
                    iv.joules.set(c.component, Some(j));
                }
                // no baseline yet (it failed last time) or a reset: this interval is unknown
                None => failed.push(c.component),
            }
        }
        for c in failed {
            iv.joules.set(c, None);
        }
        iv.temperatures = temperatures(&self.root);
        if iv.temperatures.is_empty() {
            iv.unavailable.push(Unavailable {
                figure: "temperature".into(),
                reason: format!("no readable temp*_input in {}", self.root.join("class/hwmon").display()),
            });
        }
        iv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture tree (tests/data/sysfs) copied where a test may change its counters.
    fn fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sysfs");
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for p in entries(&d) {
                let to = dir.path().join(p.strip_prefix(&src).unwrap());
                if p.is_dir() {
                    fs::create_dir_all(&to).unwrap();
                    stack.push(p);
                } else {
                    fs::copy(&p, &to).unwrap();
                }
            }
        }
        dir
    }

    fn set(root: &Path, zone: &str, uj: u64) {
        fs::write(root.join("class/powercap").join(zone).join("energy_uj"), format!("{uj}\n")).unwrap();
    }

    #[test]
    fn rapl_from_a_fixture_tree_with_a_wrap_around() {
        let dir = fixture();
        let root = dir.path();
        let mut r = Reader::at(root);
        // package: 0.099938 J to the top of its range, then 150 J past it
        set(root, "intel-rapl:0", 150_000_000);
        set(root, "intel-rapl:0:2", 2_469_474_853 + 5_000_000);
        set(root, "intel-rapl:1", 1_000_000 + 200_000_000);
        set(root, "intel-rapl:0:0", 999_999_999_999);
        let iv = r.read(2.0);
        let s = super::super::PowerSample::default().advance(SOURCE, iv.clone());
        assert!((iv.joules.cpu.unwrap() - 150.099938).abs() < 1e-9, "{:?}", iv.joules);
        assert!((s.watts.cpu.unwrap() - 75.049969).abs() < 1e-9, "the core subzone and the mmio repeat are not added");
        assert_eq!(s.watts.dram, Some(2.5));
        assert_eq!(s.watts.system, Some(100.0));
        assert_eq!((s.watts.gpu, s.watts.ane), (None, None));
        assert!((s.chip_watts.unwrap() - 77.549969).abs() < 1e-9, "package + DRAM: psys is not the chip");
        let figures: Vec<&str> = iv.unavailable.iter().map(|u| u.figure.as_str()).collect();
        assert_eq!(figures, ["gpu", "ane", "gpu_busy", "thermal_pressure"]);
        let sensors: Vec<(&str, f64)> = iv.temperatures.iter().map(|t| (t.sensor.as_str(), t.celsius)).collect();
        assert_eq!(sensors, [("coretemp_package_id_0", 45.0), ("coretemp_core_0", 43.0), ("acpitz_temp1", 27.8)]);
        // the next second reads on from the wrapped value
        set(root, "intel-rapl:0", 160_000_000);
        assert!((r.read(1.0).joules.cpu.unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn an_unreadable_counter_is_unavailable_with_its_reason_never_zero() {
        let dir = fixture();
        let root = dir.path();
        let mut r = Reader::at(root);
        // a directory where the counter should be: reading fails (as root, a permission
        // bit would not stop us; the reason for that case is tested below)
        let dram = root.join("class/powercap/intel-rapl:0:2/energy_uj");
        fs::remove_file(&dram).unwrap();
        fs::create_dir(&dram).unwrap();
        let iv = r.read(1.0);
        assert_eq!(iv.joules.dram, None);
        assert_eq!(iv.joules.cpu, Some(0.0), "an unchanged counter is a real 0 J");
        let why = iv.unavailable.iter().find(|u| u.figure == "dram").unwrap();
        assert!(why.reason.contains("intel-rapl:0:2/energy_uj"), "{why:?}");
        let denied = reason(Path::new("/sys/class/powercap/intel-rapl:0/energy_uj"), &std::io::Error::from(ErrorKind::PermissionDenied));
        assert!(denied.contains("root only") && denied.contains("chmod o+r"), "{denied}");
    }

    #[test]
    fn a_tree_without_rapl_or_hwmon_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let iv = Reader::at(dir.path()).read(1.0);
        assert_eq!(iv.joules, Default::default());
        let cpu = iv.unavailable.iter().find(|u| u.figure == "cpu").unwrap();
        assert!(cpu.reason.contains("class/powercap"), "{cpu:?}");
        assert!(iv.unavailable.iter().any(|u| u.figure == "temperature"));
    }

    #[test]
    fn amd_energy_counts_sockets_where_rapl_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let hw = dir.path().join("class/hwmon/hwmon3");
        fs::create_dir_all(&hw).unwrap();
        for (f, v) in [
            ("name", "amd_energy"),
            ("energy1_label", "Ecore000"),
            ("energy1_input", "100"),
            ("energy17_label", "Esocket0"),
            ("energy17_input", "5000000"),
        ] {
            fs::write(hw.join(f), v).unwrap();
        }
        let mut r = Reader::at(dir.path());
        fs::write(hw.join("energy17_input"), "35000000").unwrap();
        fs::write(hw.join("energy1_input"), "999999999").unwrap();
        assert_eq!(r.read(1.0).joules.cpu, Some(30.0), "the socket, not its cores on top");
    }

    /// The real /sys, when this machine has one: every figure is either read or has a reason.
    #[test]
    fn the_real_sysfs_reads_or_says_why() {
        let root = Path::new("/sys");
        if !root.is_dir() {
            return;
        }
        let mut r = Reader::at(root);
        let iv = r.read(0.001);
        for c in [Component::Cpu, Component::Dram, Component::System] {
            match iv.joules.get(c) {
                Some(j) => assert!(j >= 0.0),
                None => assert!(iv.unavailable.iter().any(|u| u.figure == c.as_str()), "{c:?} missing without a reason"),
            }
        }
        assert!(iv.temperatures.len() <= MAX_SENSORS);
        assert!(!iv.temperatures.is_empty() || iv.unavailable.iter().any(|u| u.figure == "temperature"));
    }
}
