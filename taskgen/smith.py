"""SWE-smith-style task generation: inject bugs into a local git repository, keep the ones its
own tests catch, and write them as SWE-bench rows.

    python -m taskgen.smith --repo PATH --out FILE.jsonl [--src-dir pkg] [--test-cmd CMD]
                         [--max-tasks N] [--seed S]

The story: run the full suite at the clean commit (HEAD) in a sandbox, twice, and keep the
tests that pass both times; enumerate AST mutations of the non-test source files; try them in
a seeded order that spreads over files and functions; keep a mutation when 1..max_fail of the
passing tests fail and some still pass; commit it as the task's buggy base commit (fixed
author, committer and dates, so the hash is reproducible) under `refs/tasks/<instance_id>`;
the gold patch undoes it. Every task is then graded with `SWEEnv` from a fresh reset (gold
resolves, empty patch does not) before it is written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.progress import Progress
from swebench.harness.log_parsers.python import parse_log_pytest

from envs.base import Task
from envs.swe import SWEEnv
from sandbox.docker import DockerSandbox
from taskgen.git import FIXED_DATE, bug_message, commit_file, diff, git
from taskgen.mutations import Mutation, mutations, spread

DEFAULT_TEST_CMD = "python3 -m pytest -rA --tb=short -p no:cacheprovider"
_FAILED = ("FAILED", "ERROR")


def is_test_path(path: str) -> bool:
    """Test modules and their helpers: never mutated, and reset by the grader."""
    p = PurePosixPath(path)
    return (p.name.startswith("test_") or p.name.endswith("_test.py") or p.name == "conftest.py"
            or any(part in ("tests", "test", "testing") for part in p.parts[:-1]))


def source_files(repo: Path, commit: str, src_dirs: list[str]) -> list[str]:
    """Non-test `.py` files of `commit` under `src_dirs` (all of them when empty), sorted."""
    names = git(repo, "ls-tree", "-r", "--name-only", commit).splitlines()
    picked = [n for n in names if n.endswith(".py") and not is_test_path(n)
              and (not src_dirs or any(n == d or n.startswith(d.rstrip("/") + "/") for d in src_dirs))]
    return sorted(picked)


# -- running the tests in a sandbox ------------------------------------------------------------
@dataclass
class TestRun:
    status: dict[str, str]  # test id -> PASSED / FAILED / ERROR / SKIPPED ...
    log: str
    timed_out: bool
    duration_s: float


def run_tests(sb: DockerSandbox, test_cmd: str, timeout: float) -> TestRun:
    r = sb.exec(test_cmd, timeout=timeout, output_limit=8_000_000)
    return TestRun(parse_log_pytest(r.output, None), r.output, r.timed_out or r.oom_killed, r.duration_s)


def collected_ids(sb: DockerSandbox, test_cmd: str, timeout: float) -> set[str]:
    """The node ids pytest collects; a parsed id missing here was cut at a space by the parser."""
    r = sb.exec(f"{test_cmd} --collect-only -q", timeout=timeout, output_limit=8_000_000)
    return {line.strip() for line in r.output.splitlines() if "::" in line}


def open_workspace(repo: Path, run_id: str) -> DockerSandbox:
    """A sandbox holding the repository at its HEAD in the workdir (caller closes it)."""
    sb = DockerSandbox(run_id=run_id)
    try:
        sb.copy_in(repo, sb.workdir)
        r = sb.exec("git checkout -q -f HEAD && git clean -fdxq", timeout=120)
        if not r.ok:
            raise RuntimeError(f"cannot check out HEAD of {repo} in the sandbox: {r.output[-500:]}")
    except BaseException:
        sb.close()
        raise
    return sb


# -- the problem statement ---------------------------------------------------------------------
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
# an object address, whole (" at 0x7f3a...") or cut short by pytest's repr ("....x7f3a...")
_ADDRESS = re.compile(r"(?<![0-9A-Za-z])0?x[0-9a-fA-F]{6,}\b")
_FRAME = re.compile(r"^(\S+\.py):\d+: in \S+")


def failure_sections(log: str) -> dict[str, list[str]]:
    """pytest's `--tb=short` FAILURES / ERRORS blocks, keyed by their header (`Class.test[id]`)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in log.splitlines():
        if line.startswith("=" * 5):
            current = None
            continue
        m = _SECTION.match(line)
        if m:
            current = sections.setdefault(m.group(1).removeprefix("ERROR at setup of "), [])
        elif current is not None:
            current.append(line)
    return sections


