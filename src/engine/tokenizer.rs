//! Text <-> token ids with the `tokenizers` crate, built from a GGUF's `tokenizer.ggml.*`
//! metadata (byte-level BPE here, SentencePiece in [`super::tokenizer_spm`]) or read from an
//! HF `tokenizer.json`; plus the chat template and end tokens.
use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use tokenizers::{
    decoders::byte_level::ByteLevel as ByteLevelDecoder,
    models::bpe::BPE,
    pre_tokenizers::{byte_level::ByteLevel, digits::Digits, sequence::Sequence, split::Split, PreTokenizerWrapper},
    processors::byte_level::ByteLevel as ByteLevelProcessor,
    AddedToken, SplitDelimiterBehavior, Tokenizer,
};

use super::chat_template::ChatTemplate;
use super::model::validate::{self, GgufSummary};
use super::tokenizer_spm::{CONTROL, USER_DEFINED};

/// Everything text-side of a model. `Send + Sync`: the HTTP side renders and counts prompts
/// before they reach the engine thread.
pub struct TextCodec {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Tokens that end generation: the model's EOS plus the template's end-of-turn tokens.
    pub stop_ids: BTreeSet<u32>,
    pub bos: Option<(u32, String)>,
    /// Prepend BOS to prompts (GGUF `add_bos_token`, HF `add_bos_token`).
    pub add_bos: bool,
}

impl TextCodec {
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode_fast(text, false).map_err(|e| anyhow!("tokenizer: {e}"))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some((bos, bos_text)) = &self.bos {
            if self.add_bos && !text.starts_with(bos_text.as_str()) {
                ids.insert(0, *bos);
            }
        }
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, true)
    }

    /// `skip_special`: special tokens decode to nothing (the usual) or to their text.
    pub fn decode_with(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tokenizer.decode(ids, skip_special).map_err(|e| anyhow!("tokenizer: {e}"))
    }

    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    fn finish(mut self, eos_tokens: &[&str]) -> Self {
        for t in eos_tokens {
            if let Some(id) = self.tokenizer.token_to_id(t) {
                self.stop_ids.insert(id);
            }
        }
        if let Some(tpl) = &self.template {
            for t in tpl.end_of_turn_tokens() {
                if let Some(id) = self.tokenizer.token_to_id(t) {
                    self.stop_ids.insert(id);
                }
            }
        }
        self
    }
}

/// Llama 3's and Qwen 2's pre-tokenizer split (the same regex in both).
const LLAMA3_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The arrays of a GGUF header the tokenizer reads whole (see [`validate::gguf_file_keeping`]);
/// any other array (a SentencePiece `precompiled_charsmap`, say) stays unread.
pub fn is_vocabulary_key(key: &str) -> bool {
    matches!(key, "tokenizer.ggml.tokens" | "tokenizer.ggml.scores" | "tokenizer.ggml.token_type" | "tokenizer.ggml.merges")
}

/// The text codec of the GGUF at `path` (its header alone: no tensor is read).
pub fn from_gguf_path(path: &Path) -> Result<TextCodec> {
    from_gguf(&validate::gguf_file_keeping(path, &is_vocabulary_key)?)
}

/// The text codec of a GGUF header read keeping the vocabulary ([`is_vocabulary_key`]).
pub fn from_gguf(h: &GgufSummary) -> Result<TextCodec> {
    let model = h.string("tokenizer.ggml.model").unwrap_or_default();
    let tokens = h.strings("tokenizer.ggml.tokens").context("no tokenizer.ggml.tokens")?;
    // llama.cpp takes every token as normal when the file gives no types.
    let types: Vec<i32> = match h.numbers("tokenizer.ggml.token_type") {
        Some(t) => t.iter().map(|&v| v as i32).collect(),
        None => vec![super::tokenizer_spm::NORMAL; tokens.len()],
    };
    ensure!(types.len() == tokens.len(), "GGUF tokenizer: {} tokens but {} token types", tokens.len(), types.len());
    let tokenizer = match model {
        "gpt2" => byte_level_bpe(h, tokens, &types)?,
        "llama" => {
            let scores: Vec<f32> = h.numbers("tokenizer.ggml.scores").context("no tokenizer.ggml.scores")?.iter().map(|&v| v as f32).collect();
            // llama.cpp's default for SentencePiece vocabularies.
            let prefix = h.number("tokenizer.ggml.add_space_prefix").is_none_or(|v| v != 0.0);
            super::tokenizer_spm::tokenizer(tokens, &scores, &types, prefix)?
        }
        other => bail!("GGUF tokenizer '{other}' is not supported (byte-level BPE 'gpt2' and SentencePiece 'llama' are); use a model folder with tokenizer.json instead"),
    };

    // llama.cpp's defaults where the file is silent: a SentencePiece vocabulary has BOS 1 and
    // EOS 2 and prepends BOS; a byte-level one none of that.
    let spm = model == "llama";
    let id = |k: &str, spm_default: u32| h.number(k).map(|v| v as u32).or(spm.then_some(spm_default));
    let mut stop_ids = BTreeSet::new();
    stop_ids.extend(id("tokenizer.ggml.eos_token_id", 2).filter(|&i| (i as usize) < tokens.len()));
    stop_ids.extend(h.number("tokenizer.ggml.eot_token_id").map(|v| v as u32));
    let bos = id("tokenizer.ggml.bos_token_id", 1).and_then(|b| tokens.get(b as usize).map(|t| (b, t.clone())));
    let add_bos = h.number("tokenizer.ggml.add_bos_token").map_or(spm, |v| v != 0.0);
    let template = h
        .string("tokenizer.chat_template")
        .map(|src| {
            let eos = stop_ids.iter().next().and_then(|i| tokens.get(*i as usize)).cloned();
            ChatTemplate::new(src.to_string(), bos.as_ref().map(|b| b.1.clone()), eos)
        })
        .transpose()?;
    Ok(TextCodec { tokenizer, template, stop_ids, bos, add_bos }.finish(&[]))
}

