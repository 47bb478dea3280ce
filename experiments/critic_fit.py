"""Can the critic learn a run's rewards at all? Its value model fitted offline on the run's own
rollouts, in settings the run did not try, scored on rollouts it never saw.

    python -m training.run trainer.log_tokens=true output_dir=RUN      # the run, its tokens kept
    python -m experiments.critic_fit RUN [--split-step 30] [--epochs 5] [--cases ...]
        [--output FILE.json [--resume]] [--plot FILE.png]

The run's rollouts.jsonl (written with `trainer.log_tokens=true`) holds every rollout the
learner trained on, token for token, with its step. Those of steps up to `--split-step` train
the critic, batch by batch in the run's order (K updates a batch, as the learner takes them:
`TorchLearner`'s own critic update, on the run's starting checkpoint); the later steps' rollouts
are held out. Each case is one change to the run's critic:

- `as_run`: the run's own settings (attention frozen, a linear value head, its `lr_critic`);
- `lr_x0.1`, `lr_x3`, `lr_x10`: the critic's learning rate scaled;
- `unfrozen`: attention trained too;
- `mlp_head`: a two-layer value head (hidden -> 4 x hidden -> 1, GELU) in place of the linear one;
- `unfrozen_mlp_lr_x3`: the three together.

Every case takes `--epochs` passes over the training rollouts (the first pass is what the run
itself saw; more passes are value pretraining on the run's own rollouts). Reported after each
pass: explained variance on the held-out rollouts over every sampled token (the metric the run
logs), and at each rollout's last sampled token (where everything that decides the reward has
been seen), and the same on the training rollouts (can it fit what it trained on). The floor
every critic must beat: each source's mean training reward as the value of all its tokens
(`source_mean`): explained variance from knowing which env a rollout came from, and nothing more.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from agent.trajectory import Trajectory
from benchmarks.common import read_jsonl
from training import losses
from training.losses import explained_variance
from training.batch import pack

CASES = {
    "as_run": {},
    "lr_x0.1": {"lr_scale": 0.1},
    "lr_x3": {"lr_scale": 3.0},
    "lr_x10": {"lr_scale": 10.0},
    "unfrozen": {"unfrozen": True},
    "mlp_head": {"mlp_head": True},
    "unfrozen_mlp_lr_x3": {"unfrozen": True, "mlp_head": True, "lr_scale": 3.0},
}


def load_rollouts(run: Path) -> list[dict]:
    path = run / "rollouts.jsonl"
    if not path.exists():
        raise SystemExit(f"{path}: not found (a run's output_dir, trained with trainer.log_tokens=true)")
    rows = read_jsonl(path)
    if not rows or "completion_ids" not in rows[0]:
        raise SystemExit(f"{path}: no token ids in it: train the run with trainer.log_tokens=true")
    return rows


def trajectory(row: dict) -> Trajectory:
    return Trajectory(row["instance_id"], prompt_ids=row["prompt_ids"], completion_ids=row["completion_ids"],
                      loss_mask=row["loss_mask"], logprobs=row["logprobs"], policy_version=row["policy_version"],
                      reward=float(row["reward"]))


def make_learner(model: str, algo, case: dict, seed: int):
    from training.learners.torch import TorchLearner

    algo = dataclasses.replace(algo, lr_critic=algo.lr_critic * case.get("lr_scale", 1.0),
                               freeze_critic_attention=not case.get("unfrozen", False))
    torch.manual_seed(seed)
    learner = TorchLearner(model, algo, seed=seed)
    if case.get("mlp_head"):
        hidden = learner.critic.config.hidden_size
        learner.critic.score = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                                                   torch.nn.Linear(4 * hidden, 1))
        trainable = [p for p in learner.critic.parameters() if p.requires_grad]
        learner.critic_opt = torch.optim.AdamW(trainable, lr=algo.lr_critic, weight_decay=0.0)
    learner.policy = None  # the policy is not needed: free its memory
    return learner


def fit_batch(learner, trajs: list[Trajectory]) -> float:
    """K critic updates on one batch, as the learner takes them; the explained variance before."""
    batch = learner._to(pack(trajs, learner.pad_id))
    parts = learner._micro_batches(batch, list(range(len(batch))))
    values = learner._critic_values(batch, parts)
    _, returns = learner.algo.advantages(batch, values)
    before = losses.value_loss(values, returns, batch.loss_mask)[1]["value/explained_var"]
    for _ in range(learner.algo.critic_steps):
        learner._critic_update(batch, parts, returns, max(batch.num_sampled, 1))
    return before


def score(learner, trajs: list[Trajectory], batch_size: int = 16) -> dict[str, float]:
    """Explained variance over every sampled token and at each rollout's last one."""
    preds, targets, last_pred, last_target = [], [], [], []
    for i in range(0, len(trajs), batch_size):
        part = trajs[i:i + batch_size]
        batch = learner._to(pack(part, learner.pad_id))
        values = learner._critic_values(batch, learner._micro_batches(batch, list(range(len(batch)))))
        _, returns = learner.algo.advantages(batch, values)
        mask = batch.loss_mask.bool()
        preds.append(values[mask])
        targets.append(returns[mask])
        last = mask.float().cumsum(-1).argmax(-1)  # the position of each row's last sampled token
        rows = torch.arange(len(part))
        last_pred.append(values[rows, last])
        last_target.append(returns[rows, last])
    return {"ev": explained_variance(torch.cat(preds), torch.cat(targets)),
            "ev_last": explained_variance(torch.cat(last_pred), torch.cat(last_target))}


