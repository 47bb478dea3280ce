"""SWE-smith's profiles as taskdata/smith_profiles.py has them: every log parser on a log shaped as its
tool prints it (noise lines included; the expected maps keep swesmith's quirks, which the comments
name), the profile table, the dataset language, and the test-file scripts run by bash on small trees."""

import subprocess
from pathlib import Path

import pytest
from swebench.harness.log_parsers import PARSER_REGISTRY

import envs.smith_parsers as parsers
import taskdata.smith_profiles as sp

P, F, S, E, X = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"


def parse(name: str, log: str) -> dict[str, str]:
    """Parse through swebench's registry, as grading does."""
    return PARSER_REGISTRY[name](log, None)


# -- Python ---------------------------------------------------------------------------------------
PYTEST_V = """\
============================= test session starts ==============================
platform linux -- Python 3.10.16, pytest-8.3.4, pluggy-1.5.0 -- /opt/miniconda3/envs/testbed/bin/python
cachedir: .pytest_cache
rootdir: /testbed
configfile: pyproject.toml
collecting ... collected 5 items

tests/test_routing.py::test_router PASSED                                [ 20%]
tests/test_routing.py::test_url_path_for[http] FAILED                    [ 40%]
tests/test_routing.py::test_mount_urls SKIPPED (needs httpx)             [ 60%]
tests/test_routing.py::test_known_bug XFAIL (issue 12)                   [ 80%]
tests/test_routing.py::test_raises ERROR                                 [100%]

=========================== short test summary info ============================
FAILED tests/test_routing.py::test_url_path_for[http] - AssertionError: assert '/a' == '/b'
ERROR tests/test_routing.py::test_raises - RuntimeError: boom
============= 1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error in 0.12s ==============
"""


def test_pytest_verbose():
    assert parse("parse_log_smith_pytest", PYTEST_V) == {
        "tests/test_routing.py::test_router": P,
        "tests/test_routing.py::test_url_path_for[http]": F,
        "tests/test_routing.py::test_mount_urls": S,
        "tests/test_routing.py::test_known_bug": X,
        "tests/test_routing.py::test_raises": E,
    }


PYTEST_RA = """\
tests/test_client.py ..F.s                                               [ 55%]
tests/test_transport.py ....                                             [100%]

==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_client.py::SSHClientTest::test_client
PASSED tests/test_client.py::SSHClientTest::test_client_dsa
PASSED tests/test_transport.py::TransportTest::test_compression
SKIPPED [1] tests/test_client.py:412: Requires GSS-API
FAILED tests/test_client.py::SSHClientTest::test_auth_timeout - AssertionError: 3 != 4
=================== 1 failed, 7 passed, 1 skipped in 2.51s ====================
"""


def test_paramiko_reads_the_ra_summary():
    assert parse("parse_log_smith_paramiko", PYTEST_RA) == {
        "tests/test_client.py::SSHClientTest::test_client": P,
        "tests/test_client.py::SSHClientTest::test_client_dsa": P,
        "tests/test_transport.py::TransportTest::test_compression": P,
        "[1]": S,  # a skip's summary line names its count, as in swesmith's
        "tests/test_client.py::SSHClientTest::test_auth_timeout": F,
    }


XDIST = """\
============================= test session starts ==============================
platform linux -- Python 3.10.16, pytest-8.3.4, pluggy-1.5.0
rootdir: /testbed
plugins: xdist-3.6.1
created: 12/12 workers
12 workers [5 items]

[gw0] PASSED tests/test_core.py::test_add
[gw1] FAILED tests/test_numpy.py::test_dot
[gw2] SKIPPED tests/test_scipy.py::test_logsumexp
[gw3] [ 80%] PASSED tests/test_graphs.py::test_grad_fanout
[gw11] PASSED tests/test_wrappers.py::test_checkpoint
"""


def test_autograd_reads_xdist_lines():
    # as swesmith's regex: the progress-style line and a two-digit worker are not read
    assert parse("parse_log_smith_autograd", XDIST) == {
        "tests/test_core.py::test_add": P,
        "tests/test_numpy.py::test_dot": F,
        "tests/test_scipy.py::test_logsumexp": S,
    }


