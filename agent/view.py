"""Render a trajectory as a page a person can read: the turns, tool calls and their outputs,
token counts, the masked spans and the reward.

    python -m agent.view TRAJ.json -o PAGE.html [--tokenizer MODEL_DIR]
"""

from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

import jinja2

from agent.trajectory import Trajectory

TEMPLATE = Path(__file__).parent / "templates" / "trajectory.html.jinja"


def mask_spans(traj: Trajectory, decode) -> list[tuple[str, int]]:
    """Runs of completion tokens with the same loss mask, decoded: [(text, mask), ...]."""
    spans, i = [], 0
    for mask, run in groupby(traj.loss_mask):
        n = len(list(run))
        ids = traj.completion_ids[i : i + n]
        spans.append((decode(ids) if decode else " ".join(map(str, ids)), mask))
        i += n
    return spans


def render_html(traj: Trajectory, tokenizer=None) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined)
    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer else None
    return env.from_string(TEMPLATE.read_text()).render(
        t=traj, spans=mask_spans(traj, decode), n_total=traj.num_tokens, n_prompt=len(traj.prompt_ids),
        n_sampled=traj.num_sampled, n_masked=len(traj.completion_ids) - traj.num_sampled,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.view", description=__doc__.split("\n\n")[0])
    p.add_argument("trajectory", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--tokenizer", default=None, help="decode the token view with this tokenizer")
    args = p.parse_args(argv)
    try:
        traj = Trajectory.load(args.trajectory)
    except (OSError, ValueError, TypeError) as e:
        print(f"error: {args.trajectory}: not a trajectory file ({e})", file=sys.stderr)
        return 2
    tokenizer = traj.info.get("model") if args.tokenizer is None else args.tokenizer
    tok = None
    if tokenizer:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(tokenizer)
        except OSError:
            tok = None  # the model is not on this machine: show ids instead of text
    args.output.write_text(render_html(traj, tok))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
