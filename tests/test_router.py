"""The engine router: least outstanding requests, a rollout's turns on one replica, and a
replica that dies set aside, its request served elsewhere, and the replica rebuilt with the
latest weights. Engines here are stand-ins that block until told (unit test)."""

import threading
import time

import pytest
import torch

from agent.engines.base import Completion, SamplingParams, session
from agent.engines.router import Balancer, EngineRouter, NoReplicaLeft, ReplicaRestarted, is_dead_engine


class EngineDeadError(RuntimeError):
    """Named as vLLM's is: the router knows a dead engine by its error's name."""


class Replica:
    def __init__(self, name, die=False):
        self.name, self.version, self.die, self.calls, self.weights = name, 0, die, 0, None
        self.gate = threading.Event()
        self.gate.set()

    def generate(self, prompt_ids, sampling):
        self.calls += 1
        if self.die:
            raise EngineDeadError(f"{self.name} is gone")
        self.gate.wait(10)
        return Completion([len(prompt_ids)], [-0.5], "length")

    def update_weights(self, named_tensors, version):
        self.weights, self.version = list(named_tensors), version


def test_balancer_least_outstanding_then_sticky():
    b = Balancer(3)
    first = [b.pick(f"s{i}") for i in range(3)]
    assert sorted(first) == [0, 1, 2]  # one each while all are busy
    b.done(first[1])
    assert b.pick("s9") == first[1]  # the least loaded
    assert b.pick("s0") == first[0] and b.sticky_hits == 1  # a session's next turn stays
    b.down(first[0])
    assert b.pick("s0") != first[0]  # unless its replica is down


def test_concurrent_rollouts_spread_over_replicas():
    replicas = [Replica("a"), Replica("b")]
    for r in replicas:
        r.gate.clear()
    router = EngineRouter(replicas)

    def rollout(i):
        with session(f"rollout-{i}"):
            router.generate([1, 2, 3], SamplingParams())

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while sum(router.balancer.outstanding) < 4:
        time.sleep(0.01)
    assert router.balancer.outstanding == [2, 2]
    for r in replicas:
        r.gate.set()
    for t in threads:
        t.join()
    m = router.metrics()
    assert m["engine/replica0/requests"] == m["engine/replica1/requests"] == 2


def test_a_dead_replica_is_replaced_and_its_request_served_elsewhere():
    dead, live = Replica("dead", die=True), Replica("live")
    rebuilt, may_restart = [], threading.Event()

    def restart(i):
        may_restart.wait(10)  # not before the retried request is served (else it could go to the new one)
        rebuilt.append(Replica(f"new{i}"))
        return rebuilt[-1]

    router = EngineRouter([dead, live], restart=restart)
    router.update_weights([("w", torch.ones(2))], version=4)
    with session("r1"):
        c = router.generate([1, 2], SamplingParams())  # first to the dead one (ties go low), then retried
    assert c.token_ids == [2] and dead.calls == 1 and live.calls == 1 and router.balancer.retried == 1
    may_restart.set()
    for _ in range(500):
        if router.balancer.restarts:
            break
        time.sleep(0.01)
    assert router.balancer.restarts == 1 and router.replicas[0] is rebuilt[0]
    assert rebuilt[0].version == 4 and rebuilt[0].weights[0][0] == "w"  # the latest weights, not the first
    assert router.version == 4 and router.metrics()["engine/replicas_alive"] == 2


def test_no_replica_left_is_an_error_not_a_hang():
    router = EngineRouter([Replica("x", die=True)], restart=None)
    with pytest.raises(NoReplicaLeft):
        router.generate([1], SamplingParams())


def test_an_ordinary_error_is_the_caller_s():
    class Broken(Replica):
        def generate(self, prompt_ids, sampling):
            raise ValueError("prompt too long")

    router = EngineRouter([Broken("b"), Replica("ok")])
    with pytest.raises(ValueError, match="too long"):
        router.generate([1], SamplingParams())
    assert all(router.balancer.alive)