TORNADO = """\
test_add_callback_return_sequence (tornado.test.ioloop_test.TestIOLoop) ... ok
test_close_file_object (tornado.test.ioloop_test.TestIOLoop) ... ok
test_timeout_with_arguments (tornado.test.ioloop_test.TestIOLoop) ... FAIL
test_unix_socket (tornado.test.netutil_test.TestPortAllocation) ... skipped 'unix sockets not supported'
test_gaierror (tornado.test.netutil_test.BlockingResolverErrorTest) ... ERROR

======================================================================
ERROR: test_gaierror (tornado.test.netutil_test.BlockingResolverErrorTest)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tornado/test/netutil_test.py", line 80, in test_gaierror
socket.gaierror: [Errno -2] Name or service not known

======================================================================
FAIL: test_timeout_with_arguments (tornado.test.ioloop_test.TestIOLoop)
----------------------------------------------------------------------
AssertionError: [1, 2] != [1, 2, 3]

----------------------------------------------------------------------
Ran 5 tests in 0.051s

FAILED (failures=1, errors=1, skipped=1)
"""


def test_tornado_unittest():
    assert parse("parse_log_smith_tornado", TORNADO) == {
        "test_add_callback_return_sequence (tornado.test.ioloop_test.TestIOLoop)": P,
        "test_close_file_object (tornado.test.ioloop_test.TestIOLoop)": P,
        "test_unix_socket (tornado.test.netutil_test.TestPortAllocation)": S,
        "test_gaierror (tornado.test.netutil_test.BlockingResolverErrorTest)": F,  # ERROR: headers read FAILED
        "test_timeout_with_arguments (tornado.test.ioloop_test.TestIOLoop)": F,
    }


SLUGIFY = """\
test_accented_text (__main__.TestSlugify) ... ok
test_max_length (__main__.TestSlugify) ... FAIL
test_regex_pattern_keep_underscore (__main__.TestSlugify) ... ERROR
test_py2_only (__main__.TestSlugifyUnicode) ... skipped 'py2'

======================================================================
FAIL: test_max_length (__main__.TestSlugify)
----------------------------------------------------------------------
AssertionError: 'jaja-lol' != 'jaja-lol-mememeoo'

----------------------------------------------------------------------
Ran 4 tests in 0.003s

FAILED (failures=1, errors=1, skipped=1)
"""


def test_slugify_unittest():
    assert parse("parse_log_smith_unittest", SLUGIFY) == {
        "test_accented_text (__main__.TestSlugify)": P,
        "test_max_length (__main__.TestSlugify)": F,
        "test_regex_pattern_keep_underscore (__main__.TestSlugify)": E,
    }


MYPY = """\
============================= test session starts ==============================
platform linux -- Python 3.12.8, pytest-8.3.4, pluggy-1.5.0
rootdir: /testbed
configfile: pyproject.toml
plugins: xdist-3.6.1
created: 16/16 workers
16 workers [2 items]

.F                                                                       [100%]
=================================== FAILURES ===================================
___________________________ testNarrowingIsInstance ____________________________
data: /testbed/test-data/unit/check-narrowing.test:10:
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED mypy/test/testcheck.py::TypeCheckSuite::check-functions.test::testKeywordArgs
FAILED mypy/test/testcheck.py::TypeCheckSuite::check-narrowing.test::testNarrowingIsInstance
========================= 1 failed, 1 passed in 3.21s ==========================
"""


def test_mypy_reads_the_last_word():
    assert parse("parse_log_smith_mypy", MYPY) == {
        "mypy/test/testcheck.py::TypeCheckSuite::check-functions.test::testKeywordArgs": P,
        "mypy/test/testcheck.py::TypeCheckSuite::check-narrowing.test::testNarrowingIsInstance": F,
    }


# -- Go, Rust -------------------------------------------------------------------------------------
GO = """\
=== RUN   TestContextReset
--- PASS: TestContextReset (0.00s)
=== RUN   TestRouterGroup
=== RUN   TestRouterGroup/GET
    routergroup_test.go:31:
        \tError Trace:\trouter_test.go:31
        \tError:      \tNot equal:
=== RUN   TestRouterGroup/POST
--- FAIL: TestRouterGroup (0.00s)
    --- FAIL: TestRouterGroup/GET (0.00s)
    --- PASS: TestRouterGroup/POST (0.00s)
=== RUN   TestNeedsNetwork
    net_test.go:10: no network
--- SKIP: TestNeedsNetwork (0.00s)
FAIL
FAIL\tgithub.com/gin-gonic/gin\t0.045s
ok  \tgithub.com/gin-gonic/gin/binding\t0.012s
?   \tgithub.com/gin-gonic/gin/internal/json\t[no test files]
FAIL
"""


def test_go_test():
    assert parse("parse_log_smith_go", GO) == {
        "TestContextReset": P,
        "TestRouterGroup": F,
        "TestRouterGroup/GET": F,
        "TestRouterGroup/POST": P,
        "TestNeedsNetwork": S,
        "github.com/gin-gonic/gin": F,  # the package's FAIL line, as in swesmith's
    }


