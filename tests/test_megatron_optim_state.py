"""The Megatron learner's Adam state under each Adam megatron-core 0.16 may pick
(megatron/core/optimizer/__init__.py: Transformer Engine's FusedAdam when TE imports, else Apex's,
else torch's Adam/AdamW): `_fresh_adam_state` (never-stepped parameters, as the policy in the
critic's warm-up), `_adam_step` and `_set_adam_step` (save, load), in training/learners/megatron.py.

Where each keeps what:
- torch Adam/AdamW: per parameter, {step (0-dim tensor), exp_avg, exp_avg_sq};
- Apex FusedAdam (apex/optimizers/fused_adam.py at NVIDIA/apex 6424da3, lines 180-210): the
  step count in param_group["step"], made by the first step; per parameter {exp_avg, exp_avg_sq};
  no state_dict override;
- TE FusedAdam (transformer_engine/pytorch/optimizers/fused_adam.py at tag v2.11, the newest TE
  megatron-core 0.16's extras allow (transformer-engine>=2.9,<2.12; v2.9 and v2.10 have the same
  code here, a line earlier): the step in param_group["step"] (lines 498-505); per parameter {exp_avg,
  exp_avg_sq} (+ master_param with master weights), made by `initialize_state(param,
  store_param_remainders)` (402-419); `state_dict` (421-443) and `load_state_dict` (445-474)
  pass every state key through `name_to_dtype_map` (192-196: those three keys only), so a
  per-parameter "step" is `KeyError: 'step'` at save and at load.

TE and Apex need CUDA and are not installed here: `FakeTEFusedAdam` and `FakeApexFusedAdam` are
CPU stand-ins written for these tests that behave as those files do in what matters here (where
the step lives, the state keys a first step makes, TE's key-by-key dtype table in state_dict and
load_state_dict; the update itself is plain Adam(W) in torch ops). torch's Adam runs for real.

The unit tests run the project's functions on each optimizer directly; the last test runs the
learner itself (real megatron-core on CPU, one process, gloo) through a checkpoint saved in the
critic's warm-up and one saved after, with megatron's optimizer factory given each of the three
(the fakes in place of TE's and Apex's), with and without megatron's distributed optimizer: one
worker process runs every case, each with fresh learners (megatron-core is imported once).

    python tests/test_megatron_optim_state.py KIND:0|1[,KIND:0|1 ...] MODEL OUT_DIR   # that test's worker
"""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from itertools import chain
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from training.learners.megatron import (  # noqa: E402
    _adam_step, _fresh_adam_state, _keep_torch_step, _set_adam_step)


# -- CPU stand-ins for the fused Adams ----------------------------------------------------------
class _GroupStepAdam(torch.optim.Optimizer):
    """Adam(W) whose step count lives in each param group (as both fused Adams keep it: an int
    made by a group's first step, +1 each step; groups without parameters are skipped)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 bias_correction=True, adam_w_mode=True):
        assert not amsgrad
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      bias_correction=bias_correction))
        self.adam_w_mode = adam_w_mode

    def _init_param_state(self, p):
        raise NotImplementedError

    def _moments(self, p):
        return self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if not group["params"]:
                continue
            group["step"] = group["step"] + 1 if "step" in group else 1
            t, (b1, b2) = group["step"], group["betas"]
            for p in group["params"]:
                if not self.state[p]:
                    self._init_param_state(p)
                if p.grad is None:
                    continue
                g = p.grad.float()
                m, v = self._moments(p)
                if group["weight_decay"]:
                    if self.adam_w_mode:
                        p.mul_(1 - group["lr"] * group["weight_decay"])
                    else:
                        g = g + group["weight_decay"] * p
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if group["bias_correction"] else (1.0, 1.0)
                p.addcdiv_(m, (v / c2).sqrt().add_(group["eps"]), value=-group["lr"] / c1)
        return loss


class FakeApexFusedAdam(_GroupStepAdam):
    """Apex's FusedAdam as far as these tests look: its first step makes fp32 exp_avg and
    exp_avg_sq for a parameter with a gradient; torch's state_dict and load_state_dict."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:  # Apex makes state only for parameters with a gradient
            for p in group["params"]:
                if p.grad is not None and not self.state[p]:
                    self.state[p].update(exp_avg=torch.zeros_like(p).float(), exp_avg_sq=torch.zeros_like(p).float())
        return super().step(closure)


