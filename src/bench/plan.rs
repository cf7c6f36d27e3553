//! Bench plans: a grid of cells (concurrent streams × prompt tokens × output tokens) with
//! warm-up and repetitions. Five are built in; users add TOML or JSON files to
//! `<data dir>/metrics/bench/plans/` (a file's stem is its name unless it sets one):
//! ```toml
//! description = "My editor's workload"
//! concurrency = [1, 2]
//! prompt_tokens = [1500]
//! output_tokens = [200]
//! warmup = 1
//! repetitions = 3
//! ```
//! A plan's `workload` is `"synthetic"` (the default: [`super::prompt`]'s word prompts of
//! `prompt_tokens`) or `"edit"` ([`super::edit`]'s rewrite-a-file request, whose size is the
//! file's, so such a plan sets no `prompt_tokens`); an edit plan runs every cell twice, without
//! and then with a Predicted Outputs `prediction` ([`CellSpec::prediction`]).
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub concurrency: Vec<usize>,
    /// Synthetic prompt sizes; empty for an edit plan.
    #[serde(default)]
    pub prompt_tokens: Vec<usize>,
    pub output_tokens: Vec<usize>,
    #[serde(default)]
    pub workload: Workload,
    /// Untimed single requests before each cell's first repetition.
    #[serde(default = "one")]
    pub warmup: usize,
    /// Timed rounds per cell; each round runs `concurrency` streams at once.
    #[serde(default = "one")]
    pub repetitions: usize,
    /// "builtin" or the file it came from (set on load, whatever the file says).
    #[serde(default)]
    pub source: String,
}

fn one() -> usize {
    1
}

/// What the requests of a plan ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Word prompts of each cell's `prompt_tokens` ([`super::prompt`]).
    #[default]
    Synthetic,
    /// Rewrite a ~400-token file with a one-line change ([`super::edit`]), each cell without
    /// and with a `prediction` of the file.
    Edit,
}

/// One point of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellSpec {
    pub concurrency: usize,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// The requests carry a Predicted Outputs `prediction` (edit plans' second variant).
    #[serde(default)]
    pub prediction: bool,
}

impl CellSpec {
    /// Short label for tables and charts: `4×128→64` (streams × prompt → output tokens),
    /// `1×535→450 +prediction` for a predicted cell.
    pub fn label(&self) -> String {
        let predicted = if self.prediction { " +prediction" } else { "" };
        format!("{}×{}→{}{predicted}", self.concurrency, self.prompt_tokens, self.output_tokens)
    }

    /// The same cell without the prediction: what a predicted cell's speed-up is against.
    pub fn unpredicted(self) -> CellSpec {
        CellSpec { prediction: false, ..self }
    }
}

/// Bounds that keep a plan from tying the engine up for hours by accident.
const MAX_CELLS: usize = 64;
const MAX_CONCURRENCY: usize = 256;
const MAX_TOKENS: usize = 131_072;
const MAX_REPETITIONS: usize = 100;

impl Plan {
    pub fn builtins() -> Vec<Plan> {
        let plan = |name: &str, description: &str, concurrency: &[usize], prompt: &[usize], output: &[usize], repetitions| Plan {
            name: name.into(),
            description: description.into(),
            concurrency: concurrency.to_vec(),
            prompt_tokens: prompt.to_vec(),
            output_tokens: output.to_vec(),
            workload: Workload::Synthetic,
            warmup: 1,
            repetitions,
            source: "builtin".into(),
        };
        let edit = Plan {
            workload: Workload::Edit,
            ..plan(
                "edit",
                "An editor's rewrite of a ~400-token file with a one-line change, without and with a predicted output",
                &[1],
                &[],
                &[super::edit::OUTPUT_TOKENS],
                3,
            )
        };
        vec![
            plan("quick", "One stream, short prompt: TTFT and decode speed in under a minute", &[1], &[128], &[64], 3),
            plan("standard", "One and four streams, short and medium prompts", &[1, 4], &[128, 512], &[128], 3),
            plan("concurrency-sweep", "1, 4 and 8 streams at once: aggregate throughput and queueing", &[1, 4, 8], &[64], &[64], 2),
            plan("long-context", "Long prompts: prefill speed and TTFT", &[1], &[1024, 3072], &[64], 2),
            edit,
        ]
    }

