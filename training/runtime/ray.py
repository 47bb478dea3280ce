"""runtime=ray: the same run spread over a Ray cluster.

    ray start --head                        # on the first machine
    ray start --address=HEAD_IP:6379        # on every other machine
    python -m training.run runtime=ray ray.address=auto engine.replicas=2 ...

What goes where (each a Ray actor, placed by placement groups):
- **engine replicas** (`engine.replicas`), each vLLM's async engine with its own tensor-parallel
  size (`engine.options.tensor_parallel_size`) on GPUs of its own (`engine_placement`: above one
  GPU, a bundle per GPU and vLLM's Ray executor's workers on them), behind one **router** actor
  (agent/engines/router.py's Balancer: least outstanding requests, a rollout's turns on one
  replica). A replica whose actor dies is restarted by Ray, given the latest weights by the
  router, and its requests in flight are retried on another replica.
- **learner ranks** (`ray.learner_ranks`): one actor each, joined in one torch.distributed
  group (NCCL on GPUs, gloo on CPU); every rank gets each step's batch and takes its share
  (data parallel, or the Megatron learner's layout). Weights reach the engines by collective
  (`ray.weight_sync=collective`, agent/engines/collective.py): each rank opens a process
  group with each replica's workers (gloo on CPU, NCCL on GPUs) and broadcasts its share of the
  tensors in buckets, so no rank gathers the whole model and nothing goes through the object
  store; a replica Ray restarted joins anew and gets the current weights before it serves.
  `ray.weight_sync=object_store` instead has rank 0 put the whole model in Ray's object store
  and each replica fetch it.
- **rollout workers** (`ray.rollout_actors`), spread over the nodes: each runs the agent loop
  in threads and makes its sandboxes on its own node's Docker engine (or the host of
  `ray.docker_hosts`, in turn). One that dies loses no task: the driver draws it again.
This process (the driver) keeps the stream, the learner loop and the checkpoints, as in
runtime=local: `training/lifecycle.py` runs the same orchestrator with these actors in place of
threads. `Cluster` is the runtime (training/runtime/base.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import ray
from omegaconf import DictConfig, OmegaConf
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from transformers import AutoTokenizer

from agent.engines import make_engine
from agent.engines.base import Completion, SamplingParams, current_session
from agent.engines.router import Balancer, NoReplicaLeft, ReplicaRestarted, is_dead_engine
from agent.engines.shared import shareable
from agent.rollout import rollout_and_grade
from training import collectives
from training.console import console
from training.factories import engine_choice, make_agent, make_learner, make_pool, make_source_env, prepare_model
from training.orchestrator import RolloutLost
from training.runtime.base import ClusterError, run_command

ENGINE_REQUESTS = 1024  # requests one engine actor serves at once

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 900  # model loading on a cold node can take minutes


def _gpu() -> bool:
    return ray.cluster_resources().get("GPU", 0) > 0


async def _until_up(probe, what: str) -> bool:
    """Awaits `probe()` until it succeeds (an actor Ray is restarting answers with errors until
    it is back); False, said, after READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            await probe()
            return True
        except Exception:  # still restarting
            await asyncio.sleep(1.0)
    log.error("%s did not come back", what)
    return False


def _node_address() -> str:
    """This actor's node as the cluster knows it (`ray start --node-ip-address`), not whatever
    address the machine would pick for itself."""
    node_id = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


# ---- engines ----

@dataclass(frozen=True)
class EnginePlacement:
    """Where one engine replica goes: its placement group (`bundles`, `strategy`), what its actor
    takes of bundle 0 (`actor`: num_cpus, num_gpus) and the vLLM engine args that go with that
    layout (`engine_options`, added to `engine.options`)."""

    bundles: list[dict]
    strategy: str
    actor: dict
    engine_options: dict = field(default_factory=dict)


