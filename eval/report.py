"""The reports: swebench's run report and the summary table (grading and checkpoint runs), and
for a checkpoint run pass@1 over N runs with a 95% interval, a table per repository, exit
reasons, turns and tokens per rollout (`report.json`, `report.md`) and a plot (`report.png`:
resolved by repository; turns histogram).

The interval: pass@1 is the mean over the n instances of each instance's resolved rate over
the runs, p_i = (runs resolving i) / N. Instances are the unit that is sampled, so the
standard error is the one clustered by instance, SE = sd(p_1..p_n) / sqrt(n) (run-to-run
noise is inside each p_i), and the interval is pass@1 +- 1.96 SE, clipped to [0, 1]. When
every instance has the same rate (SE = 0: all solved or none), the Wilson score interval for
n instances is given instead.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from envs.base import Task
from eval.grading import InstanceOutcome

if TYPE_CHECKING:  # eval.agent_eval imports the agent (torch); grading alone does not need it
    from eval.agent_eval import RolloutRecord

Z95 = 1.959964


def classify_failures(outcomes: list[InstanceOutcome], log_dir: Path) -> dict[str, tuple[str, str]]:
    """Why unresolved and errored instances likely failed, as swebench 5 classifies it
    (`swebench.harness.infra_failure`): instance id -> (reason, tier), tier `environment` (the
    environment broke, not the patch) or `ambiguous` (either could). Read from each instance's
    `test_output.txt` and `error.txt` in `log_dir/<id>/` and its error; advisory only, as in
    swebench: the instances stay unresolved or errored."""
    from swebench.harness.infra_failure import classify_text

    found = {}
    for o in outcomes:
        if o.status not in ("unresolved", "error"):
            continue
        files = [log_dir / o.instance_id / name for name in ("test_output.txt", "error.txt")]
        text = "\n".join([*(f.read_text(errors="replace") for f in files if f.is_file()), o.error or ""])
        if (found_one := classify_text(text)) is not None:
            found[o.instance_id] = found_one
    return found


def run_report(tasks: list[Task], predictions: dict[str, Any], outcomes: list[InstanceOutcome],
               log_dir: Path | None = None) -> dict[str, Any]:
    """swebench 5's run-report keys (as `make_run_report` writes them, failure classification
    from the logs in `log_dir` included), plus error reasons and the resolved rate over all
    instances."""
    from swebench.harness.infra_failure import TIER_ENVIRONMENT

    failures = classify_failures(outcomes, log_dir) if log_dir is not None else {}
    infra = sorted(iid for iid, (_, tier) in failures.items() if tier == TIER_ENVIRONMENT)
    ambiguous = sorted(iid for iid, (_, tier) in failures.items() if tier != TIER_ENVIRONMENT)
    by_status: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        by_status[o.status].append(o.instance_id)
    ids = lambda status: sorted(by_status.get(status, []))  # noqa: E731
    completed = sorted(ids("resolved") + ids("unresolved"))
    total = len(tasks)
    return {
        "total_instances": total,
        "submitted_instances": len(predictions),
        "completed_instances": len(completed),
        "resolved_instances": len(ids("resolved")),
        "unresolved_instances": len(ids("unresolved")),
        "infra_failure_instances": len(infra),
        "ambiguous_failure_instances": len(ambiguous),
        "empty_patch_instances": len(ids("empty_patch")),
        "error_instances": len(ids("error")),
        "completed_ids": completed,
        "incomplete_ids": ids("incomplete"),
        "empty_patch_ids": ids("empty_patch"),
        "submitted_ids": sorted(predictions),
        "resolved_ids": ids("resolved"),
        "unresolved_ids": ids("unresolved"),
        "infra_failure_ids": infra,
        "ambiguous_failure_ids": ambiguous,
        "failure_reasons": {iid: reason for iid, (reason, _) in sorted(failures.items())},
        "error_ids": ids("error"),
        "error_reasons": {o.instance_id: o.error for o in outcomes if o.status == "error"},
        "resolved_rate": len(ids("resolved")) / total if total else 0.0,
        # counted apart: patches that edit test infrastructure unasked (SWE-bench grades them as
        # it would any patch) and logs whose canary tests were tampered with (unresolved here;
        # swebench_resolved_instances is swebench's own count, those included)
        "test_edit_instances": sum(bool(o.test_edits) for o in outcomes),
        "test_edit_ids": sorted(o.instance_id for o in outcomes if o.test_edits),
        "tampered_instances": sum(bool(o.tampered) for o in outcomes),
        "tampered_ids": sorted(o.instance_id for o in outcomes if o.tampered),
        "tampered_reasons": {o.instance_id: o.tampered for o in outcomes if o.tampered},
        "swebench_resolved_instances": sum(o.status == "resolved" or bool(o.tampered and o.swebench_resolved)
                                           for o in outcomes),
        "schema_version": 2,  # swebench's: the keys above its own are additions, not a new schema
    }


def repo_name(task: Task) -> str:
    """A local repository shows as its folder name, a hub one as owner/name."""
    return Path(task.repo).name if task.repo_path else task.repo


def print_summary(report: dict[str, Any], tasks: list[Task], outcomes: list[InstanceOutcome], console: Console) -> None:
    """A per-repository table and the totals."""
    repo_of = {t.instance_id: repo_name(t) for t in tasks}
    per_repo: dict[str, Counter] = defaultdict(Counter)
    for o in outcomes:
        per_repo[repo_of[o.instance_id]][o.status] += 1
    table = Table(title="SWE grading")
    table.add_column("repository", no_wrap=True)
    for col in ("instances", "resolved", "unresolved", "empty", "error", "resolved %"):
        table.add_column(col, justify="right", no_wrap=True)
    for repo in sorted(per_repo):
        c = per_repo[repo]
        n = sum(c.values())
        table.add_row(repo, str(n), str(c["resolved"]), str(c["unresolved"]), str(c["empty_patch"]),
                      str(c["error"]), f"{100 * c['resolved'] / n:.1f}")
    table.add_row("[bold]all", str(report["total_instances"]), str(report["resolved_instances"]),
                  str(report["unresolved_instances"]), str(report["empty_patch_instances"]),
                  str(report["error_instances"]), f"[bold]{100 * report['resolved_rate']:.1f}")
    console.print(table)
    for iid, reason in report["error_reasons"].items():
        console.print(f"[red]error[/red] {iid}: {escape(reason)}", soft_wrap=True)
    if report.get("test_edit_instances"):
        console.print(f"[yellow]test edits[/yellow] (test infrastructure the patch edits unasked): "
                      f"{report['test_edit_instances']}: {', '.join(report['test_edit_ids'])}", soft_wrap=True)
    for iid, reason in (report.get("tampered_reasons") or {}).items():
        console.print(f"[red]tampered[/red] {iid}: {escape(reason)} (unresolved here; swebench's verdict: "
                      f"{report['swebench_resolved_instances']} resolved in all)", soft_wrap=True)
    if report["failure_reasons"]:
        console.print(f"likely infrastructure failures: {report['infra_failure_instances']}, ambiguous failures: "
                      f"{report['ambiguous_failure_instances']} (why: failure_reasons in report.json)")


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_1(records: list[list[RolloutRecord]]) -> tuple[float, tuple[float, float], list[float]]:
    """(pass@1, its 95% interval, each instance's resolved rate over the runs); records[run][instance]."""
    n = len(records[0]) if records else 0
    if n == 0:
        return 0.0, (0.0, 1.0), []
    rates = [sum(run[i].status == "resolved" for run in records) / len(records) for i in range(n)]
    mean = sum(rates) / n
    se = statistics.stdev(rates) / math.sqrt(n) if n > 1 else 0.0
    if se == 0.0:
        return mean, wilson(mean, n), rates
    return mean, (max(0.0, mean - Z95 * se), min(1.0, mean + Z95 * se)), rates


def _stats(values: list[int]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "max": 0.0}
    return {"mean": round(sum(values) / len(values), 2), "median": float(statistics.median(values)),
            "max": float(max(values))}


def summarize(tasks: list[Task], records: list[list[RolloutRecord]]) -> dict[str, Any]:
    """The aggregate over all runs (the part of report.json beyond swebench's keys)."""
    rate, (lo, hi), rates = pass_at_1(records)
    flat = [r for run in records for r in run]
    per_repo: dict[str, list[float]] = defaultdict(list)
    for task, r in zip(tasks, rates):
        per_repo[repo_name(task)].append(r)
    return {
        "runs": len(records),
        "instances": len(tasks),
        "pass_at_1": rate,
        "pass_at_1_ci95": [lo, hi],
        "resolved_rate_per_run": [sum(r.status == "resolved" for r in run) / len(run) if run else 0.0
                                  for run in records],
        "per_repository": {repo: {"instances": len(v), "pass_at_1": sum(v) / len(v)}
                           for repo, v in sorted(per_repo.items())},
        "status_counts": dict(Counter(r.status for r in flat)),
        "exit_reasons": dict(Counter(r.exit_reason or "no rollout" for r in flat)),
        "turns": _stats([r.turns for r in flat if r.exit_reason]),
        "tokens": _stats([r.tokens for r in flat if r.exit_reason]),
        "sampled_tokens": _stats([r.sampled_tokens for r in flat if r.exit_reason]),
    }


def report_markdown(summary: dict[str, Any], records: list[list[RolloutRecord]], ckpt: str, dataset: str) -> str:
    lo, hi = summary["pass_at_1_ci95"]
    lines = [
        "# SWE evaluation", "",
        f"- checkpoint: `{ckpt}`",
        f"- dataset: `{dataset}`, {summary['instances']} instances x {summary['runs']} run(s)",
        f"- **resolved (pass@1): {100 * summary['pass_at_1']:.1f}%**, 95% interval "
        f"[{100 * lo:.1f}%, {100 * hi:.1f}%]",
        "- the interval: p_i = share of the runs resolving instance i, pass@1 = mean(p_i) over the n instances, "
        "pass@1 +- 1.96 sd(p_i) / sqrt(n) clipped to [0, 1] (standard error clustered by instance); "
        "the Wilson interval over n when every p_i is the same",
        "- resolved per run: " + ", ".join(f"{100 * r:.1f}%" for r in summary["resolved_rate_per_run"]),
        "", "## By repository", "", "| repository | instances | pass@1 |", "| --- | ---: | ---: |",
    ]
    for repo, row in summary["per_repository"].items():
        lines.append(f"| {repo} | {row['instances']} | {100 * row['pass_at_1']:.1f}% |")
    lines += rollout_tables(summary)
    errors = [r for run in records for r in run if r.status == "error"]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- run {r.run}, `{r.instance_id}`: {r.error}" for r in errors]
    lines += ["", "Plot: `report.png`. Predictions: `predictions.jsonl` (run 0) and `run_<k>/predictions.jsonl`.", ""]
    return "\n".join(lines)


def rollout_tables(summary: dict[str, Any], status: str = "status", label=str) -> list[str]:
    """A report's markdown tables of every rollout (from `summarize`): the statuses (the column
    named `status`, each written as `label(status)`), the exit reasons, and turns and tokens per
    rollout."""
    lines = ["", "## Outcomes (all rollouts)", "", f"| {status} | rollouts |", "| --- | ---: |"]
    lines += [f"| {label(k)} | {v} |" for k, v in sorted(summary["status_counts"].items())]
    lines += ["", "| exit reason | rollouts |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(summary["exit_reasons"].items())]
    lines += ["", "## Per rollout", "", "| | mean | median | max |", "| --- | ---: | ---: | ---: |"]
    for key in ("turns", "tokens", "sampled_tokens"):
        s = summary[key]
        lines.append(f"| {key.replace('_', ' ')} | {s['mean']:g} | {s['median']:g} | {s['max']:g} |")
    return lines


def plot_report(summary: dict[str, Any], records: list[list[RolloutRecord]], path: Path) -> None:
    """Resolved by repository (bars) and the turns histogram, side by side, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    per_repo = summary["per_repository"]
    repos = list(per_repo)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.5, 0.35 * len(repos) + 1.5)))
    bars = left.barh(repos, [100 * per_repo[r]["pass_at_1"] for r in repos], color="tab:green")
    left.bar_label(bars, [f"{100 * per_repo[r]['pass_at_1']:.0f}%, n={per_repo[r]['instances']}" for r in repos],
                   padding=3, fontsize=8)
    left.set_xlim(0, 122)
    left.invert_yaxis()  # alphabetical from the top
    left.set_xlabel("resolved (pass@1, %)")
    left.set_title(f"resolved by repository: {100 * summary['pass_at_1']:.1f}% overall")
    turns = [r.turns for run in records for r in run if r.exit_reason] or [0]
    top = max(turns)
    # one bar per turn count up to 50 turns; wider bins beyond (the paper's runs reach 300)
    bins = [b - 0.5 for b in range(0, top + 2)] if top <= 50 else 50
    right.hist(turns, bins=bins, color="tab:blue", rwidth=0.85)
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("turns per rollout")
    right.set_ylabel("rollouts")
    right.set_title(f"turns ({len(turns)} rollouts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_agent_reports(records: list[list[RolloutRecord]], tasks: list[Task], out: Path, model_name: str,
                        dataset: str, console: Console) -> dict[str, Any]:
    """Predictions and swebench's run report per run (`run_<k>/`); the aggregate `report.json`
    (swebench's keys for run 0, as its own report of the top-level `predictions.jsonl` would
    have them, and `resolved_rate` = pass@1 over all runs), `report.md` and `report.png`."""
    from eval.agent_eval import write_predictions

    per_run = []
    for k, run in enumerate(records):
        write_predictions(out / f"run_{k}" / "predictions.jsonl", run, model_name)
        per_run.append(run_report(tasks, {r.instance_id: r for r in run}, [r.outcome() for r in run], out / f"run_{k}"))
        (out / f"run_{k}" / "report.json").write_text(json.dumps(per_run[-1], indent=2))
    shutil.copyfile(out / "run_0" / "predictions.jsonl", out / "predictions.jsonl")
    summary = summarize(tasks, records)
    report = {**per_run[0], **summary, "resolved_rate": summary["pass_at_1"], "per_run": per_run}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(report_markdown(summary, records, model_name, dataset))
    plot_report(summary, records, out / "report.png")
    print_summary(per_run[0], tasks, [r.outcome() for r in records[0]], console)
    lo, hi = summary["pass_at_1_ci95"]
    console.print(f"pass@1 over {summary['runs']} run(s): {100 * summary['pass_at_1']:.1f}% "
                  f"(95% interval {100 * lo:.1f}-{100 * hi:.1f}%)")
    return report
