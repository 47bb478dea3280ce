"""The run report (swebench's keys) and the summary table printed at the end of a run."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from eval.grading import InstanceOutcome
from envs.base import Task


def run_report(tasks: list[Task], predictions: dict[str, Any], outcomes: list[InstanceOutcome]) -> dict[str, Any]:
    """swebench's run-report keys (as `make_run_report` writes them), plus error reasons and
    the resolved rate over all instances."""
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
        "empty_patch_instances": len(ids("empty_patch")),
        "error_instances": len(ids("error")),
        "completed_ids": completed,
        "incomplete_ids": ids("incomplete"),
        "empty_patch_ids": ids("empty_patch"),
        "submitted_ids": sorted(predictions),
        "resolved_ids": ids("resolved"),
        "unresolved_ids": ids("unresolved"),
        "error_ids": ids("error"),
        "error_reasons": {o.instance_id: o.error for o in outcomes if o.status == "error"},
        "resolved_rate": len(ids("resolved")) / total if total else 0.0,
        "schema_version": 2,
    }


def print_summary(report: dict[str, Any], tasks: list[Task], outcomes: list[InstanceOutcome], console: Console) -> None:
    """A per-repository table and the totals."""
    # a local repository shows as its folder name, a hub one as owner/name
    repo_of = {t.instance_id: Path(t.repo).name if t.repo_path else t.repo for t in tasks}
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
