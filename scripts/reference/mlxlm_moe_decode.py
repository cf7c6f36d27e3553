"""Usage: python mlxlm_moe_decode.py [RUNS] (with mlx-lm 0.32.2 and mlx[cpu] 0.32.4, as
scripts/make-tiny-models.sh installs them).

mlx-lm's decode speed on the expert_streaming bench's model shape (qwen3_moe: 8 sparse
layers x 64 experts, 8 a token, hidden 512, expert width 256, 4-bit group 32), random
weights, 16-token prompt, 64 greedy tokens: the peer figure beside mlxbar's resident row."""
import time, sys
import mlx.core as mx
import mlx_lm
import mlx.nn as nn
from mlx_lm.models import qwen3_moe
from mlx_lm.models.cache import make_prompt_cache

mx.set_default_device(mx.cpu)
args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=512, num_hidden_layers=8, intermediate_size=1024,
    num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=320, rms_norm_eps=1e-5,
    rope_theta=1e6, max_position_embeddings=512, tie_word_embeddings=True, num_experts=64,
    num_experts_per_tok=8, moe_intermediate_size=256, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
model = qwen3_moe.Model(args)
mx.random.seed(1)
model.update(__import__("mlx.utils", fromlist=["tree_map"]).tree_map(lambda p: mx.random.normal(p.shape) * 0.05, model.parameters()))
nn.quantize(model, group_size=32, bits=4)
mx.eval(model.parameters())
runs = []
for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    cache = make_prompt_cache(model)
    prompt = mx.array([[(7 * i + run) % 320 for i in range(16)]])
    logits = model(prompt, cache=cache)
    tok = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(tok)
    t0 = time.perf_counter()
    for _ in range(64):
        logits = model(tok[:, None], cache=cache)
        tok = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(tok)
    runs.append(64 / (time.perf_counter() - t0))
print("mlx-lm", mlx_lm.__version__, "on MLX", mx.__version__, "decode tok/s:", " ".join(f"{r:.1f}" for r in runs))
