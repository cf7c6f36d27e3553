//! What benches share beside the library's `bench::machine`: the memory copy bandwidth that
//! decode's floors are measured against.
use std::time::Instant;

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
