"""Test-log parsers and verdicts that swebench's harness lacks, for the families whose own
harnesses grade another way (R2E-Gym, SWE-Next, SWE-smith's non-Python repositories).

The parsers join swebench's `PARSER_REGISTRY` under their own names, so a Task names them in
`log_parser` like any of swebench's, and `get_logs_eval` reads the log between the markers as
it does for those.

R2E-style verdicts (`Task.eval_type`):
- `expected_exact` (R2E-Gym): the parsed map equals the row's `expected_output_json`: as many
  tests, each with its expected status (a test expected to fail must still fail).
- `expected_passed` (SWE-Next): every test expected PASSED passes; the others are free.
"""

from __future__ import annotations

import re

from swebench.harness.log_parsers import PARSER_REGISTRY

EXPECTED_TYPES = ("expected_exact", "expected_passed")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SUMMARY = "short test summary info"


def _summary_lines(log: str, whole_log_fallback: bool) -> list[str] | None:
    log = _ANSI.sub("", log).replace("\r", "")
    if _SUMMARY in log:
        return log.split(_SUMMARY, 1)[1].splitlines()
    return log.splitlines() if whole_log_fallback else None


def _status(line: str) -> str | None:
    # as R2E-Gym's parser: a substring test, in this order (XPASS/XFAIL/SKIPPED lines match none)
    for status in ("PASSED", "FAILED", "ERROR"):
        if status in line:
            return status
    return None


def parse_log_r2e_gym(log: str, test_spec=None) -> dict[str, str]:
    """R2E-Gym: pytest's short summary; the key drops the file and joins the rest with "."
    (`PASSED r2e_tests/test_1.py::TestX::test_a` -> `TestX.test_a`)."""
    out: dict[str, str] = {}
    for line in _summary_lines(log, whole_log_fallback=False) or []:
        status = _status(line)
        if status is None:
            continue
        key = ".".join(line.split("::")[1:])
        if status != "PASSED":
            key = key.split(" - ")[0]
        if key:
            out[key.strip()] = status
    return out


def parse_log_swe_next(log: str, test_spec=None) -> dict[str, str]:
    """SWE-Next: as R2E-Gym, but the key keeps everything after the file's first "::"
    (`TestX::test_a`), and a log without the summary is read whole."""
    out: dict[str, str] = {}
    for line in _summary_lines(log, whole_log_fallback=True) or []:
        status, words = _status(line), line.split()
        if status is None or "::" not in line or len(words) < 2:
            continue
        # `STATUS file::test [- message]` in the summary, `file::test STATUS` elsewhere
        name = words[1] if words[0] in ("PASSED", "FAILED", "ERROR") else words[0]
        if "::" in name:
            out[name.split("::", 1)[1]] = status
    return out


PARSER_REGISTRY.setdefault("parse_log_r2e_gym", parse_log_r2e_gym)
PARSER_REGISTRY.setdefault("parse_log_swe_next", parse_log_swe_next)


def _key(k: str) -> str:
    return _ANSI.sub("", k).split(" - ")[0].strip()


def expected_verdict(eval_type: str, expected: dict[str, str], got: dict[str, str]) -> tuple[bool, dict[str, list]]:
    """Resolved or not under an R2E-style `eval_type`, and the tests that decided it
    (test -> [expected, got])."""
    expected = {_key(k): v for k, v in expected.items()}
    got = {_key(k): v for k, v in got.items() if _key(k)}
    if eval_type == "expected_exact":
        wrong = {k: [expected.get(k), got.get(k)] for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)}
        return bool(expected) and not wrong, wrong
    if eval_type == "expected_passed":
        wrong = {k: ["PASSED", got.get(k)] for k, v in expected.items() if v == "PASSED" and got.get(k) != "PASSED"}
        return any(v == "PASSED" for v in expected.values()) and not wrong, wrong
    raise ValueError(f"eval_type {eval_type!r} is not one of {EXPECTED_TYPES}")


_PERCENT = re.compile(r"\s*\[\s*\d+%\]\s*$")


def parse_log_swegym_pydantic(log: str, test_spec=None) -> dict[str, str]:
    """SWE-Gym's parser for pydantic: pytest -vv lines with colours and a `[ 10%]` progress
    tail stripped, read as `STATUS name` or `name STATUS`."""
    from swebench.harness.log_parsers.python import parse_log_pytest_v2

    clean = "\n".join(_PERCENT.sub("", _ANSI.sub("", line)) for line in log.splitlines())
    return parse_log_pytest_v2(clean, test_spec)


PARSER_REGISTRY.setdefault("parse_log_swegym_pydantic", parse_log_swegym_pydantic)
