"""SWE-smith's log parsers, per test runner (its `profiles/*.py`, as of upstream 9b74ac0).

They keep swesmith's quirks on purpose (a task's FAIL_TO_PASS / PASS_TO_PASS lists were made by
them, so reading the log any other way changes which tasks resolve). They join swebench's
`PARSER_REGISTRY` as `parse_log_smith_<format>` when the SWE env is imported, so a task names its
parser and any process that grades it (a Ray rollout worker too) finds it; C reuses swebench's
`parse_log_jq` and `parse_log_redis`, which are swesmith's jq and valkey parsers line for line.
Which repository uses which parser is in taskdata/smith_profiles.py.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from swebench.harness.log_parsers import PARSER_REGISTRY

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
_STATUS = f"({FAILED}|{PASSED}|{SKIPPED}|{ERROR}|{XFAIL})"


def _first_rule(lines, rules, clean=str.strip) -> dict[str, str]:
    """Each line: the first (regex, status) rule that matches names `clean(group 1)` with its status."""
    out = {}
    for line in lines:
        for rx, status in rules:
            if m := rx.match(line):
                out[clean(m.group(1))] = status
                break
    return out


def _rules(*pairs: tuple[str, str]) -> tuple:
    return tuple((re.compile(p), s) for p, s in pairs)


# -- Python ---------------------------------------------------------------------------------------
_PYTEST_V = re.compile(rf"^(\S+)\s+{_STATUS}")
_RA_SUMMARY = re.compile(rf"^{_STATUS}\s(\S+)")
_XDIST = re.compile(rf"^\[gw\d\]\s{_STATUS}\s(\S+)")
_UNITTEST = re.compile(r"^([a-zA-Z0-9_\-,\.\s\(\)']+)\s\.{3}\s(ok|FAIL|ERROR)$")


def parse_log_smith_pytest(log: str, test_spec=None) -> dict[str, str]:
    """swesmith's Python default: `<name> STATUS` lines of `pytest --verbose`."""
    return {m.group(1): m.group(2) for line in log.split("\n") if (m := _PYTEST_V.match(line))}


def parse_log_smith_paramiko(log: str, test_spec=None) -> dict[str, str]:
    """paramiko: `STATUS <name>` lines of pytest's -rA summary (a skip reads as `[1]`, as swesmith's)."""
    return {m.group(2): m.group(1) for line in log.split("\n") if (m := _RA_SUMMARY.match(line))}


def parse_log_smith_autograd(log: str, test_spec=None) -> dict[str, str]:
    """autograd: xdist's `[gwN] STATUS <name>` lines (one-digit workers, no `[ 50%]` progress, as swesmith's)."""
    return {m.group(2): m.group(1) for line in log.split("\n") if (m := _XDIST.match(line))}


def parse_log_smith_tornado(log: str, test_spec=None) -> dict[str, str]:
    """tornado: unittest `name ... ok` / `... skipped`, and `FAIL:` / `ERROR:` headers, both FAILED."""
    out = {}
    for line in log.split("\n"):
        if line.endswith("... ok"):
            out[line.split(" ... ")[0]] = PASSED
        elif " ... skipped " in line:
            out[line.split(" ... ")[0]] = SKIPPED
        elif line.startswith(("ERROR:", "FAIL:")):
            out[" ".join(line.split()[1:3])] = FAILED
    return out


def parse_log_smith_unittest(log: str, test_spec=None) -> dict[str, str]:
    """python-slugify: unittest `name ... ok|FAIL|ERROR` lines (skips are not read)."""
    status = {"ok": PASSED, "FAIL": FAILED, "ERROR": ERROR}
    return {m.group(1): status[m.group(2)] for line in log.split("\n") if (m := _UNITTEST.match(line))}


def parse_log_smith_mypy(log: str, test_spec=None) -> dict[str, str]:
    """mypy: any line containing PASSED (else FAILED) names its last word."""
    out = {}
    for line in log.split("\n"):
        status = next((s for s in (PASSED, FAILED) if s in line), None)
        if status:
            out[line.split()[-1]] = status
    return out


# -- Go, Rust -------------------------------------------------------------------------------------
_GO = _rules((r"--- PASS: (\S+)", PASSED), (r"--- FAIL: (\S+)", FAILED), (r"FAIL:?\s?(.+?)\s", FAILED),
             (r"--- SKIP: (\S+)", SKIPPED))


def parse_log_smith_go(log: str, test_spec=None) -> dict[str, str]:
    """`go test -v`: `--- PASS/FAIL/SKIP: name` (subtests as `TestX/sub`); `FAIL\\t<pkg>` names the package."""
    return _first_rule((line.strip() for line in log.split("\n")), _GO, clean=lambda s: s)