def engine_placement(devices: int, gpu: bool, backend: str | None = None) -> EnginePlacement:
    """The layout of one replica of `devices` GPUs (tensor x pipeline parallel size), on one node.

    Inside a Ray actor, vLLM takes the actor's placement group for its workers: with more than
    one GPU it picks its Ray executor by itself (ParallelConfig, when the actor is in a placement
    group), which refuses a bundle of more than one GPU and places one worker actor of
    VLLM_RAY_PER_WORKER_GPUS (1) GPU on each GPU bundle (v1/executor/ray_utils.py
    `initialize_ray_cluster`, ray_executor_v2.py). So: a bundle per GPU, the engine's actor on
    bundle 0 with its CPU and no GPU (the worker of rank 0 takes that bundle's GPU), and the Ray
    executor said outright. `backend="mp"` (engine.options.distributed_executor_backend) keeps
    one bundle of all the GPUs instead: the actor holds them (Ray sets CUDA_VISIBLE_DEVICES) and
    vLLM's worker processes are its children. One GPU: one bundle, the actor holds it (vLLM runs
    it in-process, `uni`). No GPUs: one CPU bundle; above one device vLLM's CPU backend has no
    Ray executor, so `mp`."""
    if devices < 1:
        raise ValueError(f"an engine replica needs at least one device, not {devices}")
    if not gpu:
        engine = {"distributed_executor_backend": backend or "mp"} if devices > 1 else {}
        return EnginePlacement([{"CPU": 1}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": 0}, engine)
    if devices == 1:
        return EnginePlacement([{"CPU": 1, "GPU": 1}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": 1})
    if backend == "mp":
        return EnginePlacement([{"CPU": 1, "GPU": devices}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": devices},
                               {"distributed_executor_backend": "mp"})
    if backend not in (None, "ray"):
        raise ValueError(f"engine.options.distributed_executor_backend={backend!r} with {devices} GPUs a replica: "
                         "under runtime=ray choose ray (a bundle per GPU) or mp (the replica's actor holds them all)")
    bundles = [{"CPU": 1, "GPU": 1}] + [{"GPU": 1}] * (devices - 1)  # STRICT_PACK: tensor parallel within a node
    return EnginePlacement(bundles, "STRICT_PACK", {"num_cpus": 1, "num_gpus": 0},
                           {"distributed_executor_backend": "ray"})


COLOCATED_GPU_SHARE = 0.5  # of each GPU in Ray's accounting, for the learner rank and the engine worker on it


@dataclass(frozen=True)
class Colocated:
    """ray.colocate: the engine replicas on the learner ranks' GPUs. A placement group per
    replica, a bundle per GPU on one node (STRICT_PACK, as tensor parallel needs); the replica's
    workers take half of each of its GPUs, learner rank k the other half of GPU k % devices of
    replica k // devices. Ray's halves are bookkeeping: the memory is shared by time, the engine
    sleeping (vLLM's sleep mode) while the learner steps, and sized by
    engine.options.gpu_memory_utilization."""

    replicas: int
    devices: int

    @property
    def bundles(self) -> list[dict]:
        """One replica's placement group: bundle 0 also holds the engine's actor's CPU."""
        return [{"CPU": 2, "GPU": 1}] + [{"CPU": 1, "GPU": 1}] * (self.devices - 1)

    def engine_actor(self) -> dict:
        """Ray options of a replica's engine actor, on bundle 0 of its group."""
        if self.devices == 1:  # vLLM runs it in the actor's process, on the GPU Ray gives the actor
            return {"num_cpus": 1, "num_gpus": COLOCATED_GPU_SHARE}
        # vLLM's Ray executor places a worker actor on each of these bundles with this share of its GPU
        env = {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(self.devices))),
               "VLLM_RAY_PER_WORKER_GPUS": str(COLOCATED_GPU_SHARE)}
        return {"num_cpus": 1, "num_gpus": 0, "runtime_env": {"env_vars": env}}

    def learner_rank(self, k: int) -> tuple[int, int]:
        """(replica whose group it is in, bundle) of learner rank k."""
        return k // self.devices, k % self.devices


def colocated_placement(ranks: int, replicas: int, devices: int) -> Colocated:
    """The layout of `ray.colocate=true`: every engine worker on a learner rank's GPU."""
    if replicas * devices != ranks:
        raise ClusterError(f"ray.colocate puts each engine worker on a learner rank's GPU: engine.replicas ({replicas}) "
                           f"x the GPUs of a replica ({devices}) must equal ray.learner_ranks ({ranks})")
    return Colocated(replicas, devices)


class EngineActor:
    """One engine replica (vLLM's async engine; another kind behind a SharedEngine)."""

    def __init__(self, kind: str, model_path: str, options: dict):
        self.engine = shareable(make_engine(kind, model_path, **options))
        self._threads = ThreadPoolExecutor(ENGINE_REQUESTS, thread_name_prefix="generate")
        # Ray restarted this replica: it holds the weights it started with, and the router may not
        # know yet (no request was in flight when it died). It serves again once `serve` is called.
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    async def ready(self) -> int:
        return self.engine.version

    async def serve(self) -> None:
        """The router has given this replica the run's weights (or the run has synced none yet)."""
        self.restarted = False

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        if self.restarted:
            raise ReplicaRestarted("this engine replica was restarted and has not been given the run's weights")
        if hasattr(self.engine, "submit"):
            return await asyncio.wrap_future(self.engine.submit(prompt_ids, sampling))
        # a thread per request in flight (the actor's max_concurrency), made as needed:
        # asyncio.to_thread's pool has min(32, CPUs + 4), and the engine batches only what it is given at once
        return await asyncio.get_running_loop().run_in_executor(self._threads, self.engine.generate, prompt_ids, sampling)

    async def update_weights(self, weights: list, version: int) -> dict:
        await asyncio.to_thread(self.engine.update_weights, weights, version)
        return dict(getattr(self.engine, "last_sync", {}))

    async def node_address(self) -> str:
        """Where this replica's workers are (one node: STRICT_PACK), as the cluster knows it."""
        return _node_address()

    async def join_collective(self, init_info: dict) -> None:
        await asyncio.to_thread(self.engine.join_collective, init_info)

    async def receive_collective(self, plan: list[dict], version: int) -> dict:
        """One sync by collective (the learner ranks send meanwhile). A failed one restarted the
        engine: it serves again only after a later sync (`serve`)."""
        try:
            await asyncio.to_thread(self.engine.receive_collective, plan, version)
        except BaseException:
            self.restarted = True
            raise
        return dict(getattr(self.engine, "last_sync", {}))

    async def sleep(self) -> None:
        await asyncio.to_thread(self.engine.sleep)

    async def wake_up(self) -> None:
        await asyncio.to_thread(self.engine.wake_up)

    async def stats(self) -> dict:
        return {"version": self.engine.version, "busy_s": getattr(self.engine, "busy_s", 0.0),
                "batch_size_mean": getattr(self.engine, "batch_size_mean", 0.0)}

    async def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()


class RouterActor:
    """The replicas' front: picks one per request (Balancer), retries a request whose replica
    died on another, brings a restarted replica the latest weights before it serves again."""

    def __init__(self, engines: list, ranks: list | None = None, workers: int = 1,
                 bucket_bytes: int = 256 << 20, timeout_s: float = 600.0, transport: str = "gloo"):
        """`ranks`: the learner actors, when weights go by collective (None: by the object
        store); `workers`: each replica's engine workers (its GPUs); `transport`: gloo or nccl."""
        self.engines = engines
        self.balancer = Balancer(len(engines))
        self.latest: tuple[list, int] | None = None  # ([weights ref], version) for restarted replicas
        self.version = 0
        self.last_sync: dict[str, float] = {}
        self._revived = asyncio.Event()
        # weights by collective: each replica's groups with the ranks (a new prefix each time it
        # joins), the replicas Ray restarted that wait for weights, the plan all syncs share
        self.ranks, self.workers, self.bucket_bytes, self.timeout_s = ranks, workers, bucket_bytes, timeout_s
        self.transport = transport
        self.joined = [False] * len(engines)
        self.joins = [0] * len(engines)
        self.pending: set[int] = set()
        self._senders: list | None = None
        self._plan: list[dict] | None = None
        self._sync_lock = asyncio.Lock()

    async def generate(self, session: str | None, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            while not any(self.balancer.alive):
                self._revived.clear()
                try:
                    await asyncio.wait_for(self._revived.wait(), timeout=max(1.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    raise NoReplicaLeft("every engine replica died and none came back") from None
            i = self.balancer.pick(session)
            try:
                return await self.engines[i].generate.remote(prompt_ids, sampling)
            except Exception as e:
                if not is_dead_engine(e):
                    raise
                self._died(i, e)
                self.balancer.retried += 1
            finally:
                self.balancer.done(i)

    def _died(self, i: int, error: BaseException) -> None:
        if self.balancer.alive[i]:
            self.balancer.down(i)
            log.warning("engine replica %d died (%s); Ray restarts it", i, type(error).__name__)
            asyncio.get_running_loop().create_task(self._revive(i))

    async def _revive(self, i: int) -> None:
        engine = self.engines[i]

        async def bring_up():
            await engine.ready.remote()
            if self.ranks is not None:  # by collective: it joins the next sync (the driver asks for one soon)
                if self.version > 0:
                    self.joined[i] = False
                    self.pending.add(i)
                    return
            given = None
            while self.latest is not None and self.latest[1] != given:  # again if a sync passed it by meanwhile
                box, given = self.latest
                await engine.update_weights.remote(box[0], given)
            await engine.serve.remote()

        if not await _until_up(bring_up, f"engine replica {i}"):
            return
        self.balancer.restarts += 1
        if i not in self.pending:
            self.balancer.up(i)
            self._revived.set()

    async def update_weights(self, box: list, version: int) -> None:
        """`box`: [an object ref of the (name, tensor) list], so each replica fetches it itself."""
        self.latest = (box, version)
        t0 = time.monotonic()
        syncs = await self._each_live("update_weights", box[0], version)  # one that died gets them when it is back
        self.version = version
        self.last_sync = {"engine/sync_s": time.monotonic() - t0,
                          "engine/sync_bytes": float(sum(s.get("engine/sync_bytes", 0.0) for s in syncs))}

    # ---- weights by collective ----

    async def pending_replicas(self) -> list[int]:
        """Replicas Ray restarted that wait for the current weights before they serve."""
        return sorted(self.pending)

    async def sync_collective(self, version: int, only: list[int] | None = None) -> None:
        """One sync by collective: every live replica (or `only` those of them waiting for
        weights) receives while every learner rank sends its share. A replica that fails is
        taken out (restarted by Ray if it died) and gets the weights at a later sync; an error
        of a learner rank is the run's."""
        async with self._sync_lock:
            if self._senders is None:
                self._senders = await asyncio.gather(*[r.weight_sender.remote(self.timeout_s, self.transport)
                                                       for r in self.ranks])
            if self._plan is None:  # all ranks walk the weights (a collective for Megatron); the plans agree
                self._plan = (await asyncio.gather(*[r.weight_plan.remote(self.bucket_bytes) for r in self.ranks]))[0]
            if only is None:
                targets = [i for i in range(len(self.engines)) if self.balancer.alive[i] or i in self.pending]
            else:
                targets = [i for i in only if i in self.pending]
                if not targets:  # a sync meanwhile brought them back
                    return
            for i in targets:
                if not self.joined[i]:
                    await self._join(i)
            targets = [i for i in targets if self.joined[i]]
            t0 = time.monotonic()
            receiving = [self.engines[i].receive_collective.remote(self._plan, version) for i in targets]
            sent = await asyncio.gather(*[r.send_weights.remote(self._plan, targets) for r in self.ranks])
            received = await asyncio.gather(*receiving, return_exceptions=True)
            failed = {int(i): why for s in sent for i, why in s["failed"].items()}
            done = []
            for i, r in zip(targets, received):
                if isinstance(r, BaseException) or i in failed:
                    self._out(i, r if isinstance(r, BaseException) else RuntimeError(failed[i]))
                    continue
                done.append(i)
                if i in self.pending:
                    self.pending.discard(i)
                    await self.engines[i].serve.remote()
                    self.balancer.up(i)
                    self._revived.set()
            if only is None:
                self.version = version
            model_bytes = sum(int(b["nbytes"]) for b in self._plan)
            self.last_sync = {"engine/sync_s": time.monotonic() - t0, "engine/sync_bytes": float(model_bytes * len(done))}
            for k, s in enumerate(sent):  # what each rank sent (all replicas) and the most it held at once
                self.last_sync.update({f"engine/sync/rank{k}_bytes": float(s["sent_bytes"]),
                                       f"engine/sync/rank{k}_held_bytes": float(s["held_bytes"]),
                                       f"engine/sync/rank{k}_s": float(s["seconds"])})

    async def _join(self, i: int) -> None:
        """Replica i's workers and every learner rank open their groups (a new prefix each time)."""
        self.joins[i] += 1
        prefix = f"replica{i}/join{self.joins[i]}"
        try:
            host = await self.engines[i].node_address.remote()
        except Exception as e:
            self._out(i, e)
            return
        info = {"senders": [list(a) for a in self._senders], "prefix": prefix, "workers": self.workers,
                "timeout_s": self.timeout_s, "transport": self.transport, "host": host}
        results = await asyncio.gather(self.engines[i].join_collective.remote(info),
                                       *[r.open_weight_group.remote(i, prefix, self.workers) for r in self.ranks],
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._out(i, errors[0])
        else:
            self.joined[i] = True

    def _out(self, i: int, error: BaseException) -> None:
        """Replica i failed a sync by collective: dead, Ray restarts it; alive, its engine was
        started anew (a half-loaded model is never resumed); either way it waits for weights."""
        self.joined[i] = False
        if is_dead_engine(error):
            self.pending.discard(i)
            self._died(i, error)
            return
        log.warning("engine replica %d failed a weight sync (%s: %s); it serves again after the next one",
                    i, type(error).__name__, error)
        if self.balancer.alive[i]:
            self.balancer.down(i)
        self.pending.add(i)

    async def sleep(self) -> None:
        """ray.colocate: every live replica frees its GPU memory for the learner's step."""
        await self._each_live("sleep")

    async def wake_up(self) -> None:
        await self._each_live("wake_up")

    async def _each_live(self, method: str, *args) -> list:
        """`method(*args)` on every live replica at once; the answers of those that gave one. A
        replica that died is set aside (Ray restarts it); any other error is the caller's."""
        live = [i for i, up in enumerate(self.balancer.alive) if up]
        results = await asyncio.gather(*[getattr(self.engines[i], method).remote(*args) for i in live],
                                       return_exceptions=True)
        for i, r in zip(live, results):
            if isinstance(r, BaseException):
                if not is_dead_engine(r):
                    raise r
                self._died(i, r)
        return [r for r in results if not isinstance(r, BaseException)]

    async def get_version(self) -> int:
        return self.version

    async def metrics(self) -> dict[str, float]:
        return {**self.balancer.metrics(), **self.last_sync}

    async def load(self) -> dict[str, float]:
        """Seconds busy and requests decoded together, the mean of the live replicas'."""
        stats = await asyncio.gather(*[e.stats.remote() for i, e in enumerate(self.engines) if self.balancer.alive[i]],
                                     return_exceptions=True)
        stats = [s for s in stats if isinstance(s, dict)]
        return {k: sum(s[k] for s in stats) / max(len(stats), 1) for k in ("busy_s", "batch_size_mean")}


class RayEngine:
    """The engine protocol in the driver, over the router actor: what the orchestrator syncs,
    what held-apart scoring samples from, what the metrics read. With weights by collective
    (`learner` given), a thread also looks every `REVIVE_POLL_S` for replicas Ray restarted
    and has the ranks send them the current weights, between the learner's commands."""

    REVIVE_POLL_S = 2.0

    def __init__(self, router, learner: "RayLearnerGroup | None" = None, sleep_during_step: bool = False):
        self.router = router
        self.learner = learner
        self.sleep_during_step = sleep_during_step  # ray.colocate: the orchestrator sleeps it around each step
        self._load: dict[str, float] = {}
        self._closed = threading.Event()
        if learner is not None:
            threading.Thread(target=self._revive_loop, name="weights-for-restarted-replicas", daemon=True).start()

    def _revive_loop(self) -> None:
        while not self._closed.wait(self.REVIVE_POLL_S):
            try:
                pending = ray.get(self.router.pending_replicas.remote())
                if pending:
                    with self.learner.lock:
                        ray.get(self.router.sync_collective.remote(self.learner.version, pending))
            except Exception as e:  # the run's own loop meets a lasting fault; this one tries again
                if self._closed.is_set():
                    return
                log.warning("weights for a restarted engine replica: %s", e)

    @property
    def version(self) -> int:
        return ray.get(self.router.get_version.remote())

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return ray.get(self.router.generate.remote(current_session(), prompt_ids, sampling))

    def update_weights(self, weights, version: int) -> None:
        if isinstance(weights, CollectiveWeights):
            with self.learner.lock:
                ray.get(self.router.sync_collective.remote(version))
            return
        if self.learner is not None:
            raise ClusterError("under ray.weight_sync=collective the engines take weights only from the learner "
                               "ranks (a snapshot, as trainer.engine_lag keeps, needs ray.weight_sync=object_store)")
        ref = weights.ref if isinstance(weights, RayWeights) else ray.put([(n, t.detach().cpu()) for n, t in weights])
        ray.get(self.router.update_weights.remote([ref], version))
        nbytes = weights.nbytes if isinstance(weights, RayWeights) else sum(t.numel() * t.element_size() for _, t in weights)
        self._sent = {"engine/sync/rank0_bytes": float(nbytes), "engine/sync/rank0_held_bytes": float(nbytes)}

    def metrics(self) -> dict[str, float]:
        return {**ray.get(self.router.metrics.remote()), **getattr(self, "_sent", {})}

    def sleep(self) -> None:
        if self.sleep_during_step:
            ray.get(self.router.sleep.remote())

    def wake_up(self) -> None:
        if self.sleep_during_step:
            ray.get(self.router.wake_up.remote())

    @property
    def busy_s(self) -> float:
        self._load = ray.get(self.router.load.remote())
        return self._load["busy_s"]

    @property
    def batch_size_mean(self) -> float:
        """As of the last `busy_s` read (the orchestrator reads both for one step's metrics)."""
        return self._load.get("batch_size_mean", 0.0)

    def close(self) -> None:
        """Stops the thread for restarted replicas; the cluster (`Cluster.close`) closes the engines."""
        self._closed.set()


class RouterClient:
    """The engine protocol inside a rollout actor: the agent's threads call the router."""

    def __init__(self, router):
        self.router = router

    @property
    def version(self) -> int:
        return ray.get(self.router.get_version.remote())

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return ray.get(self.router.generate.remote(current_session(), prompt_ids, sampling))


# ---- learner ----

class RayWeights:
    """The learner's weights for the engines, held in Ray's object store (by rank 0); already a
    snapshot, so the orchestrator keeps the handle and `fetch`es the tensors only to save them."""

    def __init__(self, ref, nbytes: int = 0):
        self.ref, self.nbytes = ref, nbytes

    def fetch(self) -> list:
        return ray.get(self.ref)


@dataclass(frozen=True)
class CollectiveWeights:
    """The learner's weights as its ranks hold them at the sync: they send them themselves
    (`RouterActor.sync_collective`), so there is no snapshot to keep (trainer.engine_lag needs
    ray.weight_sync=object_store)."""

    version: int


class LearnerActor:
    """One learner rank. `setup` joins the group and builds the learner, as a torchrun rank would."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.learner = None
        self.sender = None  # weights by collective: this rank's end of its groups with the engines

    def address(self) -> tuple[str, int]:
        host = _node_address()
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        return host, port

    def setup(self, cfg: dict, model_path: str, master: tuple[str, int]) -> tuple[str | None, bool]:
        gpus = ray.get_gpu_ids()
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world), LOCAL_RANK="0" if gpus else str(self.rank))
        collectives.init_from_env((cfg.get("local") or {}).get("rank_timeout_s"))  # (ranks wait only within a command here)
        self.learner = make_learner(OmegaConf.create(cfg), model_path)
        return self.learner.layout_summary, self.learner.collective

    def step(self, batch, group_ids) -> dict:
        return run_command(self.learner, self.world, "step", batch, group_ids)

    def version(self) -> int:
        return self.learner.version

    def release_memory(self) -> None:
        run_command(self.learner, self.world, "release")

    def weights(self) -> list | None:
        tensors = [(n, t.detach().cpu()) for n, t in run_command(self.learner, self.world, "weights")]
        return [ray.put(tensors), sum(t.numel() * t.element_size() for _, t in tensors)] if self.rank == 0 else None

    # weights by collective (agent/engines/collective.py): the router calls these on every rank

    def weight_sender(self, timeout_s: float, transport: str) -> tuple[str, int]:
        """Hosts this rank's store for its groups with the engines; its address."""
        from agent.engines.collective import BucketSender

        if self.sender is None:
            self.sender = BucketSender(self.rank, _node_address(), timeout_s, transport)
        return self.sender.address

    def open_weight_group(self, replica: int, prefix: str, workers: int) -> None:
        self.sender.open(replica, prefix, workers)

    def weight_plan(self, bucket_bytes: int) -> list[dict]:
        """The buckets every sync sends, from a walk over the weights (every rank walks them)."""
        from agent.engines.collective import make_plan, meta_of

        return make_plan([meta_of(n, t) for n, t in self.learner.weights_for_engine()], self.world, bucket_bytes)

    def send_weights(self, plan: list[dict], replicas: list[int]) -> dict:
        t0 = time.monotonic()
        out = self.sender.send(self.learner.weights_for_engine(), plan, replicas)
        return {**out, "seconds": time.monotonic() - t0}

    def save(self, path: str) -> None:
        run_command(self.learner, self.world, "save", path)

    def load(self, path: str) -> None:
        run_command(self.learner, self.world, "load", path)


class RayLearnerGroup:
    """The learner interface in the driver over the rank actors: a step goes to every rank
    (each takes its rows); rank 0's metrics, version and weights stand for all.

    Every command to the ranks holds `lock` (shared with the engine's syncs by collective): a
    command the ranks carry out together (a step's all-reduce, Megatron's export) must reach
    them all in the same order, which two threads of the driver calling at once would not keep."""

    def __init__(self, actors: list, collective: bool, layout: str | None, weight_sync: str = "object_store"):
        self.actors, self.collective, self.layout_summary = actors, collective, layout
        self.weight_sync = weight_sync
        self.lock = threading.RLock()
        self._version = ray.get(actors[0].version.remote())

    @property
    def version(self) -> int:
        return self._version

    def step(self, trajectories, group_ids=None) -> dict:
        batch = ray.put(trajectories)  # once, not once per rank
        with self.lock:
            metrics = ray.get([a.step.remote(batch, group_ids) for a in self.actors])[0]
            self._version = ray.get(self.actors[0].version.remote())
        return metrics

    def release_memory(self) -> None:
        """ray.colocate: every rank frees its step's transient memory before the engines wake."""
        with self.lock:
            ray.get([a.release_memory.remote() for a in self.actors])

    def _rank0_or_all(self):
        return self.actors if self.collective else self.actors[:1]

    def state_dict_for_engine(self) -> RayWeights | CollectiveWeights:
        if self.weight_sync == "collective":
            return CollectiveWeights(self._version)
        with self.lock:
            ref, nbytes = ray.get([a.weights.remote() for a in self._rank0_or_all()])[0]
        return RayWeights(ref, nbytes)

    def save(self, path) -> None:
        with self.lock:
            ray.get([a.save.remote(str(path)) for a in self._rank0_or_all()])

    def load(self, path) -> None:
        with self.lock:
            refs = [a.load.remote(str(path)) for a in self.actors]
            try:
                ray.get(refs)
            except ray.exceptions.RayTaskError as e:  # the learner's own error (a LayoutError, say), as itself
                raise (e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()) from None
            self._version = ray.get(self.actors[0].version.remote())


# ---- rollouts ----

class RolloutActor:
    """Rollouts on this node, one per thread of this (threaded) actor; sandboxes on this
    node's Docker engine."""

    def __init__(self, cfg: dict, model_path: str, router, index: int, slots: int):
        cfg = OmegaConf.create(cfg)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        engine = RouterClient(router)
        self.sources = {spec.get("name", spec.env): (make_source_env(spec), make_agent(engine, tokenizer, cfg, spec.get("agent")))
                        for spec in cfg.sources}
        # a run id of its own: closing one worker's pool sweeps its containers, not the others';
        # two sandboxes a rollout: its own and the clean one made ready for its grading
        self.pool = make_pool(cfg, f"{cfg.run_id}-w{index}", max_live=2 * slots)
        self._lock = threading.Lock()
        self._under_way = 0

    def rollout(self, source: str, task, seed: int):
        env, agent = self.sources[source]
        with self._lock:
            self._under_way += 1
        try:
            return rollout_and_grade(agent, task, env, self.pool, seed)
        finally:
            with self._lock:
                self._under_way -= 1

    def under_way(self) -> int:
        """How many rollouts this worker is running now (one of the spare threads answers)."""
        return self._under_way

    def node(self) -> tuple[str, str]:
        return ray.get_runtime_context().get_node_id(), _node_address()

    def close(self) -> None:
        self.pool.close()


class RayRollouts:
    """The orchestrator's `rollout`: each goes to the least busy live rollout actor. One that
    died is passed over until Ray has restarted it (its lost rollouts are drawn again)."""

    def __init__(self, actors: list):
        self.actors = actors
        self.load = [0] * len(actors)
        self.alive = [True] * len(actors)
        self._back = asyncio.Event()

    async def __call__(self, source, task, seed: int):
        while not any(self.alive):
            self._back.clear()
            await asyncio.wait_for(self._back.wait(), timeout=READY_TIMEOUT_S)
        i = min((a for a in range(len(self.actors)) if self.alive[a]), key=lambda a: (self.load[a], a))
        self.load[i] += 1
        try:
            return await self.actors[i].rollout.remote(source.name, task, seed)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
            if self.alive[i]:
                self.alive[i] = False
                asyncio.get_running_loop().create_task(self._wait_for(i))
            raise RolloutLost(f"rollout actor {i} died ({type(e).__name__})") from e
        finally:
            self.load[i] -= 1

    async def _wait_for(self, i: int) -> None:
        if await _until_up(self.actors[i].node.remote, f"rollout actor {i}"):
            self.alive[i] = True
            self._back.set()
            log.warning("rollout actor %d is back", i)


# ---- the cluster ----

class Cluster:
    """runtime=ray: everything a run places on Ray, created in order and removed by `close`."""

    is_main = True  # the driver runs the loop; the ranks are actors

    def __init__(self, cfg: DictConfig, model_path: str | None = None):
        self.groups: list = []
        self.actors: list = []
        self.model_path = model_path or prepare_model(cfg.model)
        try:
            self._start(cfg, self.model_path)
        except BaseException:  # nothing of a half-built cluster stays on a cluster that stays
            self.close()
            raise
        console.print(f"learner: {cfg.ray.learner_ranks} rank(s)" + (f", {self.learner.layout_summary}"
                                                            if self.learner.layout_summary else ""))

    def follow(self) -> int:
        raise AssertionError("under runtime=ray the learner ranks are actors: the driver never follows")

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, cfg: DictConfig, model_path: str) -> None:
        r = cfg.ray
        kind, options = engine_choice(cfg.engine)
        tp = int(options.get("tensor_parallel_size", 1))
        devices = tp * int(options.get("pipeline_parallel_size", 1))  # GPUs a replica
        n_replicas, n_ranks = cfg.engine.replicas, r.learner_ranks
        cpus_needed = n_replicas + n_ranks + r.rollout_actors * r.rollout_actor_cpus
        if not ray.is_initialized():
            # a Ray instance of the run's own counts at least the CPUs its actors ask for: on a
            # small machine they share the cores, as the threads of runtime=local do
            own = {"num_cpus": max(os.cpu_count() or 1, int(cpus_needed + 0.999))} if r.address is None else {}
            ray.init(address=r.address, namespace=f"sao-{cfg.run_id}", log_to_driver=r.log_to_driver, **own,
                     **({"_node_ip_address": r.node_ip_address} if r.get("node_ip_address") else {}))
        gpu = _gpu()
        have = ray.cluster_resources()
        colocate = bool(r.get("colocate", False))
        if colocate and not gpu:
            raise ClusterError("ray.colocate=true shares GPUs between engine replicas and learner ranks (vLLM's sleep "
                               "mode frees the engine's memory while the learner steps): the cluster has no GPUs")
        gpus_needed = (n_ranks if colocate else n_replicas * devices + n_ranks) if gpu else 0
        if have.get("CPU", 0) < cpus_needed or have.get("GPU", 0) < gpus_needed:
            raise ClusterError(
                f"the cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs; this run asks for "
                f"{cpus_needed:g} CPUs ({n_replicas} engine replicas, {n_ranks} learner ranks, {r.rollout_actors} "
                f"rollout workers x ray.rollout_actor_cpus {r.rollout_actor_cpus:g})"
                + (f" and {gpus_needed} GPUs ({n_replicas} x {devices} for the engines, {n_ranks} for the learner"
                   + (", shared" if colocate else "") + ")" if gpu else "")
                + ": add nodes, or lower engine.replicas, ray.learner_ranks or ray.rollout_actors")
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        # weights by collective (vLLM's async engine with the project's `collective` backend): each
        # learner rank straight to each replica's workers. By the object store: rank 0 puts the
        # model there, each replica's actor fetches it and gives it its engine by `inline`, in buckets
        self.weight_sync = r.get("weight_sync", "collective")
        if self.weight_sync == "collective" and kind != "vllm":
            console.print(f"[yellow]note:[/yellow] engine {kind} takes weights through Ray's object store only: "
                          "ray.weight_sync=object_store for this run")
            self.weight_sync = "object_store"
        transfer = options.get("weight_transfer", "auto")
        if kind == "vllm" and transfer not in ("auto", "inline", "collective"):
            raise ClusterError(f"engine.options.weight_transfer={transfer}: under runtime=ray the cluster picks it by "
                               "ray.weight_sync (collective, or object_store with inline); leave it auto")
        if kind == "vllm":
            options = {**options, "weight_transfer": "collective" if self.weight_sync == "collective" else "inline"}
        try:
            placement = engine_placement(devices, gpu, options.get("distributed_executor_backend"))
        except ValueError as e:
            raise ClusterError(str(e)) from None
        if kind in ("vllm", "vllm_batch"):
            options = {**options, **placement.engine_options}
        co = None
        if colocate:
            co = colocated_placement(n_ranks, n_replicas, devices)
            if kind != "vllm":
                raise ClusterError(f"ray.colocate=true needs engine=vllm (vLLM's sleep mode), not engine={kind}")
            if options.get("gpu_memory_utilization") is None:
                raise ClusterError("ray.colocate=true: set engine.options.gpu_memory_utilization, the engine's share of "
                                   "each GPU it shares with a learner rank (python -m training.plan with the run's "
                                   "overrides prints what fits)")
            options = {**options, "sleep_during_step": True}
        console.print(f"ray: {len(ray.nodes())} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs, "
                      f"{ray.cluster_resources().get('GPU', 0):g} GPUs; {n_replicas} engine replica(s) x TP {tp}, "
                      f"{n_ranks} learner rank(s), {r.rollout_actors} rollout worker(s); weights by {self.weight_sync.replace('_', ' ')}")

        # engines: a placement group each (its GPUs on one node, `engine_placement`), restarted by
        # Ray if they die; vLLM's workers above one GPU are actors of their own in that group
        engine_cls = ray.remote(EngineActor)
        engines, groups = [], []
        for i in range(n_replicas):
            pg = self._group(co.bundles, "STRICT_PACK") if co else self._group(placement.bundles, placement.strategy)
            groups.append(pg)
            engines.append(engine_cls.options(
                name=f"engine-{i}", max_restarts=-1, max_concurrency=ENGINE_REQUESTS,
                **(co.engine_actor() if co else placement.actor),
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0,
                                                                     placement_group_capture_child_tasks=bool(co)),
            ).remote(kind, model_path, options))
        self.actors += engines
        self.engines = engines
        if co:  # vLLM measures the GPU's free memory as it starts: before the learner ranks beside it take theirs
            ray.get([e.ready.remote() for e in engines], timeout=READY_TIMEOUT_S)
        # learner ranks: one placement group, a bundle per rank (colocated: on the replicas' GPUs)
        learner_cls = ray.remote(LearnerActor)
        if co:
            where = [(groups[co.learner_rank(k)[0]], co.learner_rank(k)[1]) for k in range(n_ranks)]
        else:
            pg = self._group([{"CPU": 1, **({"GPU": 1} if gpu else {})}] * n_ranks, "PACK")
            where = [(pg, k) for k in range(n_ranks)]
        ranks = [learner_cls.options(name=f"learner-{k}", num_cpus=1,
                                     num_gpus=(COLOCATED_GPU_SHARE if co else 1) if gpu else 0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=b)
                                     ).remote(k, n_ranks) for k, (group, b) in enumerate(where)]
        self.actors += ranks
        master = ray.get(ranks[0].address.remote())
        try:
            layout, collective = ray.get([a.setup.remote(cfg_dict, model_path, master) for a in ranks])[0]
        except ray.exceptions.RayTaskError as e:  # a LayoutError says which field, as in runtime=local
            raise (e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()) from None
        self.learner = RayLearnerGroup(ranks, collective, layout, self.weight_sync)

        by_collective = self.weight_sync == "collective"
        # colocated, a rank and a worker of its group share a GPU, which one NCCL group cannot hold: gloo, through the host
        transport = "nccl" if gpu and not co else "gloo"
        self.router = ray.remote(RouterActor).options(name="router", max_concurrency=4096, num_cpus=0).remote(
            engines, ranks if by_collective else None, devices, int(options.get("bucket_mb", 256)) << 20,
            float(r.get("weight_sync_timeout_s", 600)), transport)
        self.actors.append(self.router)

        # rollout workers: spread over the nodes, each with its share of the concurrent rollouts
        n_workers = r.rollout_actors
        slots = -(-cfg.trainer.num_workers // n_workers) + 1
        hosts = list(r.docker_hosts or [])
        rollout_cls = ray.remote(RolloutActor)
        workers = []
        for i in range(n_workers):
            env = {"DOCKER_HOST": hosts[i % len(hosts)]} if hosts else {}
            workers.append(rollout_cls.options(
                name=f"rollouts-{i}", max_restarts=-1, max_concurrency=slots + 2, num_cpus=r.rollout_actor_cpus,
                scheduling_strategy="SPREAD", runtime_env={"env_vars": env} if env else None,
            ).remote(cfg_dict, model_path, self.router, i, slots))
        self.actors += workers
        self.workers = workers
        ray.get([e.ready.remote() for e in engines], timeout=READY_TIMEOUT_S)
        nodes = ray.get([w.node.remote() for w in workers], timeout=READY_TIMEOUT_S)
        self.worker_nodes = [node_id for node_id, _ in nodes]
        console.print(f"ray: rollout workers on {len(set(self.worker_nodes))} node(s) "
                      f"({', '.join(sorted({f'{ip} {node_id[:8]}' for node_id, ip in nodes}))})")
        self.engine = RayEngine(self.router, self.learner if by_collective else None, sleep_during_step=bool(co))
        self.rollout = RayRollouts(workers)

    def _group(self, bundles: list[dict], strategy: str):
        pg = placement_group(bundles, strategy=strategy)
        ray.get(pg.ready(), timeout=READY_TIMEOUT_S)
        self.groups.append(pg)
        return pg

    def close(self) -> None:
        """Workers close their pools (their containers go), engines their engine processes, then
        every actor and placement group goes."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        closing = [a.close.remote() for a in getattr(self, "workers", []) + getattr(self, "engines", [])]
        for ref in closing:
            try:
                ray.get(ref, timeout=120)
            except Exception as e:
                log.warning("an actor did not close cleanly: %s", e)
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