    /// Reads one user plan file (`.toml` or `.json`).
    pub fn from_file(path: &Path) -> Result<Plan> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut plan: Plan = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
            Some("json") => serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
            _ => bail!("{}: a plan is a .toml or .json file", path.display()),
        };
        if plan.name.is_empty() {
            plan.name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        }
        plan.source = path.display().to_string();
        plan.validate()?;
        Ok(plan)
    }

    pub fn validate(&self) -> Result<()> {
        let name_ok =
            !self.name.is_empty() && self.name.len() <= 64 && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            bail!("plan name '{}' must be 1-64 letters, digits, '-' or '_'", self.name);
        }
        let edit = self.workload == Workload::Edit;
        if edit && !self.prompt_tokens.is_empty() {
            bail!("plan '{}': an edit plan's prompt is its file (~{} tokens); drop prompt_tokens", self.name, super::edit::PROMPT_TOKENS);
        }
        for (axis, values, max) in [
            ("concurrency", &self.concurrency, MAX_CONCURRENCY),
            ("prompt_tokens", &self.prompt_tokens, MAX_TOKENS),
            ("output_tokens", &self.output_tokens, MAX_TOKENS),
        ] {
            if axis == "prompt_tokens" && edit {
                continue;
            }
            if values.is_empty() || values.iter().any(|&v| v == 0 || v > max) {
                bail!("plan '{}': {axis} needs at least one value, each between 1 and {max}", self.name);
            }
        }
        if self.repetitions == 0 || self.repetitions > MAX_REPETITIONS {
            bail!("plan '{}': repetitions must be between 1 and {MAX_REPETITIONS}", self.name);
        }
        if self.cells().len() > MAX_CELLS {
            bail!("plan '{}' has {} cells; at most {MAX_CELLS}", self.name, self.cells().len());
        }
        Ok(())
    }

    /// The grid in run order: prompt and output sizes outermost, concurrency innermost, so
    /// a sweep reads naturally in a table. An edit plan's prompt is its file, and each of its
    /// points runs without and then with the prediction, side by side.
    pub fn cells(&self) -> Vec<CellSpec> {
        let (prompts, predictions): (&[usize], &[bool]) = match self.workload {
            Workload::Synthetic => (&self.prompt_tokens, &[false]),
            Workload::Edit => (&[super::edit::PROMPT_TOKENS], &[false, true]),
        };
        let mut cells = vec![];
        for &prompt_tokens in prompts {
            for &output_tokens in &self.output_tokens {
                for &concurrency in &self.concurrency {
                    for &prediction in predictions {
                        cells.push(CellSpec { concurrency, prompt_tokens, output_tokens, prediction });
                    }
                }
            }
        }
        cells
    }

    /// Requests a run sends (for progress): warm-ups plus every stream of every round.
    pub fn total_requests(&self) -> usize {
        self.cells().iter().map(|c| self.warmup + self.repetitions * c.concurrency).sum()
    }
}

/// Built-ins plus the valid user plans in `dir`; a user plan with a built-in's name
/// replaces it. Broken files are skipped with a warning (returned for the caller to show).
pub fn available(dir: &Path) -> (Vec<Plan>, Vec<String>) {
    let mut plans = Plan::builtins();
    let mut warnings = vec![];
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => vec![],
    };
    files.sort();
    for path in files.into_iter().filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("toml" | "json"))) {
        match Plan::from_file(&path) {
            Ok(plan) => {
                plans.retain(|p| p.name != plan.name);
                plans.push(plan);
            }
            Err(e) => {
                tracing::warn!("skipping bench plan: {e:#}");
                warnings.push(format!("{e:#}"));
            }
        }
    }
    (plans, warnings)
}

