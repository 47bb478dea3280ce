"""The dataset loader: every format, and errors that name the file, row and field."""

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from taskdata.load import load_tasks
from taskdata.rows import DatasetError


def rows_for(calc_task, n=2):
    return [replace(calc_task, instance_id=f"calc-{i}").to_row() for i in range(n)]


def test_json_jsonl_parquet_load_the_same_tasks(tmp_path, calc_task):
    rows = rows_for(calc_task)
    (tmp_path / "t.json").write_text(json.dumps(rows))
    (tmp_path / "d.json").write_text(json.dumps({r["instance_id"]: r for r in rows}))
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    loaded = [load_tasks(tmp_path / f) for f in ("t.json", "d.json", "t.jsonl", "t.parquet")]
    for tasks in loaded:
        assert [t.instance_id for t in tasks] == ["calc-0", "calc-1"]
        assert tasks[0].FAIL_TO_PASS == calc_task.FAIL_TO_PASS and tasks[0].patch == calc_task.patch
        assert tasks[0].repo_path == calc_task.repo_path  # an absolute local git repository
    # test lists may be real lists as well as JSON strings
    rows[0]["FAIL_TO_PASS"] = ["a.py::t"]
    (tmp_path / "l.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert load_tasks(tmp_path / "l.jsonl")[0].FAIL_TO_PASS == ["a.py::t"]


def test_relative_local_repo_and_remote_names(tmp_path, calc_task):
    import shutil

    shutil.copytree(calc_task.repo_path, tmp_path / "repos" / "calc")
    row = replace(calc_task, repo="./repos/calc").to_row()
    remote = replace(calc_task, instance_id="django__django-1", repo="django/django").to_row()
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(remote) + "\n")
    local, hub = load_tasks(tmp_path / "t.jsonl")
    assert local.repo_path == str((tmp_path / "repos" / "calc").resolve())
    assert hub.repo_path is None and hub.repo == "django/django"


def test_instance_ids_select_in_order(tmp_path, calc_task):
    (tmp_path / "t.json").write_text(json.dumps(rows_for(calc_task, 3)))
    tasks = load_tasks(tmp_path / "t.json", instance_ids=["calc-2", "calc-0"])
    assert [t.instance_id for t in tasks] == ["calc-2", "calc-0"]
    with pytest.raises(DatasetError, match="not in the dataset: calc-9"):
        load_tasks(tmp_path / "t.json", instance_ids=["calc-9"])


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda r: r.pop("base_commit"), r"row 1 \(calc-1\): field 'base_commit' is missing"),
        (lambda r: r.update(FAIL_TO_PASS="[not json"), r"row 1 \(calc-1\): field 'FAIL_TO_PASS' is not a JSON list"),
        (lambda r: r.update(PASS_TO_PASS=json.dumps([1, 2])), r"row 1 \(calc-1\): field 'PASS_TO_PASS' must be a list of test ids"),
        (lambda r: r.update(repo="./nowhere"), r"row 1 \(calc-1\): field 'repo' = './nowhere' -> .* is not a git repository"),
        (lambda r: r.update(instance_id="calc-0"), r"row 1: instance_id 'calc-0' repeats row 0"),
        (lambda r: r.update(patch=3), r"row 1 \(calc-1\): field 'patch' must be a string, got int"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, calc_task, change, message):
    rows = rows_for(calc_task)
    change(rows[1])
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DatasetError, match=rf"bad\.jsonl: {message}"):
        load_tasks(path)


def test_unreadable_sources(tmp_path, monkeypatch):
    (tmp_path / "broken.jsonl").write_text('{"instance_id": 1}\n{oops\n')
    with pytest.raises(DatasetError, match=r"broken\.jsonl: line 2 is not JSON"):
        load_tasks(tmp_path / "broken.jsonl")
    with pytest.raises(DatasetError, match="no such dataset file"):
        load_tasks(tmp_path / "missing.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetError, match="cannot load dataset 'no-such-org/no-such-set' split 'test'"):
        load_tasks("no-such-org/no-such-set")
