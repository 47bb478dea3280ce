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
  (data parallel, or the Megatron learner's layout). Weights for the engines leave rank 0 (all
  ranks gather them for Megatron) by Ray's object store, not through this process.
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

    def __init__(self, engines: list):
        self.engines = engines
        self.balancer = Balancer(len(engines))
        self.latest: tuple[list, int] | None = None  # ([weights ref], version) for restarted replicas
        self.version = 0
        self.last_sync: dict[str, float] = {}
        self._revived = asyncio.Event()

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
            given = None
            while self.latest is not None and self.latest[1] != given:  # again if a sync passed it by meanwhile
                box, given = self.latest
                await engine.update_weights.remote(box[0], given)
            await engine.serve.remote()

        if not await _until_up(bring_up, f"engine replica {i}"):
            return
        self.balancer.restarts += 1
        self.balancer.up(i)
        self._revived.set()

    async def update_weights(self, box: list, version: int) -> None:
        """`box`: [an object ref of the (name, tensor) list], so each replica fetches it itself."""
        self.latest = (box, version)
        t0 = time.monotonic()
        live = [i for i, up in enumerate(self.balancer.alive) if up]
        results = await asyncio.gather(*[self.engines[i].update_weights.remote(box[0], version) for i in live],
                                       return_exceptions=True)
        for i, r in zip(live, results):
            if isinstance(r, BaseException):
                if not is_dead_engine(r):
                    raise r
                self._died(i, r)  # it gets these weights when it is back
        self.version = version
        syncs = [r for r in results if isinstance(r, dict)]
        self.last_sync = {"engine/sync_s": time.monotonic() - t0,
                          "engine/sync_bytes": float(sum(s.get("engine/sync_bytes", 0.0) for s in syncs))}

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
    what held-apart scoring samples from, what the metrics read."""

    def __init__(self, router):
        self.router = router
        self._load: dict[str, float] = {}

    @property
    def version(self) -> int:
        return ray.get(self.router.get_version.remote())

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        return ray.get(self.router.generate.remote(current_session(), prompt_ids, sampling))

    def update_weights(self, weights, version: int) -> None:
        ref = weights.ref if isinstance(weights, RayWeights) else ray.put([(n, t.detach().cpu()) for n, t in weights])
        ray.get(self.router.update_weights.remote([ref], version))

    def metrics(self) -> dict[str, float]:
        return ray.get(self.router.metrics.remote())

    @property
    def busy_s(self) -> float:
        self._load = ray.get(self.router.load.remote())
        return self._load["busy_s"]

    @property
    def batch_size_mean(self) -> float:
        """As of the last `busy_s` read (the orchestrator reads both for one step's metrics)."""
        return self._load.get("batch_size_mean", 0.0)

    def close(self) -> None:
        """Nothing here: the cluster (`Cluster.close`) closes the engines."""


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

    def __init__(self, ref):
        self.ref = ref

    def fetch(self) -> list:
        return ray.get(self.ref)


class LearnerActor:
    """One learner rank. `setup` joins the group and builds the learner, as a torchrun rank would."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.learner = None

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

    def weights(self) -> list | None:
        tensors = [(n, t.detach().cpu()) for n, t in run_command(self.learner, self.world, "weights")]
        return [ray.put(tensors)] if self.rank == 0 else None

    def save(self, path: str) -> None:
        run_command(self.learner, self.world, "save", path)

    def load(self, path: str) -> None:
        run_command(self.learner, self.world, "load", path)


class RayLearnerGroup:
    """The learner interface in the driver over the rank actors: a step goes to every rank
    (each takes its rows); rank 0's metrics, version and weights stand for all."""

    def __init__(self, actors: list, collective: bool, layout: str | None):
        self.actors, self.collective, self.layout_summary = actors, collective, layout
        self._version = ray.get(actors[0].version.remote())

    @property
    def version(self) -> int:
        return self._version

    def step(self, trajectories, group_ids=None) -> dict:
        batch = ray.put(trajectories)  # once, not once per rank
        metrics = ray.get([a.step.remote(batch, group_ids) for a in self.actors])[0]
        self._version = ray.get(self.actors[0].version.remote())
        return metrics

    def _rank0_or_all(self):
        return self.actors if self.collective else self.actors[:1]

    def state_dict_for_engine(self) -> RayWeights:
        return RayWeights(ray.get([a.weights.remote() for a in self._rank0_or_all()])[0][0])

    def save(self, path) -> None:
        ray.get([a.save.remote(str(path)) for a in self._rank0_or_all()])

    def load(self, path) -> None:
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

    def rollout(self, source: str, task, seed: int):
        env, agent = self.sources[source]
        return rollout_and_grade(agent, task, env, self.pool, seed)

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
        gpus_needed = n_replicas * devices + n_ranks if gpu else 0
        if have.get("CPU", 0) < cpus_needed or have.get("GPU", 0) < gpus_needed:
            raise ClusterError(
                f"the cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs; this run asks for "
                f"{cpus_needed:g} CPUs ({n_replicas} engine replicas, {n_ranks} learner ranks, {r.rollout_actors} "
                f"rollout workers x ray.rollout_actor_cpus {r.rollout_actor_cpus:g})"
                + (f" and {gpus_needed} GPUs ({n_replicas} x {devices} for the engines, {n_ranks} for the learner)" if gpu else "")
                + ": add nodes, or lower engine.replicas, ray.learner_ranks or ray.rollout_actors")
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        # weights reach each replica through Ray's object store, on the host; from the replica's
        # actor into its engine they go by the inline backend, in buckets
        transfer = options.get("weight_transfer", "auto")
        if kind == "vllm" and transfer not in ("auto", "inline"):
            raise ClusterError(f"engine.options.weight_transfer={transfer}: under runtime=ray the weights reach each "
                             "replica through Ray's object store (inline); NCCL from the learner's GPUs straight to "
                             "the engines' is not built yet")
        if kind == "vllm":
            options = {**options, "weight_transfer": "inline"}
        try:
            placement = engine_placement(devices, gpu, options.get("distributed_executor_backend"))
        except ValueError as e:
            raise ClusterError(str(e)) from None
        if kind in ("vllm", "vllm_batch"):
            options = {**options, **placement.engine_options}
        console.print(f"ray: {len(ray.nodes())} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs, "
                      f"{ray.cluster_resources().get('GPU', 0):g} GPUs; {n_replicas} engine replica(s) x TP {tp}, "
                      f"{n_ranks} learner rank(s), {r.rollout_actors} rollout worker(s)")

        # engines: a placement group each (its GPUs on one node, `engine_placement`), restarted by
        # Ray if they die; vLLM's workers above one GPU are actors of their own in that group
        engine_cls = ray.remote(EngineActor)
        engines = []
        for i in range(n_replicas):
            pg = self._group(placement.bundles, placement.strategy)
            engines.append(engine_cls.options(
                name=f"engine-{i}", max_restarts=-1, max_concurrency=ENGINE_REQUESTS, **placement.actor,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
            ).remote(kind, model_path, options))
        self.actors += engines
        self.engines = engines
        self.router = ray.remote(RouterActor).options(name="router", max_concurrency=4096, num_cpus=0).remote(engines)
        self.actors.append(self.router)

        # learner ranks: one placement group, a bundle per rank
        pg = self._group([{"CPU": 1, **({"GPU": 1} if gpu else {})}] * n_ranks, "PACK")
        learner_cls = ray.remote(LearnerActor)
        ranks = [learner_cls.options(name=f"learner-{k}", num_cpus=1, num_gpus=1 if gpu else 0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k)
                                     ).remote(k, n_ranks) for k in range(n_ranks)]
        self.actors += ranks
        master = ray.get(ranks[0].address.remote())
        try:
            layout, collective = ray.get([a.setup.remote(cfg_dict, model_path, master) for a in ranks])[0]
        except ray.exceptions.RayTaskError as e:  # a LayoutError says which field, as in runtime=local
            raise (e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()) from None
        self.learner = RayLearnerGroup(ranks, collective, layout)

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
        self.engine = RayEngine(self.router)
        self.rollout = RayRollouts(workers)

    def _group(self, bundles: list[dict], strategy: str):
        pg = placement_group(bundles, strategy=strategy)
        ray.get(pg.ready(), timeout=READY_TIMEOUT_S)
        self.groups.append(pg)
        return pg

    def close(self) -> None:
        """Workers close their pools (their containers go), engines their engine processes, then
        every actor and placement group goes."""
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
