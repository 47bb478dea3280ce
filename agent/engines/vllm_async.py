"""vLLM's asynchronous engine (`AsyncLLM`) behind the engine protocol: continuous batching.

Each request joins the running batch the moment it arrives and leaves it the moment it ends,
so a rollout with a short turn never waits for its neighbours' long ones (the blocking
`LLM.generate` returns only when its whole batch is done). The engine core is a process of its
own; this object keeps an event loop in a thread, so the agent's rollout threads call the
blocking `generate` and async code awaits `agenerate`, both on the same engine.

Weights move by vLLM's weight-transfer API, in buckets (`agent.engines.vllm_transfer`):
`inline` on CPU, `ipc` when the learner shares the engine's GPU, `nccl` when they have their
own, `collective` when runtime=ray's learner ranks send their shares themselves
(`agent.engines.collective`, `agent.engines.vllm_collective`). Around a sync the engine pauses
(vLLM's pause mode): with `sync_mode=continue` requests in flight freeze and go on under the
new weights (vLLM records which version sampled each token, and so does the trajectory); with
`sync_mode=finish` they finish under the old weights first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import threading
import time
from typing import Iterable

import torch

from agent.engines.base import Completion, SamplingParams, engine_defaults

SYNC_MODES = {"continue": "keep", "finish": "wait"}  # ours -> vLLM's pause mode


def resolve_transfer(backend: str, tensor_parallel: int = 1) -> str:
    """`auto` is `inline` where there is no CUDA, else `ipc` (the learner's rank 0 beside the
    engine on its GPU, this process's case) for an engine on one GPU; an engine over several GPUs
    (tensor parallel) takes `inline`, since the weights rank 0 sends live on its GPU alone and an
    IPC handle opens only on the GPU it was made on. `nccl` is for learners on GPUs of their own
    (runtime=ray). `collective`: runtime=ray's learner ranks each send their share (gloo on CPU,
    NCCL on GPUs); the cluster sets it, by `ray.weight_sync`."""
    if backend == "auto":
        return "ipc" if torch.cuda.is_available() and tensor_parallel == 1 else "inline"
    if backend == "collective":
        return backend
    if backend not in ("inline", "ipc", "nccl"):
        raise ValueError(f"engine.options.weight_transfer {backend!r}: choose auto, inline, ipc or nccl")
    if backend in ("ipc", "nccl") and not torch.cuda.is_available():
        raise ValueError(f"engine.options.weight_transfer {backend!r} needs CUDA; on CPU use inline")
    if backend == "ipc" and tensor_parallel > 1:
        raise ValueError(f"engine.options.weight_transfer ipc with tensor_parallel_size={tensor_parallel}: the "
                         "learner's rank 0 holds the weights on its one GPU, and an IPC handle opens only there; "
                         "use inline (or auto), or runtime=ray with nccl")
    return backend


class AsyncVLLMEngine:
    def __init__(self, model_path: str, dtype: str = "auto", max_model_len: int = 16384,
                 gpu_memory_utilization: float | None = None, seed: int = 0, sync_mode: str = "continue",
                 weight_transfer: str = "auto", bucket_mb: int = 256, sleep_during_step: bool = False,
                 spin_sleep_s: float | None = None, **engine_kwargs):
        """`dtype`: auto is bfloat16 on CUDA, float32 on CPU. `gpu_memory_utilization`: vLLM's
        share of the GPU; training computes it from the memory plan (`training.plan`), alone on a
        GPU it is 0.9. `sleep_during_step`: colocated on GPUs, the engine frees its memory (vLLM's
        sleep mode) while the learner steps. `spin_sleep_s`: vLLM's processes check for their next
        message in a loop that yields the core; this sleeps between checks instead
        (`agent.engines.vllm.spin_sleep`: null is vLLM's yield on CUDA, 0.5 ms on CPU, where the
        loop took the cores the learner and the sandboxes need). Other keywords go to vLLM's engine args
        (`tensor_parallel_size`, `enforce_eager`: off on CUDA by default, say)."""
        from agent.engines.base import check_context

        check_context(model_path, max_model_len)
        if sync_mode not in SYNC_MODES:
            raise ValueError(f"engine.options.sync_mode {sync_mode!r}: choose continue or finish")
        if sleep_during_step and not torch.cuda.is_available():
            raise ValueError("engine.options.sleep_during_step needs GPUs (vLLM's sleep mode frees GPU memory); "
                             "on CPU leave it false")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
        from agent.engines.vllm import _quiet_known_noise, cpu_workarounds, spin_sleep

        _quiet_known_noise()  # in this process; the engine's own processes get it from the plugin hook
        cpu_workarounds(engine_kwargs, max_model_len)
        spin_sleep(spin_sleep_s)  # read by the plugin hook in the engine's processes, started below
        from agent.engines.vllm_transfer import register

        register()
        self.sync_mode = sync_mode
        self.transfer = resolve_transfer(weight_transfer, int(engine_kwargs.get("tensor_parallel_size", 1)))
        if self.transfer == "ipc":  # see vllm_transfer.wire_update_info: the engine's worker unpickles the handles
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        if self.transfer in ("inline", "collective"):
            from importlib.metadata import entry_points

            if "sao_inline_weights" not in {e.name for e in entry_points(group="vllm.general_plugins")}:
                raise RuntimeError(f"the {self.transfer} weight-transfer backend is a vLLM plugin of this project, registered "
                                   "when it is installed: pip install -e . (./setup.sh does)")
        self.bucket_bytes = bucket_mb << 20
        self.sleep_during_step = sleep_during_step
        self.version = 0
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async", daemon=True)
        self._thread.start()
        self._trainer = None  # vLLM's trainer-side transfer engine, made at the first sync
        # what the metrics read: requests served, busy time (at least one request running), and
        # the time-integral of requests running together (its mean is the effective batch size)
        self.requests = 0
        self.tokens = 0
        self.outstanding = 0
        self.busy_s = 0.0
        self._running_area = 0.0
        self._last_change = time.monotonic()
        self.last_sync: dict[str, float] = {}
        engine_kwargs = engine_defaults(dict(engine_kwargs, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization))
        self._args = dict(model=model_path, max_model_len=max_model_len, seed=seed, logprobs_mode="processed_logprobs",
                          enable_sleep_mode=sleep_during_step, **engine_kwargs)
        self.restarts = 0  # engines started anew after a failed weight sync
        self.llm = self._call(self._start(self._args))
        hf_config = self.llm.model_config.hf_config
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    async def _start(self, args: dict):
        from vllm import AsyncEngineArgs
        from vllm.config import WeightTransferConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
            weight_transfer_config=WeightTransferConfig(backend=self.transfer), **args))
        await llm.update_weight_version("0")  # every token is labelled with the version that sampled it
        return llm

    def _call(self, coro):
        """Run a coroutine on the engine's loop from any other thread and wait for it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking engine call from the engine's own loop would wait forever: await it")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ---- generation ----

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return self._call(self.agenerate(prompt_ids, sampling))

    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> concurrent.futures.Future:
        """The request started on the engine's loop; another event loop awaits it with
        `asyncio.wrap_future` (a Ray actor's, say)."""
        return asyncio.run_coroutine_threadsafe(self.agenerate(prompt_ids, sampling), self._loop)

    async def agenerate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = VSamplingParams(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                 top_p=sampling.top_p, seed=sampling.seed, stop_token_ids=list(sampling.stop_token_ids),
                                 logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
        self._running(+1)
        try:
            final = None
            async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                               request_id=f"r{next(self._ids)}"):
                final = out
        finally:
            self._running(-1)
        seq = final.outputs[0]
        token_ids = list(seq.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(seq.logprobs, token_ids)]
        versions = [self.version] * len(token_ids)
        for span in seq.weight_versions or ():
            versions[span.start:span.end] = [int(span.version)] * (span.end - span.start)
        self.requests += 1
        self.tokens += len(token_ids)
        return Completion(token_ids, logprobs, "stop" if seq.finish_reason == "stop" else "length", versions)

    def _running(self, delta: int) -> None:
        now = time.monotonic()
        if self.outstanding:
            self.busy_s += now - self._last_change
            self._running_area += self.outstanding * (now - self._last_change)
        self.outstanding += delta
        self._last_change = now

    @property
    def batch_size_mean(self) -> float:
        """Requests decoded together, averaged over the time the engine was busy."""
        return self._running_area / self.busy_s if self.busy_s else 0.0

    # ---- weights ----

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Pause, send the weights in buckets through vLLM's weight-transfer API, label the
        version, reset the prefix cache (its keys and values were made by the old weights), go on."""
        from agent.engines.vllm_transfer import TensorsSource

        weights = [(name, t.detach()) for name, t in named_tensors]
        names = {n for n, _ in weights}
        if self.tie_word_embeddings and "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))  # vLLM keeps its own copy
        t0 = time.monotonic()
        if self._trainer is None:
            from agent.engines.vllm_transfer import make_trainer

            self._source = TensorsSource(weights)
            self._trainer = make_trainer(self.transfer, _SyncClient(self), self._source, self.bucket_bytes)
        self._source.update(weights)
        self._call(self.llm.pause_generation(mode=SYNC_MODES[self.sync_mode], clear_cache=True))
        try:
            self._send(version)
        except Exception as e:
            # vLLM's layerwise reload moved the layers to the meta device at the update's start: a
            # failed send leaves a half-loaded model, never to be resumed. Start the engine anew
            # (its requests in flight fail with it, as an engine death) and send again, once.
            self._restart(e)
            self._send(version)
        else:
            self._call(self.llm.resume_generation())
        self.version = version
        self.last_sync = {"engine/sync_s": time.monotonic() - t0, "engine/sync_bytes": float(self._source.nbytes),
                          "engine/restarts": float(self.restarts)}

    def _send(self, version: int) -> None:
        self._trainer.send_weights()
        self._call(self.llm.update_weight_version(str(version)))

    def _restart(self, cause: BaseException) -> None:
        import logging

        from agent.engines.vllm_transfer import make_trainer

        logging.getLogger(__name__).error("weight sync failed (%s: %s): the engine's model may be half loaded; "
                                          "starting the engine anew", type(cause).__name__, cause)
        old, self.llm = self.llm, None
        try:
            self._call(self._shutdown(old))
        except Exception as e:  # what is left of it goes with its processes
            logging.getLogger(__name__).warning("shutting down the failed engine: %s", e)
        old.shutdown = lambda *args, **kwargs: None  # as in close(): not again from __del__ at exit
        self.llm = self._call(self._start(self._args))
        self.restarts += 1
        if self._trainer is not None:  # (weights by collective have no trainer side here)
            self._trainer = make_trainer(self.transfer, _SyncClient(self), self._source, self.bucket_bytes)

    # ---- weights by collective (runtime=ray: the learner ranks send, agent.engines.vllm_collective) ----

    def join_collective(self, init_info: dict) -> None:
        """This engine's workers open a group with each learner rank (which open theirs at once)."""
        if self.transfer != "collective":
            raise RuntimeError(f"weights by collective need an engine made with weight_transfer=collective, not {self.transfer}")
        _SyncClient(self).init_weight_transfer_engine(init_info)

    def receive_collective(self, plan: list[dict], version: int) -> None:
        """One sync by collective: pause, receive every bucket of `plan` from its learner rank (the
        ranks send meanwhile), label the version, go on. A failed receive leaves the model half
        loaded (vLLM's layerwise reload): the engine is started anew and the error raised; it
        serves again once a later sync has given it weights."""
        client = _SyncClient(self)
        t0 = time.monotonic()
        self._call(self.llm.pause_generation(mode=SYNC_MODES[self.sync_mode], clear_cache=True))
        try:
            client.start_weight_update()
            client.update_weights({"buckets": plan})
            client.finish_weight_update()
            self._call(self.llm.update_weight_version(str(version)))
        except Exception as e:
            self._restart(e)
            raise
        self._call(self.llm.resume_generation())
        self.version = version
        self.last_sync = {"engine/sync_s": time.monotonic() - t0,
                          "engine/sync_bytes": float(sum(int(b["nbytes"]) for b in plan)),
                          "engine/restarts": float(self.restarts)}

    def sleep(self) -> None:
        """Free the GPU for the learner's step (colocated): weights offloaded, KV cache dropped."""
        if self.sleep_during_step:
            self._call(self.llm.sleep(level=1, mode="keep"))

    def wake_up(self) -> None:
        if self.sleep_during_step:
            self._call(self.llm.wake_up())

    def metrics(self) -> dict[str, float]:
        return {"engine/requests": float(self.requests), "engine/running": float(self.outstanding), **self.last_sync}

    def close(self) -> None:
        """Stop the engine core and the loop, now: left to vLLM's `__del__` at interpreter exit,
        its shutdown runs with the modules half gone and fails noisily."""
        if getattr(self, "llm", None) is None:
            return
        llm, self.llm = self.llm, None
        self._call(self._shutdown(llm))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        # it is shut down: the object may outlive this (vLLM's own registries hold it), and its
        # __del__ would shut it down again at interpreter exit, when its module globals are gone
        llm.shutdown = lambda *args, **kwargs: None

    @staticmethod
    async def _shutdown(llm) -> None:
        llm.shutdown()
        handler = getattr(llm, "output_handler", None)
        if handler is not None:  # let its cancellation run, so nothing on the loop holds the engine
            await asyncio.gather(handler, return_exceptions=True)


class _SyncClient:
    """vLLM's `VLLMWeightSyncClient` protocol over this engine, for its trainer-side transfer
    engines (they call these from the syncing thread; each runs on the engine's loop)."""

    def __init__(self, engine: AsyncVLLMEngine):
        self.engine = engine

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self.engine._call(self.engine.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)))

    def start_weight_update(self) -> None:
        self.engine._call(self.engine.llm.start_weight_update())

    def update_weights(self, update_info) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        from agent.engines.vllm_transfer import wire_update_info

        self.engine._call(self.engine.llm.update_weights(WeightTransferUpdateRequest(
            update_info=wire_update_info(update_info))))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.engine._call(self.engine.llm.finish_weight_update(weight_version))