CARGO = """\
   Compiling itertools v0.14.0 (/testbed)
     Running `rustc --crate-name itertools --edition=2018 src/lib.rs --test`
    Finished `test` profile [unoptimized + debuginfo] target(s) in 12.34s
     Running unittests src/lib.rs (target/debug/deps/itertools-1a2b3c4d)

running 4 tests
test adaptors::coalesce::tests::test_dedup ... ok
test free::tests::test_zip_eq ... FAILED
test tests::slow_one ... ignored
test tests::panics - should panic ... ok

failures:

---- free::tests::test_zip_eq stdout ----
thread 'free::tests::test_zip_eq' panicked at src/free.rs:10:5:

failures:
    free::tests::test_zip_eq

test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

   Doc-tests itertools

running 1 test
test src/lib.rs - Itertools::interleave (line 512) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.40s
"""


def test_cargo_test():
    assert parse("parse_log_smith_cargo", CARGO) == {
        "adaptors::coalesce::tests::test_dedup": P,
        "free::tests::test_zip_eq": F,
        "tests::panics - should panic": P,
        "src/lib.rs - Itertools::interleave (line 512)": P,
    }


# -- JavaScript / TypeScript ----------------------------------------------------------------------
JEST = """\
> github-readme-stats@1.0.0 test
> node --experimental-vm-modules node_modules/jest/bin/jest.js --verbose

PASS tests/calculateRank.test.js
  calculateRank
    ✓ new user gets C rank (4 ms)
    ✓ average user gets B+ rank (1 ms)
FAIL tests/renderStatsCard.test.js
  Test renderStatsCard
    ✓ should render correctly (25 ms)
    ✕ should hide individual stats (12 ms)
    ○ skipped should render icons

  ● Test renderStatsCard › should hide individual stats

    expect(received).toBe(expected) // Object.is equality

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 1 skipped, 3 passed, 5 total
"""


def test_jest():
    assert parse("parse_log_smith_jest", JEST) == {
        "new user gets C rank": P,
        "average user gets B+ rank": P,
        "should render correctly": P,
        "should hide individual stats": F,
        "skipped should render icons": S,  # jest's own prefix stays in the name
    }


MOCHA = """\
> express@4.21.2 test
> mocha --require test/support/env --reporter spec --check-leaks test/ test/acceptance/ --verbose

  app.router
    methods
      ✔ should include GET
      ✔ should reject numbers for app.get (52ms)
      - should include PATCH
      1) should include DELETE


  2 passing (45ms)
  1 pending
  1 failing

  1) app.router
       methods
         should include DELETE:
     Error: expected 200 "OK", got 404 "Not Found"
      at Context.<anonymous> (test/app.router.js:42:8)
"""


def test_mocha():
    assert parse("parse_log_smith_mocha", MOCHA) == {
        "should include GET": P,
        "should reject numbers for app.get": P,
        "should include PATCH": S,
        "should include DELETE": F,
        "app.router": F,  # the failure's header line is read too, as in swesmith's
    }


VITEST = """\
> svelte-monorepo@0.0.1 test /testbed
> vitest run --verbose

 RUN  v2.1.9 /testbed

 ✓ packages/svelte/tests/signals/test.ts (95 tests) 120ms
 ❯ packages/svelte/tests/runtime-runes/test.ts (1432 tests | 2 failed | 3 skipped) 8123ms
   × runtime-runes > each-keyed 12ms
     → expected 'a' to be 'b'
 ✓ packages/svelte/tests/parser-modern/test.ts (31 tests) 88ms

 Test Files  1 failed | 2 passed (3)
      Tests  2 failed | 1553 passed | 3 skipped (1558)
"""


def test_vitest_names_files():
    assert parse("parse_log_smith_vitest", VITEST) == {
        "packages/svelte/tests/signals/test.ts": P,
        "packages/svelte/tests/runtime-runes/test.ts": F,
        "packages/svelte/tests/parser-modern/test.ts": P,
    }


REACT_PDF = """\
 RUN  v1.6.0 /testbed

 ✓ packages/layout/tests/text/layoutText.test.ts > layoutText > should render text 4ms
 ✓ packages/layout/tests/steps/resolveStyles.test.ts > resolveStyles > should resolve page styles 1ms
 × packages/layout/tests/node/getPadding.test.ts > getPadding > should return zero for empty node 6ms
   → expected 1 to be +0
 ↓ packages/fns/tests/skip.test.ts > skipped one
 ✓ packages/primitives/tests/index.test.ts > primitives > should export view

 Test Files  1 failed | 3 passed (4)
"""


