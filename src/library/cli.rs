//! `mlxbar models [--json]`: the library as a table (or JSON), from the same sources the
//! server scans (the config's `models_dirs` and `model`, plus `--model PATH`).
use std::path::PathBuf;

use anyhow::Result;

use super::{Library, ModelEntry, Sources};
use crate::config::{Config, ServeArgs};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ModelsArgs {
    /// Print the entries as JSON (an array) instead of a table
    #[arg(long)]
    pub json: bool,
    /// Also list this .gguf file or model folder (repeatable)
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Config file whose `models_dirs` (and `model`) are scanned [default: the user config dir's mlxbar/config.toml, if present]
    #[arg(long, env = "MLXBAR_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Scans and prints; blocking.
pub fn run(args: &ModelsArgs) -> Result<()> {
    let config = Config::load(&ServeArgs { config: args.config.clone(), ..Default::default() })?;
    let mut paths = args.model.clone();
    paths.extend(config.model.clone());
    let library = Library::new(Sources::from_env(config.models_dirs.clone(), paths));
    let entries = library.entries();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        print!("{}", table(&entries));
    }
    Ok(())
}

/// ID, FORMAT, ARCH, PARAMS, QUANT, SIZE, CTX, RUNNABLE (or why not), in aligned columns.
pub fn table(entries: &[ModelEntry]) -> String {
    if entries.is_empty() {
        return "No models found (searched the Hugging Face hub cache, LM Studio's models folder, mlxbar's models dir and models_dirs).\n"
            .into();
    }
    let header = ["ID", "FORMAT", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "RUNNABLE"].map(String::from);
    let rows: Vec<[String; 8]> = entries
        .iter()
        .map(|e| {
            [
                e.id.clone(),
                e.format.as_str().into(),
                e.architecture.clone().unwrap_or_else(|| "-".into()),
                e.parameters.map_or("-".into(), |p| si(p as f64, "")),
                e.quantization.map_or("-".into(), |q| format!("{}-bit g{}", q.bits, q.group_size)),
                si(e.size_bytes as f64, "B"),
                e.context_length.map_or("-".into(), |c| c.to_string()),
                match &e.unsupported_reason {
                    None if e.runnable => "yes".into(),
                    why => format!("no: {}", why.as_deref().unwrap_or("unknown")),
                },
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// 134515008 -> "134.5M"; 98362432 B -> "98.4 MB".
fn si(v: f64, unit: &str) -> String {
    let (scaled, prefix) =
        [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")].into_iter().find(|(s, _)| v >= *s).map_or((v, ""), |(s, p)| (v / s, p));
    let sep = if unit.is_empty() { "" } else { " " };
    if prefix.is_empty() {
        format!("{v}{sep}{unit}")
    } else {
        format!("{scaled:.1}{sep}{prefix}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(si(134_515_008.0, ""), "134.5M");
        assert_eq!(si(98_362_432.0, "B"), "98.4 MB");
        assert_eq!(si(512.0, "B"), "512 B");
    }

    #[test]
    fn the_table_aligns_and_says_why() {
        let mut e = super::super::inspect::folder(std::path::Path::new("/nonexistent/gpt"));
        e.id = "org/gpt".into();
        let t = table(&[e]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("ID       FORMAT  ARCH"), "{t}");
        assert!(lines[1].starts_with("org/gpt  mlx     -"), "{t}");
        assert!(lines[1].ends_with("no: no config.json"), "{t}");
        assert!(table(&[]).starts_with("No models found"));
    }
}
