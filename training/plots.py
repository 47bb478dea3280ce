"""The reward curve of a run, from its metrics.jsonl rows."""

from __future__ import annotations

from pathlib import Path


def plot_rewards(rows: list[dict], path: str | Path, title: str = "reward", window: int = 5) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    reward = [r.get("reward/mean") or 0.0 for r in rows]
    smooth = [sum(reward[max(0, i - window + 1): i + 1]) / len(reward[max(0, i - window + 1): i + 1])
              for i in range(len(reward))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, reward, "o", alpha=0.35, label="batch reward")
    ax.plot(steps, smooth, "-", lw=2, label=f"mean of last {window}")
    ax.set_xlabel("learner step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
