//! `mlxbar pull org/name [--revision R] [--file X.gguf]`: a pull with a progress bar on a
//! terminal; prints the snapshot directory. Ctrl-C leaves the partial file, and running the
//! same command again resumes it. Warnings (HF_TOKEN over plain http) go to stderr.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::Result;

use super::{pull, PullOptions, PullProgress};

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// The model on Hugging Face, as org/name (e.g. mlx-community/Qwen2.5-0.5B-Instruct-4bit);
    /// HF_ENDPOINT, HF_TOKEN and HF_HUB_CACHE / HF_HOME are honoured
    pub model: String,
    /// Branch, tag or commit (default: main)
    #[arg(long)]
    pub revision: Option<String>,
    /// For a repo of GGUF files: the one to fetch
    #[arg(long)]
    pub file: Option<String>,
}

/// Runs the pull (blocking: call from `spawn_blocking`).
pub fn run(args: PullArgs) -> Result<PathBuf> {
    let mut opts = PullOptions::from_env(&args.model);
    opts.revision = args.revision;
    opts.gguf_file = args.file;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let warned = AtomicUsize::new(0);
    let show = |p: &PullProgress| {
        for w in p.warnings.iter().skip(warned.load(Ordering::Relaxed)) {
            bar.suspend(|| eprintln!("warning: {w}"));
        }
        warned.store(p.warnings.len(), Ordering::Relaxed);
        if let Some(total) = p.bytes_total {
            bar.set_length(total);
        }
        bar.set_position(p.bytes_done);
        let file = p.file.as_deref().unwrap_or("");
        bar.set_message(format!("{} {}/{} {file}", p.repo, (p.files_done + 1).min(p.files_total), p.files_total));
    };
    let result = pull(&opts, &show, &AtomicBool::new(false));
    bar.finish_and_clear();
    result
}
