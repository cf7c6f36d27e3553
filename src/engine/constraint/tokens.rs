//! The model's vocabulary as llguidance sees it (a `TokEnv`: every token's bytes in a trie),
//! built from our `TextCodec`. toktrie_hf_tokenizers pins tokenizers 0.21 while mlxbar uses
//! 0.22, so the tokenizer crosses over as its `tokenizer.json` text.
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use toktrie::TokEnv;
use toktrie_hf_tokenizers::ByteTokenizer;

use crate::engine::TextCodec;

/// The `TokEnv` for `codec`, `n_vocab` wide (ids past the tokenizer's vocabulary become
/// placeholder special tokens no grammar can produce). Its end-of-sequence tokens are the
/// codec's stop ids, so llguidance allows all of them exactly when the grammar may end.
pub fn tok_env(codec: &TextCodec, n_vocab: usize) -> Result<TokEnv> {
    let text = codec.tokenizer.to_string(false).map_err(|e| anyhow!("serializing the tokenizer: {e}"))?;
    let mut json: Value = serde_json::from_str(&text).context("re-reading the serialized tokenizer")?;
    if let Some(pre) = json.get_mut("pre_tokenizer") {
        no_prefix_space(pre);
    }
    let bytes = serde_json::to_vec(&json)?;
    let mut tokenizer = ByteTokenizer::from_json_bytes(&bytes)?;
    let vocab = tokenizer.tokrx_info().vocab_size as usize;
    let stops: Vec<u32> = codec.stop_ids.iter().copied().filter(|&id| (id as usize) < vocab).collect();
    if !stops.is_empty() {
        tokenizer.set_eos_tokens(&stops);
    }
    tokenizer.into_tok_env(Some(n_vocab.max(vocab)))
}

/// llguidance tokenizes forced text fragments on their own; a byte-level pre-tokenizer that
/// adds a leading space would put a space in front of every one of them.
fn no_prefix_space(pre: &mut Value) {
    match pre {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("ByteLevel") {
                map.insert("add_prefix_space".into(), Value::Bool(false));
            }
            if let Some(Value::Array(list)) = map.get_mut("pretokenizers") {
                list.iter_mut().for_each(no_prefix_space);
            }
        }
        Value::Array(list) => list.iter_mut().for_each(no_prefix_space),
        _ => {}
    }
}

impl super::Grammars {
    /// The longest token's bytes: a text of `n` bytes is at least `n / max_token_bytes` tokens.
    pub fn max_token_bytes(&self) -> usize {
        self.factory.tok_env().tok_trie().max_token_len().max(1)
    }

    /// A token's exact bytes (a special token's text without toktrie's 0xFF marker), for
    /// `logprobs`; empty for ids past the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let trie = self.factory.tok_env().tok_trie();
        if id as usize >= trie.vocab_size() {
            return vec![];
        }
        let bytes = trie.token(id);
        bytes.strip_prefix(&[toktrie::TokTrie::SPECIAL_TOKEN_MARKER]).unwrap_or(bytes).to_vec()
    }
}
