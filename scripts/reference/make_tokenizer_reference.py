#!/usr/bin/env python3
"""Reference token ids for mlxbar's tokenizer tests, from a tokenizer that shares nothing with mlxbar's.

Usage:
  python make_tokenizer_reference.py MODEL.gguf REFERENCE.json OUT.json
  (scripts/make-tokenizer-reference.sh installs llama-cpp-python and runs it)

mlxbar builds its tokenizer from the GGUF's vocabulary and merges with the Rust `tokenizers`
crate (digits one by one, then GPT-2's byte-level split, as llama.cpp's "smollm" pre-tokenizer
names it); tests/data/reference.json's tokenizer samples came from a converter with that same
recipe, so they could not catch a wrong recipe. These ids come from llama.cpp's own
tokenizer (llama-cpp-python, from PyPI, loading only the GGUF's vocabulary): its C++
byte-level BPE and its "smollm" pre-tokenizer regexes, which llama.cpp's converter picked by
checking the official tokenizer's output on its test text. The official tokenizer.json
(Hugging Face hub) cannot be fetched here and no package on PyPI carries it, so it is not
compared (Python `tokenizers` on a tokenizer.json rebuilt from the GGUF would be mlxbar's
recipe again).

Texts: the rendered prompts of REFERENCE.json (special tokens inline), the earlier samples,
and hostile strings: emoji (ZWJ sequences, flags, skin tones), CJK, other scripts,
combining marks, long digit runs and non-ASCII numerals, control characters, whitespace runs
(Unicode spaces too), special-token text (complete, broken and repeated), long words.
Special-token text is parsed as those tokens (llama.cpp's parse_special, as mlxbar's encode
does); no BOS is added (the model's GGUF says add_bos_token false).
"""
import importlib.metadata
import json
import platform
import sys

import llama_cpp

HOSTILE = [
    # emoji
    "🚀🎉 rocket party",
    "family 👨\u200d👩\u200d👧\u200d👦 and flag 🏳️\u200d🌈, thumbs 👍🏽👍🏿",
    "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇",
    # CJK and other scripts
    "日本語のテキストと中文文本，한국어 텍스트。",
    "東京タワーは333メートルです",
    "مرحبا بالعالم שלום עולם Привет мир Γειά σου",
    "हिन्दी ภาษาไทย ქართული",
    # combining marks and zero-width characters
    "café cafe\u0301 naïve nai\u0308ve",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    # digits
    "31415926535897932384626433832795028841971693993751058209749445923078164062862089986280348253421170679",
    "1,000,000.00 and 0x1F600 and 2026-12-31T23:59:59Z and +1 (555) 010-9999",
    "½ ² ³ Ⅻ ٣٤٥ ४५ ๑๒๓ 〇一二",
    # control characters
    "a\x00b\x01c\x07d\x08e",
    "\x1b[31mred\x1b[0m and \x7fdel",
    "\r\n\r\nwindows\r\nlines\r",
    "\x0b vertical tab \x0c form feed \x85 next line",
    # whitespace runs
    "    four spaces first",
    "tabs\t\t\tand\n\n\nnewlines   \n  ",
    "trailing spaces   ",
    " ",
    "\n",
    "\u00a0nbsp\u2003em space\u3000ideographic space\u2028line separator",
    "a" + " " * 40 + "b",
    # special-token text
    "<|im_start|>system\nx<|im_end|>",
    "<|endoftext|>",
    "<|im_end|><|im_end|><|im_start|>",
    "text<|im_start|>assistant\n",
    "<|im_start|",
    "< |im_start| >",
    "<repo_name>mlxbar<file_sep>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    # contractions, code, long words
    "I'm you're they've we'll it's DON'T I'M",
    "fn main() { println!(\"{}\", x?); } // -> => !== ... ;;",
    "supercalifragilisticexpialidocious" * 3,
    "x" * 300,
]


def main():
    gguf, ref_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    ref = json.load(open(ref_path))
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
    texts = [p["rendered"] for p in ref["prompts"]]
    texts += [s["text"] for s in ref["tokenizer_samples"]]
    texts += HOSTILE
    result = {
        "how_made": " ".join(__doc__.split()),
        "llama_cpp_python_version": importlib.metadata.version("llama_cpp_python"),
        "python": platform.python_version(),
        "samples": [],
    }
    for text in texts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        result["samples"].append({"text": text, "ids": ids})
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(texts)} texts -> {out}")


if __name__ == "__main__":
    main()
