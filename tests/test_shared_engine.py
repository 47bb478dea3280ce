"""The shared engine: concurrent requests batched while the engine is busy, each answered
with its own result, errors reaching every waiter, weight updates between batches."""

import threading
import time

import pytest

from agent.engines.base import Completion, SamplingParams
from agent.engines.shared import SharedEngine


class Echo:
    """A scripted engine (unit test only): answers prompt p with [p[0] + 1], slowly."""

    version = 0

    def __init__(self, fail_on=None):
        self.batch_sizes = []
        self.fail_on = fail_on

    def generate(self, prompt_ids, sampling):
        return self.generate_batch([(prompt_ids, sampling)])[0]

    def generate_batch(self, requests):
        self.batch_sizes.append(len(requests))
        time.sleep(0.05)
        if any(p[0] == self.fail_on for p, _ in requests):
            raise RuntimeError("engine died")
        return [Completion([p[0] + 1], [-0.5], "stop") for p, _ in requests]

    def update_weights(self, named_tensors, version):
        self.version = version


def call_all(shared, prompts):
    results, errors = {}, {}

    def one(p):
        try:
            results[p] = shared.generate([p], SamplingParams())
        except RuntimeError as e:
            errors[p] = e

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results, errors


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer():
    echo = Echo()
    shared = SharedEngine(echo)
    results, errors = call_all(shared, list(range(10, 26)))
    assert not errors and {p: c.token_ids for p, c in results.items()} == {p: [p + 1] for p in range(10, 26)}
    # the first request runs alone; the rest queue behind it and go in (much) fewer batches
    assert sum(echo.batch_sizes) == 16 and len(echo.batch_sizes) < 16 and max(echo.batch_sizes) > 1
    assert shared.requests == 16 and shared.batches == len(echo.batch_sizes) and shared.busy_s > 0


class Serial:
    """A scripted engine with no `generate_batch` (as hf): counts calls running at once."""

    version = 0

    def __init__(self):
        self.running = self.most = 0

    def generate(self, prompt_ids, sampling):
        self.running += 1
        self.most = max(self.most, self.running)
        time.sleep(0.02)
        self.running -= 1
        return Completion([prompt_ids[0] + 1], [-0.5], "stop")


def test_an_engine_without_batching_serves_one_at_a_time():
    serial = Serial()
    shared = SharedEngine(serial)
    results, _ = call_all(shared, list(range(6)))
    assert {p: c.token_ids for p, c in results.items()} == {p: [p + 1] for p in range(6)}
    assert serial.most == 1 and shared.requests == 6


def test_an_engine_error_reaches_every_request_of_its_batch():
    echo = Echo(fail_on=3)
    shared = SharedEngine(echo)
    results, errors = call_all(shared, list(range(8)))
    assert 3 in errors and set(results) | set(errors) == set(range(8))
    assert all(str(e) == "engine died" for e in errors.values())


def test_weight_updates_wait_for_the_running_batch():
    echo = Echo()
    shared = SharedEngine(echo)
    t = threading.Thread(target=shared.generate, args=([1], SamplingParams()))
    t.start()
    time.sleep(0.01)
    shared.update_weights([], version=3)  # blocks until the 50 ms batch is done
    assert not t.is_alive() or t.join(timeout=5) is None
    assert shared.version == 3


@pytest.mark.parametrize("n", [1, 3])
def test_batch_size_bound(n):
    echo = Echo()
    shared = SharedEngine(echo, max_batch=n)
    call_all(shared, list(range(9)))
    assert max(echo.batch_sizes) <= n


def test_without_batching_an_error_is_only_its_own_requests():
    class Picky(Serial):
        def generate(self, prompt_ids, sampling):
            if prompt_ids[0] == 2:
                raise RuntimeError("bad prompt")
            return super().generate(prompt_ids, sampling)

    results, errors = call_all(SharedEngine(Picky()), list(range(6)))
    assert set(errors) == {2} and set(results) == {0, 1, 3, 4, 5}
