"""runtime=ray's engine replica layout (`training.runtime.ray.engine_placement`) against vLLM
0.32's own placement code, without a Ray cluster and without GPUs.

Inside a Ray actor vLLM takes the actor's placement group (engine/arg_utils.py: `is_in_ray_actor`
-> `get_current_placement_group()`), and with a world size above one and a placement group its
ParallelConfig picks the Ray executor by itself. The Ray executor (v1/executor/ray_utils.py
`initialize_ray_cluster`) then checks that group:

    for bundle in bundles:
        bundle_devices = bundle.get(device_str, 0)
        if bundle_devices > 1:
            raise ValueError("Placement group bundle cannot have more than 1 GPU.")
        ...
    if parallel_config.world_size > device_bundles: raise ValueError(...)

and RayExecutorV2 puts one worker actor (`num_cpus=0`, `num_gpus=VLLM_RAY_PER_WORKER_GPUS`, 1)
on each GPU bundle, in bundle order on one node (`get_bundles_sorted_by_node`). These tests call
those functions themselves, with a CUDA-like platform in place of this machine's CPU one (vLLM's
CPU platform has no Ray executor at all) and Ray's cluster queries answered for one node.
What only GPUs show (the workers starting, weights reaching them, a replica's restart) is for a
GPU machine.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="runtime=ray needs Ray: pip install -e '.[ray]'")
pytest.importorskip("vllm", reason="the layout is checked against vLLM's own code")

from ray._raylet import PlacementGroupID  # noqa: E402
from ray.util.placement_group import PlacementGroup  # noqa: E402

from training.runtime.ray import EnginePlacement, engine_placement  # noqa: E402

NODE = "node-a"


class CudaLikePlatform:
    """What vLLM's Ray code reads of `current_platform` on CUDA (platforms/cuda.py)."""

    ray_device_key = "GPU"
    device_name = "cuda"

    def is_cuda(self) -> bool:
        return False  # skips the up-front torch device count, which this machine has none of

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False


def group(bundles: list[dict]) -> PlacementGroup:
    """A placement group object as a Ray actor's `get_current_placement_group()` gives it, its
    bundles known without asking a cluster."""
    return PlacementGroup(PlacementGroupID.from_random(), bundle_cache=[dict(b) for b in bundles])


@pytest.fixture
def vllm_on_one_gpu_node(monkeypatch):
    """vLLM's Ray executor code as on a CUDA node of a running cluster: every bundle on NODE,
    the engine (the executor's driver) on NODE too."""
    import vllm.platforms
    from vllm.v1.executor import ray_executor_v2, ray_utils

    platform = CudaLikePlatform()
    monkeypatch.setattr(vllm.platforms, "current_platform", platform, raising=False)
    monkeypatch.setattr(ray_utils, "current_platform", platform)
    monkeypatch.setattr(ray_executor_v2, "current_platform", platform)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # initialize_ray_cluster sets it
    monkeypatch.delenv("VLLM_RAY_PER_WORKER_GPUS", raising=False)
    monkeypatch.delenv("VLLM_RAY_BUNDLE_INDICES", raising=False)

    class Context:
        def get_node_id(self):
            return NODE

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": NODE, "NodeManagerAddress": "10.0.0.1", "Alive": True}])
    monkeypatch.setattr(ray_utils, "placement_group_table", lambda pg: {
        "bundles": dict(enumerate(pg.bundle_specs)),
        "bundles_to_node_id": {i: NODE for i in range(len(pg.bundle_specs))}})
    return ray_utils, ray_executor_v2


def parallel_config(tp: int, pg: PlacementGroup, engine_options: dict):
    """The ParallelConfig vLLM builds inside the engine's actor: the actor's placement group
    and the engine args our layout adds."""
    from vllm.config import ParallelConfig

    return ParallelConfig(tensor_parallel_size=tp, placement_group=pg, **engine_options)


def fits(bundle: dict, *demands: dict) -> bool:
    total: dict[str, float] = {}
    for d in demands:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return all(v <= bundle.get(k, 0) for k, v in total.items() if v)


def demand(actor_options: dict) -> dict:
    return {"CPU": actor_options.get("num_cpus", 0), "GPU": actor_options.get("num_gpus", 0),
            **actor_options.get("resources", {})}


# ---- CPU: as before ----