pub fn find(dir: &Path, name: &str) -> Option<Plan> {
    available(dir).0.into_iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid_and_expand_in_order() {
        for p in Plan::builtins() {
            p.validate().unwrap();
        }
        let sweep = Plan::builtins().into_iter().find(|p| p.name == "concurrency-sweep").unwrap();
        let labels: Vec<_> = sweep.cells().iter().map(CellSpec::label).collect();
        assert_eq!(labels, ["1×64→64", "4×64→64", "8×64→64"]);
        assert_eq!(sweep.total_requests(), 3 + 2 * (1 + 4 + 8));
    }

    #[test]
    fn user_plans_load_override_and_broken_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tiny.toml"), "concurrency = [1, 2]\nprompt_tokens = [16]\noutput_tokens = [4]\nrepetitions = 2\n")
            .unwrap();
        std::fs::write(dir.path().join("q.json"), r#"{"name": "quick", "concurrency": [2], "prompt_tokens": [8], "output_tokens": [8]}"#)
            .unwrap();
        std::fs::write(dir.path().join("bad.toml"), "concurrency = [0]\nprompt_tokens = [1]\noutput_tokens = [1]\n").unwrap();
        std::fs::write(dir.path().join("garbage.json"), "{not json").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let (plans, warnings) = available(dir.path());
        let tiny = plans.iter().find(|p| p.name == "tiny").unwrap();
        assert_eq!((tiny.warmup, tiny.repetitions, tiny.cells().len()), (1, 2, 2));
        let quick: Vec<_> = plans.iter().filter(|p| p.name == "quick").collect();
        assert_eq!(quick.len(), 1);
        assert_eq!(quick[0].concurrency, [2], "the user's quick replaces the built-in");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(plans.iter().any(|p| p.name == "long-context"));
    }

    #[test]
    fn the_edit_plan_runs_each_cell_without_then_with_the_prediction() {
        let edit = Plan::builtins().into_iter().find(|p| p.name == "edit").unwrap();
        edit.validate().unwrap();
        let cells = edit.cells();
        assert_eq!(cells.iter().map(|c| c.prediction).collect::<Vec<_>>(), [false, true]);
        assert_eq!(cells[1].unpredicted(), cells[0]);
        assert_eq!(cells[0].prompt_tokens, super::super::edit::PROMPT_TOKENS);
        assert_eq!(cells[1].label(), format!("1×{}→450 +prediction", super::super::edit::PROMPT_TOKENS));
        assert_eq!(edit.total_requests(), 2 * (1 + 3));
    }

    #[test]
    fn user_edit_plans_load_and_take_no_prompt_sizes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ed.toml"), "workload = \"edit\"\nconcurrency = [1, 2]\noutput_tokens = [450]\n").unwrap();
        std::fs::write(
            dir.path().join("ed2.json"),
            r#"{"workload": "edit", "concurrency": [1], "prompt_tokens": [128], "output_tokens": [450]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("ed3.toml"), "workload = \"rewrite\"\nconcurrency = [1]\noutput_tokens = [450]\n").unwrap();
        std::fs::write(dir.path().join("syn.toml"), "concurrency = [1]\noutput_tokens = [4]\n").unwrap();
        let (plans, warnings) = available(dir.path());
        let ed = plans.iter().find(|p| p.name == "ed").unwrap();
        assert_eq!((ed.workload, ed.cells().len()), (Workload::Edit, 4));
        for broken in ["ed2", "ed3", "syn"] {
            assert!(!plans.iter().any(|p| p.name == broken), "{broken} is refused");
        }
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("drop prompt_tokens")), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("prompt_tokens needs at least one value")), "{warnings:?}");
        // A synthetic plan's cells never carry a prediction.
        assert!(Plan::builtins().iter().filter(|p| p.workload == Workload::Synthetic).all(|p| p.cells().iter().all(|c| !c.prediction)));
    }

    #[test]
    fn oversized_plans_are_refused() {
        let mut p = Plan::builtins().remove(0);
        p.concurrency = (1..=65).collect();
        assert!(p.validate().unwrap_err().to_string().contains("cells"));
        p.concurrency = vec![1];
        p.name = "../etc".into();
        assert!(p.validate().is_err());
    }
}
