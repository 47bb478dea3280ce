"""SWE-bench-format rows: SWE-bench itself, SWE-Gym, SWE-rebench (and SWE-bench-extra).

All three are graded by a version of swebench's harness, in the instance's image with the
repository at /testbed and conda's `testbed` environment: the test files go back to the base
commit, the test patch is applied, the test command runs over the files the test patch
names, and every FAIL_TO_PASS and PASS_TO_PASS test must pass. They differ in:

- the image each publishes: `swebench/sweb.eval.x86_64.<id, "__" -> "_1776_">`, SWE-Gym's
  `xingyaoww/sweb.eval.x86_64.<id, "__" -> "_s_">`, SWE-rebench's `swerebench/...` (or the
  row's `docker_image`); a swebench 5 row names its own `image`;
- where the test command and parser come from: a swebench 5 row carries its `eval_script`
  and `log_parser`; SWE-Gym's harness keeps a command per repository (`GYM_TEST_CMDS`, mypy
  selecting its `[case ...]`s with -k); SWE-rebench's row has `install_config.test_cmd` and
  `.log_parser`. A SWE-bench row without an eval script (swebench 4's, whose command tables
  swebench 5 no longer ships) runs `pytest -rA` over its test files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from swebench.harness.constants import NON_TEST_EXTS
from swebench.harness.log_parsers import PARSER_REGISTRY

from envs.base import Task
from taskdata.rows import DatasetError, row_to_task
from envs.swe import build_eval_script

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
LAYOUTS = {  # in detection order: a row with an install_config is SWE-rebench's before it is SWE-bench's
    "swe-rebench": {"datasets": ("nebius/swe-rebench", "nebius/swe-bench-extra"), "required": REQUIRED},
    "swe-gym": {"datasets": ("swe-gym/",), "required": REQUIRED},
    "swe-bench": {"datasets": ("swe-bench/swe-bench", "princeton-nlp/swe-bench", "swe-bench", "swebench"),
                  "required": REQUIRED},
}
# swebench's instance images: conda's `testbed` environment (miniconda in swebench's and
# SWE-Gym's images; SWE-rebench's prebuilt ones may have it under /opt/conda)
CONDA = ("for c in /opt/miniconda3 /opt/conda; do if [ -f $c/bin/activate ]; then "
         "source $c/bin/activate && conda activate testbed; break; fi; done")
# SWE-Gym's harness (swegym/harness/constants.py): its test command per repository; the test
# files of the test patch follow (mypy's: -k over its cases instead)
GYM_TEST_CMDS = {
    "getmoto/moto": "pytest -n0 -rA",
    "conan-io/conan": "pytest -n0 -rA",
    "dask/dask": "pytest -n0 -rA  --color=no",
    "project-monai/monai": "pytest -rA ",
    "pandas-dev/pandas": "pytest -rA --tb=long",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
    "python/mypy": "pytest -rA -k",
}
GYM_PARSERS = {"pydantic/pydantic": "parse_log_swegym_pydantic"}
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def detect(layout: str, row: dict[str, Any]) -> bool:
    if layout == "swe-rebench":
        return isinstance(row.get("install_config"), dict) and all(isinstance(row.get(f), str) for f in REQUIRED)
    if layout == "swe-bench":  # the last tried: its columns present (an empty one is then said as such)
        return all(f in row for f in ("instance_id", "repo", "base_commit"))
    return False  # SWE-Gym's rows look like SWE-bench's: known by the dataset's name, or layout=swe-gym


def swebench_image(instance_id: str, namespace: str = "swebench", sep: str = "_1776_") -> str:
    """An instance image as the harnesses name them: lower case, "__" replaced (Docker Hub refuses it)."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id.lower()}:latest".replace("__", sep)


def test_directives(test_patch: str) -> list[str]:
    """The files a test patch touches that hold tests (swebench's directives): not deleted,
    not data (NON_TEST_EXTS)."""
    out = []
    for block in re.split(r"(?m)^(?=diff --git )", test_patch):
        m = _DIFF_HEADER.search(block)
        if m and "\n+++ /dev/null" not in block and not any(m.group(2).endswith(ext) for ext in NON_TEST_EXTS):
            out.append(m.group(2))
    return list(dict.fromkeys(out))


def mypy_cases(test_patch: str) -> str:
    """SWE-Gym's -k expression for mypy: the `[case NAME]` headers its test patch adds."""
    cases = re.findall(r"^\+\[case ([^\]]+)\]", test_patch, re.M)
    return '"' + " or ".join(dict.fromkeys(cases)) + '"'


def to_task(layout: str, row: dict[str, Any], where: str, base_dir: Path | None) -> Task:
    task = row_to_task(row, where, base_dir, REQUIRED)
    task.layout = layout
    if task.repo_path:  # a local repository (the built-in tasks, a user's own): as it is
        return task
    directives = " ".join(test_directives(task.test_patch))
    if layout == "swe-gym":
        task.image = task.image or swebench_image(task.instance_id, "xingyaoww", "_s_")
        repo = task.repo.lower()
        cmd = GYM_TEST_CMDS.get(repo, "pytest -rA")
        task.test_cmd = f"{cmd} {mypy_cases(task.test_patch)}" if repo == "python/mypy" else f"{cmd} {directives}"
        task.log_parser = GYM_PARSERS.get(repo, "parse_log_pytest")
    elif layout == "swe-rebench":
        config = row.get("install_config") or {}
        if not isinstance(config, dict):
            raise DatasetError(f"{where}: field 'install_config' must be an object, got {type(config).__name__}")
        image = row.get("docker_image") or row.get("image_name")
        task.image = task.image or (f"{image}:latest" if image and ":" not in image.rsplit("/", 1)[-1] else image) \
            or swebench_image(task.instance_id, "swerebench")
        # the fork's loader: commands run under a UTF-8 locale
        task.test_cmd = f"LANG=C.UTF-8 LC_ALL=C.UTF-8 {config.get('test_cmd') or 'pytest -rA'} {directives}"
        task.log_parser = config.get("log_parser") or "parse_log_pytest"
    elif not task.eval_script:  # a swebench 4 row: its image by swebench's convention
        task.image = task.image or swebench_image(task.instance_id)
        task.test_cmd = task.test_cmd or (f"pytest -rA {directives}" if directives else None)
    if task.log_parser not in PARSER_REGISTRY:
        raise DatasetError(f"{where}: log parser {task.log_parser!r} is not one swebench or this project knows")
    if not task.eval_script:
        task.test_cmd = (task.test_cmd or "").strip() or None
        task.eval_script = build_eval_script(task, prelude=CONDA)
    return task
