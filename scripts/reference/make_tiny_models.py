#!/usr/bin/env python3
"""Tiny random-weight models of every architecture mlxbar claims, with reference outputs
computed by mlx-lm's own model classes (tests/architectures.rs checks mlxbar against them).

Usage:
  python make_tiny_models.py OUT_DIR      (scripts/make-tiny-models.sh runs it)

For each model: mlx-lm builds the architecture from a config.json, every parameter is
replaced by seeded normal noise (norm weights 1 + noise, so norms are not identities), and
the folder is saved as MLX/HF does it (model.safetensors float32, config.json, a small
byte-level BPE tokenizer.json made with the `tokenizers` package, tokenizer_config.json
with a chat template). The model is then re-loaded from that folder with
mlx_lm.utils.load_model, and for a few token-id sequences of different lengths the
reference records the full-vocab float32 logits of the last prefill position and of
DECODE_STEPS greedy decode steps through mlx-lm's KV cache (each step fed the argmax of the
one before), plus the greedy ids. GGUF copies (gguf-py, llama.cpp's writer, with llama.cpp's
tensor names and, for llama, its q/k row permutation and rope_freqs factors) hold the same
weights and share the reference of their source folder.
"""
# Said in MOE_HOW (appended to their references' how_made), not above, so the dense
# references stay byte-identical.
MOE_HOW = (
    "Mixture-of-experts models (MOE_MODELS, seeded apart so the dense ones stay byte-identical) "
    "are saved as mlx-lm saves them (experts stacked: mlp.switch_mlp.*), again in Hugging Face's "
    "layout (one tensor per expert, mlp.experts.{e}.*; mlx-lm loads it and must give the same "
    "logits, so it shares the reference), and 4-bit quantized by mlx_lm.utils.quantize_model "
    "(the family's own quant_predicate: the router at 8 bits) with its own reference from "
    "mlx-lm's quantized model. Their references also record the smallest gap between the k-th "
    "and (k+1)-th router probability seen, so a rounding-level difference cannot flip a choice."
)
import importlib.metadata
import json
import math
import platform
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, _get_classes
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 20261201
DECODE_STEPS = 6
SEQUENCE_LENGTHS = [1, 13, 50]
VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A smallest top-2 logit gap below this would make the greedy ids hinge on rounding.
MIN_TOP2_GAP = 1e-3

BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "max_position_embeddings": 512,
}
# name -> (config overrides, what the model exercises)
MODELS = {
    "llama3-rope": ({
        "model_type": "llama", "num_key_value_heads": 4, "head_dim": 16, "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        # original_max_position_embeddings 64 puts head_dim 16's wavelengths (6.3 .. 19869)
        # on all three sides of the rule: one untouched, two blended, five stretched 8x.
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }, "llama with Llama 3 RoPE frequency scaling, tied embeddings"),
    "llama-gqa-untied": ({
        "model_type": "llama", "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 500.0,
        "tie_word_embeddings": False,
    }, "llama with GQA (4 query heads over 2 kv heads) and an untied lm_head"),
    "mistral": ({
        "model_type": "mistral", "num_key_value_heads": 1, "head_dim": 16, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "sliding_window": None,
    }, "mistral (mlx-lm runs it as llama), one kv head, untied"),
    "qwen2-bias": ({
        "model_type": "qwen2", "num_key_value_heads": 2, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    }, "qwen2: q/k/v projection biases, GQA, tied"),
    "qwen3-qknorm": ({
        "model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    }, "qwen3: per-head q/k RMS norms, head_dim 32 != hidden/heads, GQA, tied"),
}
# Mixture-of-experts models: name -> (config overrides, what it exercises). Layer 0 is
# sparse, layer 1 dense (mlp_only_layers), so both kinds of MLP run.
MOE_MODELS = {
    "qwen3-moe": ({
        "model_type": "qwen3_moe", "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1000000.0,
        "tie_word_embeddings": True, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True,
    }, "qwen3_moe: 8 experts, top-2 renormalized (norm_topk_prob), layer 0 sparse and layer 1 dense, "
       "q/k norms, GQA, tied; experts stacked as mlx-lm saves them (mlp.switch_mlp.*)"),
}
# Of SEED + 1..8, the one whose routers keep the widest k-th/(k+1)-th gaps (float and 4-bit).
MOE_SEED = SEED + 8
# Families added later, each seeded on its own so the folders before them stay byte-identical.
LATER_MOE_MODELS = {
    "mixtral": ({
        "model_type": "mixtral", "num_key_value_heads": 2, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32,
    }, "mixtral: 8 experts in every layer, top-2 of the router logits then softmax over those two, "
       "head_dim = hidden / heads, GQA, untied; experts stacked as mlx-lm saves them "
       "(block_sparse_moe.switch_mlp.*)", SEED + 31),
    "gpt-oss": ({
        "model_type": "gpt_oss", "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 10000.0,
        "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 8,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32.0, "beta_slow": 1.0},
    }, "gpt_oss: q/k/v/o biases, per-head attention sinks, layer 0 local (window 8) and layer 1 global, "
       "YaRN RoPE (factor 4), 8 biased experts in every layer behind a biased router (top-2 logits, then a "
       "softmax over those two), gpt-oss's clamped SwiGLU, GQA, untied; experts stacked as mlx-lm saves them "
       "(mlp.experts.*_proj)", SEED + 61),
}
# Dense families added later, each seeded on its own so the folders before them stay
# byte-identical: name -> (config overrides, what it exercises, seed).
LATER_MODELS = {
    "phi3": ({
        "model_type": "phi3", "num_key_value_heads": 2, "rope_theta": 10000.0, "tie_word_embeddings": False,
        # head_dim 16 (hidden / heads), 12 of it rotated; LongRoPE at 8x its original 64 positions.
        "partial_rotary_factor": 0.75, "original_max_position_embeddings": 64,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0],
                         "short_factor": [1.0] * 6},
    }, "phi3: fused qkv_proj and gate_up_proj, head_dim = hidden / heads, RoPE over 12 of 16 dims, "
       "LongRoPE (long_factor periods and the attention factor sqrt(1 + ln 8 / ln 64)), GQA, untied", SEED + 41),
    "gemma3": ({
        "model_type": "gemma3_text", "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 24,
        "rope_theta": 10000.0, "rope_local_base_freq": 100.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        # Layer 0 local (its last 8 positions), layer 1 global: the 13- and 50-token cases pass the window.
        "sliding_window": 8, "sliding_window_pattern": 2,
    }, "gemma3: 1 + weight norms before and after attention and MLP, q/k norms, gelu_approx, embeddings "
       "scaled by sqrt(hidden) in bfloat16, scores by query_pre_attn_scalar^-1/2, layer 0 local (window 8, "
       "its own RoPE base) and layer 1 global (linear RoPE scaling); untied (mlx-lm's class holds an lm_head: with random weights "
       "a head tied to embeddings scaled by sqrt(hidden) only ever repeats the last token)", SEED + 51),
}
# Copies in another checkpoint layout mlx-lm reads to the same logits: folder -> (source, writer name).
LATER_LAYOUTS = {"gemma3-multimodal": ("gemma3", "gemma3_multimodal")}
# The same weights in Hugging Face's per-expert layout: folder -> source model.
MOE_HF_LAYOUT = {"qwen3-moe-hf": "qwen3-moe", "mixtral-hf": "mixtral"}
# 4-bit copies (mlx_lm.utils.quantize_model): folder -> (source model, group size).
MOE_QUANTIZED = {"qwen3-moe-4bit": ("qwen3-moe", 32), "mixtral-4bit": ("mixtral", 32)}
# The dense later families 4-bit as mlx_lm.convert -q makes them (the default weight format
# users run): folder -> (source model, group size).
DENSE_QUANTIZED = {"phi3-4bit": ("phi3", 32), "gemma3-4bit": ("gemma3", 32)}
# gpt-oss's experts MXFP4-quantized (MLX's mxfp4 mode) in OpenAI's checkpoint layout:
# folder -> source model.
OPENAI_MXFP4 = {"gpt-oss-openai": "gpt-oss"}
# Those converted as `mlx_lm.convert -q --q-bits 8` does (experts stay MXFP4, every other
# quantizable module 8-bit affine in groups of 64): mlx-community's gpt-oss-*-MXFP4-Q8.
MXFP4_CONVERTED = {"gpt-oss-mxfp4-q8": "gpt-oss-openai"}
# A router's k-th and (k+1)-th probabilities closer than this would make the choice of
# experts hinge on rounding.
MIN_ROUTER_GAP = 1e-3
ROUTER_GAPS = []

# GGUF copies: folder name -> source model.
GGUFS = {"qwen2-bias-gguf": "qwen2-bias", "qwen3-qknorm-gguf": "qwen3-qknorm", "llama3-rope-gguf": "llama3-rope"}
# Written after LATER_MODELS (their sources are among them).
LATER_GGUFS = {"phi3-gguf": "phi3"}
# Mixture-of-experts GGUF copies, in llama.cpp's layout (qwen3moe; mixtral as llama with
# experts; routers ffn_gate_inp, experts stacked ffn_{gate,up,down}_exps).
MOE_GGUFS = {"qwen3-moe-gguf": "qwen3-moe", "mixtral-gguf": "mixtral"}
# gpt-oss as llama.cpp's GptOssModel converts OpenAI's checkpoint: experts MXFP4 (GGML type 39,
# repacked from OpenAI's blocks and written before every other tensor), everything else F32.
MXFP4_GGUFS = {"gpt-oss-gguf": "gpt-oss-openai"}

# A mixture-of-experts GGUF quantized as llama-quantize's Q8_0 (folder -> source), written
# last: its experts stream through mlxbar's own GGUF reader, its resident load through MLX's.
Q8_GGUFS = {"qwen3-moe-q8-gguf": "qwen3-moe"}
# gemma3 as a GGUF in llama.cpp's layout with a SentencePiece vocabulary (folder -> source):
# written last, so every folder before it stays byte-identical.
SPM_GGUFS = {"gemma3-gguf": "gemma3"}
# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json's chat_template).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

CORPUS = (
    "The lighthouse keeper climbed the stairs again, counting each step aloud. "
    "Tiny models with random weights still have to agree with the reference, token by token. "
    "def f(x):\n    return x * 2 + 1  # code 12345\n"
    "Rotary positions, grouped queries, biases and norms: each one is checked here. "
) * 8


