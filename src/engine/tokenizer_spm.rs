//! A SentencePiece vocabulary read from a GGUF (`tokenizer.ggml.model = "llama"`: Llama 2,
//! Phi-3, Gemma 3 and most other SentencePiece models llama.cpp converts) as a `tokenizers`
//! BPE, the way transformers' `SpmConverter` builds a fast tokenizer from `tokenizer.model`:
//! every normal piece that splits into two normal pieces gives a merge, ranked by the merged
//! piece's score
//! (SentencePiece's BPE joins the adjacent pair whose join scores highest, as llama.cpp's
//! `llm_tokenizer_spm` does); characters no piece covers fall back to `<0xXX>` byte pieces.
//! Spaces become `▁`, and `add_space_prefix` (llama.cpp's key, true unless the file says
//! otherwise) puts one before each run of text, as llama.cpp does at the start and after
//! every special token.
use anyhow::{anyhow, Result};
use tokenizers::{
    decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as DecoderSequence, strip::Strip, DecoderWrapper},
    models::bpe::{Vocab, BPE},
    normalizers::{prepend::Prepend, replace::Replace, utils::Sequence as NormalizerSequence, NormalizerWrapper},
    AddedToken, Tokenizer,
};

/// SentencePiece piece types as GGUF stores them (llama.cpp's `llama_token_type`).
pub const NORMAL: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const BYTE: i32 = 6;

/// The piece SentencePiece writes for a space.
const SPACE: &str = "\u{2581}";

/// The tokenizer of a GGUF SentencePiece vocabulary: `tokens`, their `scores` and `types`
/// (one each per id).
pub fn tokenizer(tokens: &[String], scores: &[f32], types: &[i32], add_space_prefix: bool) -> Result<Tokenizer> {
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        return Err(anyhow!("GGUF SentencePiece vocabulary: {} tokens, {} scores, {} types", tokens.len(), scores.len(), types.len()));
    }
    // The first id of a piece wins should a vocabulary repeat one.
    let mut vocab = Vocab::default();
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(id as u32);
    }
    let is_normal = |piece: &str| vocab.get(piece).is_some_and(|&id| types[id as usize] == NORMAL);
    let unk = types.iter().position(|&t| t == UNKNOWN).map(|id| tokens[id].clone());
    let has_bytes = types.contains(&BYTE);

    let mut bpe = BPE::builder().vocab_and_merges(vocab.clone(), merges(tokens, scores, types, &is_normal)).byte_fallback(has_bytes);
    if let Some(unk) = unk {
        bpe = bpe.unk_token(unk).fuse_unk(true);
    }
    let mut tokenizer = Tokenizer::new(bpe.build().map_err(|e| anyhow!("building the SentencePiece BPE: {e}"))?);

    let replace = || Replace::new(" ", SPACE).map_err(|e| anyhow!("{e}"));
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new(SPACE.into())));
    }
    normalizers.push(NormalizerWrapper::Replace(replace()?));
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));

    let mut decoders = vec![
        DecoderWrapper::Replace(Replace::new(SPACE, " ").map_err(|e| anyhow!("{e}"))?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        // The space the prefix put before the text is not the model's to say.
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));

    // Control pieces (<s>, </s>, <start_of_turn> in Gemma's converted files) are special;
    // user-defined ones are matched whole in text but decode as text; the unknown piece is
    // special as transformers marks it.
    let added: Vec<AddedToken> = types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == CONTROL || t == USER_DEFINED || t == UNKNOWN)
        .map(|(i, &t)| AddedToken::from(tokens[i].clone(), t != USER_DEFINED).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&added);
    Ok(tokenizer)
}

/// Every normal piece that splits into two normal pieces, as one merge per split, ordered as
/// transformers' `SentencePieceExtractor` orders them: the merged piece's score first
/// (highest first), then the longer left and right parts; ties keep vocabulary order.
fn merges(tokens: &[String], scores: &[f32], types: &[i32], is_normal: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    let mut found: Vec<(f32, usize, usize, usize, &str, &str)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate().filter(|(id, _)| types[*id] == NORMAL) {
        let chars = piece.chars().count();
        for (n, (at, _)) in piece.char_indices().enumerate().skip(1) {
            let (left, right) = piece.split_at(at);
            if is_normal(left) && is_normal(right) {
                found.push((scores[id], n, chars - n, id, left, right));
            }
        }
    }
    found.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)).then(a.3.cmp(&b.3)));
    found.into_iter().map(|(_, _, _, _, l, r)| (l.to_string(), r.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[(&str, f32, i32)], prefix: bool) -> Tokenizer {
        let tokens: Vec<String> = pieces.iter().map(|p| p.0.to_string()).collect();
        let scores: Vec<f32> = pieces.iter().map(|p| p.1).collect();
        let types: Vec<i32> = pieces.iter().map(|p| p.2).collect();
        tokenizer(&tokens, &scores, &types, prefix).unwrap()
    }

    fn ids(t: &Tokenizer, text: &str) -> Vec<u32> {
        t.encode_fast(text, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn joins_the_highest_scoring_pair_first() {
        // "abc": "bc" outscores "ab", so SentencePiece joins b+c and a stays alone.
        let mut pieces = vec![("<unk>", 0.0, UNKNOWN), ("a", -1.0, NORMAL), ("b", -1.0, NORMAL), ("c", -1.0, NORMAL)];
        pieces.extend([("ab", -5.0, NORMAL), ("bc", -2.0, NORMAL)]);
        let t = vocab(&pieces, false);
        assert_eq!(ids(&t, "abc"), vec![1, 5]);
        assert_eq!(ids(&t, "abab"), vec![4, 4]);
        assert_eq!(t.decode(&[1, 5], false).unwrap(), "abc");
        // With "abc" a piece too, a + bc joins on.
        pieces.push(("abc", -9.0, NORMAL));
        assert_eq!(ids(&vocab(&pieces, false), "abc"), vec![6]);
    }

    #[test]
    fn bytes_stand_in_for_characters_no_piece_covers() {
        let mut pieces: Vec<(String, f32, i32)> = vec![("<unk>".into(), 0.0, UNKNOWN), ("▁".into(), -1.0, NORMAL)];
        pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, BYTE)));
        pieces.push(("h".into(), -2.0, NORMAL));
        let tokens: Vec<String> = pieces.iter().map(|p| p.0.clone()).collect();
        let scores: Vec<f32> = pieces.iter().map(|p| p.1).collect();
        let types: Vec<i32> = pieces.iter().map(|p| p.2).collect();
        let t = tokenizer(&tokens, &scores, &types, true).unwrap();
        // " hé": prefix ▁, the space as ▁, h, then é as its two UTF-8 bytes.
        let got = ids(&t, " hé");
        assert_eq!(got, vec![1, 1, 258, 2 + 0xC3, 2 + 0xA9]);
        // The prefix's space is taken off again; the text's own space stays.
        assert_eq!(t.decode(&got, false).unwrap(), " hé");
    }
}