def test_react_pdf():
    # vitest's `×` and `↓` are not read (swesmith looks for ✗/✖), so a failing test is absent, which grades as failed
    assert parse("parse_log_smith_react_pdf", REACT_PDF) == {
        "packages/layout/tests/text/layoutText.test.ts > layoutText > should render text": P,
        "packages/layout/tests/steps/resolveStyles.test.ts > resolveStyles > should resolve page styles": P,
        "packages/primitives/tests/index.test.ts > primitives > should export view": P,
    }


MARKED = """\
▶ Lexer
  ▶ paragraph
    ✔ space between paragraphs (1.058958ms)
    ✖ trailing spaces (0.5102ms)
      AssertionError [ERR_ASSERTION]: Expected values to be strictly deep-equal:
  ✖ paragraph (3.2ms)
✖ Lexer (4.1ms)
▶ Parser
  ✔ heading (0.3ms)
✔ Parser (0.9ms)
ℹ tests 3
ℹ suites 3
ℹ pass 2
ℹ fail 1
"""


def test_marked_node_test():
    assert parse("parse_log_smith_marked", MARKED) == {
        "space between paragraphs": P, "trailing spaces": F, "paragraph": F, "Lexer": F, "heading": P, "Parser": P,
    }


# -- Java -----------------------------------------------------------------------------------------
SUREFIRE = """\
[INFO] -------------------------------------------------------
[INFO]  T E S T S
[INFO] -------------------------------------------------------
[INFO] Running com.google.gson.JsonArrayTest
[INFO] com.google.gson.JsonArrayTest.testEqualsOnEmptyArray -- Time elapsed: 0.002 s
[ERROR] com.google.gson.JsonArrayTest.testRemove -- Time elapsed: 0.004 s <<< FAILURE!
java.lang.AssertionError: expected:<2> but was:<1>
\tat org.junit.Assert.fail(Assert.java:89)
[ERROR] com.google.gson.JsonArrayTest.testGetAs -- Time elapsed: 0.001 s <<< ERROR!
java.lang.NullPointerException
[WARNING] com.google.gson.JsonArrayTest.testSkipped -- Time elapsed: 0 s <<< SKIPPED!
[ERROR] Tests run: 4, Failures: 1, Errors: 1, Skipped: 1, Time elapsed: 0.031 s <<< FAILURE! -- in com.google.gson.JsonArrayTest
Running com.google.gson.internal.LinkedTreeMapTest
testIterationOrder(com.google.gson.internal.LinkedTreeMapTest)  Time elapsed: 0.003 sec
testClear(com.google.gson.internal.LinkedTreeMapTest)  Time elapsed: 0.001 sec  <<< FAILURE!
Tests run: 2, Failures: 1, Errors: 0, Skipped: 0, Time elapsed: 0.02 sec <<< FAILURE!
[INFO] BUILD FAILURE
"""


def test_maven_surefire():
    assert parse("parse_log_smith_maven", SUREFIRE) == {
        "com.google.gson.JsonArrayTest.testEqualsOnEmptyArray": P,
        "com.google.gson.JsonArrayTest.testRemove": F,
        "com.google.gson.JsonArrayTest.testGetAs": P,  # swesmith reads `<<< ERROR!` as passed
        "com.google.gson.internal.LinkedTreeMapTest.testIterationOrder": P,
        "com.google.gson.internal.LinkedTreeMapTest.testClear": P,  # old-style lines are always passed
    }


GRADLE_XML = """\
+ ./gradlew test --rerun-tasks --continue --no-daemon --console=plain
> Task :tests:test

ApplicationTests > saveLoad() FAILED
    org.opentest4j.AssertionFailedError at ApplicationTests.java:88

3 tests completed, 1 failed, 1 skipped
BUILD FAILED in 41s
+ find . -type f -name 'TEST-*.xml' -exec cat '{}' ';'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="ApplicationTests" tests="3" skipped="1" failures="1" errors="0" timestamp="2025-06-01T10:00:00" hostname="c" time="0.51">
  <properties/>
  <testcase name="initialization()" classname="ApplicationTests" time="0.2"/>
  <testcase name="saveLoad()" classname="ApplicationTests" time="0.1">
    <failure message="expected: &lt;1&gt; but was: &lt;2&gt;" type="org.opentest4j.AssertionFailedError">org.opentest4j.AssertionFailedError: expected: &lt;1&gt; but was: &lt;2&gt;
\tat ApplicationTests.saveLoad(ApplicationTests.java:88)</failure>
  </testcase>
  <testcase name="[1] fill" classname="ApplicationTests" time="0.0">
    <skipped/>
  </testcase>
  <system-out><![CDATA[Loading content...]]></system-out>
  <system-err><![CDATA[]]></system-err>
</testsuite>
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="PatcherTests" tests="1" skipped="0" failures="0" errors="1" time="0.01">
  <testcase name="unitWeapons()" classname="mindustry.PatcherTests" time="0.01">
    <error message="boom" type="java.lang.IllegalStateException">java.lang.IllegalStateException: boom</error>
  </testcase>
</testsuite>
"""


