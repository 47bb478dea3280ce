"""The engine protocol: token ids in, sampled token ids and their logprobs out, new weights in."""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch


DTYPES = ("float32", "bfloat16", "float16")


def is_hub_name(name: str) -> bool:
    """`owner/model`, as a hub names a model: one slash, not a path (., / or ~ first)."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1


def resolve_dtype(dtype: str = "auto") -> str:
    """`auto` is bfloat16 where CUDA is available (real-size models are trained and served in
    it), else float32 (CPU kernels for half precision are slow or missing); others pass as given."""
    if dtype == "auto":
        return "bfloat16" if torch.cuda.is_available() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose auto or one of {', '.join(DTYPES)}")
    return dtype


def resolve_device(device: str = "auto") -> str:
    """`auto` is cuda where it is available, else cpu; a CUDA device asked for on a machine
    without CUDA is refused here, not at the first generation."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"device {device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    return device


def engine_defaults(options: dict) -> dict:
    """Engine options a GPU user expects where none were given: CUDA graphs (vLLM's
    `enforce_eager` off), bfloat16 weights; on CPU, eager float32 as before. `dtype: auto` is
    resolved the same way."""
    cuda = torch.cuda.is_available()
    out = dict(options)
    out["dtype"] = resolve_dtype(out.get("dtype") or "auto")
    out.setdefault("enforce_eager", not cuda)
    if out.get("gpu_memory_utilization") is None:
        out["gpu_memory_utilization"] = 0.9 if cuda else 0.15  # a GPU of its own unless told the share
    return out


# RoPE scalings that leave max_position_embeddings as the scaled length (vLLM 0.32 does not
# multiply it by their factor again: vllm/config/model.py, _get_and_verify_max_len)
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


class ContextTooLong(ValueError):
    """The context asked for is longer than the model's positions."""


def rope_scaling_of(config) -> dict | None:
    """The model's RoPE scaling (YaRN, linear, ...) from its HF config, None for plain RoPE.
    transformers 5 keeps it in `rope_parameters` (with `rope_type: default` for none)."""
    for key in ("rope_scaling", "rope_parameters"):
        rp = getattr(config, key, None) if not isinstance(config, dict) else config.get(key)
        if isinstance(rp, dict) and rp.get("rope_type", rp.get("type", "default")) not in ("default", None):
            return rp
    return None


def context_limit(config) -> int | None:
    """The longest context the model's config allows, as vLLM derives it: max_position_embeddings,
    times the RoPE factor for scalings that do not pre-scale it; None when the config names none."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    native = get("max_position_embeddings")
    if not native:
        return None
    rp = rope_scaling_of(config)
    if rp and rp.get("rope_type", rp.get("type")) not in _PRESCALED_ROPE:
        return int(native * float(rp.get("factor") or 1.0))
    return int(native)


def check_context(model_path: str, max_model_len: int, field: str = "engine.options.max_model_len") -> None:
    """Refuse a context longer than the model's positions before anything starts (vLLM would
    refuse it only once its engine starts; past them RoPE gives garbage, not an error). A model
    whose config cannot be read here (a hub name not in the local cache) is left to the engine."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError):
        return
    limit = context_limit(config)
    if limit is None or max_model_len <= limit:
        return
    raise ContextTooLong(
        f"{field}={max_model_len} is longer than {model_path} allows: its config.json declares "
        f"max_position_embeddings={config.max_position_embeddings}"
        + (f" with RoPE scaling {rope_scaling_of(config)}" if rope_scaling_of(config) else "")
        + f". Set {field}={limit} or less (and agent.max_tokens with it), or extend the model's context "
        "with YaRN in its config.json (rope_scaling and max_position_embeddings, as vLLM and transformers read "
        "them); only learner=torch trains such a model: mbridge 0.15 builds Megatron's rotary embedding without "
        "rope_scaling, so the Megatron learner refuses it (its logprobs would differ from the engine's)")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. temperature 0 is greedy (logprobs of the raw distribution)."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]  # [T] as sampled, the stop token included when one ended it
    logprobs: list[float]  # [T] the sampler's logprob of each token, from the distribution it sampled
    finish_reason: str  # "stop" | "length"
    # [T] the policy version that sampled each token, where the engine knows it (vLLM's async
    # engine: a sync in mid-request splits it); None: the version the engine had when asked
    versions: list[int] | None = None


class Engine(Protocol):
    version: int

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


# The rollout a request belongs to, for engines that route (agent.engines.router): the agent
# opens one session per rollout, and every turn of it is sent within that session.
_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("engine_session", default=None)


def current_session() -> str | None:
    return _SESSION.get()


@contextlib.contextmanager
def session(key: str | None = None):
    """Within this block, this thread's requests belong to one rollout (a fresh key if none)."""
    token = _SESSION.set(key or uuid.uuid4().hex)
    try:
        yield _SESSION.get()
    finally:
        _SESSION.reset(token)