class FakeTEFusedAdam(_GroupStepAdam):
    """TE's FusedAdam as far as these tests look (see the module docstring): state made by
    `initialize_state`, every state key looked up in a dtype table in `state_dict` and
    `load_state_dict`, master weights optional. Only fp32 states here (no scaling)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 bias_correction=True, adam_w_mode=True, master_weights=False, master_weight_dtype=torch.float32,
                 exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32, store_param_remainders=False,
                 use_decoupled_grad=False, capturable=False):
        assert not capturable and not use_decoupled_grad and not store_param_remainders
        assert torch.float32 == master_weight_dtype == exp_avg_dtype == exp_avg_sq_dtype
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, bias_correction=bias_correction,
                         adam_w_mode=adam_w_mode)
        self.master_weights = master_weights
        self.store_param_remainders = False
        self.name_to_dtype_map = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype,
                                  "master_param": master_weight_dtype}

    def initialize_state(self, param, store_param_remainders):
        assert not store_param_remainders
        for name in ("exp_avg", "exp_avg_sq"):
            self.state[param][name] = torch.zeros(param.shape, dtype=self.name_to_dtype_map[name])
        if self.master_weights:
            self.state[param]["master_param"] = param.detach().clone().to(self.name_to_dtype_map["master_param"])

    def _init_param_state(self, p):
        self.initialize_state(p, False)

    def get_unscaled_state(self, param, name):
        dtype = self.name_to_dtype_map[name]  # TE: KeyError for a key not in its table
        assert self.state[param][name].dtype == dtype
        return self.state[param][name]

    def set_scaled_state(self, param, name, value):
        assert value.dtype == torch.float32
        dtype = self.name_to_dtype_map[name]  # TE: KeyError for a key not in its table
        if name not in self.state[param]:
            self.state[param][name] = torch.empty(param.shape, dtype=dtype)
        self.state[param][name].copy_(value)

    def _params_by_id(self, saved_groups):
        return dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                        chain.from_iterable(g["params"] for g in self.param_groups)))

    def state_dict(self):
        sd = super().state_dict()
        by_id = self._params_by_id(sd["param_groups"])
        sd["state"] = {k: {name: self.get_unscaled_state(by_id[k], name) for name in v} if k in by_id else v
                       for k, v in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        by_id = self._params_by_id(state_dict["param_groups"])
        for k, v in state_dict["state"].items():
            if k in by_id:
                param = by_id[k]
                self.state[param] = {}
                for name, value in v.items():
                    if value is not None:
                        self.set_scaled_state(param, name, value.float())

    def _moments(self, p):
        return self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"]


# -- the optimizers under test ------------------------------------------------------------------
KINDS = ("torch-adam", "torch-adamw", "apex", "te", "te-master")


def make(kind: str, params):
    groups = [{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "weight_decay": 0.0}]
    if kind == "torch-adam":
        inner = torch.optim.Adam(groups, lr=1e-2)
    elif kind == "torch-adamw":
        inner = torch.optim.AdamW(groups, lr=1e-2)
    elif kind == "apex":
        inner = FakeApexFusedAdam(groups, lr=1e-2)
    else:
        inner = FakeTEFusedAdam(groups, lr=1e-2, master_weights=kind == "te-master")
    return SimpleNamespace(optimizer=inner)  # megatron's wrapper: `.optimizer` is the torch one


def params(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((4, 3), (3,), (2, 2), (5,))]


def grads(ps, seed: int):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def take_step(opt, seed: int):
    ps = [p for group in opt.optimizer.param_groups for p in group["params"]]
    grads(ps, seed)
    opt.optimizer.step()


def expected_keys(kind: str) -> set[str]:
    return {"torch-adam": {"step", "exp_avg", "exp_avg_sq"}, "torch-adamw": {"step", "exp_avg", "exp_avg_sq"},
            "apex": {"exp_avg", "exp_avg_sq"}, "te": {"exp_avg", "exp_avg_sq"},
            "te-master": {"exp_avg", "exp_avg_sq", "master_param"}}[kind]


def same_state(a, b) -> None:
    pa = [p for g in a.optimizer.param_groups for p in g["params"]]
    pb = [p for g in b.optimizer.param_groups for p in g["params"]]
    for x, y in zip(pa, pb):
        assert torch.equal(x, y)
        sa, sb = a.optimizer.state[x], b.optimizer.state[y]
        assert set(sa) == set(sb)
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), k
    for ga, gb in zip(a.optimizer.param_groups, b.optimizer.param_groups):
        assert ga.get("step") == gb.get("step")


# -- the fakes reproduce what they stand for ----------------------------------------------------
def test_fake_te_refuses_a_per_parameter_step_as_te_does():
    """The reported failure: a per-parameter "step" (what the project put in every empty state)
    is a KeyError in TE's state_dict and load_state_dict."""
    opt = make("te", params())
    take_step(opt, 1)
    first = opt.optimizer.param_groups[0]
    assert first["step"] == 1 and "step" not in opt.optimizer.state[first["params"][0]]
    good = opt.optimizer.state_dict()
    for st in opt.optimizer.state.values():
        st["step"] = torch.tensor(1.0)
    with pytest.raises(KeyError, match="step"):
        opt.optimizer.state_dict()
    bad = copy.deepcopy(good)
    for st in bad["state"].values():
        st["step"] = torch.tensor(1.0)
    with pytest.raises(KeyError, match="step"):
        make("te", params()).optimizer.load_state_dict(bad)