def test_gradle_junit_xml():
    assert parse("parse_log_smith_gradle", GRADLE_XML) == {
        "ApplicationTests.initialization()": P,
        "ApplicationTests.saveLoad()": F,
        "ApplicationTests.[1] fill": S,
        "mindustry.PatcherTests.unitWeapons()": F,
    }


# -- C++, C, PHP ----------------------------------------------------------------------------------
CTEST = """\
UpdateCTestConfiguration  from :/testbed/build/DartConfiguration.tcl
Test project /testbed/build
    Start 1: test_json_parse
1: Test command: /testbed/build/tests/test_json_parse
1: [doctest] test cases: 12 | 12 passed | 0 failed
1/3 Test #1: test_json_parse ..................   Passed    0.02 sec
    Start 2: test_json_dump
2/3 Test #2: test_json_dump ...................***Failed    0.01 sec
    Start 3: test_unicode
3/3 Test #3: test_unicode .....................   Passed    0.40 sec

67% tests passed, 1 tests failed out of 3

Total Test time (real) =   0.45 sec

The following tests FAILED:
\t  2 - test_json_dump (Failed)
Errors while running CTest
"""


def test_ctest():
    # `***Failed` matches no result pattern; the failure comes from the FAILED list
    assert parse("parse_log_smith_ctest", CTEST) == {"test_json_parse": P, "test_unicode": P, "test_json_dump": F}


def test_ctest_summary_only():
    log = "Test project /testbed/build\n\n67% tests passed, 1 tests failed out of 3\n"
    assert parse("parse_log_smith_ctest", log) == {"synthetic_pass_0": P, "synthetic_pass_1": P, "synthetic_fail_0": F}


JQ = """\
make  check-TESTS
make[2]: Entering directory '/testbed'
PASS: tests/mantest
PASS: tests/jqtest
FAIL: tests/onigtest
SKIP: tests/shtest
============================================================================
Testsuite summary for jq 1.7.1
============================================================================
# TOTAL: 4
# PASS:  2
# FAIL:  1
"""

VALKEY = """\
Cleanup: may take some time... OK
[ok]: SET and GET an item (1 ms)
[ok]: DEL against a single item (0 ms)
[err]: INCR fails against key with spaces in tests/unit/type/incr.tcl
Expected 'ERR*' to equal or match '1'
[skip]: Check encoding - listpack
[ignore]: Not supported in cluster mode
[ok]: Very big payload in GET/SET (212 ms)
[1/1 done]: unit/type/incr (2 seconds)
"""


def test_c_reuses_swebench_jq_and_redis_parsers():
    """swebench's parse_log_jq / parse_log_redis are swesmith's jq / valkey parsers: the same maps."""
    assert sp.profile_for("jqlang/jq", "c")[1] == "parse_log_jq"
    assert parse("parse_log_jq", JQ) == {"tests/mantest": P, "tests/jqtest": P, "tests/onigtest": F}
    assert sp.profile_for("valkey-io/valkey", "c")[1] == "parse_log_redis"
    assert parse("parse_log_redis", VALKEY) == {
        "SET and GET an item": P, "DEL against a single item": P, "INCR fails against key with spaces": F,
        "Check encoding - listpack": S, "Not supported in cluster mode": S, "Very big payload in GET/SET": P,
    }


TESTDOX = """\
PHPUnit 10.5.20 by Sebastian Bergmann and contributors.

Runtime:       PHP 8.3.4
Configuration: /testbed/phpunit.xml.dist

..F.S.                                                              6 / 6 (100%)

Time: 00:00.123, Memory: 10.00 MB

Logger (Monolog\\LoggerTest)
 ✔ Get name
 ✔ With name returns new instance
 ✘ Process records
   │
   │ Failed asserting that false is true.
   │
   │ /testbed/tests/Monolog/LoggerTest.php:42
   │
 ↩ Skips on windows

Line Formatter (Monolog\\Formatter\\LineFormatterTest)
 ✔ Def format with string

FAILURES!
Tests: 6, Assertions: 9, Failures: 1, Skipped: 1.
"""


