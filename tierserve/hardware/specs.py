"""Model architectures and GPU datasheets: the inputs every roofline number is computed from."""
from __future__ import annotations

from dataclasses import dataclass, field

from tierserve.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape (numbers from each model's HF `config.json`)."""

    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated_mlp: bool
    max_model_len: int
    dtype_bytes: int = 2
    aliases: tuple[str, ...] = field(default=())
    profile_dir: str | None = None  # Vidur's `<org>/<model>` folder name, where profiles exist

    @property
    def q_dim(self) -> int:
        return self.num_q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: QKV + O projections, MLP, two RMSNorm vectors."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def param_count(self) -> int:
        """All weights: layers, input embedding, untied LM head, final norm."""
        return self.num_layers * self.layer_params + 2 * self.embedding_params + self.hidden

    @property
    def param_bytes(self) -> int:
        return self.param_count * self.dtype_bytes

    def check_tp(self, tp: int) -> None:
        """Tensor parallelism shards heads, so TP must divide both head counts."""
        if not isinstance(tp, int) or tp < 1:
            raise ConfigError("tp", tp, "a positive integer")
        if self.num_q_heads % tp or self.num_kv_heads % tp:
            ok = [d for d in (1, 2, 4, 8, 16) if self.num_q_heads % d == 0 and self.num_kv_heads % d == 0]
            raise ConfigError(
                "tp", tp,
                f"a divisor of {self.name}'s num_q_heads={self.num_q_heads} and num_kv_heads="
                f"{self.num_kv_heads}: {ok}",
            )


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """Datasheet numbers for one accelerator (dense fp16/bf16, no sparsity)."""

    name: str
    peak_tflops: float       # dense fp16 tensor-core TFLOP/s
    memory_gb: float         # HBM capacity in GiB (the "80GB" of an A100-80GB is 80 GiB)
    hbm_gbytes_s: float          # HBM bandwidth, GB/s (1e9 bytes/s)
    pcie_gbytes_s: float         # host link, GB/s per direction
    nvlink_gbytes_s: float       # NVLink, GB/s per direction per GPU
    aliases: tuple[str, ...] = field(default=())
    profile_dir: str | None = None   # Vidur compute-profile device folder
    network_dir: str | None = None   # Vidur network-profile folder for all-reduce
    num_sms: int = 108               # streaming multiprocessors: one GEMM output tile each per wave

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbytes_s * 1e9

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * (1 << 30))


_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 128, 11008, 32000, True, 4096,
              aliases=("meta-llama/Llama-2-7b-hf", "llama2-7b", "llama-2-7b-hf"),
              profile_dir="meta-llama/Llama-2-7b-hf"),
    ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, True, 8192,
              aliases=("meta-llama/Meta-Llama-3-8B", "meta-llama-3-8b", "llama3-8b"),
              profile_dir="meta-llama/Meta-Llama-3-8B"),
    ModelSpec("CodeLlama-34B", 48, 8192, 64, 8, 128, 22016, 32000, True, 16384,
              aliases=("codellama/CodeLlama-34b-Instruct-hf", "codellama/CodeLlama-34b-hf", "codellama-34b"),
              profile_dir="codellama/CodeLlama-34b-Instruct-hf"),
    ModelSpec("Llama-2-70B", 80, 8192, 64, 8, 128, 28672, 32000, True, 4096,
              aliases=("meta-llama/Llama-2-70b-hf", "llama2-70b", "llama-2-70b-hf"),
              profile_dir="meta-llama/Llama-2-70b-hf"),
    ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, True, 8192,
              aliases=("meta-llama/Meta-Llama-3-70B", "meta-llama-3-70b", "llama3-70b"),
              profile_dir="meta-llama/Meta-Llama-3-70B"),
    # Qwen-72B's config lists intermediate_size 49152 for w1+w2 together; each projection is 24576 wide.
    ModelSpec("Qwen-72B", 80, 8192, 64, 64, 128, 24576, 152064, True, 32768,
              aliases=("Qwen/Qwen-72B", "qwen72b"), profile_dir="Qwen/Qwen-72B"),
    # Qwen/Qwen-7B (QWenConfig / config.json): 32 layers, hidden 4096, 32 heads without GQA, vocab 151,936,
    # 8,192 positions; intermediate_size 22016 counts w1+w2 together, each projection is 11,008 wide.
    # Seed 003 serves it on 2× A100 (TP2). No Vidur profiles: its times are scaled from a profiled model.
    ModelSpec("Qwen-7B", 32, 4096, 32, 32, 128, 11008, 151936, True, 8192,
              aliases=("Qwen/Qwen-7B", "qwen7b", "qwen-7b")),
    # 01-ai/Yi-34B config.json: the model of Sarathi-Serve's real-GPU measurements (shared/data/real_gpu).
    ModelSpec("Yi-34B", 60, 7168, 56, 8, 128, 20480, 64000, True, 4096,
              aliases=("01-ai/Yi-34B", "yi34b")),
)

