"""Make the saved test logs of tests/test_eval_ckpt.py's grading agreement test (run once;
they are committed): for five built-in tasks, the log of the tests after the gold patch
(`<id>.gold.log.gz`) and with no fix (`<id>.nofix.log.gz`), made by envs.swe in real
sandboxes, and `expected.json`, the verdict on each log when it was made (resolved; how
many tests had each status in swebench's status map).

    .venv/bin/python tests/data/eval_logs/make_logs.py
"""

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from taskdata.load import load_tasks  # noqa: E402
from envs.swe import SWEEnv  # noqa: E402
from sandbox.pool import SandboxPool  # noqa: E402

IDS = ["inflection__smith-1bcae7b7", "isodate__smith-9f2d3d29", "more_itertools__smith-399bfa04",
       "tabulate__smith-f9b29dec", "toolz__smith-7a9655cf"]


def main() -> None:
    env, pool = SWEEnv(), SandboxPool("eval-logs", max_live=1)
    expected = {}
    try:
        for task in load_tasks("builtin", instance_ids=IDS):
            for kind, patch in (("gold", task.patch), ("nofix", "")):
                with pool.sandbox(env.image_for(task)) as sb:
                    env.reset(task, sb)
                    result = env.grade(task, sb, patch)
                name = f"{task.instance_id}.{kind}"
                (HERE / f"{name}.log.gz").write_bytes(gzip.compress(result.log.encode(), mtime=0))
                expected[name] = {"resolved": result.resolved,
                                  "statuses": {s: sum(v == s for v in result.tests_status.values())
                                               for s in sorted(set(result.tests_status.values()))}}
                print(name, expected[name])
    finally:
        pool.close()
    (HERE / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")


if __name__ == "__main__":
    main()
