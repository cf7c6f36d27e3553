#!/usr/bin/env python3
"""tests/data/tiny/gpt-oss-harmony: the tiny random-weight gpt-oss (tests/data/tiny/gpt-oss,
made by make_tiny_models.py) with harmony's special tokens and gpt-oss's real chat template,
so the server can be driven end to end in gpt-oss's chat format.

Usage:
  python make_harmony_fixture.py TINY_DIR      (scripts/make-harmony-fixture.sh runs it)

The tokenizer gets HARMONY as added special tokens (the `tokenizers` package; ids 320-326
after the 320 of the byte-level vocabulary), the embedding and the untied head one seeded
normal row each per new token (the same spread as the rows they join), config.json the new
vocab_size, a context of 4096 and <|return|> as EOS (gpt-oss's own EOS), and the folder gets
tests/data/templates/gpt-oss.jinja as chat_template.jinja (where openai/gpt-oss-20b ships
its template; tokenizer_config.json then names no template of its own).
"""
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import AddedToken, Tokenizer

SEED = 20261203
HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


def main(tiny: Path) -> None:
    src, dst = tiny / "gpt-oss", tiny / "gpt-oss-harmony"
    root = Path(__file__).resolve().parents[2]
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir()

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    before = tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY])
    ids = [tok.token_to_id(t) for t in HARMONY]
    assert ids == list(range(before, before + len(HARMONY))), ids
    tok.save(str(dst / "tokenizer.json"))
    vocab = before + len(HARMONY)

    weights, metadata = mx.load(str(src / "model.safetensors"), return_metadata=True)
    rng = np.random.default_rng(SEED)
    for name in ["model.embed_tokens.weight", "lm_head.weight"]:
        w = np.array(weights[name])
        rows = rng.normal(0.0, float(w.std()), size=(len(HARMONY), w.shape[1])).astype(w.dtype)
        weights[name] = mx.array(np.concatenate([w, rows]))
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata=metadata)

    config = json.loads((src / "config.json").read_text())
    config["vocab_size"] = vocab
    # Room for harmony's system turn and a tool's description: the byte-level vocabulary spends
    # about a token per character (positions are computed, so the weights do not change).
    config["max_position_embeddings"] = 4096
    config["eos_token_id"] = tok.token_to_id("<|return|>")
    (dst / "config.json").write_text(json.dumps(config, indent=1) + "\n")

    tc = json.loads((src / "tokenizer_config.json").read_text())
    tc.pop("chat_template")
    tc["eos_token"] = "<|return|>"
    (dst / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")
    shutil.copy(root / "tests/data/templates/gpt-oss.jinja", dst / "chat_template.jinja")
    print(f"wrote {dst}: vocab {vocab}, harmony ids {ids}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
