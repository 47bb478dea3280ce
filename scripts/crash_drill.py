"""Crash drill: many short rollouts on real sandboxes while their worker processes are killed at
random; afterwards every rollout is done exactly once and no container is left.

    python -m scripts.crash_drill [--rollouts 1000] [--kind short|full] [--workers 4]
                                     [--kill-every 4] [--seed 0] [--quick] [--output FILE]

A rollout here is a sandbox's life without a model (the sandboxes are what is drilled). `full`:
a built-in task's workspace reset in a sandbox, its gold patch applied there as an agent's
edit would be, the diff taken, and the tests run in a fresh sandbox made ready meanwhile, as
training grades (`agent.rollout`'s grading sandbox). `short`: one sandbox, one command of
0 to 1 s, as a one-turn rollout (cheap enough for thousands on two cores). Worker
processes take rollouts one at a time; about every `--kill-every` seconds (exponentially
distributed) one busy worker, chosen at random, gets SIGKILL wherever it is (creating, running,
grading or removing a container: nothing of it can clean up) and a new worker takes its place;
its rollout is handed out again. A kill waits until a rollout was done since the last kill, so
a slow machine slows the drill but cannot stall it. A worker starting sweeps the containers of dead owners as
every sandbox pool does (`sandbox.docker.sweep`), and the drill sweeps once more at the end.

Prints and writes (JSON, last line of stdout and `--output`): rollouts done, each once; kills;
containers found orphaned (swept by new workers and the final sweep); containers left (0 is
the pass); wall seconds. Exit status 1 if a rollout is missing or done twice, a gold patch did
not resolve, or a container is left.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import uuid
from multiprocessing.connection import Connection, wait
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LABEL = "sao.sandbox"


def _worker(conn: Connection, run_id: str, kind: str) -> None:
    """Run rollouts the driver sends (a key each), answer each with its verdict; stop on None."""
    from agent.rollout import _SandboxInThread
    from taskdata.load import load_builtin_tasks
    from envs.swe import SWEEnv
    from sandbox.docker import client, sweep
    from sandbox.pool import SandboxPool

    swept = len(sweep(docker_client=client()))  # what dead workers left: a pool sweeps the same on creation
    env, pool, tasks = SWEEnv(), SandboxPool(run_id, max_live=2), load_builtin_tasks()
    conn.send(("ready", swept))
    while (key := conn.recv()) is not None:
        task = tasks[key % len(tasks)]
        if kind == "short":
            with pool.sandbox(env.image_for(task)) as sb:
                r = sb.exec(f"sleep {random.Random(key).random():.2f}; echo {key}", timeout=30)
            resolved = r.output.strip() == str(key)
            conn.send(("done", key, resolved, "" if resolved else f"exit {r.exit_code}: {r.output[-500:]}"))
            continue
        with pool.sandbox(env.image_for(task)) as sb:
            grading = _SandboxInThread(pool, env.image_for(task), lambda sb: env.reset(task, sb))
            try:
                env.reset(task, sb)
                if (failed := env._apply(sb, task.patch)) is not None:  # the agent's edit, left in the workspace
                    raise RuntimeError(f"{task.instance_id}: the gold patch did not apply in the workspace: {failed[1][-500:]}")
                patch = env.patch_of(task, sb)
                sb.close()
                grade = env.grade(task, grading.get(), patch)
            finally:
                grading.close()
        failing = [t for t, status in grade.tests_status.items() if status != "PASSED"]
        # swebench's own verdict per named test: a FAIL_TO_PASS / PASS_TO_PASS test missing from the
        # log is among its failures, as a failed one is
        named = (grade.report or {}).get("tests_status", {})
        failed = [t for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in named.get(k, {}).get("failure", [])]
        why = "" if grade.resolved else (f"{task.instance_id}: {grade.error or 'tests failed'} (patch of {len(patch)} "
                                         f"chars; not passing: {failing[:5]}; named tests graded failed: "
                                         f"{len(failed)} {failed[:5]}; log of {len(grade.log)} chars, "
                                         f"{grade.log.count(chr(10))} lines); log: {grade.log[-600:]}")
        conn.send(("done", key, grade.resolved, why))


class Drill:
    def __init__(self, rollouts: int, workers: int, kill_every: float, seed: int, kind: str = "full"):
        self.n, self.n_workers, self.kill_every, self.kind = rollouts, workers, kill_every, kind
        self.rng = random.Random(seed)
        self.run_id = f"drill-{uuid.uuid4().hex[:8]}"
        self.ctx = mp.get_context("spawn")
        self.todo = list(range(rollouts))
        self.done: dict[int, bool] = {}
        self.why_unresolved: dict[int, str] = {}  # key -> what grading said, for a gold patch that failed
        self.twice = 0
        self.kills = 0
        self.swept = 0
        self.workers: dict[Connection, tuple] = {}  # conn -> (process, key it runs or None)

    def _start_worker(self) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.run_id, self.kind), daemon=True)
        proc.start()
        child.close()
        self.workers[parent] = (proc, None)

    def _give(self, conn: Connection) -> None:
        proc, _ = self.workers[conn]
        key = self.todo.pop(0) if self.todo else None
        self.workers[conn] = (proc, key)
        if key is not None:
            conn.send(key)

    def _answer(self, conn: Connection, message: tuple) -> None:
        if message[0] == "ready":
            self.swept += message[1]
        else:
            self._record(*message[1:])
        self._give(conn)

    def _record(self, key: int, resolved: bool, why: str) -> None:
        self.twice += key in self.done
        self.done[key] = resolved
        if why:
            self.why_unresolved[key] = why

    def _kill_one(self) -> bool:
        busy = [c for c, (_, key) in self.workers.items() if key is not None]
        if not busy:
            return False
        conn = self.rng.choice(busy)
        proc, key = self.workers.pop(conn)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        self.kills += 1
        finished = False
        try:
            while conn.poll():  # it may have answered before it died
                message = conn.recv()
                finished |= message[0] == "done" and message[1] == key
                if message[0] == "done":
                    self._record(*message[1:])
        except (EOFError, OSError):
            pass
        conn.close()
        if not finished:
            self.todo.insert(0, key)  # handed out again
        self._start_worker()
        return True

    def run(self, progress: Progress | None = None) -> dict:
        t0 = time.monotonic()
        bar = progress.add_task("rollouts", total=self.n, kills=0) if progress else None
        shown = 0
        for _ in range(self.n_workers):
            self._start_worker()
        # the first kill within `kill_every` seconds, so even a short drill has one
        next_kill = time.monotonic() + min(self.rng.expovariate(1 / self.kill_every), self.kill_every)
        done_at_kill = 0
        try:
            while len(self.done) < self.n:
                # a kill waits for a rollout done since the last one: however slow the machine (a
                # worker's start and a rollout can take longer than the time between kills), the
                # drill moves on, with at most one kill per rollout done
                may_kill = self.kills == 0 or len(self.done) > done_at_kill
                timeout = max(0.0, next_kill - time.monotonic()) if may_kill else None
                for conn in wait(list(self.workers), timeout=timeout):
                    try:
                        message = conn.recv()
                    except EOFError:  # died by itself: treated as a kill
                        proc, key = self.workers.pop(conn)
                        proc.join()
                        if key is not None:
                            self.todo.insert(0, key)
                        self._start_worker()
                        continue
                    self._answer(conn, message)
                may_kill = self.kills == 0 or len(self.done) > done_at_kill
                if time.monotonic() >= next_kill and len(self.done) < self.n and may_kill:
                    if self._kill_one():
                        done_at_kill = len(self.done)
                        next_kill = time.monotonic() + self.rng.expovariate(1 / self.kill_every)
                    else:  # no worker busy yet (they are starting): the kill waits for one
                        next_kill = time.monotonic() + 0.2
                if progress:
                    progress.update(bar, completed=len(self.done), kills=self.kills)
                    if not progress.console.is_terminal and len(self.done) // 100 > shown // 100:
                        progress.console.print(f"{len(self.done)}/{self.n} rollouts, {self.kills} kills, "
                                               f"{time.monotonic() - t0:.0f} s")  # a log file gets a line now and then
                    shown = len(self.done)
        finally:
            for conn, (proc, _) in list(self.workers.items()):
                try:
                    conn.send(None)
                except OSError:
                    pass
            for proc, _ in self.workers.values():
                proc.join(60)
                if proc.is_alive():
                    proc.kill()
        return self._tally(time.monotonic() - t0)

    def _tally(self, wall_s: float) -> dict:
        from sandbox.docker import client, sweep

        c = client()
        ours = {"label": [f"{LABEL}=1", f"sao.run_id={self.run_id}"]}
        before = len(c.containers.list(all=True, filters=ours, sparse=True))
        self.swept += len(sweep(docker_client=c))  # as the next run's pool does
        left = len(c.containers.list(all=True, filters=ours, sparse=True))
        return {"kind": self.kind, "rollouts": self.n, "done": len(self.done), "done_twice": self.twice, "kills": self.kills,
                "resolved": sum(self.done.values()), "orphans_at_end": before, "orphans_swept": self.swept,
                "containers_left": left, "workers": self.n_workers, "wall_s": round(wall_s, 1),
                "why_unresolved": {str(k): v for k, v in sorted(self.why_unresolved.items())}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.crash_drill", description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=1000)
    p.add_argument("--kind", choices=["short", "full"], default="short")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--kill-every", type=float, default=4.0, help="mean seconds between kills")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="8 full rollouts, 2 workers, a kill every 3 s (for the test)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.rollouts, args.workers, args.kill_every, args.kind = 8, 2, 3.0, "full"
    console = Console(stderr=True)
    columns = [TextColumn("crash drill"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("kills {task.fields[kills]}")]
    with Progress(*columns, console=console) as progress:
        result = Drill(args.rollouts, args.workers, args.kill_every, args.seed, args.kind).run(progress)
    console.print(f"{result['done']}/{result['rollouts']} {result['kind']} rollouts done ({result['done_twice']} twice), "
                  f"{result['resolved']} resolved; {result['kills']} workers killed; {result['orphans_swept']} "
                  f"orphaned containers swept; {result['containers_left']} left; {result['wall_s']} s")
    for key, why in result["why_unresolved"].items():
        console.print(f"rollout {key} did not resolve: {why}", markup=False)
    if args.output:
        args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    ok = (result["done"] == result["rollouts"] and not result["done_twice"] and not result["containers_left"]
          and result["resolved"] == result["rollouts"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