def parse_log_smith_cargo(log: str, test_spec=None) -> dict[str, str]:
    """`cargo test`: `test <name> ... ok|FAILED`, the name being all before the last ` ... ` (doc tests too)."""
    out = {}
    for line in log.splitlines():
        line = line.removeprefix("test ")
        if "... ok" in line:
            out[line.rsplit(" ... ", 1)[0].strip()] = PASSED
        elif "... FAILED" in line:
            out[line.rsplit(" ... ", 1)[0].strip()] = FAILED
    return out


# -- JavaScript / TypeScript ----------------------------------------------------------------------
_MS = r"(?:\s\(\d+\s*m?s\))?$"
_JEST = _rules((rf"^\s*✓\s(.+?){_MS}", PASSED), (rf"^\s*✕\s(.+?){_MS}", FAILED), (rf"^\s*○\s(.+?){_MS}", SKIPPED))
_MOCHA = _rules((rf"^\s*[✓✔]\s(.+?){_MS}", PASSED), (rf"^\s*✖\s(.+?){_MS}", FAILED),
                (rf"^\s*-\s(.+?){_MS}", SKIPPED), (r"^\s*\d+\)\s+(.+?)(?:\s\((\d+\s*m?s)\))?$", FAILED))
_VITEST = _rules((r"^✓\s+(.+?)(?:\s+\([\.\d]+ms\))?$", PASSED), (r"^❯\s+(.+?)(?:\s+\(.*?\))?$", FAILED),
                 (r"^✗\s+(.+?)(?:\s+\([\.\d]+ms\))?$", FAILED), (r"^○\s+(.+?)(?:\s+\([\.\d]+ms\))?$", SKIPPED),
                 (r"^✓\s+(.+?)$", PASSED), (r"^✗\s+(.+?)$", FAILED), (r"^○\s+(.+?)$", SKIPPED))
_REACT_PDF = _rules((r"^\s*✓\s(.*)\s\d+ms", PASSED), (r"^\s*✗\s(.*)\s\d+ms", FAILED), (r"^\s*✖\s(.*)", FAILED),
                    (r"^\s*✓\s(.*)", PASSED))
_MARKED = _rules((r"^\s*✖\s(.*?)\s\([\.\d]+ms\)", FAILED), (r"^\s*✔\s(.*?)\s\([\.\d]+ms\)", PASSED))


def parse_log_smith_jest(log: str, test_spec=None) -> dict[str, str]:
    """jest --verbose: `✓|✕|○ name (N ms)` (a skip keeps jest's `skipped ` prefix in its name)."""
    return _first_rule((line.strip() for line in log.split("\n")), _JEST, clean=lambda s: s)


def parse_log_smith_mocha(log: str, test_spec=None) -> dict[str, str]:
    """mocha spec: `✓|✔` pass, `✖` fail, `- ` pending, and any `N) text` line FAILED (failure headers too)."""
    return _first_rule((line.strip() for line in log.split("\n")), _MOCHA, clean=lambda s: s)


def parse_log_smith_vitest(log: str, test_spec=None) -> dict[str, str]:
    """vitest: `✓` / `❯` / `✗` / `○` lines, the name cut before its first `(`: mostly test files."""
    return _first_rule((line.strip() for line in log.split("\n")), _VITEST, clean=lambda s: s.split("(")[0].strip())


def parse_log_smith_react_pdf(log: str, test_spec=None) -> dict[str, str]:
    """react-pdf (vitest verbose): `✓ name Nms` passes, `✗`/`✖` fail; vitest's own `×` is not read."""
    return _first_rule(log.split("\n"), _REACT_PDF)


def parse_log_smith_marked(log: str, test_spec=None) -> dict[str, str]:
    """marked (`node --test` spec reporter): `✔ name (Nms)` / `✖ name (Nms)`, suites included."""
    return _first_rule(log.split("\n"), _MARKED)


# -- Java -----------------------------------------------------------------------------------------
_SUREFIRE = re.compile(r"^\[(INFO|ERROR)\]\s+(.*?)\s+--\s+Time elapsed:\s+([\d.]+)\s")
_SUREFIRE_OLD = re.compile(r"^([a-zA-Z0-9_]+)\(([a-zA-Z0-9_.]+)\)\s+Time elapsed:\s+([\d.]+)\s+sec")
_JUNIT_XML = re.compile(r"<\?xml version.*?</testsuite>", re.DOTALL)


