"""Moved to `taskdata` (rows become Tasks: taskdata/load.py, taskdata/rows.py). This module
forwards the old path for one release: `python -m envs.data ...` and `_target_: envs.data.load_tasks`
in a user's config still work. It sits outside the layers on purpose (pyproject's import-linter
contracts name it)."""

from __future__ import annotations

import sys

from taskdata.__main__ import main
from taskdata.load import decontaminated, load_tasks, read_tasks
from taskdata.rows import DatasetError, read_rows, row_to_task

__all__ = ["DatasetError", "decontaminated", "load_tasks", "main", "read_rows", "read_tasks", "row_to_task"]

if __name__ == "__main__":
    sys.exit(main())
