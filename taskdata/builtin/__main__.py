"""`python -m taskdata.builtin`: build the suite's git repositories (checking every base commit).
`--regenerate` makes `tasks.jsonl` anew with `taskgen.smith` (a few minutes, Docker needed)."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.progress import Progress

from taskdata.builtin import DATASET, PROJECTS, REPOS, build_repo, ensure_repos, read_rows
from taskgen import smith


def regenerate(per_project: int, seed: int, workers: int, console: Console) -> None:
    """Generate `per_project` validated tasks for each project of `PROJECTS`, write DATASET,
    then rebuild every repository from scratch to prove the base commits reproduce."""
    tasks = []
    for project, spec in PROJECTS.items():
        repo = REPOS / project
        build_repo(project, [], repo, force=True)  # the clean initial commit only
        cfg = smith.Config(repo=repo, out=DATASET, src_dirs=spec["src_dirs"], max_tasks=per_project, seed=seed,
                           workers=workers, project=project, version=spec["version"], run_id="smith-builtin")
        tasks += smith.generate(cfg, console)
    smith.write_jsonl(tasks, DATASET)
    ensure_repos(force=True)
    console.print(f"wrote {len(tasks)} tasks to {DATASET}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taskdata.builtin", description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even the repositories that look up to date")
    ap.add_argument("--regenerate", action="store_true", help="make tasks.jsonl anew (needs Docker)")
    ap.add_argument("--per-project", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    console = Console(stderr=True)
    start = time.monotonic()
    if a.regenerate:
        regenerate(a.per_project, a.seed, a.workers, console)
    else:
        with Progress(console=console) as bar:
            job = bar.add_task("building repositories", total=len(PROJECTS))
            ensure_repos(force=a.force, on_project=lambda p: bar.update(job, advance=1, description=f"building {p}"))
        console.print(f"{len(read_rows())} tasks, repositories under {REPOS}")
    console.print(f"done in {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