def describe_failure(lines: list[str], hidden: str, max_lines: int = 14) -> list[str]:
    """What a failure shows a user: the test's own frames, the `E` lines and captured output.
    Frames in non-test files are dropped (they would point at the bug); so is any line naming
    the mutated file `hidden`."""
    keep: list[str] = []
    in_test_frame = captured = False
    for line in lines:
        frame = _FRAME.match(line)
        if line.startswith("-" * 5) and "Captured" in line:
            captured = True
            keep.append("--- " + line.strip("- ").lower() + " ---")
        elif captured:
            keep.append(line)
        elif frame:
            in_test_frame = is_test_path(frame.group(1))
            keep += [line] if in_test_frame else []
        elif line.startswith("E ") or (in_test_frame and line.startswith("    ")):
            keep.append(line)
    # object addresses change from run to run; the statement should not
    keep = [_ADDRESS.sub("0x...", ln[:240]) for ln in keep if hidden not in ln and ln.strip()]
    return keep[:max_lines] + (["    ..."] if len(keep) > max_lines else [])


def problem_statement(failing: list[str], passing_after: int, log: str, hidden: str, show: int = 3) -> str:
    """A bug report written from the failing tests' output only: names, assertions, values."""
    sections = failure_sections(log)
    out = [f"Some behaviour of this library is broken: {len(failing)} test(s) fail, while the other "
           f"{passing_after} tests of the suite still pass.", "", "Failing tests:"]
    out += [f"- {t}" for t in failing[:10]] + ([f"- ... and {len(failing) - 10} more"] if len(failing) > 10 else [])
    shown = 0
    for test in failing:
        key = test.split("::", 1)[-1].replace("::", ".")
        body = describe_failure(sections.get(key, []), hidden)
        if not body or shown == show:
            continue
        out += ["", f"`{test}` reports:", "```", *body, "```"]
        shown += 1
    out += ["", "Fix the library so that these tests pass, without changing the tests."]
    return "\n".join(out) + "\n"


# -- the generator -----------------------------------------------------------------------------
@dataclass
class Config:
    """What `generate` needs; the CLI flags map onto it one to one."""

    repo: Path
    out: Path
    src_dirs: tuple[str, ...] = ()
    test_cmd: str | None = None  # None: pytest -rA over the whole suite; grading then runs the test files
    max_tasks: int = 10
    seed: int = 0
    max_fail: int = 25  # a bug that fails more tests than this is too blunt to be a task
    max_tries: int | None = None  # None: 20 candidates per wanted task
    workers: int = 2
    project: str | None = None  # the instance_id prefix; default: the repository's folder name
    version: str = ""
    run_id: str = "smith"


@dataclass
class Outcome:
    mutation: Mutation
    reason: str  # "kept", or why the mutation was rejected
    task: Task | None = None