def test_without_gpus_a_replica_is_one_cpu_bundle_as_before():
    p = engine_placement(1, gpu=False)
    assert p == EnginePlacement([{"CPU": 1}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": 0}, {})


def test_without_gpus_tensor_parallel_takes_vllms_multiprocessing_not_its_ray_executor():
    """On CPU vLLM has no Ray executor ('does not support ray'), yet in a placement group it
    would pick it for a world size above one: the layout says mp."""
    from vllm.config import ParallelConfig

    p = engine_placement(2, gpu=False)
    assert p.bundles == [{"CPU": 1}] and p.actor == {"num_cpus": 1, "num_gpus": 0}
    pg = group(p.bundles)
    assert ParallelConfig(tensor_parallel_size=2, placement_group=pg).distributed_executor_backend == "ray"
    assert parallel_config(2, pg, p.engine_options).distributed_executor_backend == "mp"


# ---- GPUs ----

def test_one_gpu_the_actor_holds_it_and_vllm_runs_in_process():
    p = engine_placement(1, gpu=True)
    assert p == EnginePlacement([{"CPU": 1, "GPU": 1}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": 1}, {})
    assert parallel_config(1, group(p.bundles), p.engine_options).distributed_executor_backend == "uni"


@pytest.mark.parametrize("tp", [2, 4])
def test_the_old_layout_is_what_vllm_refuses(tp, vllm_on_one_gpu_node):
    """The finding: one bundle {"CPU": 1, "GPU": tp}, and vLLM's own choice of executor in it."""
    ray_utils, _ = vllm_on_one_gpu_node
    pc = parallel_config(tp, group([{"CPU": 1, "GPU": tp}]), {})
    assert pc.distributed_executor_backend == "ray"  # chosen by vLLM: the actor is in a placement group
    with pytest.raises(ValueError, match="cannot have more than 1 GPU"):
        ray_utils.initialize_ray_cluster(pc, require_gpu_on_driver=False)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_gets_a_bundle_per_gpu_that_vllms_ray_executor_accepts(tp, vllm_on_one_gpu_node):
    ray_utils, ray_executor_v2 = vllm_on_one_gpu_node
    p = engine_placement(tp, gpu=True)
    assert p.strategy == "STRICT_PACK"  # tensor parallel within one node
    assert len(p.bundles) == tp and all(b["GPU"] == 1 for b in p.bundles)
    assert p.engine_options == {"distributed_executor_backend": "ray"}
    pg = group(p.bundles)
    pc = parallel_config(tp, pg, p.engine_options)
    assert pc.distributed_executor_backend == "ray" and pc.world_size == tp
    for driver_gpu in (False, True):  # RayExecutorV2, and the older RayDistributedExecutor's stricter call
        ray_utils.initialize_ray_cluster(pc, require_gpu_on_driver=driver_gpu)  # raises on a layout it refuses
        assert pc.placement_group is pg  # the replica's own group, no other made

    # the workers: rank k on bundle k, each taking one GPU and no CPU beside the engine's actor
    assigned = ray_utils.get_bundles_sorted_by_node(pg)
    assert [b for b, _, _ in assigned] == list(range(tp))
    worker = {"num_cpus": 0, **ray_executor_v2.RayExecutorV2._get_actor_resource_kwargs()}
    assert worker == {"num_cpus": 0, "num_gpus": 1.0}
    assert fits(p.bundles[0], demand(p.actor), demand(worker))
    assert all(fits(b, demand(worker)) for b in p.bundles[1:])
    assert not fits(p.bundles[0], {"GPU": 1}, demand(worker))  # why the actor holds no GPU of bundle 0
    # the run's CPU count is unchanged: one a replica, on its actor
    assert sum(b.get("CPU", 0) for b in p.bundles) == p.actor["num_cpus"] == 1


def test_pipeline_parallel_counts_its_gpus_too(vllm_on_one_gpu_node):
    ray_utils, _ = vllm_on_one_gpu_node
    from vllm.config import ParallelConfig

    p = engine_placement(2 * 2, gpu=True)
    pc = ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2, placement_group=group(p.bundles),
                        **p.engine_options)
    ray_utils.initialize_ray_cluster(pc, require_gpu_on_driver=False)


def test_multiprocessing_instead_keeps_one_bundle_the_actor_holds():
    """engine.options.distributed_executor_backend=mp: the actor holds all the replica's GPUs
    (Ray sets its CUDA_VISIBLE_DEVICES to them) and vLLM's workers are its child processes."""
    p = engine_placement(4, gpu=True, backend="mp")
    assert p == EnginePlacement([{"CPU": 1, "GPU": 4}], "STRICT_PACK", {"num_cpus": 1, "num_gpus": 4},
                                {"distributed_executor_backend": "mp"})
    assert parallel_config(4, group(p.bundles), p.engine_options).distributed_executor_backend == "mp"


def test_an_executor_that_cannot_span_the_gpus_is_refused():
    with pytest.raises(ValueError, match="choose ray .* or mp"):
        engine_placement(2, gpu=True, backend="uni")
    with pytest.raises(ValueError, match="at least one device"):
        engine_placement(0, gpu=True)