@pytest.mark.parametrize("kind", KINDS)
def test_first_step_makes_the_keys_named(kind):
    opt = make(kind, params())
    take_step(opt, 1)
    for st in opt.optimizer.state.values():
        assert set(st) == expected_keys(kind)
    group_step = {g.get("step") for g in opt.optimizer.param_groups}
    assert group_step == ({None} if kind.startswith("torch") else {1})


# -- the project's functions --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_fresh_state_is_what_a_first_step_starts_from(kind):
    fresh, new = make(kind, params()), make(kind, params())
    _fresh_adam_state(fresh)
    for st in fresh.optimizer.state.values():
        assert set(st) == expected_keys(kind)
    assert all("step" not in g for g in fresh.optimizer.param_groups)  # the fused Adams' count: none yet
    assert _adam_step(fresh) == 0.0
    fresh.optimizer.state_dict()  # TE's dtype table takes every key
    before = copy.deepcopy(fresh.optimizer.state)
    _fresh_adam_state(fresh)  # a second call leaves made state alone
    assert all(set(before[k]) == set(v) for k, v in zip(before, fresh.optimizer.state.values()))
    for seed in (1, 2):  # the same two steps as an optimizer that never had the state made
        take_step(fresh, seed)
        take_step(new, seed)
    same_state(fresh, new)
    assert _adam_step(fresh) == _adam_step(new) == 2.0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("steps", [0, 3])