def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def randomize(model, key, gemma=False):
    """Seeded normal weights large enough that attention is peaked and logits spread. Gemma's
    norms scale by 1 + weight, so theirs are centred on 0; and its embeddings, scaled up by
    sqrt(hidden), are kept small so the layers, not the last token alone, decide the next."""
    norm_center, embed_std = (0.0, 0.1) if gemma else (1.0, 0.5)
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    out = []
    for (name, p), k in zip(params, keys):
        if name.endswith("norm.weight") or "layernorm" in name:
            v = norm_center + 0.2 * mx.random.normal(p.shape, key=k)
        elif name.endswith("sinks"):
            v = mx.random.normal(p.shape, key=k)
        elif name.endswith(".bias"):
            v = 0.5 * mx.random.normal(p.shape, key=k)
        elif "embed_tokens" in name or "lm_head" in name:
            v = embed_std * mx.random.normal(p.shape, key=k)
        elif "q_proj" in name or "k_proj" in name:
            v = 0.25 * mx.random.normal(p.shape, key=k)
        else:
            v = 0.15 * mx.random.normal(p.shape, key=k)
        out.append((name, v.astype(mx.float32)))
    model.update(tree_unflatten(out))
    mx.eval(model.parameters())


def build(name, overrides, out_dir: Path, tok: Tokenizer, key):
    config = {**BASE, **overrides}
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    randomize(model, key, gemma=config["model_type"] == "gemma3_text")
    d = out_dir / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = {**config, "architectures": [model_class.__module__.split(".")[-1]], "torch_dtype": "float32",
           "bos_token_id": tok.token_to_id("<|endoftext|>"), "eos_token_id": tok.token_to_id("<|im_end|>")}
    (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
    }, indent=1) + "\n")
    return d


def f32(a):
    """Float32 values as JSON numbers that read back to the same float32."""
    return [float(f"{x:.9g}") for x in np.array(a, dtype=np.float32).tolist()]


