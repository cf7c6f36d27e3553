//! Which of a repo's files a pull fetches, and the checks on every name that becomes a path
//! or a URL (repo ids, revisions, file names and commits come from users or from the hub).
//! An MLX repo: its config, tokenizer, chat template and top-level safetensors (no README,
//! no `original/` weights). A GGUF repo: one `.gguf`, the asked one, else the only one,
//! else the single Q4_K_M; otherwise the choices are listed.

/// `org/name` (or a legacy one-part `name`), in the hub's alphabet.
pub fn check_repo_id(repo: &str) -> anyhow::Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok = !repo.is_empty()
        && repo.len() <= 96
        && parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && !p.contains("..")
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        });
    anyhow::ensure!(ok, "'{repo}' is not a Hugging Face model id: expected org/name (letters, digits, '-', '_', '.')");
    Ok(())
}

/// A branch, tag or commit; may hold `/` (`refs/pr/1`), never `..`.
pub fn check_revision(revision: &str) -> anyhow::Result<()> {
    let ok = !revision.is_empty()
        && revision.len() <= 200
        && revision.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
        && revision.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    anyhow::ensure!(ok, "'{revision}' is not a revision (a branch, tag or commit)");
    Ok(())
}

/// A relative path inside the repo: no absolute paths, `..`, backslashes or control characters.
pub fn check_file_name(file: &str) -> anyhow::Result<()> {
    let ok = !file.is_empty()
        && file.len() <= 500
        && file.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
        && !file.chars().any(|c| c == '\\' || c.is_control());
    anyhow::ensure!(ok, "'{file}' is not a file name inside a repo");
    Ok(())
}

/// A commit the hub named: it becomes the snapshot directory's name.
pub fn check_commit(commit: &str) -> anyhow::Result<()> {
    let ok = (7..=64).contains(&commit.len()) && commit.chars().all(|c| c.is_ascii_alphanumeric());
    anyhow::ensure!(ok, "the hub named '{commit}' as the commit, which is not one");
    Ok(())
}

/// The files (besides weights) an MLX folder needs or uses.
const MLX_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

fn is_gguf(file: &str) -> bool {
    file.to_ascii_lowercase().ends_with(".gguf")
}