def test_save_and_load_round_trip(kind, steps):
    """save: `_fresh_adam_state`, the optimizer's own state_dict, `_adam_step`; load into a new
    optimizer: `_fresh_adam_state`, its load_state_dict, the step count as megatron's torch path
    leaves it (per-parameter steps back at 0, one tensor shared; or absent), `_set_adam_step`.
    Then the saver's and the loader's next steps are the same."""
    saver = make(kind, params())
    for seed in range(steps):
        take_step(saver, seed)
    _fresh_adam_state(saver)
    buf = io.BytesIO()
    torch.save({"optimizer": saver.optimizer.state_dict(), "adam_step": _adam_step(saver)}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    assert saved["adam_step"] == float(steps)
    for st in saved["optimizer"]["state"].values():
        assert set(st) == expected_keys(kind)

    loader = make(kind, [torch.nn.Parameter(p.detach().clone()) for g in saver.optimizer.param_groups
                         for p in g["params"]])
    _fresh_adam_state(loader)
    loader.optimizer.load_state_dict(saved["optimizer"])
    if kind.startswith("torch"):
        shared = torch.tensor(0.0)  # megatron's dp_reshardable load: the pre-load step, one tensor
        for st in loader.optimizer.state.values():
            st["step"] = shared
    _set_adam_step(loader, saved["adam_step"])
    assert _adam_step(loader) == float(steps)
    if kind.startswith("torch"):  # each parameter its own step tensor
        assert len({id(st["step"]) for st in loader.optimizer.state.values()}) == len(loader.optimizer.state)
    same_state(saver, loader)
    for seed in (10, 11):
        take_step(saver, seed)
        take_step(loader, seed)
    same_state(saver, loader)
    assert _adam_step(loader) == float(steps + 2)


@pytest.mark.parametrize("kind", KINDS)
def test_set_step_where_a_load_left_none(kind):
    """megatron's non-distributed load restores torch's step only when it was not 0: a state
    with moments and no step gets one; a fused Adam's group gets its count (none for 0)."""
    opt = make(kind, params())
    _fresh_adam_state(opt)
    for st in opt.optimizer.state.values():
        st.pop("step", None)
    _set_adam_step(opt, 0.0)
    assert _adam_step(opt) == 0.0
    for st in opt.optimizer.state.values():
        assert set(st) == expected_keys(kind)
    assert all("step" not in g for g in opt.optimizer.param_groups)
    _set_adam_step(opt, 5.0)
    assert _adam_step(opt) == 5.0
    take_step(opt, 1)
    assert _adam_step(opt) == 6.0


@pytest.mark.parametrize("nested", [False, True])
def test_non_distributed_load_of_a_never_stepped_torch_adam(nested):
    """megatron's non-distributed optimizers save torch's per-parameter step apart, as one
    `common_step`, and none at all when it is 0 (megatron/core/optimizer/optimizer.py, `if
    step:`); torch's load_state_dict then refuses the state (KeyError: 'step'). `_keep_torch_step`
    puts the saved count where megatron's load reads it (FP32Optimizer's dict; the bf16 wrapper's,
    nested under "optimizer"), and leaves the distributed optimizer's and the fused Adams' alone."""
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    saver = make("torch-adamw", params())
    _fresh_adam_state(saver)
    sd = copy.deepcopy(saver.optimizer.state_dict())  # torch's state_dict shares the state's dicts
    for st in sd["state"].values():
        st.pop("step")  # saved apart; 0: not saved
    loader = make("torch-adamw", params())
    with pytest.raises(KeyError, match="step"):
        loader.optimizer.load_state_dict(copy.deepcopy(sd))
    loaded = {"optimizer": sd, "fp32_from_fp16_params": []} if nested else sd
    _keep_torch_step(loader, loaded, 0.0)
    inner = loaded["optimizer"] if nested else loaded
    MegatronOptimizer._restore_common_per_param_step(inner, inner["state"].pop("common_step"))  # megatron's load
    loader.optimizer.load_state_dict(inner)
    _set_adam_step(loader, 0.0)
    for seed in (1, 2):
        take_step(saver, seed)
        take_step(loader, seed)
    same_state(saver, loader)

    distributed = {"optimizer": {"param_groups": [{"step": 3}]}, "param_state": {}}
    before = copy.deepcopy(distributed)
    _keep_torch_step(loader, distributed, 3.0)
    assert distributed == before
    te = make("te", params())
    _fresh_adam_state(te)
    te_sd = te.optimizer.state_dict()
    _keep_torch_step(te, te_sd, 0.0)
    assert "common_step" not in te_sd["state"]


def test_chained_optimizers_and_a_rank_without_parameters():
    te, torch_adam = make("te", params(0)), make("torch-adamw", params(1))
    chained = SimpleNamespace(chained_optimizers=[te, torch_adam, SimpleNamespace(optimizer=None)])
    _fresh_adam_state(chained)
    assert _adam_step(chained) == 0.0
    take_step(te, 1)
    take_step(torch_adam, 1)
    assert _adam_step(chained) == 1.0
    _set_adam_step(chained, 4.0)
    assert te.optimizer.param_groups[0]["step"] == 4 and _adam_step(chained) == 4.0
    te.optimizer.state_dict()


# -- the learner itself: real megatron-core on CPU ----------------------------------------------
_ORIGINAL: dict = {}


def _use_adam(kind: str) -> None:
    """Have megatron-core's optimizer factory build `kind`'s Adam, as it would have chosen with
    TE or Apex installed (megatron/core/optimizer/__init__.py, .../distrib_optimizer.py); "torch"
    puts back what megatron-core chose here."""
    import megatron.core.optimizer as mo
    import megatron.core.optimizer.distrib_optimizer as do

    names = (mo, "Adam"), (do, "Adam"), (mo, "USING_PYTORCH_OPTIMIZER"), (do, "HAVE_APEX_OR_TE"), \
        (do, "USING_TE_OPTIMIZER"), (do, "USING_APEX_OPTIMIZER")
    if not _ORIGINAL:
        _ORIGINAL.update({(m.__name__, n): getattr(m, n) for m, n in names})
    for m, n in names:
        setattr(m, n, _ORIGINAL[(m.__name__, n)])
    if kind == "torch":
        return
    mo.Adam = do.Adam = FakeTEFusedAdam if kind == "te" else FakeApexFusedAdam
    mo.USING_PYTORCH_OPTIMIZER = False
    do.HAVE_APEX_OR_TE, do.USING_TE_OPTIMIZER, do.USING_APEX_OPTIMIZER = True, kind == "te", kind == "apex"


def _worker(kind: str, distributed_optimizer: bool, model: str, out: str) -> None:
    """One process: a learner with SAO (one critic-only warm-up step, then critic and policy)
    saves at step 1 (the policy never stepped) and at step 2; learners loaded from each take the
    saver's next step."""
    from tests.megatron_batch import BATCH, GROUPS
    from training.algos import SAO
    from training.learners.megatron import MegatronLearner

    _use_adam(kind)

    def learner():
        return MegatronLearner(model, SAO(critic_warmup_steps=1, lr_policy=1e-3, lr_critic=1e-3),
                               distributed_optimizer=distributed_optimizer, micro_batch_tokens=64)

    def summary(lr, metrics):
        return {"metrics": metrics, "weights": {k: v.clone() for k, v in lr.state_dict_for_engine()},
                "adam": {n: _adam_step(m.optimizer) for n, m in lr._models()},
                "inner": type(lr.policy.optimizer.optimizer if not hasattr(lr.policy.optimizer, "chained_optimizers")
                              else lr.policy.optimizer.chained_optimizers[0].optimizer).__name__}

    ckpt = Path(out).parent
    saver = learner()
    saver.step(BATCH, GROUPS)
    saver.save(ckpt / "warmup")
    after_warmup = summary(saver, saver.step(BATCH, GROUPS))
    saver.save(ckpt / "trained")
    after_trained = summary(saver, saver.step(BATCH, GROUPS))
    result = {"saver": [after_warmup, after_trained], "resumed": []}
    for name in ("warmup", "trained"):
        resumed = learner()
        resumed.load(ckpt / name)
        loaded = {n: _adam_step(m.optimizer) for n, m in resumed._models()}
        result["resumed"].append({**summary(resumed, resumed.step(BATCH, GROUPS)), "loaded": loaded})
    torch.save(result, out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("megatron.core")
    pytest.importorskip("mbridge")
    from tests.megatron_batch import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("mcore-optim") / "qwen2", "qwen2"))