def generate(cfg: Config, console: Console | None = None) -> list[Task]:
    """Up to `cfg.max_tasks` validated tasks from `cfg.repo`'s HEAD (deterministic given the seed),
    each with its buggy commit stored under `refs/tasks/<instance_id>` in that repository."""
    console = console or Console(stderr=True)
    repo = cfg.repo.resolve()
    head = git(repo, "rev-parse", "HEAD").strip()
    project = cfg.project or repo.name
    files = source_files(repo, head, list(cfg.src_dirs))
    if not files:
        raise SystemExit(f"error: no non-test .py files under {list(cfg.src_dirs) or 'the repository'} in {repo}")
    texts = {f: git(repo, "show", f"{head}:{f}") for f in files}
    candidates = spread([m for f in files for m in _safe_mutations(f, texts[f], console)], cfg.seed)
    tries = candidates[: cfg.max_tries or 20 * cfg.max_tasks]
    console.print(f"[bold]{project}[/]: {len(files)} source files, {len(candidates)} candidate bugs, trying up to {len(tries)}")
    test_cmd = cfg.test_cmd or DEFAULT_TEST_CMD

    workspaces = [open_workspace(repo, cfg.run_id) for _ in range(max(1, cfg.workers))]
    try:
        passing, timeout = _baseline(workspaces[0], test_cmd, set(files))
        console.print(f"baseline: {len(passing)} tests pass twice at {head[:10]} (test timeout {timeout:.0f}s)")
        ctx = dict(cfg=cfg, repo=repo, head=head, project=project, texts=texts, passing=passing,
                   timeout=timeout, test_cmd=test_cmd)
        outcomes = _try_all(tries, workspaces, ctx, console)
    finally:
        for sb in workspaces:
            sb.close()
    tasks, seen = [], set()
    for o in outcomes:
        if o.task is not None and len(tasks) < cfg.max_tasks and tuple(o.task.FAIL_TO_PASS) not in seen:
            seen.add(tuple(o.task.FAIL_TO_PASS))
            tasks.append(o.task)
        elif o.task is not None:
            o.reason = "duplicate or surplus"
            git(repo, "update-ref", "-d", f"refs/tasks/{o.task.instance_id}")
    _summary(console, project, outcomes, tasks)
    return tasks


def _safe_mutations(path: str, text: str, console: Console) -> list[Mutation]:
    try:
        return mutations(path, text)
    except (SyntaxError, ValueError, tokenize.TokenError) as e:  # a file this Python cannot parse
        console.print(f"[yellow]skipping {path}: {e}[/]")
        return []


def _baseline(sb: DockerSandbox, test_cmd: str, sources: set[str]) -> tuple[list[str], float]:
    """Tests that pass in two clean runs (flaky ones drop out), and the timeout for a run.
    Ids the log parser cut at a space, and doctests of source files (the grader would reset
    those files), are left out."""
    first = run_tests(sb, test_cmd, 600)
    second = run_tests(sb, test_cmd, 600)
    ids = collected_ids(sb, test_cmd, 600)
    passing = sorted(t for t, s in first.status.items() if s == "PASSED" and second.status.get(t) == "PASSED"
                     and t in ids and t.split("::", 1)[0] not in sources)
    if not passing:
        raise SystemExit(f"error: no test passes at the clean commit with `{test_cmd}`:\n{first.log[-3000:]}")
    return passing, max(30.0, 5 * max(first.duration_s, second.duration_s) + 10)


def _try_all(tries: list[Mutation], workspaces: list[DockerSandbox], ctx: dict, console: Console) -> list[Outcome]:
    """Try candidates in order, a chunk at a time over the workspaces, until enough are kept.
    The kept set is the first `max_tasks` by candidate order, so it does not depend on timing."""
    from concurrent.futures import ThreadPoolExecutor

    want, outcomes = ctx["cfg"].max_tasks, []
    with Progress(console=console, transient=False) as bar, ThreadPoolExecutor(len(workspaces)) as pool:
        job = bar.add_task(f"{ctx['project']}: 0 kept", total=len(tries))
        for i in range(0, len(tries), len(workspaces)):
            chunk = tries[i : i + len(workspaces)]
            outcomes += list(pool.map(lambda a: _try_one(a[1], workspaces[a[0]], ctx), enumerate(chunk)))
            kept = len({tuple(o.task.FAIL_TO_PASS) for o in outcomes if o.task})
            bar.update(job, advance=len(chunk), description=f"{ctx['project']}: {kept} kept")
            if kept >= want:
                break
    return outcomes


