"""`python -m taskdata --dataset NAME|FILE [--split S] [--layout L] [--decontaminate SET] --check`

Loads every row of a SWE dataset and reports the rows it cannot map, repeated instance ids, the
rows per repository, the images missing on the local Docker engine, and (with --decontaminate)
the rows an eval set would drop; exit code 1 when anything is amiss, 2 on a dataset error.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import docker
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envs.base import Task
from envs.swe import SWEEnv
from sandbox.docker import DEFAULT_IMAGE, client
from taskdata.load import where_of, decontaminated, layouts, read_tasks
from taskdata.rows import DatasetError


def check(source: str, split: str, layout: str | None, decontaminate: str | None, console) -> int:
    """`--check`: map every row (a progress bar), then say the rows that cannot be mapped, the
    images the local Docker engine lacks, the rows per repository; 1 when anything is amiss."""
    errors: list[str] = []
    with Progress(TextColumn("mapping rows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bar = progress.add_task("rows", total=None)
        tasks, lay = read_tasks(source, split, layout, errors,
                                progress=lambda done, total: progress.update(bar, completed=done, total=total))
    where = where_of(source, split)
    console.print(f"{where}: layout [bold]{lay}[/bold], {len(tasks) + len(errors)} rows, {len(tasks)} mapped, "
                  f"{len(errors)} cannot be")
    for e in errors[:20]:
        console.print(f"  [red]x[/red] {e}", soft_wrap=True, markup=False, highlight=False)
    if len(errors) > 20:
        console.print(f"  ... and {len(errors) - 20} more")
    ids = Counter(t.instance_id for t in tasks)
    repeated = [i for i, n in ids.items() if n > 1]
    if repeated:
        console.print(f"[red]{len(repeated)} instance id(s) repeat[/red]: {', '.join(repeated[:10])}")
    per_repo = Counter(t.repo for t in tasks)
    table = Table("repository", "rows", title=f"rows per repository ({len(per_repo)})")
    for repo, n in per_repo.most_common(30):
        table.add_row(repo, str(n))
    if len(per_repo) > 30:
        table.add_row(f"... {len(per_repo) - 30} more", str(sum(n for _, n in per_repo.most_common()[30:])))
    console.print(table)
    _canaries(tasks, console)
    missing = _missing_images(tasks, SWEEnv(), console)
    dropped = 0
    if decontaminate:
        _, gone = decontaminated(tasks, decontaminate)
        dropped = len(gone)
        console.print(f"decontamination against {decontaminate}: {dropped} row(s) would be dropped"
                      + (f" (first: {', '.join(t.instance_id for t in gone[:5])})" if gone else ""))
    return 1 if errors or repeated or missing else 0


def canary_support_of(tasks: list[Task]) -> Counter:
    """Each task's canary support (envs/canary.py): `ok`, or what stops a canary."""
    from envs.canary import canary_support
    from envs.swe import test_spec_for

    support: Counter = Counter()
    for t in tasks:
        try:
            support[canary_support(test_spec_for(t).eval_script, t.log_parser)] += 1
        except ValueError as e:  # no eval script to read (an unknown parser): said with the rest
            support[f"unsupported ({e})"] += 1
    return support


def _canaries(tasks: list[Task], console) -> None:
    """How many tasks take canary tests when graded, and why the others cannot."""
    support = canary_support_of(tasks)
    console.print(f"canary tests: {support.pop('ok', 0)} of {len(tasks)} tasks"
                  + ("; " + ", ".join(f"{n} {why}" for why, n in support.most_common()) if support else ""))


def _missing_images(tasks: list[Task], env, console) -> int:
    """The images the tasks run in that the local Docker engine lacks, said with how to get them."""
    images = Counter(env.image_for(t) for t in tasks)
    try:
        api = client()
        local = {tag for image in api.images.list() for tag in image.tags}
    except (docker.errors.DockerException, OSError) as e:
        console.print(f"[yellow]images not checked[/yellow]: no Docker engine answers ({e})")
        return 0
    absent = [i for i in images if i not in local and f"{i}:latest" not in local]
    console.print(f"images: {len(images)} distinct, {len(images) - len(absent)} on this Docker engine, {len(absent)} missing")
    for image in absent[:20]:
        how = "python -m sandbox.images" if image == DEFAULT_IMAGE else f"docker pull {image}"
        console.print(f"  [red]missing[/red] {image} ({images[image]} rows): {how}", markup=True, highlight=False)
    if len(absent) > 20:
        console.print(f"  ... and {len(absent) - 20} more")
    if absent and DEFAULT_IMAGE not in absent:
        console.print("  Pull them where a registry is reachable (or `docker save` there and `docker load` here).")
    return len(absent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskdata", description="Load a SWE dataset and check it can train.")
    p.add_argument("--dataset", required=True, help="a hub name, a .json/.jsonl/.parquet file, or builtin")
    p.add_argument("--split", default="train")
    p.add_argument("--layout", default=None, help=f"force a layout (default: by the name, else the fields): "
                                                  f"{', '.join(layouts())}")
    p.add_argument("--decontaminate", default=None, help="an eval set (name or file): say how many rows it drops")
    p.add_argument("--check", action="store_true", help="map every row, find the images, count per repository")
    args = p.parse_args(argv)
    console = Console(stderr=True, soft_wrap=True)  # long ids and image names on one line each
    if not args.check:
        p.error("nothing to do: add --check")
    try:
        return check(args.dataset, args.split, args.layout, args.decontaminate, console)
    except DatasetError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