CASES = [("torch", True), ("torch", False), ("te", True), ("te", False), ("apex", True)]


@pytest.fixture(scope="module")
def worker_results(tiny, tmp_path_factory):
    """Every case in one worker process (megatron-core imported once): {case: its result}."""
    out = tmp_path_factory.mktemp("mcore-optim-cases")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases = ",".join(f"{kind}:{int(distributed)}" for kind, distributed in CASES)
    proc = subprocess.run([sys.executable, __file__, cases, tiny, str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return {case: torch.load(out / f"{case[0]}-{int(case[1])}" / "result.pt", weights_only=False) for case in CASES}


@pytest.mark.parametrize("kind,distributed_optimizer", CASES)
def test_learner_saves_in_warmup_and_resumes(worker_results, kind, distributed_optimizer):
    check(worker_results[(kind, distributed_optimizer)], kind)


def check(result: dict, kind: str) -> None:
    """The worker's result: the step counts saved and loaded where each optimizer keeps them,
    and each loaded learner's next step the saver's (metrics, weights, Adam's counts)."""
    inner = {"torch": "AdamW", "te": "FakeTEFusedAdam", "apex": "FakeApexFusedAdam"}[kind]
    # saved at step 1: critic 2 Adam steps (K = 2), policy none; at step 2: critic 4, policy 1
    assert [r["loaded"] for r in result["resumed"]] == [{"policy": 0.0, "critic": 2.0}, {"policy": 1.0, "critic": 4.0}]
    assert [s["adam"] for s in result["saver"]] == [{"policy": 1.0, "critic": 4.0}, {"policy": 2.0, "critic": 6.0}]
    for mine, theirs in zip(result["resumed"], result["saver"]):
        assert mine["inner"] == theirs["inner"] == inner
        assert mine["adam"] == theirs["adam"]
        assert mine["metrics"].keys() == theirs["metrics"].keys()
        for k, v in theirs["metrics"].items():
            if not k.startswith("time/"):  # (seconds differ from run to run)
                assert abs(mine["metrics"][k] - v) <= 1e-6 * max(1.0, abs(v)), (k, mine["metrics"][k], v)
        for k, v in theirs["weights"].items():
            assert torch.allclose(mine["weights"][k], v, rtol=0, atol=1e-6), k

if __name__ == "__main__":
    from training.learners.mcore import cpu

    cpu.enable()
    with cpu.scope():
        for case in sys.argv[1].split(","):
            kind, distributed = case.split(":")
            folder = Path(sys.argv[3]) / f"{kind}-{distributed}"
            folder.mkdir(parents=True)
            _worker(kind, distributed == "1", sys.argv[2], str(folder / "result.pt"))