def _try_one(m: Mutation, sb: DockerSandbox, ctx: dict) -> Outcome:
    """Run the suite with `m` applied; on a useful failure pattern, commit it and validate it."""
    cfg, passing = ctx["cfg"], ctx["passing"]
    sb.write_file(m.path, m.apply(ctx["texts"][m.path]))
    run = run_tests(sb, ctx["test_cmd"], ctx["timeout"])
    sb.exec(f"git checkout -q HEAD -- {shlex.quote(m.path)} && git clean -fdq", timeout=60)
    if run.timed_out:
        return Outcome(m, "timeout")
    if any(t not in run.status for t in passing):
        return Outcome(m, "breaks collection")
    failing = [t for t in passing if run.status[t] in _FAILED]
    still = [t for t in passing if run.status[t] == "PASSED"]
    if not failing:
        return Outcome(m, "survived")
    if len(failing) > cfg.max_fail or not still:
        return Outcome(m, "fails too many")
    instance_id = f"{ctx['project']}__smith-{m.key}"
    buggy = commit_file(ctx["repo"], ctx["head"], m.path, m.apply(ctx["texts"][m.path]), bug_message(instance_id))
    git(ctx["repo"], "update-ref", f"refs/tasks/{instance_id}", buggy)
    # relative to the dataset file when the repository lies below it, as data.py resolves it
    rel = os.path.relpath(ctx["repo"], cfg.out.resolve().parent)
    task = Task(
        instance_id=instance_id, repo=str(ctx["repo"]) if rel.startswith("..") else f"./{rel}", base_commit=buggy,
        problem_statement=problem_statement(failing, len(still), run.log, m.path),
        patch=diff(ctx["repo"], buggy, ctx["head"]), FAIL_TO_PASS=failing, PASS_TO_PASS=still,
        version=cfg.version, environment_setup_commit=ctx["head"], created_at=FIXED_DATE,
        test_cmd=cfg.test_cmd, repo_path=str(ctx["repo"]), extra={"mutation_kind": m.kind},
    )
    if not validate(task, cfg.run_id):
        git(ctx["repo"], "update-ref", "-d", f"refs/tasks/{instance_id}")
        return Outcome(m, "failed validation")
    return Outcome(m, "kept", task)


def validate(task: Task, run_id: str = "smith") -> bool:
    """Grade from a fresh reset, as training will: the gold patch resolves, an empty one does not."""
    env = SWEEnv(test_timeout_s=300)
    with DockerSandbox(run_id=run_id) as sb:
        env.reset(task, sb)
        gold = env.grade(task, sb, task.patch)
        empty = env.grade(task, sb, "")
    return gold.resolved and not empty.resolved


def _summary(console: Console, project: str, outcomes: list[Outcome], tasks: list[Task]) -> None:
    from rich.table import Table

    table = Table(title=f"{project}: {len(tasks)} tasks from {len(outcomes)} tried bugs")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for reason, n in Counter(o.reason for o in outcomes).most_common():
        table.add_row(reason, str(n))
    kinds = Counter(t.extra["mutation_kind"] for t in tasks)
    table.add_row("[dim]kept, by kind[/]", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    console.print(table)


def write_jsonl(tasks: list[Task], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for t in tasks:
            f.write(json.dumps(t.to_row(), sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m taskgen.smith", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="a local git repository (its HEAD is the clean commit)")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL file to write (SWE-bench rows)")
    ap.add_argument("--src-dir", action="append", default=[], help="mutate only files under this folder (repeatable)")
    ap.add_argument("--test-cmd", help=f"the command that runs the suite with -rA (default: {DEFAULT_TEST_CMD})")
    ap.add_argument("--max-tasks", type=int, default=10)
    ap.add_argument("--max-tries", type=int)
    ap.add_argument("--max-fail", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--project", help="the instance_id prefix (default: the repository's folder name)")
    ap.add_argument("--version", default="")
    a = ap.parse_args(argv)
    if not (a.repo / ".git").exists():
        ap.error(f"--repo {a.repo} is not a git repository")
    start = time.monotonic()
    cfg = Config(a.repo, a.out, tuple(a.src_dir), a.test_cmd, a.max_tasks, a.seed, a.max_fail, a.max_tries,
                 a.workers, a.project, a.version)
    tasks = generate(cfg)
    write_jsonl(tasks, a.out)
    Console(stderr=True).print(f"wrote {len(tasks)} tasks to {a.out} in {time.monotonic() - start:.0f}s")
    return 0 if tasks else 1


if __name__ == "__main__":
    sys.exit(main())