def test_dead_engine_errors_as_the_ray_router_receives_them():
    """A replica Ray restarted unnoticed refuses requests (ReplicaRestarted); wrapped by Ray as
    its caller gets it, the router takes it as a dead replica, and an ordinary error as the caller's."""
    from ray.exceptions import RayTaskError

    assert is_dead_engine(RayTaskError("generate", "tb", ReplicaRestarted("restarted")).as_instanceof_cause())
    assert not is_dead_engine(RayTaskError("generate", "tb", ValueError("bad prompt")).as_instanceof_cause())


# ---- runtime=ray's router actor with weights by collective (its bookkeeping; stand-in actors) ----

class _Method:
    """`handle.method.remote(...)` as the router awaits it: here a coroutine on the stand-in."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)
        return call()


class _Handle:
    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        return _Method(getattr(self._obj, name))


class _Rank:
    def __init__(self, k):
        self.k, self.opened, self.sends, self.plans = k, [], [], 0

    def weight_sender(self, timeout_s, transport):
        return ("127.0.0.1", 1000 + self.k)

    def weight_plan(self, bucket_bytes):
        self.plans += 1
        return [{"sender": 0, "names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "nbytes": 8},
                {"sender": 1, "names": ["v"], "dtype_names": ["float32"], "shapes": [[2]], "nbytes": 8}]

    def open_weight_group(self, replica, prefix, workers):
        self.opened.append(prefix)

    def send_weights(self, plan, replicas):
        self.sends.append(list(replicas))
        return {"sent_bytes": 8 * len(replicas), "held_bytes": 8, "failed": {}, "seconds": 0.01}


class _Engine:
    def __init__(self):
        self.joined, self.received, self.served, self.fail_next, self.naps = [], [], 0, False, []

    def node_address(self):
        return "127.0.0.1"

    def join_collective(self, info):
        assert info["host"] == "127.0.0.1" and info["transport"] == "gloo"
        self.joined.append(info["prefix"])

    def receive_collective(self, plan, version):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("half loaded")
        self.received.append(version)
        return {}

    def serve(self):
        self.served += 1

    def sleep(self):
        self.naps.append("sleep")

    def wake_up(self):
        self.naps.append("wake_up")


def test_the_ray_router_syncs_by_collective_and_brings_a_failed_replica_back_at_the_next_sync():
    import asyncio

    ray_runtime = pytest.importorskip("training.runtime.ray")
    engines, ranks = [_Engine(), _Engine()], [_Rank(0), _Rank(1)]

    async def scenario():
        router = ray_runtime.RouterActor([_Handle(e) for e in engines], [_Handle(r) for r in ranks], workers=1)
        await router.sync_collective(1)
        assert [e.joined for e in engines] == [["replica0/join1"], ["replica1/join1"]]
        assert [r.opened for r in ranks] == [["replica0/join1", "replica1/join1"]] * 2
        assert router.version == 1 and router.last_sync["engine/sync_bytes"] == 2 * 16
        assert router.last_sync["engine/sync/rank1_bytes"] == 16
        engines[1].fail_next = True  # its receive fails: its engine was restarted, it waits for weights
        await router.sync_collective(2)
        assert router.balancer.alive == [True, False] and router.pending == {1}
        assert await router.pending_replicas() == [1]
        await router.sync_collective(2, [1])  # the driver's thread: the current weights, to it alone
        assert engines[1].joined == ["replica1/join1", "replica1/join2"] and engines[1].received == [1, 2]
        assert router.balancer.alive == [True, True] and not router.pending and engines[1].served == 1
        assert ranks[0].sends[-1] == [1] and ranks[0].plans == 1  # one plan for the run
        await router.sleep()
        await router.wake_up()
        assert engines[0].naps == engines[1].naps == ["sleep", "wake_up"]

    asyncio.run(scenario())