def run(model, ids):
    """Last-position prefill logits and DECODE_STEPS greedy steps through mlx-lm's KV cache."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)
    steps = [logits]
    greedy = [int(mx.argmax(logits))]
    for _ in range(DECODE_STEPS):
        logits = model(mx.array([[greedy[-1]]]), cache=cache)[0, -1].astype(mx.float32)
        steps.append(logits)
        greedy.append(int(mx.argmax(logits)))
    mx.eval(steps)
    return steps, greedy


def top2_gap(logits):
    s = np.sort(np.array(logits))
    return float(s[-1] - s[-2])


def reference(d: Path, sequences, description):
    model, config = load_model(d)
    cases, min_gap = [], math.inf
    for ids in sequences:
        steps, greedy = run(model, ids)
        min_gap = min(min_gap, *(top2_gap(s) for s in steps))
        cases.append({"ids": ids, "prefill_logits": f32(steps[0]),
                      "decode_logits": [f32(s) for s in steps[1:]], "greedy_ids": greedy})
    assert min_gap > MIN_TOP2_GAP, f"{d.name}: top-2 logit gap {min_gap}"
    router_gap = min(ROUTER_GAPS) if ROUTER_GAPS else None
    ROUTER_GAPS.clear()
    if router_gap is not None:
        assert router_gap > MIN_ROUTER_GAP, f"{d.name}: router k-th/(k+1)-th probability gap {router_gap}"
    spread = float(np.std(np.array(cases[-1]["prefill_logits"])))
    ref = {
        "how_made": " ".join(__doc__.split()),
        "model": d.name,
        "exercises": description,
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "python": platform.python_version(),
        "device": str(mx.default_device()),
        "seed": SEED,
        "decode_steps": DECODE_STEPS,
        "min_top2_gap": min_gap,
        "logit_std_longest": spread,
        "cases": cases,
    }
    if router_gap is not None:
        ref["how_made"] += " " + MOE_HOW
        ref["min_router_gap"] = router_gap
    if config.get("rope_scaling"):
        # The scaling must matter for these sequences, or the test would not see it.
        plain, _ = load_model(d, model_config={"rope_scaling": None})
        longest = sequences[-1]
        a = run(model, longest)[0][-1]
        b = run(plain, longest)[0][-1]
        ref["rope_scaling_effect_max_abs"] = float(mx.max(mx.abs(a - b)))
        assert ref["rope_scaling_effect_max_abs"] > 0.05, ref["rope_scaling_effect_max_abs"]
    if config.get("model_type") in ("gemma3_text", "gpt_oss"):
        # So must the local window: the same model attending globally everywhere differs.
        wide, _ = load_model(d, model_config={"sliding_window": 4096})
        a = run(model, sequences[-1])[0][-1]
        b = run(wide, sequences[-1])[0][-1]
        ref["sliding_window_effect_max_abs"] = float(mx.max(mx.abs(a - b)))
        assert ref["sliding_window_effect_max_abs"] > 0.05, ref["sliding_window_effect_max_abs"]
    (d / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    return ref


def llama_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> GGML pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(config):
    """llama.cpp's rope_freqs.weight: per-pair divisors of the frequency."""
    s, dim, base = config["rope_scaling"], config["head_dim"], config["rope_theta"]
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def gguf_name(k: str, names: dict) -> str:
    """llama.cpp's name of HF tensor `k`, its layers' modules mapped by `names`."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if k in fixed:
        return fixed[k]
    layer, rest = k.removeprefix("model.layers.").split(".", 1)
    if rest == "self_attn.sinks":
        return f"blk.{layer}.attn_sinks.weight"
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{names[module]}.{kind}"


def write_gguf(src: Path, dst: Path, tok: Tokenizer, q8: bool = False) -> dict:
    """The GGUF copy of folder `src`, tensors F32; with `q8`, every matrix but the routers in
    Q8_0 as llama-quantize writes them (it keeps ffn_gate_inp float). Returns the weights as
    the file holds them, dequantized (HF names)."""
    import gguf

    config = json.loads((src / "config.json").read_text())
    arch = config["model_type"]
    gguf_arch = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "gpt_oss": "gpt-oss"}.get(arch, arch)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    w = {k: np.array(v) for k, v in mx.load(str(src / "model.safetensors")).items()}
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    g = gguf.GGUFWriter(str(dst / "model.gguf"), gguf_arch)
    g.add_name(dst.name)
    g.add_context_length(config["max_position_embeddings"])
    g.add_embedding_length(config["hidden_size"])
    g.add_block_count(config["num_hidden_layers"])
    g.add_feed_forward_length(config["intermediate_size"])
    g.add_head_count(heads)
    g.add_head_count_kv(kv_heads)
    if arch == "phi3":
        # Phi3MiniModel.set_gguf_parameters: no key/value length, the rotated dims, the
        # original context, a sliding window (0: none); LongRoPE's factors as tensors.
        g.add_rope_dimension_count(int(config.get("partial_rotary_factor", 1.0) * config["hidden_size"]) // heads)
        g.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        g.add_sliding_window(config.get("sliding_window") or 0)
        scaling = config["rope_scaling"]
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        g.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(config["original_max_position_embeddings"])))
        g.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32))
        g.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32))
    else:
        g.add_key_length(head_dim)
        g.add_value_length(head_dim)
        g.add_rope_dimension_count(head_dim)
    g.add_rope_freq_base(config["rope_theta"])
    g.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if arch == "gpt_oss":
        # GptOssModel.set_gguf_parameters and TextModel's YaRN keys.
        g.add_sliding_window(config["sliding_window"])
        yarn = config["rope_scaling"]
        g.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        g.add_rope_scaling_factor(yarn["factor"])
        g.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
        g.add_rope_scaling_yarn_beta_fast(yarn["beta_fast"])
        g.add_rope_scaling_yarn_beta_slow(yarn["beta_slow"])
    if arch in ("qwen3_moe", "mixtral", "gpt_oss"):
        g.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        g.add_expert_used_count(config["num_experts_per_tok"])
        g.add_expert_feed_forward_length(config.get("moe_intermediate_size") or config["intermediate_size"])
    g.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("default")
    g.add_token_list(tokens)
    g.add_token_types([gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens])
    g.add_token_merges([" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]])
    g.add_bos_token_id(tok.token_to_id("<|endoftext|>"))
    g.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    g.add_add_bos_token(False)
    g.add_chat_template(CHAT_TEMPLATE)
    if config.get("rope_scaling") and arch not in ("phi3", "gpt_oss"):
        g.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp",
             # phi3's fused projections (gate_up as llama.cpp's FFN_UP, gate rows first).
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
             # gpt-oss: the norm before the experts is llama.cpp's ATTN_POST_NORM.
             "mlp.router": "ffn_gate_inp"}
    if arch == "gpt_oss":
        names["post_attention_layernorm"] = "post_attention_norm"
        names.update(write_mxfp4_experts(g, w))
    for block in ("mlp", "block_sparse_moe"):
        for proj in ("gate", "up", "down"):
            names[f"{block}.switch_mlp.{proj}_proj"] = f"ffn_{proj}_exps"
    held = {}
    for k in sorted(w):
        a = w[k].astype(np.float32)
        name = gguf_name(k, names)
        if k.startswith("model.layers."):
            module = k.split(".", 3)[3].rsplit(".", 1)[0]
            # llama.cpp permutes llama-arch q/k (weights and biases) and no other arch's.
            if gguf_arch in ("llama", "mistral") and module == "self_attn.q_proj":
                a = llama_permute(a, heads)
            elif gguf_arch in ("llama", "mistral") and module == "self_attn.k_proj":
                a = llama_permute(a, kv_heads)
        if q8 and a.ndim >= 2 and "ffn_gate_inp" not in name and a.shape[-1] % 32 == 0:
            qa = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            held[k] = gguf.quants.dequantize(qa, gguf.GGMLQuantizationType.Q8_0).reshape(a.shape)
            g.add_tensor(name, qa, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            held[k] = a
            g.add_tensor(name, a)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return held


def write_mxfp4_experts(g, w: dict):
    """gpt-oss's experts as llama.cpp's GptOssModel writes them, popped from `w`: each
    OpenAI `*_blocks`/`*_scales` pair repacked to GGML's block_mxfp4 (the E8M0 scale byte, then
    element j in the low nibble of byte j and element j+16 in its high nibble, where OpenAI
    holds elements 2i and 2i+1 in byte i), gate and up split from the interleaved rows (even
    rows gate, odd up), biases split alike and kept F32. Checked against gguf-py's own MXFP4
    dequantizer and MLX's."""
    import gguf

    def repack(blocks, scales):
        values = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
        data = np.concatenate([scales[..., None], values[..., :16] | (values[..., 16:] << 4)], axis=-1)
        ggml = gguf.quants.dequantize(data.reshape(-1, 17), gguf.GGMLQuantizationType.MXFP4).reshape(*blocks.shape[:-2], -1)
        words = mx.array(blocks).view(mx.uint32).reshape(*blocks.shape[:-2], -1)
        mlx = np.array(mx.dequantize(words, mx.array(scales), group_size=32, bits=4, mode="mxfp4", dtype=mx.float32))
        assert np.array_equal(ggml, mlx), "MXFP4 repack disagrees with MLX's dequantization"
        return data.reshape(*data.shape[:-2], -1)

    for prefix in sorted({k.split(".mlp.experts.")[0] for k in w if ".mlp.experts." in k}):
        layer = prefix.removeprefix("model.layers.")
        pop = lambda name: w.pop(f"{prefix}.mlp.experts.{name}")
        down = (pop("down_proj_blocks"), pop("down_proj_scales"), pop("down_proj_bias"))
        gate_up = (pop("gate_up_proj_blocks"), pop("gate_up_proj_scales"), pop("gate_up_proj_bias"))
        parts = [("down", *down)] + [(proj, gate_up[0][:, i::2], gate_up[1][:, i::2], gate_up[2][:, i::2])
                                     for i, proj in enumerate(("gate", "up"))]
        for proj, blocks, scales, bias in parts:
            g.add_tensor(f"blk.{layer}.ffn_{proj}_exps.weight", repack(blocks, scales), raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            w[f"{prefix}.mlp.experts.{proj}_proj.bias"] = bias
    names_bias = {f"mlp.experts.{p}_proj": f"ffn_{p}_exps" for p in ("gate", "up", "down")}
    return names_bias


def derived_reference(out_dir: Path, name: str, src: str, sequences, description: str, seed: int) -> dict:
    """The reference of folder `name`, made from `src` (quantized or re-laid), written beside it."""
    ref = reference(out_dir / name, sequences, description)
    ref["seed"] = seed
    ref["quantized_from"] = src
    (out_dir / name / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    return ref


def gguf_copy(out_dir: Path, name: str, src: str, tok: Tokenizer, how: str):
    """The GGUF copy `name` of folder `src`, sharing its reference (`how` said in "exercises")."""
    write_gguf(out_dir / src, out_dir / name, tok)
    ref = json.loads((out_dir / src / "reference.json").read_text())
    ref["model"] = name
    ref["gguf_from"] = src
    ref["exercises"] += f"; {how} written by gguf-py {importlib.metadata.version('gguf')}"
    (out_dir / name / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{name}: GGUF of {src}")


def train_sentencepiece(vocab_size: int) -> bytes:
    """A SentencePiece BPE model shaped as Gemma's: byte fallback, no dummy prefix, spaces kept
    as they are, pad/eos/bos/unk at 0..3, the turn markers as pieces matched whole."""
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    lines = [line for chunk in CORPUS.split(". ") for line in chunk.split("\n") if line]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, remove_extra_whitespaces=False,
        normalization_rule_name="identity", split_digits=True, character_coverage=1.0, num_threads=1,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        minloglevel=2,
    )
    return out.getvalue()


def write_gemma3_gguf(src: Path, dst: Path, sequences):
    """gemma3 as llama.cpp's Gemma3Model converter writes it: norms stored as 1 + weight,
    post_attention_norm / ffn_norm / post_ffw_norm, rope.freq_base_swa, the sliding window and
    (this model's 2, not llama.cpp's default 6) its period, linear RoPE scaling; a SentencePiece
    vocabulary (tokens, scores, types as _create_vocab_sentencepiece reads them, the turn markers
    CONTROL as tokenizer_config's special added tokens make them) with add_space_prefix false
    and Gemma 3's chat template. llama.cpp scales scores by head_dim^-1/2 (the file cannot say
    otherwise), so the reference is mlx-lm's on the same weights with query_pre_attn_scalar =
    head_dim. The reference also records what the official sentencepiece library makes of
    tests/data/tokenizer_reference.json's texts with this vocabulary."""
    import gguf
    import sentencepiece as spm

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["query_pre_attn_scalar"] = config["head_dim"]
    (dst / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    ref = reference(dst, sequences, LATER_MODELS[src.name][1] + "; as a GGUF in llama.cpp's gemma3 layout with a "
                    "SentencePiece vocabulary (scores scaled by head_dim^-1/2, as llama.cpp has it)")
    ref["seed"] = LATER_MODELS[src.name][2]
    ref["gguf_from"] = src.name

    sp = spm.SentencePieceProcessor(model_proto=train_sentencepiece(config["vocab_size"]))
    assert sp.vocab_size() == config["vocab_size"], sp.vocab_size()
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        if piece in ("<start_of_turn>", "<end_of_turn>"):
            types.append(gguf.TokenType.CONTROL)
            scores[-1] = -1000.0
        elif sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    texts = [s["text"] for s in json.loads((Path(__file__).parents[2] / "tests/data/tokenizer_reference.json").read_text())["samples"]]
    texts += ["<start_of_turn>user\nHi there<end_of_turn>\n", "  two  spaces ", "tab\there", "12345 67"]
    ref["tokenizer_samples"] = [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in texts]
    ref["tokenizer_how"] = (f"sentencepiece {spm.__version__} trained on the fixture corpus (train_sentencepiece); "
                            "ids from SentencePieceProcessor.encode, text from .decode")

    w = {k: np.array(v) for k, v in mx.load(str(dst / "model.safetensors")).items()}
    for f in list(dst.iterdir()):
        f.unlink()
    g = gguf.GGUFWriter(str(dst / "model.gguf"), "gemma3")
    g.add_name(dst.name)
    g.add_context_length(config["max_position_embeddings"])
    g.add_embedding_length(config["hidden_size"])
    g.add_block_count(config["num_hidden_layers"])
    g.add_feed_forward_length(config["intermediate_size"])
    g.add_head_count(config["num_attention_heads"])
    g.add_head_count_kv(config["num_key_value_heads"])
    g.add_key_length(config["head_dim"])
    g.add_value_length(config["head_dim"])
    g.add_layer_norm_rms_eps(config["rms_norm_eps"])
    g.add_rope_freq_base(config["rope_theta"])
    g.add_rope_freq_base_swa(config["rope_local_base_freq"])
    g.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    g.add_rope_scaling_factor(config["rope_scaling"]["factor"])
    g.add_sliding_window(config["sliding_window"])
    g.add_sliding_window_pattern(config["sliding_window_pattern"])
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    g.add_tokenizer_model("llama")
    g.add_tokenizer_pre("default")
    g.add_token_list(tokens)
    g.add_token_scores(scores)
    g.add_token_types(types)
    g.add_bos_token_id(sp.bos_id())
    g.add_eos_token_id(sp.eos_id())
    g.add_unk_token_id(sp.unk_id())
    g.add_pad_token_id(sp.pad_id())
    g.add_add_bos_token(True)
    g.add_add_eos_token(False)
    g.add_add_space_prefix(False)
    g.add_chat_template(GEMMA3_TEMPLATE)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for k in sorted(w):
        a = w[k].astype(np.float32)
        if k.endswith("norm.weight"):
            a = a + 1.0  # Gemma3Model.norm_shift
        g.add_tensor(gguf_name(k, names), a)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    (dst / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{dst.name}: GGUF of {src.name} with a SentencePiece vocabulary, min top-2 gap {ref['min_top2_gap']:.3g}")


def q8_gguf_copy(out_dir: Path, name: str, src: str, tok: Tokenizer, sequences):
    """The Q8_0 GGUF copy `name` of MoE folder `src`, with its own reference: mlx-lm on the
    weights the file holds (Q8_0 dequantized by gguf-py), from a folder written beside it
    and removed."""
    dst = out_dir / name
    held = write_gguf(out_dir / src, dst, tok, q8=True)
    work = out_dir / f"{name}.reference-folder"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(out_dir / src, work)
    mx.save_safetensors(str(work / "model.safetensors"), {k: mx.array(v) for k, v in held.items()}, metadata={"format": "mlx"})
    description = (MOE_MODELS[src][1] + "; as a GGUF in llama.cpp's mixture-of-experts layout with every matrix but the "
                   f"routers Q8_0 (gguf-py {importlib.metadata.version('gguf')}), reference from mlx-lm on those weights "
                   "dequantized")
    ref = reference(work, sequences, description)
    ref["model"] = name
    ref["seed"] = MOE_SEED
    ref["gguf_from"] = src
    shutil.rmtree(work)
    (dst / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{name}: Q8_0 GGUF of {src}, min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}")


def watch_routers():
    """Records, for every token mlx-lm routes, the gap between its k-th and (k+1)-th router
    probability (the family's own block runs unchanged)."""
    from mlx_lm.models import gpt_oss, mixtral, qwen3_moe

    def watch(block, gaps, k):
        original = block.__call__

        def call(self, x):
            s = mx.sort(gaps(self, x), axis=-1)
            ROUTER_GAPS.append(float(mx.min(s[..., -k(self)] - s[..., -k(self) - 1])))
            return original(self, x)

        block.__call__ = call

    # qwen3_moe picks the top-k probabilities, mixtral the top-k logits.
    watch(qwen3_moe.Qwen3MoeSparseMoeBlock, lambda m, x: mx.softmax(m.gate(x), axis=-1, precise=True), lambda m: m.top_k)
    watch(mixtral.MixtralSparseMoeBlock, lambda m, x: m.gate(x), lambda m: m.num_experts_per_tok)
    watch(gpt_oss.MLPBlock, lambda m, x: m.router(x), lambda m: m.num_experts_per_tok)


def write_hf_layout(src: Path, dst: Path):
    """The folder with each stacked expert tensor split into Hugging Face's per-expert ones."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    (dst / "reference.json").unlink()
    weights = {}
    # mixtral's Hugging Face names: block_sparse_moe.experts.{e}.w1 (gate), w2 (down), w3 (up).
    mixtral = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
    for k, v in mx.load(str(src / "model.safetensors")).items():
        if ".mlp.switch_mlp." in k:
            prefix, rest = k.split(".mlp.switch_mlp.")
            for e in range(v.shape[0]):
                weights[f"{prefix}.mlp.experts.{e}.{rest}"] = v[e]
        elif ".block_sparse_moe.switch_mlp." in k:
            prefix, rest = k.split(".block_sparse_moe.switch_mlp.")
            proj, kind = rest.split(".")
            for e in range(v.shape[0]):
                weights[f"{prefix}.block_sparse_moe.experts.{e}.{mixtral[proj]}.{kind}"] = v[e]
        else:
            weights[k] = v
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "pt"})


def write_gemma3_multimodal(src: Path, dst: Path):
    """The text model as a multimodal gemma3 checkpoint holds it: config under text_config,
    weights under language_model., and a vision tower mlx-lm (and mlxbar) must drop."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    (dst / "reference.json").unlink()
    text = json.loads((src / "config.json").read_text())
    outer = {"model_type": "gemma3", "vocab_size": text["vocab_size"], "architectures": ["Gemma3ForConditionalGeneration"],
             "text_config": {k: v for k, v in text.items() if k not in ("architectures", "vocab_size")},
             "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
             "bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    (dst / "config.json").write_text(json.dumps(outer, indent=1) + "\n")
    weights = {f"language_model.{k}": v for k, v in mx.load(str(src / "model.safetensors")).items()}
    weights["vision_tower.vision_model.embeddings.patch_embedding.weight"] = mx.zeros((8, 3, 2, 2))
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata={"format": "mlx"})


def write_quantized(src: Path, dst: Path, group_size: int, bits: int = 4):
    """The folder quantized as mlx_lm.convert does it (quantize_model, the family's
    quant_predicate) and saved with mlx-lm's names. On an already partly quantized model (the
    MXFP4 experts of gpt-oss) the quantized modules stay as they are and config.json names
    each newly quantized one, under both keys mlx-lm writes then."""
    from mlx_lm.utils import quantize_model

    model, config = load_model(src)
    model, config = quantize_model(model, config, group_size=group_size, bits=bits)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    (dst / "reference.json").unlink()
    mx.save_safetensors(str(dst / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
    saved = json.loads((src / "config.json").read_text())
    saved["quantization"] = config["quantization"]
    if "quantization_config" in saved:
        saved["quantization_config"] = config["quantization"]
    (dst / "config.json").write_text(json.dumps(saved, indent=1) + "\n")


def write_openai_mxfp4(src: Path, dst: Path):
    """The float gpt-oss folder with its experts MXFP4-quantized by MLX (mx.quantize,
    mode mxfp4) and saved as OpenAI's checkpoint holds them: gate_up_proj_blocks
    ([experts, 2 x intermediate, in/32, 16] bytes, gate and up rows interleaved),
    gate_up_proj_scales (E8M0 bytes), gate_up_proj_bias (interleaved too), down_proj_* alike,
    and config.json's quantization_config {"quant_method": "mxfp4"}."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    (dst / "reference.json").unlink()
    w = mx.load(str(src / "model.safetensors"))
    out = {k: v for k, v in w.items() if ".mlp.experts." not in k}
    for prefix in sorted({k.split(".mlp.experts.")[0] for k in w if ".mlp.experts." in k}):
        e = lambda name: w[f"{prefix}.mlp.experts.{name}"]
        experts = e("gate_proj.weight").shape[0]
        gate_up = mx.stack([e("gate_proj.weight"), e("up_proj.weight")], axis=2).reshape(experts, -1, e("gate_proj.weight").shape[-1])
        gate_up_bias = mx.stack([e("gate_proj.bias"), e("up_proj.bias")], axis=-1).reshape(experts, -1)
        for name, matrix, bias in (("gate_up_proj", gate_up, gate_up_bias), ("down_proj", e("down_proj.weight"), e("down_proj.bias"))):
            packed, scales = mx.quantize(matrix, group_size=32, bits=4, mode="mxfp4")
            out[f"{prefix}.mlp.experts.{name}_blocks"] = packed.view(mx.uint8).reshape(*packed.shape[:-1], -1, 16)
            out[f"{prefix}.mlp.experts.{name}_scales"] = scales
            out[f"{prefix}.mlp.experts.{name}_bias"] = bias
    mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def main():
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    tok = make_tokenizer()
    rng = np.random.default_rng(SEED)
    sequences = [rng.integers(0, VOCAB, size=n).tolist() for n in SEQUENCE_LENGTHS]
    keys = mx.random.split(mx.random.key(SEED), len(MODELS))
    for i, (name, (overrides, description)) in enumerate(MODELS.items()):
        d = build(name, overrides, out_dir, tok, keys[i])
        ref = reference(d, sequences, description)
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, logit std {ref['logit_std_longest']:.3g}, "
              f"greedy {[c['greedy_ids'] for c in ref['cases']]}"
              + (f", rope scaling moves logits by {ref['rope_scaling_effect_max_abs']:.3g}" if "rope_scaling_effect_max_abs" in ref else ""))
    for name, src in GGUFS.items():
        gguf_copy(out_dir, name, src, tok, "as a GGUF (F32 tensors)")
    for name, (overrides, description, seed) in LATER_MODELS.items():
        d = build(name, overrides, out_dir, tok, mx.random.key(seed))
        ref = reference(d, sequences, description)
        ref["seed"] = seed
        (d / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, logit std {ref['logit_std_longest']:.3g}, "
              f"greedy {[c['greedy_ids'] for c in ref['cases']]}"
              + (f", rope scaling moves logits by {ref['rope_scaling_effect_max_abs']:.3g}" if "rope_scaling_effect_max_abs" in ref else ""))
    for name, src in LATER_GGUFS.items():
        gguf_copy(out_dir, name, src, tok, "as a GGUF (F32 tensors) in llama.cpp's phi3 layout (fused attn_qkv and ffn_up, "
                  "rope_factors_long/short, rope.scaling.attn_factor),")
    for name, (src, writer) in LATER_LAYOUTS.items():
        globals()[f"write_{writer}"](out_dir / src, out_dir / name)
        mine = reference(out_dir / name, sequences, "")
        ref = json.loads((out_dir / src / "reference.json").read_text())
        assert mine["cases"] == ref["cases"], f"{name}: mlx-lm gives other logits from this layout"
        ref["model"] = name
        ref["layout_from"] = src
        ref["exercises"] += "; here as a multimodal gemma3 checkpoint (text_config, language_model.*, a vision tower to drop)"
        (out_dir / name / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: {writer} layout of {src}, same logits in mlx-lm")
    watch_routers()
    moe_keys = mx.random.split(mx.random.key(MOE_SEED), len(MOE_MODELS))
    for i, (name, (overrides, description)) in enumerate(MOE_MODELS.items()):
        d = build(name, overrides, out_dir, tok, moe_keys[i])
        ref = reference(d, sequences, description)
        ref["seed"] = MOE_SEED
        (d / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}, "
              f"greedy {[c['greedy_ids'] for c in ref['cases']]}")
    for name, (overrides, description, seed) in LATER_MOE_MODELS.items():
        MOE_MODELS[name] = (overrides, description)
        d = build(name, overrides, out_dir, tok, mx.random.key(seed))
        ref = reference(d, sequences, description)
        ref["seed"] = seed
        (d / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}, "
              f"greedy {[c['greedy_ids'] for c in ref['cases']]}")
    for name, src in MOE_HF_LAYOUT.items():
        write_hf_layout(out_dir / src, out_dir / name)
        mine = reference(out_dir / name, sequences, "")
        ref = json.loads((out_dir / src / "reference.json").read_text())
        assert mine["cases"] == ref["cases"], f"{name}: mlx-lm gives other logits from the per-expert layout"
        ref["model"] = name
        ref["layout_from"] = src
        ref["exercises"] += "; here in Hugging Face's per-expert layout (mlp.experts.{e}.*), which mlx-lm stacks at load"
        (out_dir / name / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
        print(f"{name}: per-expert layout of {src}, same logits in mlx-lm")
    for name, (src, group_size) in MOE_QUANTIZED.items():
        write_quantized(out_dir / src, out_dir / name, group_size)
        router = "router 8-bit group 64" if src == "qwen3-moe" else "router 4-bit too: mixtral has no quant_predicate"
        description = (MOE_MODELS[src][1] + f"; 4-bit affine (group {group_size}, {router}) "
                       "by mlx_lm.utils.quantize_model, reference from mlx-lm's quantized model")
        ref = derived_reference(out_dir, name, src, sequences, description,
                                LATER_MOE_MODELS[src][2] if src in LATER_MOE_MODELS else MOE_SEED)
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}")
    for name, src in MOE_GGUFS.items():
        gguf_copy(out_dir, name, src, tok, "as a GGUF (F32 tensors) in llama.cpp's mixture-of-experts layout,")
    for name, src in OPENAI_MXFP4.items():
        write_openai_mxfp4(out_dir / src, out_dir / name)
        description = (MOE_MODELS[src][1] + "; experts MXFP4 (mx.quantize, mode mxfp4) in OpenAI's checkpoint layout "
                       "(gate_up_proj_blocks/_scales/_bias, gate and up rows interleaved; quantization_config "
                       "quant_method mxfp4), everything else float32; reference from mlx-lm loading that layout")
        ref = derived_reference(out_dir, name, src, sequences, description, LATER_MOE_MODELS[src][2])
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}")
    for name, src in MXFP4_CONVERTED.items():
        write_quantized(out_dir / src, out_dir / name, 64, 8)
        description = (MOE_MODELS["gpt-oss"][1] + "; as mlx_lm.convert -q --q-bits 8 leaves gpt-oss in OpenAI's MXFP4: "
                       "experts MXFP4 (config.json's default mode, scales as bytes), every other module 8-bit affine "
                       "group 64 named one by one in config.json's quantization; reference from mlx-lm's model")
        ref = derived_reference(out_dir, name, src, sequences, description, LATER_MOE_MODELS["gpt-oss"][2])
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, min router gap {ref['min_router_gap']:.3g}")
    for name, src in MXFP4_GGUFS.items():
        gguf_copy(out_dir, name, src, tok, "as a GGUF in llama.cpp's gpt-oss layout (experts MXFP4, GGML type 39, "
                  "repacked from OpenAI's blocks and written first; sinks, post_attention_norm, YaRN keys; the rest F32),")
    for name, (src, group_size) in DENSE_QUANTIZED.items():
        write_quantized(out_dir / src, out_dir / name, group_size)
        description = (LATER_MODELS[src][1] + f"; 4-bit affine (group {group_size}, every linear layer and the "
                       "embedding) by mlx_lm.utils.quantize_model, reference from mlx-lm's quantized model")
        ref = derived_reference(out_dir, name, src, sequences, description, LATER_MODELS[src][2])
        print(f"{name}: min top-2 gap {ref['min_top2_gap']:.3g}, greedy {[c['greedy_ids'] for c in ref['cases']]}")
    for name, src in SPM_GGUFS.items():
        write_gemma3_gguf(out_dir / src, out_dir / name, sequences)
    for name, src in Q8_GGUFS.items():
        q8_gguf_copy(out_dir, name, src, tok, sequences)


if __name__ == "__main__":
    main()
