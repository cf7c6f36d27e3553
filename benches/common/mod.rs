//! What the benches print about the machine they ran on: the CPU's name (every figure is
//! named with it) and the memory copy bandwidth that decode's floors are measured against.
use std::time::Instant;

/// The CPU's model name (`/proc/cpuinfo`), else the architecture.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Copy bandwidth: read + write of a 256 MB buffer (best of 5 after a warm-up), in bytes/s.
pub fn copy_bandwidth() -> f64 {
    let big = vec![1u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    dst.copy_from_slice(&big);
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&big));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    2.0 * big.len() as f64 / best
}