fn base_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// The files to fetch from `siblings` (the repo's file list), or why none fit.
pub fn select_files(siblings: &[String], gguf_file: Option<&str>) -> Result<Vec<String>, String> {
    let ggufs: Vec<&String> = siblings.iter().filter(|f| is_gguf(f)).collect();
    let choices = || ggufs.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", ");
    if let Some(want) = gguf_file {
        if let Some(found) = ggufs.iter().find(|f| f.as_str() == want) {
            return Ok(vec![found.to_string()]);
        }
        // A bare file name is enough when the repo keeps its GGUFs in folders.
        let by_name: Vec<&&String> = ggufs.iter().filter(|f| base_name(f) == want).collect();
        if let [only] = by_name.as_slice() {
            return Ok(vec![only.to_string()]);
        }
        return Err(if ggufs.is_empty() {
            format!("'{want}' is not in the repo, and it has no GGUF files")
        } else {
            format!("'{want}' is not in the repo; its GGUF files: {}", choices())
        });
    }
    let top_level = |f: &&String| !f.contains('/');
    let safetensors: Vec<&String> = siblings.iter().filter(top_level).filter(|f| f.ends_with(".safetensors")).collect();
    if siblings.iter().any(|f| f == "config.json") && !safetensors.is_empty() {
        // Mistral-style repos ship the same weights twice; the HF-layout ones are what loads.
        let hf_layout = safetensors.iter().any(|f| !f.starts_with("consolidated"));
        let mut files: Vec<String> = siblings
            .iter()
            .filter(top_level)
            .filter(|f| {
                MLX_FILES.contains(&f.as_str())
                    || f.ends_with(".safetensors.index.json")
                    || (f.ends_with(".safetensors") && !(hf_layout && f.starts_with("consolidated")))
            })
            .cloned()
            .collect();
        files.sort();
        return Ok(files);
    }
    // Vision projectors (`mmproj-*.gguf`) are never the model.
    let models: Vec<&&String> = ggufs.iter().filter(|f| !base_name(f).to_ascii_lowercase().starts_with("mmproj")).collect();
    if let [only] = models.as_slice() {
        return Ok(vec![only.to_string()]);
    }
    let q4km: Vec<&&&String> = models.iter().filter(|f| base_name(f).to_ascii_lowercase().contains("q4_k_m")).collect();
    if let [only] = q4km.as_slice() {
        return Ok(vec![only.to_string()]);
    }
    if !ggufs.is_empty() {
        return Err(format!(
            "it has {} GGUF files; choose one with --file (API: \"file\"): {}",
            ggufs.len(),
            choices()
        ));
    }
    let mut shown: Vec<&str> = siblings.iter().take(20).map(|s| s.as_str()).collect();
    if siblings.len() > 20 {
        shown.push("…");
    }
    Err(format!(
        "not an MLX model (config.json and *.safetensors) or a GGUF; its files: {}",
        if shown.is_empty() { "none".to_string() } else { shown.join(", ") }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_mlx_repo_gets_only_what_loads() {
        let siblings = names(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "chat_template.jinja",
            "original/model.safetensors",
            "consolidated.safetensors",
            "vocab.json",
        ]);
        assert_eq!(
            select_files(&siblings, None).unwrap(),
            names(&[
                "chat_template.jinja",
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ])
        );
    }

    #[test]
    fn a_gguf_repo_gets_one_file_or_the_choices() {
        let siblings = names(&["README.md", "m-Q8_0.gguf", "m-F16.gguf", "mmproj-m-f16.gguf"]);
        let err = select_files(&siblings, None).unwrap_err();
        assert!(err.contains("m-Q8_0.gguf") && err.contains("m-F16.gguf") && err.contains("--file"), "{err}");
        assert_eq!(select_files(&siblings, Some("m-F16.gguf")).unwrap(), names(&["m-F16.gguf"]));
        let err = select_files(&siblings, Some("m-Q2_K.gguf")).unwrap_err();
        assert!(err.contains("m-Q2_K.gguf") && err.contains("m-Q8_0.gguf"), "{err}");

        let with_default = names(&["m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-x.gguf"]);
        assert_eq!(select_files(&with_default, None).unwrap(), names(&["m-Q4_K_M.gguf"]));
        let single = names(&["m-Q8_0.gguf", "mmproj-x.gguf"]);
        assert_eq!(select_files(&single, None).unwrap(), names(&["m-Q8_0.gguf"]));
        let nested = names(&["Q4/m-Q4_0.gguf", "Q8/m-Q8_0.gguf"]);
        assert_eq!(select_files(&nested, Some("m-Q8_0.gguf")).unwrap(), names(&["Q8/m-Q8_0.gguf"]));
    }

    #[test]
    fn a_repo_with_neither_says_what_it_has() {
        let err = select_files(&names(&["README.md", "model.bin"]), None).unwrap_err();
        assert!(err.contains("model.bin") && err.contains("not an MLX model"), "{err}");
        let err = select_files(&names(&["config.json", "pytorch_model.bin"]), Some("x.gguf")).unwrap_err();
        assert!(err.contains("no GGUF files"), "{err}");
    }

    #[test]
    fn names_that_would_escape_the_cache_are_refused() {
        for ok in ["mlx-community/Qwen2.5-0.5B-Instruct-4bit", "gpt2", "a_b/c.d"] {
            check_repo_id(ok).unwrap();
        }
        for bad in ["", "a/b/c", "../x", "a/..", "a/.hidden", "a b/c", "a/", "/a", "a\\b/c"] {
            assert!(check_repo_id(bad).is_err(), "{bad}");
        }
        for ok in ["main", "refs/pr/1", "v1.0", "0123456789abcdef0123456789abcdef01234567"] {
            check_revision(ok).unwrap();
        }
        for bad in ["", "../main", "a//b", "main branch", "a/./b"] {
            assert!(check_revision(bad).is_err(), "{bad}");
        }
        for ok in ["config.json", "Q4/m.gguf"] {
            check_file_name(ok).unwrap();
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a\\b", "a\nb", "a//b"] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
        check_commit("0123456789abcdef0123456789abcdef01234567").unwrap();
        assert!(check_commit("../../x").is_err());
    }
}
