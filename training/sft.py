"""Supervised warm start on generated demonstrations (its own stage, before RL).

A randomly initialised tiny model has never seen a tool call; a short SFT on demonstrations
of the small envs teaches it the format, so that RL starts from a policy that answers
well-formed and sometimes earns reward. Each env writes its own (`env.demonstrations`): arith
answers right, prefer names a random digit (its rule only reward can teach), guess plays at
random inside the range left.

    python -m training.sft [--model DIR] [--out DIR] [--steps N] [--examples N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from rich.progress import Progress
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent.chat import ChatRenderer
from agent.tiny_model import DEFAULT_DIR, build_tiny_model
from agent.tools import DEFAULT_TOOLS, load_definitions
from envs.base import make_env

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "models" / "tiny-qwen2-sft"


def encode_demo(renderer: ChatRenderer, system: str, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one conversation, tokenised as the agent loop builds a trajectory:
    the first prompt, each assistant turn (masked in, ending at its end-of-turn token, as a
    sampled turn does) and the tool observations between turns (masked out). A trailing
    observation is left out: a rollout ends at the turn that ends its episode."""
    history = [{"role": "system", "content": system}]
    ids: list[int] = []
    mask: list[int] = []
    pending: list[dict] = []  # observations since the last assistant turn
    for message in messages:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if not ids:  # the first prompt: system, user, generation prompt
            part = renderer.prompt_ids(history + pending)
        else:
            part = renderer.observation_ids(history, pending, sampled_eos=True)
        history += pending
        pending = []
        ids, mask = ids + part, mask + [0] * len(part)
        prompt_text = renderer.render(history, add_generation_prompt=True)
        full_text = renderer.render(history + [message])
        assert full_text.startswith(prompt_text)
        reply = renderer.encode(full_text[len(prompt_text):].rstrip("\n"))
        ids, mask = ids + reply, mask + [1] * len(reply)
        history.append(message)
    return ids, mask


def demonstrations(envs: list[str], examples: int, rng: random.Random, seed: int, max_operand: int,
                   tokenizer) -> list[tuple[list[int], list[int]]]:
    """`examples` demonstrations shared evenly between `envs` (each env's own `demonstrations`:
    conversations after its system prompt), tokenised with that env's tools."""
    data = []
    for i, name in enumerate(envs):
        env = make_env(name)
        n = examples // len(envs) if i < len(envs) - 1 else examples - (len(envs) - 1) * (examples // len(envs))
        renderer = ChatRenderer(tokenizer, load_definitions(names=env.tools or DEFAULT_TOOLS))
        try:
            convos = env.demonstrations(n, rng, seed=seed, max_operand=max_operand)
        except NotImplementedError as e:
            raise ValueError(f"model.sft.envs: {e}") from None
        data += [encode_demo(renderer, env.system_prompt, convo) for convo in convos]
    return data


def sft(model_path: str, out: Path, steps: int = 150, examples: int = 2000, batch_size: int = 32,
        lr: float = 2e-3, seed: int = 1234, max_operand: int = 9, envs: list[str] = ("arith", "prefer")) -> dict:
    """Train on `examples` demonstrations of `envs` for `steps` steps and save to `out`; returns stats."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    # a seed far from the RL and evaluation seeds, so held-out questions stay held out in text
    data = demonstrations(list(envs), examples, rng, seed, max_operand, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    with Progress() as progress:
        bar = progress.add_task("sft", total=steps)
        for _ in range(steps):
            batch = rng.sample(data, batch_size)
            length = max(len(ids) for ids, _ in batch)
            ids = torch.full((batch_size, length), tokenizer.pad_token_id)
            mask = torch.zeros((batch_size, length))
            attention = torch.zeros((batch_size, length), dtype=torch.long)
            for b, (x, m) in enumerate(batch):
                ids[b, : len(x)] = torch.tensor(x)
                mask[b, : len(m)] = torch.tensor(m, dtype=torch.float)
                attention[b, : len(x)] = 1
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                    reduction="none").view(batch_size, -1)
            loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            progress.update(bar, advance=1, description=f"sft loss {loss.item():.3f}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    stats = {"steps": steps, "examples": examples, "envs": list(envs), "loss_first": losses[0], "loss_last": losses[-1], "base": model_path}
    (out / "sft.json").write_text(json.dumps(stats, indent=2))
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.sft", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the embedded tiny model (built if missing)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max-operand", type=int, default=9)
    p.add_argument("--envs", nargs="+", default=["arith", "prefer"], help="the envs whose demonstrations it trains on")
    args = p.parse_args(argv)
    model = args.model or str(build_tiny_model(DEFAULT_DIR))
    stats = sft(model, args.out, args.steps, args.examples, lr=args.lr, seed=args.seed, max_operand=args.max_operand,
                envs=args.envs)
    print(f"sft: loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
