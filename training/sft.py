"""Supervised warm start on generated demonstrations (its own stage, before RL).

A randomly initialised tiny model has never seen a tool call; a short SFT on demonstrations
of the small envs (a question -> one `answer` call: the right sum for arith, a random digit
for prefer, whose rule only reward can teach) teaches it the format, so that RL starts from
a policy that answers well-formed and sometimes earns reward.

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
from agent.tools import load_definitions
from envs.arith import ArithEnv, make_arith_tasks
from envs.prefer import PreferEnv, make_prefer_tasks

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "models" / "tiny-qwen2-sft"


def demonstration(renderer: ChatRenderer, system: str, question: str, answer: str) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one conversation; the mask covers the assistant's reply only."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    prompt_text = renderer.render(messages, add_generation_prompt=True)
    reply = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "answer", "arguments": {"value": answer}}}]}
    full_text = renderer.render(messages + [reply])
    assert full_text.startswith(prompt_text)
    # the reply ends at the end-of-turn token, as a sampled turn does
    reply_text = full_text[len(prompt_text):].rstrip("\n")
    prompt_ids, reply_ids = renderer.encode(prompt_text), renderer.encode(reply_text)
    return prompt_ids + reply_ids, [0] * len(prompt_ids) + [1] * len(reply_ids)


def sft(model_path: str, out: Path, steps: int = 150, examples: int = 2000, batch_size: int = 32,
        lr: float = 2e-3, seed: int = 1234, max_operand: int = 9) -> dict:
    """Train on `examples` demonstrations for `steps` steps and save to `out`; returns stats."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    arith, prefer = ArithEnv(), PreferEnv()
    renderer = ChatRenderer(tokenizer, load_definitions(names=arith.tools))
    # a seed far from the RL and evaluation seeds, so held-out questions stay held out in text;
    # prefer prompts get a uniformly random digit: the format is taught, the hidden rule is not
    data = [demonstration(renderer, arith.system_prompt, t.problem_statement, t.extra["answer"])
            for t in make_arith_tasks(examples // 2, seed=seed, max_operand=max_operand)]
    data += [demonstration(renderer, prefer.system_prompt, t.problem_statement, str(rng.randint(0, 9)))
             for t in make_prefer_tasks(examples - examples // 2, seed=seed)]
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
    stats = {"steps": steps, "examples": examples, "loss_first": losses[0], "loss_last": losses[-1], "base": model_path}
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
    args = p.parse_args(argv)
    model = args.model or str(build_tiny_model(DEFAULT_DIR))
    stats = sft(model, args.out, args.steps, args.examples, lr=args.lr, seed=args.seed, max_operand=args.max_operand)
    print(f"sft: loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