def test_phpunit_testdox():
    assert parse("parse_log_smith_phpunit", TESTDOX) == {
        "Monolog\\LoggerTest::Get name": P,
        "Monolog\\LoggerTest::With name returns new instance": P,
        "Monolog\\LoggerTest::Process records": F,
        "Monolog\\LoggerTest::Skips on windows": S,
        "Monolog\\Formatter\\LineFormatterTest::Def format with string": P,
    }


def test_every_parser_is_registered_and_differs_from_swebench_where_it_must():
    assert all(PARSER_REGISTRY[name] is fn for name, fn in parsers.PARSERS.items())
    # swebench's own cargo / go parsers miss doc tests and package failures: why ours exist
    assert "src/lib.rs - Itertools::interleave (line 512)" not in PARSER_REGISTRY["parse_log_cargo"](CARGO, None)
    assert "github.com/gin-gonic/gin" not in PARSER_REGISTRY["parse_log_gotest"](GO, None)


# -- profiles -------------------------------------------------------------------------------------
CONDA = "source /opt/miniconda3/bin/activate; conda activate testbed; "


@pytest.mark.parametrize("repo, language, expected", [
    ("encode/starlette", "python",
     (CONDA + "pytest --disable-warnings --color=no --tb=no --verbose", "parse_log_smith_pytest", 90)),
    ("tkrajina/gpxpy", "python",
     (CONDA + "pytest test.py --verbose --color=no --tb=no --disable-warnings", "parse_log_smith_pytest", 90)),
    ("mido/mido", "python",
     (CONDA + "pytest --disable-warnings --color=no --tb=no --verbose -rs -c /dev/null", "parse_log_smith_pytest", 90)),
    ("paramiko/paramiko", "python", (CONDA + "pytest -rA --color=no --disable-warnings", "parse_log_smith_paramiko", 90)),
    ("HIPS/autograd", "python",
     (CONDA + "pytest --disable-warnings --color=no --tb=no --verbose", "parse_log_smith_autograd", 90)),
    ("tornadoweb/tornado", "python", (CONDA + "python -m tornado.test --verbose", "parse_log_smith_tornado", 90)),
    ("un33k/python-slugify", "python", (CONDA + "python test.py --verbose", "parse_log_smith_unittest", 90)),
    ("python/mypy", "python", (CONDA + "pytest --color=no -rA -k", "parse_log_smith_mypy", 90)),
    ("pydantic/pydantic", "python",
     ("/root/.local/bin/uv run pytest --disable-warnings --color=no --tb=no --verbose", "parse_log_smith_pytest", 90)),
    ("junegunn/fzf", "go", ("go test -v ./...", "parse_log_smith_go", 90)),
    ("nats-io/nats-server", "go", ("go test -v ./...", "parse_log_smith_go", 120)),
    ("serde-rs/json", "rust", ("cargo test --verbose", "parse_log_smith_cargo", 90)),
    ("clap-rs/clap", "rust", ("make test-full ARGS=--verbose", "parse_log_smith_cargo", 90)),
    ("hyperium/hyper", "rust", ("cargo test --verbose --features full", "parse_log_smith_cargo", 90)),
    ("uuid-rs/uuid", "rust", ("cargo test --verbose --all-features", "parse_log_smith_cargo", 90)),
    ("tokio-rs/tokio", "rust",
     ("cargo test --verbose --features full -- --skip try_exists", "parse_log_smith_cargo", 180)),
    ("rust-lang/mdBook", "rust", ("cargo test --workspace --verbose", "parse_log_smith_cargo", 90)),
    ("BurntSushi/ripgrep", "rust", ("cargo test --all --verbose", "parse_log_smith_cargo", 90)),
    ("huggingface/tokenizers", "rust",
     ("cd ~/testbed/tokenizers && cargo test --verbose", "parse_log_smith_cargo", 90)),
    ("axios/axios", "javascript", ("npm run test:mocha -- --verbose", "parse_log_smith_mocha", 90)),
    ("caolan/async", "javascript", ("npm run mocha-node-test -- --verbose", "parse_log_smith_mocha", 90)),
    ("Automattic/mongoose", "javascript", ("npm test -- --verbose", "parse_log_smith_mocha", 90)),
    ("tj/commander.js", "javascript", ("npm test -- --verbose", "parse_log_smith_jest", 90)),
    ("sveltejs/svelte", "javascript", ("pnpm test -- --verbose", "parse_log_smith_vitest", 90)),
    ("diegomura/react-pdf", "javascript",
     ("./node_modules/.bin/vitest --no-color --reporter verbose", "parse_log_smith_react_pdf", 90)),
    ("markedjs/marked", "javascript", ("NO_COLOR=1 node --test", "parse_log_smith_marked", 90)),
    ("google/gson", "java", (sp.MAVEN, "parse_log_smith_maven", 90)),
    ("alibaba/fastjson", "java", (sp.MAVEN, "parse_log_smith_maven", 400)),
    ("Anuken/Mindustry", "java", (sp.GRADLE, "parse_log_smith_gradle", 300)),
    ("nlohmann/json", "cpp", ("cd build && ctest --verbose --output-on-failure --rerun-failed --repeat until-pass:1",
                              "parse_log_smith_ctest", 90)),
    ("Seldaek/monolog", "php", ("vendor/bin/phpunit --testdox --colors=never", "parse_log_smith_phpunit", 90)),
])
def test_profile_for(repo, language, expected):
    assert sp.profile_for(repo, language) == expected


