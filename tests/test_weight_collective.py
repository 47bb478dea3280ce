"""Weights by collective (agent/engines/collective.py) without an engine: the plan, and
learner ranks sending their shares over real gloo groups to receivers that stand for an engine
replica's workers (they receive and unpack as the worker side does). The end to end case, vLLM
engines under Ray with the Megatron learner's ranks, is in test_ray_runtime.py."""

import socket
import threading

import pytest
import torch

from agent.engines.collective import BucketSender, make_plan, meta_of, open_group, receive


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (50, 16), "a.w": (16, 16), "a.b": (16,), "b.w": (32, 16), "b.b": (7,), "head": (16, 50)}
    out = [(n, torch.randn(s, generator=g)) for n, s in shapes.items()]
    out.append(("half", torch.randn(3, generator=g).to(torch.bfloat16)))  # 6 bytes: the next tensor is misaligned
    out.append(("after", torch.randn(5, generator=g)))
    return out


def test_the_plan_holds_each_tensor_once_in_buckets_shared_out_by_bytes():
    w = weights()
    metas = [meta_of(n, t) for n, t in w]
    plan = make_plan(metas, ranks=3, bucket_bytes=1000)
    names = [n for b in plan for n in b["names"]]
    assert sorted(names) == sorted(n for n, _ in w)
    total = sum(t.numel() * t.element_size() for _, t in w)
    assert sum(b["nbytes"] for b in plan) == total
    per_rank = [sum(b["nbytes"] for b in plan if b["sender"] == r) for r in range(3)]
    largest = max(t.numel() * t.element_size() for _, t in w)
    assert max(per_rank) - min(per_rank) <= largest  # greedy by bytes: apart by at most one tensor
    for b in plan:  # a bucket closes at the first tensor that takes it to the bound
        sizes = [torch.Size(s).numel() * getattr(torch, d).itemsize for d, s in zip(b["dtype_names"], b["shapes"])]
        assert sum(sizes[:-1]) < 1000
    assert make_plan(metas, 3, 1000) == plan  # every rank makes the same one
    with pytest.raises(ValueError, match="at least one sending rank"):
        make_plan(metas, 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(senders, prefix, plan, results, key, stop_after=None):
    """One engine worker's side: a group per sender, every bucket in plan order."""
    groups = [open_group(host, port, prefix, 1, 2, 30) for host, port in senders]
    got = []
    buckets = plan if stop_after is None else plan[:stop_after]
    got += [(n, t.clone()) for _, tensors in receive(groups, buckets, "cpu") for n, t in tensors]
    groups.clear()  # (with stop_after: this replica goes away mid-sync)
    results[key] = got


def test_ranks_walking_a_collective_in_step_send_their_shares_to_two_replicas():
    """Two ranks whose walk over the weights is a collective (a barrier at every tensor, as the
    Megatron bridge's export is), each sending its buckets as the walk completes them, and two
    replicas receiving in plan order: nothing waits forever, each replica has every tensor
    exactly, each rank sent its share only and held one bucket at a time."""
    w = weights()
    plan = make_plan([meta_of(n, t) for n, t in w], ranks=2, bucket_bytes=600)
    senders = [BucketSender(k, "127.0.0.1", 30) for k in range(2)]
    addresses = [s.address for s in senders]
    results, sent = {}, {}
    step = threading.Barrier(2, timeout=30)

    def walk():
        for name, tensor in w:
            step.wait()  # the other rank is at the same tensor
            yield name, tensor

    def rank(k):
        for r in (0, 1):
            senders[k].open(r, f"replica{r}", 1)
        sent[k] = senders[k].send(walk(), plan, [0, 1])

    threads = [threading.Thread(target=worker, args=(addresses, f"replica{r}", plan, results, r)) for r in (0, 1)]
    threads += [threading.Thread(target=rank, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a sync by collective did not finish"
    for r in (0, 1):
        got = dict(results[r])
        assert sorted(got) == sorted(n for n, _ in w)
        assert all(torch.equal(got[n], t) for n, t in w)
    model = sum(t.numel() * t.element_size() for _, t in w)
    assert sent[0]["sent_bytes"] + sent[1]["sent_bytes"] == 2 * model
    for k in (0, 1):
        assert 0 < sent[k]["sent_bytes"] < 2 * model and sent[k]["held_bytes"] < model / 2 and not sent[k]["failed"]


def test_a_replica_gone_mid_sync_is_reported_and_the_other_still_gets_every_tensor():
    w = weights(1)
    plan = make_plan([meta_of(n, t) for n, t in w], ranks=1, bucket_bytes=300)
    assert len(plan) >= 4
    sender = BucketSender(0, "127.0.0.1", 10)
    results, sent = {}, {}

    def rank():
        sender.open(0, "a", 1)
        sender.open(1, "b", 1)
        sent[0] = sender.send(iter(w), plan, [0, 1])

    threads = [threading.Thread(target=worker, args=([sender.address], "a", plan, results, 0)),
               threading.Thread(target=worker, args=([sender.address], "b", plan, results, 1), kwargs={"stop_after": 2}),
               threading.Thread(target=rank)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)
    assert set(sent[0]["failed"]) == {1} and 1 not in sender.groups
    assert sorted(dict(results[0])) == sorted(n for n, _ in w)


def test_a_stream_that_disagrees_with_the_plan_is_refused_by_name():
    w = weights()
    plan = make_plan([meta_of(n, t) for n, t in w], ranks=1)
    sender = BucketSender(0, "127.0.0.1", 5)
    with pytest.raises(ValueError, match="'extra'.*plan lacks"):
        sender.send(iter(w + [("extra", torch.zeros(2))]), plan, [])
    with pytest.raises(ValueError, match=r"a\.w: torch.float32 \[4, 4\] in the learner"):
        sender.send(iter([("a.w", torch.zeros(4, 4)) if n == "a.w" else (n, t) for n, t in w]), plan, [])
    with pytest.raises(ValueError, match="lack head"):
        sender.send(iter([(n, t) for n, t in w if n != "head"]), plan, [])