def source_mean_floor(train: list[dict], test: list[dict]) -> dict[str, float]:
    """Each source's mean training reward as the value of its every token, scored as the critic is."""
    by_source: dict[str, list[float]] = {}
    for r in train:
        by_source.setdefault(r["source"], []).append(float(r["reward"]))
    mean = {s: statistics.mean(v) for s, v in by_source.items()}
    overall = statistics.mean(float(r["reward"]) for r in train)
    pred, target, lp, lt = [], [], [], []
    for r in test:
        n = sum(r["loss_mask"])
        v = mean.get(r["source"], overall)
        pred += [v] * n
        target += [float(r["reward"])] * n
        lp.append(v)
        lt.append(float(r["reward"]))
    return {"ev": explained_variance(torch.tensor(pred), torch.tensor(target)),
            "ev_last": explained_variance(torch.tensor(lp), torch.tensor(lt))}


def run_case(name: str, model: str, algo, train_steps: list[list[Trajectory]], train_flat: list[Trajectory],
             test: list[Trajectory], epochs: int, seed: int) -> dict:
    learner = make_learner(model, algo, CASES[name], seed)
    out = {"name": name, "lr_critic": learner.algo.lr_critic, "epochs": []}
    start = score(learner, test)
    out["start"] = start
    for epoch in range(epochs):
        online = [fit_batch(learner, batch) for batch in train_steps]
        held, fit = score(learner, test), score(learner, train_flat)
        out["epochs"].append({"epoch": epoch + 1, "online_ev_mean": statistics.mean(online), "online_ev": online,
                              "held_out": held, "train": fit})
        print(f"  {name} epoch {epoch + 1}: held-out ev {held['ev']:.3f} (last token {held['ev_last']:.3f}), "
              f"train ev {fit['ev']:.3f} (last {fit['ev_last']:.3f}), online {statistics.mean(online):.3f}",
              file=sys.stderr, flush=True)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for c in results["cases"]:
        xs = [e["epoch"] for e in c["epochs"]]
        axes[0].plot(xs, [e["held_out"]["ev"] for e in c["epochs"]], marker="o", label=c["name"])
        axes[1].plot(xs, [e["held_out"]["ev_last"] for e in c["epochs"]], marker="o", label=c["name"])
        axes[2].plot(xs, [e["train"]["ev"] for e in c["epochs"]], marker="o", label=c["name"])
    floor = results["source_mean"]
    axes[0].axhline(floor["ev"], color="k", ls="--", label="source mean")
    axes[1].axhline(floor["ev_last"], color="k", ls="--", label="source mean")
    for ax, title in zip(axes, ("held out: every sampled token", "held out: last sampled token",
                                "training rollouts: every sampled token")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("passes over the training rollouts")
        ax.set_ylabel("explained variance")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.critic_fit", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run's output_dir, trained with trainer.log_tokens=true")
    p.add_argument("--split-step", type=int, default=None, help="train on steps up to this (default: 3/4 of the run)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path)
    p.add_argument("--resume", action="store_true", help="keep the cases already in --output (same run, split, epochs)")
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    if args.resume and not args.output:
        p.error("--resume needs --output (the file whose cases it keeps)")
    from training.factories import make_algo, prepare_model

    rows = load_rollouts(args.run)
    config = args.run / ".hydra" / "config.yaml"
    if not config.exists():
        raise SystemExit(f"{config}: not found (the run's resolved config, which says its model and critic)")
    cfg = OmegaConf.load(config)
    model, algo = prepare_model(cfg.model), make_algo(cfg)
    if not algo.uses_critic:
        raise SystemExit(f"{args.run}: its algo has no critic ({cfg.algo._target_}, baseline {cfg.algo.get('baseline')})")
    last = max(r["step"] for r in rows)
    split = args.split_step or max(1, (3 * last) // 4)
    if not 1 <= split < last:
        raise SystemExit(f"--split-step {split}: must be from 1 to {last - 1} (the run has {last} steps)")
    train_rows = [r for r in rows if r["step"] <= split]
    test_rows = [r for r in rows if r["step"] > split]
    steps = sorted({r["step"] for r in train_rows})
    train_steps = [[trajectory(r) for r in train_rows if r["step"] == s] for s in steps]
    train_flat = [t for b in train_steps for t in b]
    test = [trajectory(r) for r in test_rows]
    random.Random(args.seed).shuffle(test)
    floor = source_mean_floor(train_rows, test_rows)
    print(f"{len(train_flat)} training rollouts (steps 1-{split}), {len(test)} held out (steps {split + 1}-{last}); "
          f"mean reward {statistics.mean(t.reward for t in train_flat):.3f} / {statistics.mean(t.reward for t in test):.3f}; "
          f"source-mean floor: ev {floor['ev']:.3f}, last token {floor['ev_last']:.3f}", file=sys.stderr)
    results = {"run": str(args.run), "model": model, "split_step": split, "steps": last, "epochs": args.epochs,
               "train_rollouts": len(train_flat), "held_out_rollouts": len(test), "critic_steps": algo.critic_steps,
               "lr_critic": algo.lr_critic, "source_mean": floor, "cases": []}
    done: dict[str, dict] = {}
    if args.resume and args.output.exists():
        old = json.loads(args.output.read_text())
        for key in ("run", "split_step", "epochs", "train_rollouts", "held_out_rollouts"):
            if old.get(key) != results[key]:
                p.error(f"--resume: {args.output} holds {key} {old.get(key)!r}, this run has {results[key]!r}")
        done = {c["name"]: c for c in old["cases"]}
        print(f"--resume: {', '.join(done) or 'no case'} kept from {args.output}", file=sys.stderr)
    for name in args.cases:
        results["cases"].append(done.get(name) or
                                run_case(name, model, algo, train_steps, train_flat, test, args.epochs, args.seed))
        if args.output:  # after each case: a long study keeps what it measured
            args.output.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    print(json.dumps({c["name"]: {"held_out_ev_by_epoch": [round(e["held_out"]["ev"], 4) for e in c["epochs"]],
                                  "held_out_ev_last_by_epoch": [round(e["held_out"]["ev_last"], 4) for e in c["epochs"]]}
                      for c in results["cases"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