def test_profile_parsers_all_exist_and_unknown_language_is_refused():
    for table in [sp.DEFAULTS, *sp.OVERRIDES.values()]:
        assert all(parser in PARSER_REGISTRY for _, parser, _ in table.values())
    assert sp.GRADLE.endswith("find . -type f -name 'TEST-*.xml' -exec cat {} \\;")
    with pytest.raises(ValueError, match="ruby"):
        sp.profile_for("rails/rails", "ruby")


def test_mypy_k_expression_and_eval_commands():
    f2p = ["mypy/test/testcheck.py::TypeCheckSuite::check-narrowing.test::testNarrowingIsInstance",
           "mypy/test/testcheck.py::TypeCheckSuite::check-functions.test::testKeywordArgs"]
    assert sp.mypy_k_expression(f2p) == "testNarrowingIsInstance or testKeywordArgs"
    assert sp.eval_test_cmd("python/mypy", "python", f2p, []) == \
        CONDA + "pytest --color=no -rA -k 'testNarrowingIsInstance or testKeywordArgs'"
    # min_testing: the sorted F2P files, then the sorted P2P files
    moto = sp.eval_test_cmd("getmoto/moto", "python", ["tests/test_s3/test_s3.py::test_a"],
                            ["tests/test_ec2/test_vpcs.py::test_b", "tests/test_s3/test_s3.py::test_c"])
    assert moto.endswith("--verbose tests/test_s3/test_s3.py tests/test_ec2/test_vpcs.py tests/test_s3/test_s3.py")
    assert "getmoto/moto" in sp.MIN_TESTING and len(sp.MIN_TESTING) == 13
    # any other repository runs its whole suite
    assert sp.eval_test_cmd("encode/starlette", "python", ["tests/test_a.py::t"], []) == sp.profile_for(
        "encode/starlette", "python")[0]
    assert sp.eval_test_cmd("junegunn/fzf", "go", ["TestX"], []) == "go test -v ./..."


@pytest.mark.parametrize("dataset, image, repo, expected", [
    ("SWE-bench/SWE-smith-go", "", "", "go"),
    ("SWE-bench/SWE-smith-rs", "", "", "rust"),
    ("SWE-bench/SWE-smith-js", "", "", "javascript"),
    ("SWE-bench/SWE-smith-ts", "", "", "typescript"),
    ("SWE-bench/SWE-smith-java", "", "", "java"),
    ("SWE-bench/SWE-smith-cpp", "", "", "cpp"),
    ("SWE-bench/SWE-smith-php", "", "", "php"),
    ("SWE-bench/SWE-smith-py", "", "", "python"),
    ("SWE-bench/SWE-smith", "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
     "swesmith/pandas-dev__pandas.95280573", "python"),
    # no dataset name: a repository this module knows says its language
    (None, "swebench/swesmith.x86_64.tj_1776_commander.js.395cf714", "", "javascript"),
    (None, "", "swesmith/tokio-rs__tokio.ab3ff69c", "rust"),
    (None, "", "swesmith/encode__starlette.db5063c2", "python"),
])
def test_language_of(dataset, image, repo, expected):
    assert sp.language_of(dataset, image, repo) == expected