def parse_log_smith_maven(log: str, test_spec=None) -> dict[str, str]:
    """Surefire plain report: `[INFO] name -- Time elapsed` PASSED, `[ERROR] ... <<< FAILURE!` FAILED;
    as swesmith's, `<<< ERROR!` and old-style `method(Class)  Time elapsed` lines read PASSED."""
    out = {}
    for line in log.split("\n"):
        line = line.strip()
        if line.startswith("["):
            failed = line.startswith("[ERROR]") and line.endswith("<<< FAILURE!")
            if (failed or "Time elapsed:" in line) and (m := _SUREFIRE.match(line)):
                out[m.group(2)] = FAILED if failed else PASSED
        elif "Time elapsed:" in line and "(" in line and (m := _SUREFIRE_OLD.match(line)):
            out[f"{m.group(2)}.{m.group(1)}"] = PASSED
    return out


def parse_log_smith_gradle(log: str, test_spec=None) -> dict[str, str]:
    """Gradle: the JUnit XML reports cat'ed after the run; `classname.name`, failure/error FAILED."""
    out = {}
    for block in _JUNIT_XML.findall(log):
        try:
            suite = ET.fromstring(block)
        except ET.ParseError:
            continue
        for case in suite.iter("testcase"):
            name = f"{case.get('classname', suite.get('name', ''))}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                out[name] = FAILED
            else:
                out[name] = SKIPPED if case.find("skipped") is not None else PASSED
    return out


# -- C++, PHP -------------------------------------------------------------------------------------
_CTEST = re.compile(r"\s*\d+/\d+\s+Test\s+#\d+:\s+([\w\-/.]+)\s+\.+\s+(Passed|Failed)", re.IGNORECASE)
_CTEST_FAILED = re.compile(r"The following tests FAILED:\n((?:\s+\d+\s+-\s+[\w\-/.]+.*\n?)+)")
_CTEST_SUMMARY = re.compile(r"(\d+)%\s+tests\s+passed,\s+(\d+)\s+tests\s+failed\s+out\s+of\s+(\d+)", re.IGNORECASE)


def parse_log_smith_ctest(log: str, test_spec=None) -> dict[str, str]:
    """ctest: `k/n Test #k: name .... Passed` lines, then the `tests FAILED:` list; with neither,
    `synthetic_pass_i` / `synthetic_fail_i` from the summary (`***Failed` lines match no pattern)."""
    out = {m.group(1): PASSED if m.group(2).lower() == "passed" else FAILED for m in _CTEST.finditer(log)}
    if section := _CTEST_FAILED.search(log):
        for line in section.group(1).splitlines():
            if m := re.search(r"\d+\s+-\s+([\w\-/.]+)", line):
                out[m.group(1)] = FAILED
    if not out and (m := _CTEST_SUMMARY.search(log)):
        total, failed = int(m.group(3)), int(m.group(2))
        out = {f"synthetic_pass_{i}": PASSED for i in range(total - failed)}
        out |= {f"synthetic_fail_{i}": FAILED for i in range(failed)}
    return out


_TESTDOX_CLASS = re.compile(r"^.+\((.+)\)\s*$")
_TESTDOX = _rules((r"^\s*✔\s*(.+)$", PASSED), (r"^\s*✘\s*(.+)$", FAILED), (r"^\s*↩\s*(.+)$", SKIPPED))


def parse_log_smith_phpunit(log: str, test_spec=None) -> dict[str, str]:
    """phpunit --testdox: `Title (FQCN)` headers, then `✔|✘|↩ text` named `FQCN::text` (any line
    ending in `(...)` counts as a header, as swesmith's)."""
    out, current = {}, None
    for line in log.split("\n"):
        if m := _TESTDOX_CLASS.match(line):
            current = m.group(1).strip()
            continue
        for name, status in _first_rule([line], _TESTDOX).items():
            out[f"{current}::{name}" if current else name] = status
    return out


PARSERS = {f.__name__: f for f in (
    parse_log_smith_pytest, parse_log_smith_paramiko, parse_log_smith_autograd, parse_log_smith_tornado,
    parse_log_smith_unittest, parse_log_smith_mypy, parse_log_smith_go, parse_log_smith_cargo, parse_log_smith_jest,
    parse_log_smith_mocha, parse_log_smith_vitest, parse_log_smith_react_pdf, parse_log_smith_marked,
    parse_log_smith_maven, parse_log_smith_gradle, parse_log_smith_ctest, parse_log_smith_phpunit,
)}
for _name, _fn in PARSERS.items():
    PARSER_REGISTRY.setdefault(_name, _fn)
