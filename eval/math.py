"""Evaluate a checkpoint on math problems with the Python tool, or grade given final answers.

    python -m eval.math --ckpt PATH --dataset NAME|FILE|builtin [--runs N] [--max-turns 50]
        [--engine auto|vllm|hf] [--max-workers N] [--ids ID ...] [--limit N] [--resume] --output DIR
    python -m eval.math --dataset NAME|FILE|builtin --predictions FILE --output DIR

The paper's protocol: Pass@1 at temperature 1.0 and top-p 1.0, averaged over N runs (16 for
AIME 2025, HMMT November 2025 and IMO-AnswerBench, 4 for BeyondAIME: the default for those
datasets, named as in taskdata/math.py; 1 for others). Each (run, problem) is one rollout in
a fresh sandbox with the `python` and `answer` tools (envs/math.py), its answer graded by
math-verify. Outputs in --output: each job's `run_<k>/<id>/` (trajectory, result.json),
`run_<k>/predictions.jsonl` (id, answer: what --predictions reads), `report.json`,
`report.md` and `report.png` (accuracy per run with the mean and its 95% interval; how many
runs solved each problem). Ctrl-C keeps the finished rollouts; the same command with
`--resume` runs the rest. The agent, the engine, the jobs and the interval are eval.swebench's
(eval/agent_eval.py, eval/report.py).

With `--predictions` (rows with `id` and `answer`, JSON/JSONL/parquet) the answers are graded
alone, without a model or a sandbox: `report.json` and `report.md`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from envs.base import Task
from taskdata.rows import DatasetError, read_rows
from taskdata.math import BENCHMARKS, benchmark, load_math_tasks
from eval.agent_eval import (RolloutRecord, UsageError, add_agent_arguments, agent_settings, check_agent_arguments,
                             resolve_checkpoint)
from sandbox.base import Limits, SandboxError

console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)
log = logging.getLogger("eval.math")
# the jobs' statuses (shared with the SWE evaluation) in a math report's words
WORDS = {"resolved": "correct", "unresolved": "wrong", "empty_patch": "no_answer", "error": "error"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.math", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="builtin",
                   help=f"a benchmark ({', '.join(BENCHMARKS)}), a hub dataset, a .json/.jsonl/.parquet file "
                        "(id, problem or question, answer), or builtin[:SEED] (generated problems)")
    p.add_argument("--split", default=None, help="the hub dataset's split (default: the benchmark's, or its only one)")
    p.add_argument("--ids", nargs="+", default=None, help="only these problems")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--predictions", type=Path, help="final answers to grade: rows with id and answer")
    src.add_argument("--ckpt", help="the model: an HF model directory, a training.run checkpoint or output "
                                    "directory (its newest checkpoint), or a hub name")
    p.add_argument("--run-id", default="math")
    p.add_argument("--output", type=Path, default=None, help="default: outputs/eval/<run-id>")
    p.add_argument("--max-workers", type=int, default=2, help="rollouts at once")
    p.add_argument("--python-timeout", type=float, default=30.0, help="seconds of one python call")
    p.add_argument("--image", default=None, help="the sandbox image (default: the math env's; one with sympy helps)")
    p.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="memory of one sandbox")
    p.add_argument("--cpus", type=float, default=Limits.cpus, help="CPUs of one sandbox")
    p.add_argument("--warm-pool", type=int, default=0, help="started containers kept ready (for --runs > 1); 0: none")
    add_agent_arguments(p, runs_default=None, max_turns_help="the paper's math runs use up to 50",
                        runs_help="runs per problem, Pass@1 averaged over them (default: the benchmark's "
                                  "protocol, 16, or 4 for beyondaime; 1 for other datasets)")
    args = p.parse_args(argv)
    check_agent_arguments(p, args)
    for name in ("limit",):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("python_timeout", "cpus"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.warm_pool < 0:
        p.error(f"--warm-pool must be at least 0, got {args.warm_pool}")
    return args


def protocol_runs(dataset: str) -> int:
    b = benchmark(dataset)
    return b.runs if b else 1


# -- the checkpoint's rollouts --------------------------------------------------------------------
def math_rollout(agent, task: Task, env, pool, inst: Path, record: RolloutRecord, seed: int, model_name: str) -> None:
    """One math job (eval.agent_eval.run_job's `rollout`): the rollout in a fresh sandbox, its
    answer graded there by the env (math-verify); fills `record`, saves the trajectory."""
    with pool.sandbox(env.image_for(task)) as sb:
        traj = agent.run(task, env, sb, seed=seed)
        graded = env.grade(task, sb) if traj.exit_reason not in ("sandbox_error", "sandbox_killed") else None
    record.exit_reason, record.turns = traj.exit_reason, traj.turns
    record.tokens, record.sampled_tokens = traj.num_tokens, traj.num_sampled
    traj.info.update(model=model_name, run=record.run)
    if traj.exit_reason == "sandbox_error":
        record.error = f"SandboxError: {traj.info.get('error', 'the sandbox failed')}"
    elif graded is None:  # its own commands stopped the sandbox: nothing to grade
        record.status, record.error = "empty_patch", f"the sandbox was stopped ({traj.info.get('error', '')})"
        traj.reward = 0.0
    else:
        record.answer = graded.report["given"]
        record.status = "resolved" if graded.resolved else "empty_patch" if graded.empty_patch else "unresolved"
        record.error = graded.error
        traj.reward = graded.reward
        traj.info["grade"] = {k: v for k, v in asdict(graded).items() if k != "log"}
    traj.save(inst)


def run_settings(args: argparse.Namespace, image: str, model: str, kind: str, max_tokens: int, options: dict) -> dict:
    """What the results depend on, as `--resume` compares them (eval.agent_eval.prepare_output)."""
    return {**agent_settings(args, model, kind, max_tokens, options), "python_timeout": args.python_timeout,
            "image": image}


def evaluate_checkpoint(args: argparse.Namespace, tasks: list[Task], env, pool, out: Path, runs: int) -> dict:
    """The story of `--ckpt`: the agent on the checkpoint, every (run, problem) rolled out and
    graded, the reports."""
    from eval.agent_eval import evaluate_agent, start_agent

    agent, engine, model = start_agent(args, out, lambda *engine: run_settings(args, env.image, *engine), console,
                                       f"{len(tasks)} problem(s) x {runs} run(s)")
    try:
        records = evaluate_agent(agent, tasks, env, pool, out, runs=runs, max_workers=args.max_workers,
                                 resume=args.resume, seed=args.seed, model_name=model, rollout=math_rollout)
    finally:
        engine.close()
    return write_reports(records, tasks, out, model, args)


# -- reports ----------------------------------------------------------------------------------------
def write_reports(records: list[list[RolloutRecord]], tasks: list[Task], out: Path, model: str,
                  args: argparse.Namespace) -> dict:
    """Each run's answers (`run_<k>/predictions.jsonl`), `report.json`, `report.md`, `report.png`."""
    from eval.agent_eval import write_atomic
    from eval.report import summarize

    for k, run in enumerate(records):
        lines = [json.dumps({"id": r.instance_id, "answer": r.answer}) + "\n" for r in run]
        write_atomic(out / f"run_{k}" / "predictions.jsonl", "".join(lines))
    summary = summarize(tasks, records)
    summary.pop("per_repository")
    summary["accuracy_per_run"] = summary.pop("resolved_rate_per_run")
    summary["status_counts"] = {WORDS[k]: v for k, v in summary["status_counts"].items()}
    per_problem = {}
    for i, task in enumerate(tasks):
        row = [run[i] for run in records]
        per_problem[task.instance_id] = {"expected": task.extra["answer"],
                                         "solved": sum(r.status == "resolved" for r in row) / len(row),
                                         "answers": [r.answer for r in row]}
    report = {"model": model, "dataset": args.dataset, "protocol": {"runs": len(records), "temperature":
              args.temperature, "top_p": args.top_p, "max_turns": args.max_turns}, **summary,
              "errors": {f"run {r.run} {r.instance_id}": r.error for run in records for r in run if r.error},
              "per_problem": per_problem}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(report_markdown(report))
    plot_report(report, out / "report.png")
    lo, hi = report["pass_at_1_ci95"]
    console.print(f"accuracy (Pass@1 over {report['runs']} run(s)): {100 * report['pass_at_1']:.1f}% "
                  f"(95% interval {100 * lo:.1f}-{100 * hi:.1f}%); per run: "
                  + ", ".join(f"{100 * a:.1f}%" for a in report["accuracy_per_run"]))
    return report


def report_markdown(report: dict[str, Any]) -> str:
    from eval.report import rollout_tables

    lo, hi = report["pass_at_1_ci95"]
    proto = report["protocol"]
    lines = [
        "# Math evaluation", "",
        f"- checkpoint: `{report['model']}`",
        f"- dataset: `{report['dataset']}`, {report['instances']} problems x {report['runs']} run(s), temperature "
        f"{proto['temperature']:g}, top-p {proto['top_p']:g}, up to {proto['max_turns']} turns",
        f"- **accuracy (Pass@1, averaged over the runs): {100 * report['pass_at_1']:.1f}%**, 95% interval "
        f"[{100 * lo:.1f}%, {100 * hi:.1f}%]",
        "- the interval: p_i = share of the runs solving problem i, Pass@1 = mean(p_i), +- 1.96 sd(p_i) / sqrt(n) "
        "clipped to [0, 1] (clustered by problem); the Wilson interval over n when every p_i is the same",
        "- accuracy per run: " + ", ".join(f"{100 * a:.1f}%" for a in report["accuracy_per_run"]),
    ]
    lines += rollout_tables(report, status="answer", label=lambda k: k.replace("_", " "))
    lines += ["", "## Problems", "", "| id | expected | solved | answers given |", "| --- | --- | ---: | --- |"]
    for iid, row in report["per_problem"].items():
        given = ", ".join("-" if a is None else f"`{a}`" for a in row["answers"][:8])
        more = f" (+{len(row['answers']) - 8})" if len(row["answers"]) > 8 else ""
        lines.append(f"| {iid} | `{row['expected']}` | {100 * row['solved']:.0f}% | {given}{more} |")
    if report["errors"]:
        lines += ["", "## Errors and grading notes", ""]
        lines += [f"- {where}: {why}" for where, why in report["errors"].items()]
    lines += ["", "Plot: `report.png`. Answers: `run_<k>/predictions.jsonl` (regrade with --predictions).", ""]
    return "\n".join(lines)


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Accuracy per run (bars) with the mean and its 95% interval, and how many runs solved
    each problem (a histogram), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    per_run = [100 * a for a in report["accuracy_per_run"]]
    mean, (lo, hi) = 100 * report["pass_at_1"], [100 * x for x in report["pass_at_1_ci95"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    bars = left.bar(range(len(per_run)), per_run, color="tab:blue", label="accuracy of the run")
    left.bar_label(bars, [f"{a:.0f}" for a in per_run], padding=2, fontsize=7)
    left.axhspan(lo, hi, color="tab:orange", alpha=0.2, label=f"95% interval [{lo:.1f}, {hi:.1f}]")
    left.axhline(mean, color="tab:orange", label=f"Pass@1 {mean:.1f}%")
    left.set_ylim(0, 105)
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("run")
    left.set_ylabel("accuracy (%)")
    left.set_title(f"{report['dataset']}: {report['instances']} problems x {report['runs']} run(s)")
    left.legend(loc="upper right", fontsize=8)
    runs = report["runs"]
    solved = [round(row["solved"] * runs) for row in report["per_problem"].values()]
    right.hist(solved, bins=[b - 0.5 for b in range(runs + 2)], color="tab:green", rwidth=0.85)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel(f"runs solving the problem (of {runs})")
    right.set_ylabel("problems")
    right.set_title("solved per problem")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- grading given answers --------------------------------------------------------------------------
def load_answers(path: Path, tasks: list[Task]) -> dict[str, str | None]:
    """id -> answer (None: none given) from rows with `id` and `answer`; a bad row, an id twice
    or one the dataset lacks fails naming the file, the row and the field."""
    if not path.is_file():
        raise UsageError(f"--predictions {path}: no such file")
    rows, _, where = read_rows(path)
    known = {t.instance_id for t in tasks}
    answers: dict[str, str | None] = {}
    rows_of: dict[str, int] = {}
    for i, row in enumerate(rows):
        at = f"{where}: row {i}"
        if not isinstance(row, dict):
            raise UsageError(f"{at}: not an object but {type(row).__name__}")
        iid, answer = row.get("id"), row.get("answer")
        if isinstance(iid, bool) or not isinstance(iid, (str, int)) or not str(iid).strip():
            raise UsageError(f"{at}: field 'id' must be a non-empty string or a whole number, got {iid!r:.80}")
        iid = str(iid)
        if iid not in known:
            raise UsageError(f"{at}: field 'id' = {iid!r} is not a problem of the dataset")
        if iid in answers:
            raise UsageError(f"{at}: id {iid!r} repeats row {rows_of[iid]}")
        if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
            raise UsageError(f"{at}: field 'answer' must be a string, a number or null, got {answer!r:.80}")
        answers[iid], rows_of[iid] = None if answer is None else str(answer), i
    return answers


def grade_answers(args: argparse.Namespace, tasks: list[Task], out: Path) -> dict:
    """The story of `--predictions`: each problem's answer graded by math-verify (a problem
    without one counts as unanswered), `report.json`, `report.md`, a table."""
    from envs.math import Verifier, Verdict

    answers = load_answers(args.predictions, tasks)
    console.print(f"grading {len(answers)} answer(s) for {len(tasks)} problem(s) -> {out}")
    verifier = Verifier()
    try:
        verdicts = {t.instance_id: verifier.check(t.extra["answer"], answers[t.instance_id])
                    if (answers.get(t.instance_id) or "").strip() else Verdict(False) for t in tasks}
    finally:
        verifier.close()
    ids = lambda keep: sorted(t.instance_id for t in tasks if keep(t.instance_id))  # noqa: E731
    answered = lambda iid: bool((answers.get(iid) or "").strip())  # noqa: E731
    report = {
        "dataset": args.dataset, "predictions": str(args.predictions), "problems": len(tasks),
        "answered": len(ids(answered)), "correct": len(ids(lambda i: verdicts[i].correct)),
        "accuracy": sum(v.correct for v in verdicts.values()) / len(tasks),
        "correct_ids": ids(lambda i: verdicts[i].correct),
        "wrong_ids": ids(lambda i: answered(i) and not verdicts[i].correct),
        "unanswered_ids": ids(lambda i: not answered(i)),
        "errors": {i: v.error for i, v in verdicts.items() if v.error},
        "per_problem": {iid: {"expected": t.extra["answer"], "given": answers.get(iid), "correct": v.correct,
                              "expected_parsed": v.expected, "given_parsed": v.given}
                        for t in tasks for iid, v in [(t.instance_id, verdicts[t.instance_id])]},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    lines = ["# Math answers graded", "", f"- dataset: `{args.dataset}`, answers: `{args.predictions}`",
             f"- **accuracy: {100 * report['accuracy']:.1f}%** ({report['correct']} of {report['problems']}; "
             f"{report['answered']} answered)", "", "| id | expected | given | read as | correct |",
             "| --- | --- | --- | --- | --- |"]
    for iid, row in report["per_problem"].items():
        lines.append(f"| {iid} | `{row['expected']}` | `{row['given']}` | `{row['given_parsed']}` | "
                     f"{'yes' if row['correct'] else 'no'} |")
    lines += [f"- {i}: {why}" for i, why in report["errors"].items()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    table = Table(title="math answers")
    for col in ("problems", "answered", "correct", "accuracy %"):
        table.add_column(col, justify="right")
    table.add_row(str(report["problems"]), str(report["answered"]), str(report["correct"]),
                  f"{100 * report['accuracy']:.1f}")
    console.print(table)
    for iid, why in report["errors"].items():
        console.print(f"[yellow]note[/yellow] {iid}: {escape(why)}", soft_wrap=True)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = args.output or Path("outputs") / "eval" / args.run_id
    env = pool = None
    try:
        if args.ckpt:
            resolve_checkpoint(args.ckpt)  # a wrong path is named before the dataset loads
        tasks = load_math_tasks(args.dataset, args.split, args.ids, args.limit)
        if args.predictions:
            grade_answers(args, tasks, out)
            console.print(f"report: {out / 'report.json'}, {out / 'report.md'}")
            return 0
        from envs.base import make_env
        from sandbox.pool import SandboxPool

        env = make_env("math", timeout_s=args.python_timeout, **({"image": args.image} if args.image else {}))
        pool = SandboxPool(args.run_id, Limits(memory_mb=args.memory_mb, cpus=args.cpus), max_live=args.max_workers,
                           warm=args.warm_pool)
        evaluate_checkpoint(args, tasks, env, pool, out, args.runs or protocol_runs(args.dataset))
    except (DatasetError, SandboxError, UsageError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted (the finished rollouts are kept: the same command with --resume runs the rest)")
        return 130
    finally:
        if pool is not None:
            pool.close()
        if env is not None:
            env.verifier.close()
    console.print(f"report: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
