#!/usr/bin/env python3
"""Reference outputs for mlxbar's engine tests, computed independently with Python MLX.

Usage:
  python make_reference.py MLX_MODEL_DIR OUT.json

MLX_MODEL_DIR is the default GGUF converted to an MLX-LM folder by
../shared/peers/convert_gguf_to_mlx.py (`shared/peers/setup.sh` makes it as
smollm2-mlx/; scripts/make-reference.sh runs all of it). The weights stay as the
GGUF's affine-quantized triplets (MLX quantized_matmul), norms and scales in
float32, and mlx-lm's own Llama implementation (NeoX RoPE on un-permuted q/k rows)
runs the forward pass. mlxbar instead dequantizes to float32 and runs GGML-order
q/k rows with traditional RoPE, so the two paths share only the weights.

Records, for each chat prompt: the rendered template, the prompt token ids,
the top-10 logits of the first generated position, the first GREEDY_TOKENS
greedy token ids and the top-10 logits at every one of those steps (decoded one
token at a time over mlx-lm's KV cache). Also tokenizer round-trip samples.
"""
import json, sys, platform
import mlx.core as mx
import mlx_lm
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

GREEDY_TOKENS = 32
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "List three primary colors."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me one fact about the Moon in 2026."}],
]
TOKENIZER_SAMPLES = [
    "Hello, world!",
    "The year 2026 has 365 days; 3.14159 is pi.",
    "  leading spaces and\ttabs\nnewlines\n\n",
    "Unicode: café, naïve, 日本語, Ελληνικά, emoji 🚀🎉",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "def f(x):\n    return x**2  # code",
]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    model, tok = load(model_dir)
    result = {
        "how_made": " ".join(__doc__.split()),
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "python": platform.python_version(),
        "device": str(mx.default_device()),
        "greedy_tokens": GREEDY_TOKENS,
        "prompts": [],
        "tokenizer_samples": [],
    }
    for messages in PROMPTS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        cache = make_prompt_cache(model)
        logits = model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)
        order = mx.argsort(-logits)[:10]
        mx.eval(logits, order)
        top = [{"id": int(i), "logit": float(logits[int(i)])} for i in order.tolist()]
        greedy = []
        steps = [top]
        nxt = int(order[0])
        for _ in range(GREEDY_TOKENS):
            greedy.append(nxt)
            if nxt in tok.eos_token_ids or len(greedy) == GREEDY_TOKENS:
                break
            step = model(mx.array([[nxt]]), cache=cache)[0, -1].astype(mx.float32)
            step_order = mx.argsort(-step)[:10]
            mx.eval(step, step_order)
            steps.append([{"id": int(i), "logit": float(step[int(i)])} for i in step_order.tolist()])
            nxt = int(step_order[0])
        result["prompts"].append({
            "messages": messages,
            "rendered": text,
            "prompt_ids": ids,
            "top10": top,
            "greedy_ids": greedy,
            "step_top10": steps,
            "greedy_text": tok.decode(greedy),
        })
        print(repr(tok.decode(greedy)))
    for s in TOKENIZER_SAMPLES:
        result["tokenizer_samples"].append({"text": s, "ids": tok.encode(s, add_special_tokens=False)})
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