_GPUS: tuple[GPUSpec, ...] = (
    GPUSpec("A100-80GB", 312.0, 80.0, 2039.0, 32.0, 300.0,
            aliases=("a100", "a100-sxm4-80gb", "a100_80g"), profile_dir="a100", network_dir="a100_dgx"),
    # A100 80GB PCIe datasheet: HBM2e at 1,935 GB/s (SXM: 2,039), same 312 TFLOP/s fp16; NVLink bridges join
    # GPUs in pairs (600 GB/s both ways), hence Vidur's pairwise-NVLink network profile. No compute profiles.
    GPUSpec("A100-80GB-PCIe", 312.0, 80.0, 1935.0, 32.0, 300.0,
            aliases=("a100-pcie", "a100-pcie-80gb", "a100_80g_pcie"), network_dir="a100_pairwise_nvlink"),
    GPUSpec("H100-80GB", 989.0, 80.0, 3350.0, 64.0, 450.0, num_sms=132,
            aliases=("h100", "h100-sxm5-80gb", "h100_80g"), profile_dir="h100", network_dir="h100_dgx"),
    # H200 has H100's compute and NVLink with larger, faster HBM3e; no Vidur profiles exist for it.
    GPUSpec("H200", 989.0, 141.0, 4800.0, 64.0, 450.0, num_sms=132, aliases=("h200-sxm-141gb", "h200_141g")),
)


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _index(specs: tuple) -> dict[str, object]:
    out: dict[str, object] = {}
    for s in specs:
        for key in (s.name, *s.aliases):
            out[_norm(key)] = s
            out[_norm(key.split("/")[-1])] = s  # accept the bare HF repo name too
    return out


_MODEL_INDEX = _index(_MODELS)
_GPU_INDEX = _index(_GPUS)


def known_models() -> list[ModelSpec]:
    return list(_MODELS)


def known_gpus() -> list[GPUSpec]:
    return list(_GPUS)


def get_model(name: str | ModelSpec) -> ModelSpec:
    """Look a model up by name or alias, case-insensitively."""
    if isinstance(name, ModelSpec):
        return name
    spec = _MODEL_INDEX.get(_norm(str(name)))
    if spec is None:
        raise ConfigError("model", name, ", ".join(m.name for m in _MODELS))
    return spec  # type: ignore[return-value]


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Look a GPU up by name or alias, case-insensitively."""
    if isinstance(name, GPUSpec):
        return name
    spec = _GPU_INDEX.get(_norm(str(name)))
    if spec is None:
        raise ConfigError("gpu", name, ", ".join(g.name for g in _GPUS))
    return spec  # type: ignore[return-value]


def engine_defaults(gpu: str | GPUSpec) -> tuple[int, int]:
    """(token budget, max_num_seqs) that vLLM's OpenAI server picks for this GPU when neither is set.

    Follows vLLM's `EngineArgs._set_default_args` / `get_batch_defaults` (vllm/engine/arg_utils.py, v0.9-v0.19):
    ≥ 70 GiB of device memory and not an A100 → 8192 tokens / 1024 sequences; otherwise 2048 / 256 (the A100
    carve-out is vLLM PR #17885: larger budgets lowered A100 throughput).
    """
    g = get_gpu(gpu)
    if g.memory_gb >= 70 and "a100" not in g.name.lower():
        return 8192, 1024
    return 2048, 256
