#!/usr/bin/env python3
"""A second, independent reference for mlxbar's engine tests: llama.cpp on the GGUF itself.

Usage:
  python make_llamacpp_reference.py MODEL.gguf REFERENCE.json OUT.json
  (scripts/make-llamacpp-reference.sh installs llama-cpp-python and runs it)

tests/data/reference.json (Python MLX) runs the GGUF's weights through mlx-lm; this one
runs the GGUF file through llama.cpp's own loader and CPU kernels (llama-cpp-python, from
PyPI), which share nothing with MLX: Q4_1 dot products against activations quantized to
Q8_1 on the fly, GGML-order q/k rows with its own RoPE. For each prompt of REFERENCE.json
the same prompt_ids are fed as tokens (no template re-rendering, no BOS added), and it
records the top-10 logits over the full vocabulary at the first generated position, then
the first GREEDY_TOKENS greedy token ids (or up to EOS) with the top-10 logits at every
step, decoded one token at a time over llama.cpp's KV cache. Two threads, one sequence.
"""
import importlib.metadata
import json
import os
import platform
import sys

import llama_cpp
import numpy as np

GREEDY_TOKENS = 16
EOS = 2  # <|im_end|>


def top10(row):
    order = np.argsort(-row, kind="stable")[:10]
    return [{"id": int(i), "logit": float(row[i])} for i in order]


def main():
    gguf, ref_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    ref = json.load(open(ref_path))
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False, seed=0)
    result = {
        "how_made": " ".join(__doc__.split()),
        "llama_cpp_python_version": importlib.metadata.version("llama_cpp_python"),
        # The wheel is built from source by pip; the flags it was built with and what the
        # CPU backend reports it uses (AVX2, F16C, FMA, AMX...).
        "build_cmake_args": os.environ.get("CMAKE_ARGS", "(llama-cpp-python defaults: GGML_NATIVE=ON)"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "python": platform.python_version(),
        "model": os.path.basename(gguf),
        "greedy_tokens": GREEDY_TOKENS,
        "prompts": [],
    }
    for case in ref["prompts"]:
        ids = case["prompt_ids"]
        llm.reset()
        llm.eval(ids)
        first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        steps = [top10(first)]
        greedy = []
        nxt = steps[0][0]["id"]
        for _ in range(GREEDY_TOKENS):
            greedy.append(nxt)
            if nxt == EOS or len(greedy) == GREEDY_TOKENS:
                break
            llm.eval([nxt])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            steps.append(top10(row))
            nxt = steps[-1][0]["id"]
        result["prompts"].append({
            "prompt_ids": ids,
            "top10": steps[0],
            "greedy_ids": greedy,
            "step_top10": steps,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
        })
        print(repr(result["prompts"][-1]["greedy_text"]), "| mlx-lm:", case["greedy_ids"][:len(greedy)] == greedy)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