def test_owner_repo_of():
    assert sp.owner_repo_of("swesmith/tj__commander.js.395cf714") == "tj/commander.js"
    assert sp.owner_repo_of("jyangballin/swesmith.x86_64.instagram_1776_monkeytype.70c3acf6") == "instagram/monkeytype"
    assert sp.owner_repo_of("getmoto/moto") == "getmoto/moto"


# -- test files -----------------------------------------------------------------------------------
TREE = {
    "pkg/router_test.go": "package pkg\n\nfunc TestRouterGroup(t *testing.T) {\n}\n\nfunc helper() {}\n",
    "pkg/other_test.go": "package pkg\n\nfunc TestRouterGroupX(t *testing.T) {}\n",
    "pkg/router.go": "package pkg\n\nfunc TestRouterGroup() {}\n",  # not a _test.go file
    "src/lib.rs": "#[cfg(test)]\nmod tests {\n    #[test]\n    fn test_dedup() {\n    }\n}\n",
    "tests/zip.rs": "#[tokio::test]\n// comment\nasync fn zip_eq() {}\n",
    "src/util.rs": "pub fn test_dedup() {}\n",  # no test attribute in the file
    "target/debug/build/x/out/gen.rs": "#[test]\nfn test_dedup() {}\n",  # build output, pruned
    "src/test/java/com/x/FooTest.java": "package com.x;\nclass FooTest {}\n",
    "src/main/java/com/x/Outer.java": "package com.x;\nclass Outer {}\n",
    "src/main/java/com/x/Foo.java": "package com.x;\nclass Foo {}\n",
    "test/router.test.js": "it('routes GET (with params)', () => {});\ntest.only(\"a.b [c]\", () => {});\n",
    "src/router.js": "it('routes GET (with params)', () => {});\n",  # not a test file
    "node_modules/dep/test/x.test.js": "it('routes GET (with params)', () => {});\n",
    "tests/LoggerTest.php": "<?php\n\nnamespace Monolog;\n\nfinal class LoggerTest extends TestCase\n{\n}\n",
    "tests/Other/LoggerTest.php": "<?php\nnamespace Monolog\\Other;\nclass LoggerTest {}\n",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def files(root: Path, language: str, tests: list[str], owner_repo: str = "") -> list[str]:
    """Run the snippet with bash on stdin, in `root`, under the eval script's `set -uxo pipefail`."""
    script = "set -uo pipefail\n" + sp.test_files_script(language, tests, owner_repo)
    r = subprocess.run(["bash", "-s"], check=False, input=script, cwd=root, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    return sorted(r.stdout.splitlines())


def test_files_python(tree):
    tests = ["tests/a.py::T::x", "tests/b.py::y[1::2]", "tests/a.py::z", "README.rst::README.rst"]
    assert files(tree, "python", tests) == ["README.rst", "tests/a.py", "tests/b.py"]
    assert files(tree, "python", ["test_x (tornado.test.web_test.WebTest)"], "tornadoweb/tornado") == [
        "tornado/test/web_test.py"]
    assert files(tree, "python", ["test_a (__main__.TestSlugify)"], "un33k/python-slugify") == ["test.py"]


def test_files_go(tree):
    tests = ["TestRouterGroup/GET", "TestRouterGroup", "github.com/gin-gonic/gin", "TestMissing"]
    assert files(tree, "go", tests) == ["pkg/router_test.go"]


def test_files_rust(tree):
    tests = ["adaptors::tests::test_dedup", "zip_eq", "src/doc.rs - Foo::bar (line 3)", "tests::panics - should panic"]
    assert files(tree, "rust", tests) == ["src/doc.rs", "src/lib.rs", "tests/zip.rs"]


def test_files_java(tree):
    tests = ["com.x.FooTest.testA", "com.x.FooTest.testB()", "com.x.Outer$InnerTest.method[1]", "lowercase.only"]
    assert files(tree, "java", tests) == ["src/main/java/com/x/Outer.java", "src/test/java/com/x/FooTest.java"]


def test_files_javascript(tree):
    tests = ["routes GET (with params)", "a.b [c]", "packages/svelte/tests/runtime/test.ts", "no such test"]
    assert files(tree, "javascript", tests) == ["packages/svelte/tests/runtime/test.ts", "test/router.test.js"]


def test_files_php(tree):
    assert files(tree, "php", ["Monolog\\LoggerTest::Get name", "Monolog\\LoggerTest::Process records"]) == [
        "tests/LoggerTest.php"]


def test_files_none_for_typescript_and_cpp(tree):
    assert files(tree, "typescript", ["should render"]) == []
    assert files(tree, "cpp", ["test_json_parse"]) == []
    assert files(tree, "go", []) == []