/// A byte-level BPE vocabulary (`gpt2`: Llama 3, Qwen, SmolLM ...) with its merges and the
/// pre-tokenizer `tokenizer.ggml.pre` names.
fn byte_level_bpe(h: &GgufSummary, tokens: &[String], types: &[i32]) -> Result<Tokenizer> {
    let merges = h.strings("tokenizer.ggml.merges").context("no tokenizer.ggml.merges")?;
    let vocab: tokenizers::models::bpe::Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges: Vec<(String, String)> = merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| anyhow!("bad merge '{m}'")))
        .collect::<Result<_>>()?;
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| anyhow!("building BPE: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);

    let pre = h.string("tokenizer.ggml.pre").unwrap_or("default");
    let byte_level = |use_regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, use_regex));
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        // llama.cpp's "smollm": digits one by one, then GPT-2's byte-level split.
        "smollm" => Sequence::new(vec![PreTokenizerWrapper::Digits(Digits::new(true)), byte_level(true)]).into(),
        "llama-bpe" | "llama3" | "qwen2" | "smaug-bpe" => Sequence::new(vec![
            PreTokenizerWrapper::Split(
                Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(LLAMA3_SPLIT.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| anyhow!("{e}"))?,
            ),
            byte_level(false),
        ])
        .into(),
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        other => {
            tracing::warn!("GGUF pre-tokenizer '{other}' is not known; using GPT-2 byte-level splitting");
            byte_level(true)
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    tokenizer.with_post_processor(Some(ByteLevelProcessor::new(true, false, true)));

    let added: Vec<AddedToken> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == CONTROL || **t == USER_DEFINED)
        .map(|(i, t)| AddedToken::from(tokens[i].clone(), *t == CONTROL).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&added);
    Ok(tokenizer)
}

/// An HF folder: `tokenizer.json`, `tokenizer_config.json` (template, bos/eos), and the
/// EOS ids of `generation_config.json` / `config.json`.
pub fn from_hf_dir(dir: &Path) -> Result<TextCodec> {
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| anyhow!("{}/tokenizer.json: {e}", dir.display()))?;
    let read_json = |name: &str| -> Result<serde_json::Value> {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(s) => serde_json::from_str(&s).with_context(|| format!("{}/{name}", dir.display())),
            Err(_) => Ok(serde_json::Value::Null),
        }
    };
    let tc = read_json("tokenizer_config.json")?;
    // A token may be a string or {"content": "..."}.
    let token_str = |v: &serde_json::Value| -> Option<String> {
        v.as_str().map(str::to_string).or_else(|| v.get("content").and_then(|c| c.as_str()).map(str::to_string))
    };
    let bos_text = tc.get("bos_token").and_then(token_str);
    let eos_text = tc.get("eos_token").and_then(token_str);
    let mut stop_ids = BTreeSet::new();
    for cfg in [read_json("generation_config.json")?, read_json("config.json")?] {
        match cfg.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => stop_ids.extend(n.as_u64().map(|n| n as u32)),
            Some(serde_json::Value::Array(a)) => stop_ids.extend(a.iter().filter_map(|n| n.as_u64()).map(|n| n as u32)),
            _ => {}
        }
    }
    let template_src = match tc.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        // A list of named templates: take "default".
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or(list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => std::fs::read_to_string(dir.join("chat_template.jinja")).ok(),
    };
    let template = template_src.map(|src| ChatTemplate::new(src, bos_text.clone(), eos_text.clone())).transpose()?;
    let bos = bos_text.as_ref().and_then(|t| tokenizer.token_to_id(t).map(|id| (id, t.clone())));
    let add_bos = tc.get("add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
    let eos: Vec<&str> = eos_text.as_deref().into_iter().collect();
    Ok(TextCodec { tokenizer, template, stop_ids, bos, add_bos }.finish(&eos))
}
