"""Specs registry and KV-cache memory arithmetic."""
import pytest

from tierserve.core.errors import ConfigError
from tierserve.hardware import (
    get_gpu, get_model, known_gpus, known_models, kv_bytes_per_token, kv_capacity_blocks, kv_capacity_tokens,
    kv_transfer_time_s, swap_time_s,
)


def test_lookup_by_alias_case_insensitive():
    assert get_model("meta-llama/Meta-Llama-3-8B").name == "Llama-3-8B"
    assert get_model("LLAMA-3-8B").name == "Llama-3-8B"
    assert get_model("Qwen/Qwen-72B").name == "Qwen-72B"
    assert get_gpu("a100").name == "A100-80GB"
    assert get_gpu("H100").name == "H100-80GB"
    assert get_gpu("h200").name == "H200"


def test_unknown_names_list_known_ones():
    with pytest.raises(ConfigError) as e:
        get_model("gpt-5")
    assert e.value.field == "model" and "Llama-3-8B" in str(e.value)
    with pytest.raises(ConfigError) as e:
        get_gpu("tpu-v5")
    assert "H100-80GB" in str(e.value)


def test_param_counts_match_published_sizes():
    expected = {"Llama-2-7B": 6.74e9, "Llama-3-8B": 8.03e9, "CodeLlama-34B": 33.7e9, "Llama-2-70B": 68.98e9,
                "Llama-3-70B": 70.55e9, "Qwen-72B": 72.3e9}
    for name, n in expected.items():
        assert get_model(name).param_count == pytest.approx(n, rel=0.02), name


def test_tp_must_divide_heads():
    with pytest.raises(ConfigError) as e:
        kv_bytes_per_token("Llama-3-8B", 3)
    assert "num_kv_heads" in str(e.value)
    with pytest.raises(ConfigError):
        get_model("Llama-3-8B").check_tp(16)   # 8 KV heads


def test_kv_bytes_and_capacity():
    assert kv_bytes_per_token("Llama-3-8B") == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token("Llama-3-8B", 2) == kv_bytes_per_token("Llama-3-8B") // 2
    toks = kv_capacity_tokens("Llama-3-8B", "a100", 1)
    assert 300_000 < toks < 600_000
    assert kv_capacity_blocks("Llama-3-8B", "a100", 1, block_size=16) * 16 == toks
    assert kv_capacity_tokens("Llama-3-8B", "a100", 1, gpu_memory_utilization=0.5) < toks
    assert kv_capacity_tokens("Llama-3-8B", "h200", 1) > toks


def test_capacity_error_says_why():
    with pytest.raises(ConfigError) as e:
        kv_capacity_blocks("Llama-2-70B", "a100", 1)
    assert "weights" in str(e.value)


def test_every_shipped_config_with_room_has_positive_capacity():
    for m in known_models():
        for g in known_gpus():
            for tp in (1, 2, 4, 8):
                if m.num_kv_heads % tp or m.param_bytes / tp > 0.8 * g.memory_bytes:
                    continue
                assert kv_capacity_blocks(m, g, tp) > 0


def test_swap_and_transfer_times():
    one = swap_time_s(1, "Llama-3-8B", "a100")
    assert swap_time_s(100, "Llama-3-8B", "a100") == pytest.approx(100 * one)
    assert swap_time_s(0, "Llama-3-8B", "a100") == 0.0
    ib = kv_transfer_time_s(4096, "Llama-3-8B")
    nv = kv_transfer_time_s(4096, "Llama-3-8B", nvlink=True, gpu="a100")
    assert 0 < nv < ib
    assert ib == pytest.approx(50e-6 + 4096 * 131072 / 100e9)
    with pytest.raises(ConfigError):
        kv_transfer_time_s(10, "Llama-3-8B", nvlink=True)
