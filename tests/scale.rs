//! At a size where it matters (a ~1.1B-parameter 4-bit MLX folder, tests/common/fixtures.rs
//! `scale_folder`), the CPU keeps affine-quantized weights packed in `WeightFormat::Native`:
//! loading grows the process by about the folder's size, not the 4 bytes a parameter that
//! float32 would take, and the model decodes. Prints the figures (RSS, ratio, tok/s).
//!
//! The load runs in a child process (this test binary re-run on `load_in_child`) so the
//! RSS it measures is the model's alone, not the fixture build's MLX and malloc caches.
mod common;

use std::time::Instant;

use mlx_rs::Device;
use mlxbar::engine::{loader, sampling::argmax, WeightFormat};

/// Allowed RSS growth over the stored size: allocator rounding, and the KV cache and
/// activations of a few tokens (the weights themselves are held at their stored size).
const RSS_FACTOR: f64 = 1.15;
const RSS_SLACK_MIB: f64 = 150.0;
const DECODE_STEPS: usize = 8;
const CHILD_ENV: &str = "MLXBAR_SCALE_CHILD";

#[test]
fn native_keeps_a_1b_model_packed_and_decodes() {
    let started = Instant::now();
    let dir = common::fixtures::scale_folder();
    println!("fixture ready in {:.1} s: {}", started.elapsed().as_secs_f64(), dir.display());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "load_in_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "the child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("decode ok"), "the child ran the load test: {stdout}");
}

/// Only does anything when run by the test above (with the fixture's path in `CHILD_ENV`).
#[test]
fn load_in_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let dir = std::path::PathBuf::from(dir);
    Device::set_default(&Device::cpu());
    let stored = common::fixtures::safetensors_bytes(&dir);
    let params = common::fixtures::scale_params();
    let mib = |b: f64| b / (1024.0 * 1024.0);

    let before = rss_bytes();
    let t = Instant::now();
    let (model, codec, info) = loader::load(&dir, WeightFormat::Native).unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let grown = rss_bytes().saturating_sub(before) as f64;
    let f32_bytes = params as f64 * 4.0;
    println!(
        "{params} params; stored {:.0} MiB; loaded in {load_s:.1} s; RSS +{:.0} MiB ({:.2}x stored; weights {:.0} MiB); float32 would need {:.0} MiB ({:.1}x the growth)",
        mib(stored as f64),
        mib(grown),
        grown / stored as f64,
        mib(info.weight_bytes as f64),
        mib(f32_bytes),
        f32_bytes / grown
    );
    assert_eq!(info.weight_format, WeightFormat::Native);
    assert_eq!(info.layers, 22);
    // Packed values and the file's float16 scales and biases as they are: the weights take
    // in memory what they take on disk (float32 scales would add 11 % at groups of 64).
    let held = info.weight_bytes as f64;
    assert!(held <= stored as f64 * 1.01, "weights held {held} B, stored {stored} B");
    // The registry's estimate of these weights (from the folder's safetensors shapes) is
    // what the engine holds, within 3%.
    let entry = mlxbar::library::inspect::inspect(&dir).unwrap();
    let estimate = mlxbar::registry::budget::weights_as_held(&entry, WeightFormat::Native, false) as f64;
    println!("weights estimated {:.0} MiB, held {:.0} MiB ({:+.2}%)", mib(estimate), mib(held), 100.0 * (estimate / held - 1.0));
    assert!((estimate - held).abs() <= 0.03 * held, "estimated {estimate} B, held {held} B");
    let limit = stored as f64 * RSS_FACTOR + RSS_SLACK_MIB * 1024.0 * 1024.0;
    assert!(grown <= limit, "RSS grew {:.0} MiB loading a {:.0} MiB folder (limit {:.0} MiB)", mib(grown), mib(stored as f64), mib(limit));

    let prompt = codec.encode("The lighthouse keeper").unwrap();
    let mut cache = model.new_cache();
    let t = Instant::now();
    let mut next = argmax(model.forward(&prompt, &mut cache).unwrap().as_slice::<f32>());
    let prefill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..DECODE_STEPS {
        let logits = model.forward(&[next], &mut cache).unwrap();
        let logits = logits.as_slice::<f32>();
        assert!(logits.iter().all(|x| x.is_finite()), "finite logits");
        next = argmax(logits);
    }
    let decode_s = t.elapsed().as_secs_f64();
    println!(
        "prefill {} tokens in {prefill_s:.2} s; {DECODE_STEPS} decode steps in {decode_s:.2} s = {:.2} tok/s (Native, CPU, {} threads available); RSS now +{:.0} MiB",
        prompt.len(),
        DECODE_STEPS as f64 / decode_s,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mib(rss_bytes().saturating_sub(before) as f64)
    );
    println!("decode ok");
}

/// This process's resident set (VmRSS in /proc/self/status).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}
