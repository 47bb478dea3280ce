"""How SWE-smith runs each repository's tests, per language (its `profiles/*.py`, as of upstream
9b74ac0): the test command, the log parser's name and the timeout of a repository's profile, the
language a dataset holds, and which test files its test names live in. The parsers themselves
are the SWE env's (envs/smith_parsers.py): grading reads the log wherever the task was loaded.

Only the repositories named below have their own entry; any other gets its language's default.
swesmith has no default for JavaScript or TypeScript (every profile names its own), so those
defaults are the most common command and parser of its tables.
"""

from __future__ import annotations

import re
import shlex

# -- profiles: (test_cmd, parser name, timeout_s) -------------------------------------------------
CONDA = "source /opt/miniconda3/bin/activate; conda activate testbed; "
PYTEST = "pytest --disable-warnings --color=no --tb=no --verbose"
MAVEN = "mvn test -B -T 1C -Dsurefire.useFile=false -Dsurefire.printSummary=true -Dsurefire.reportFormat=plain"
GRADLE = ("./gradlew test --rerun-tasks --continue --no-daemon --console=plain || true; "
          "find . -type f -name 'TEST-*.xml' -exec cat {} \\;")
# swesmith's Gradle profiles (the other Java ones use Maven); many name their own module task, which this skips
GRADLE_REPOS = {
    "Anuken/Mindustry", "Col-E/Recaf", "HMCL-dev/HMCL", "LFDT-web3j/web3j", "LMAX-Exchange/disruptor",
    "Netflix/eureka", "PaperMC/Paper", "PhilJay/MPAndroidChart", "ReactiveX/RxAndroid", "ZCShou/GoGoGo",
    "apache/jmeter", "baomidou/mybatis-plus", "btraceio/btrace", "diffplug/spotless", "hibernate/hibernate-orm",
    "iBotPeaches/Apktool", "journeyapps/zxing-android-embedded", "json-path/JsonPath", "mik3y/usb-serial-for-android",
    "osmandapp/OsmAnd", "reactor/reactor-core", "scwang90/SmartRefreshLayout", "skylot/jadx", "traccar/traccar",
    "YoKeyword/Fragmentation", "apache/calcite", "apache/cassandra", "apache/iceberg", "baomidou/dynamic-datasource",
    "bisq-network/bisq", "google/tsunami-security-scanner", "huanghaibin-dev/CalendarView", "jankotek/mapdb",
    "plantuml/plantuml", "remkop/picocli", "runelite/runelite", "spring-projects/spring-authorization-server",
    "spring-projects/spring-boot", "youlookwhat/CloudReader",
}
# python repos whose eval command gets the F2P + P2P test files appended (`min_testing`)
MIN_TESTING = {
    "getmoto/moto", "python/mypy", "Project-MONAI/MONAI", "iterative/dvc", "dask/dask", "modin-project/modin",
    "conan-io/conan", "pandas-dev/pandas", "sympy/sympy", "scrapy/scrapy", "sqlfluff/sqlfluff", "tobymao/sqlglot",
    "sunpy/sunpy",
}
_S = "parse_log_smith_"
DEFAULTS = {
    "python": (CONDA + PYTEST, _S + "pytest", 90),
    "go": ("go test -v ./...", _S + "go", 90),
    "rust": ("cargo test --verbose", _S + "cargo", 90),
    "javascript": ("npm test -- --verbose", _S + "mocha", 90),
    "typescript": ("npm test", _S + "jest", 90),
    "java": (MAVEN, _S + "maven", 400),  # 65 of swesmith's 67 Maven profiles set 400 s
    "cpp": ("cd build && ctest --verbose --output-on-failure --rerun-failed --repeat until-pass:1", _S + "ctest", 90),
    "c": ("make check", "parse_log_jq", 90),  # swesmith has two C profiles (jq, valkey) and no default
    "php": ("vendor/bin/phpunit --testdox --colors=never", _S + "phpunit", 90),
}
_CARGO = "cargo test --verbose"
OVERRIDES = {
    "python": {
        "tkrajina/gpxpy": (CONDA + "pytest test.py --verbose --color=no --tb=no --disable-warnings", _S + "pytest", 90),
        "mido/mido": (CONDA + PYTEST + " -rs -c /dev/null", _S + "pytest", 90),
        "paramiko/paramiko": (CONDA + "pytest -rA --color=no --disable-warnings", _S + "paramiko", 90),
        "HIPS/autograd": (CONDA + PYTEST, _S + "autograd", 90),
        "tornadoweb/tornado": (CONDA + "python -m tornado.test --verbose", _S + "tornado", 90),
        "un33k/python-slugify": (CONDA + "python test.py --verbose", _S + "unittest", 90),
        # the -k expression is appended per task: see mypy_k_expression / eval_test_cmd
        "python/mypy": (CONDA + "pytest --color=no -rA -k", _S + "mypy", 90),
        # swesmith runs pydantic through uv, without the conda prefix
        "pydantic/pydantic": ("/root/.local/bin/uv run " + PYTEST, _S + "pytest", 90),
    },
    "go": {"nats-io/nats-server": ("go test -v ./...", _S + "go", 120),
           "blevesearch/bleve": ("go test -v ./...", _S + "go", 120)},
    "rust": {
        "clap-rs/clap": ("make test-full ARGS=--verbose", _S + "cargo", 90),
        "hyperium/hyper": (_CARGO + " --features full", _S + "cargo", 90),
        "rust-itertools/itertools": (_CARGO + " --all-features", _S + "cargo", 90),
        "uuid-rs/uuid": (_CARGO + " --all-features", _S + "cargo", 90),
        "tokio-rs/tokio": (_CARGO + " --features full -- --skip try_exists", _S + "cargo", 180),
        "rust-lang/mdBook": ("cargo test --workspace --verbose", _S + "cargo", 90),
        "BurntSushi/ripgrep": ("cargo test --all --verbose", _S + "cargo", 90),
        "huggingface/tokenizers": ("cd ~/testbed/tokenizers && " + _CARGO, _S + "cargo", 90),
    },
    "javascript": {
        "axios/axios": ("npm run test:mocha -- --verbose", _S + "mocha", 90),
        "caolan/async": ("npm run mocha-node-test -- --verbose", _S + "mocha", 90),
        "expressjs/express": ("npm test -- --verbose", _S + "mocha", 90),
        "Automattic/mongoose": ("npm test -- --verbose", _S + "mocha", 90),
        "anuraghazra/github-readme-stats": ("npm test -- --verbose", _S + "jest", 90),
        "iamkun/dayjs": ("npm test -- --verbose", _S + "jest", 90),
        "tj/commander.js": ("npm test -- --verbose", _S + "jest", 90),
        # swesmith appends the packages/<pkg> folders the task's patch touches
        "babel/babel": ("yarn jest --verbose", _S + "jest", 90),
        "sveltejs/svelte": ("pnpm test -- --verbose", _S + "vitest", 90),
        "diegomura/react-pdf": ("./node_modules/.bin/vitest --no-color --reporter verbose", _S + "react_pdf", 90),
        "markedjs/marked": ("NO_COLOR=1 node --test", _S + "marked", 90),
    },
    "java": {"google/gson": (MAVEN, _S + "maven", 90)} | {r: (GRADLE, _S + "gradle", 300) for r in GRADLE_REPOS},
    "c": {"jqlang/jq": ("make check", "parse_log_jq", 90),
          "valkey-io/valkey": ("TERM=dumb ./runtest --durable", "parse_log_redis", 90)},
}


def profile_for(owner_repo: str, language: str) -> tuple[str, str, int]:
    """(test_cmd, parser name, timeout_s) of swesmith's profile for `owner/repo`; else the language's default."""
    if language not in DEFAULTS:
        raise ValueError(f"language {language!r} is not one of {sorted(DEFAULTS)}")
    return OVERRIDES.get(language, {}).get(owner_repo, DEFAULTS[language])


def mypy_k_expression(tests: list[str]) -> str:
    """mypy's `-k` expression: each test's last `::` part, joined with ` or `."""
    return " or ".join(t.rsplit("::", 1)[-1] for t in tests)


def python_test_files(owner_repo: str, tests: list[str]) -> list[str]:
    """swesmith's Python `get_test_files`: the path before `::` (tornado, slugify and mido their own way)."""
    if owner_repo == "un33k/python-slugify":
        return ["test.py"]
    if owner_repo == "tornadoweb/tornado":  # `test_x (tornado.test.web_test.WebTest)` -> tornado/test/web_test.py
        found = (re.search(r"\s\((.*)\)", t) for t in tests)
        return sorted({"/".join(m.group(1).split(".")[:-1]) + ".py" for m in found if m})
    return sorted({t.split("::", 1)[0].removeprefix("../dev/") for t in tests})


def eval_test_cmd(owner_repo: str, language: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> str:
    """The command swesmith's `get_test_cmd` runs at evaluation: mypy with its `-k` expression,
    `MIN_TESTING` repos with the F2P then P2P test files appended, every other repo the whole suite."""
    cmd = profile_for(owner_repo, language)[0]
    if language != "python":
        return cmd
    if owner_repo == "python/mypy":  # swesmith leaves -k bare (a usage error) when F2P has one test
        return f"{cmd} {shlex.quote(mypy_k_expression(fail_to_pass))}"
    files = python_test_files(owner_repo, fail_to_pass) + python_test_files(owner_repo, pass_to_pass)
    if owner_repo in MIN_TESTING and files:
        cmd += " " + " ".join(shlex.quote(f) for f in files)
    return cmd


# -- which language a dataset holds ---------------------------------------------------------------
_SUFFIX_LANGUAGE = {"py": "python", "go": "go", "rs": "rust", "js": "javascript", "ts": "typescript",
                    "java": "java", "cpp": "cpp", "c": "c", "php": "php"}
_KNOWN_LANGUAGE = {r.lower(): lang for lang, table in OVERRIDES.items() for r in table}


def owner_repo_of(repo: str) -> str:
    """`owner/repo` from a row's `repo` (`swesmith/owner__repo.commit8`) or an image name (lowercase)."""
    name = repo.rsplit("/", 1)[-1]
    if "__" not in name and "_1776_" not in name:  # already `owner/repo`
        return repo
    name = re.sub(r"^swesmith\.(x86_64|arm64)\.", "", name).replace("_1776_", "__")
    return re.sub(r"\.[0-9a-f]{8}$", "", name).replace("__", "/", 1)


def language_of(dataset_name: str | None, image_name: str, repo: str) -> str:
    """The language of a SWE-smith row: its hub dataset's suffix (`SWE-bench/SWE-smith-go` -> go), else
    the language of a repository this module knows by name, else python (`SWE-bench/SWE-smith`)."""
    last = (dataset_name or "").rstrip("/").rsplit("/", 1)[-1].lower()
    if (m := re.search(r"-([a-z]+)$", last)) and m.group(1) in _SUFFIX_LANGUAGE:
        return _SUFFIX_LANGUAGE[m.group(1)]
    for source in (repo, image_name):
        if source and (lang := _KNOWN_LANGUAGE.get(owner_repo_of(source).lower())):
            return lang
    return "python"


# -- test name -> test files, as a bash snippet -----------------------------------------------------
_EOF = "__SMITH_PATTERNS__"
_REL = """while IFS= read -r f; do printf '%s\\n' "${f#./}"; done"""
_WORD = re.compile(r"\w+")
_NOT_WORD = "([^[:alnum:]_]|$)"
_JS_EXTS = (".js", ".ts", ".jsx", ".tsx", ".mjs", ".cjs")


def _ere(text: str) -> str:
    """`text` as a literal inside a POSIX extended regex."""
    return re.sub(r"([\\.\[()*+?{|^$])", r"\\\1", text)


def _print(paths) -> list[str]:
    return [f"printf '%s\\n' {shlex.quote(p)}" for p in sorted(set(paths))]


def _grep_files(patterns: list[str], pipeline: str) -> list[str]:
    """Lines that write `patterns` to "$_p" (one ERE a line, by heredoc: no argument-length limit), run `pipeline`."""
    if not patterns:
        return []
    heredoc = [f"cat > \"$_p\" <<'{_EOF}'", *sorted(set(patterns)), _EOF]
    return ["_p=$(mktemp)", *heredoc, f"{pipeline} || true", 'rm -f "$_p"']


def _go_files(tests: list[str]) -> list[str]:
    """Go: the `*_test.go` files that define `func <root name>` (the part before `/`)."""
    roots = {t.split("/", 1)[0] for t in tests}
    pats = [rf"^[[:space:]]*func[[:space:]]+{r}{_NOT_WORD}" for r in roots if _WORD.fullmatch(r)]
    return _grep_files(pats, f"find . -name '*_test.go' -type f -exec grep -lE -f \"$_p\" {{}} + | {_REL}")


def _rust_files(tests: list[str]) -> list[str]:
    """Rust: a doc test's own file; else the .rs files with a `#[...test]` attribute and `fn <last :: part>`."""
    docs, fns = [], set()
    for t in tests:
        before = t.split(" - ", 1)[0].strip()
        if " - " in t and ".rs" in before:
            docs.append(before)
        else:
            fns.add(before.rsplit("::", 1)[-1])
    pats = [rf"^[[:space:]]*(pub(\([^)]*\))?[[:space:]]+)?(async[[:space:]]+)?fn[[:space:]]+{n}{_NOT_WORD}"
            for n in fns if _WORD.fullmatch(n)]
    attr = shlex.quote(r"^[[:space:]]*#\[([[:alnum:]_]+::)*test")
    find = ("find . -path ./target -prune -o -name '*.rs' -type f -exec grep -lE -f \"$_p\" {} + | "
            f"while IFS= read -r f; do grep -qE {attr} \"$f\" && printf '%s\\n' \"${{f#./}}\"; done")
    return _print(docs) + _grep_files(pats, find)


def _java_class(test: str) -> str | None:
    """The outer class of a JUnit name: the last dotted part that starts uppercase (`pkg.A$B.m()` -> A)."""
    name = re.sub(r"\(.*$", "", re.sub(r"\[.*$", "", test)).rstrip(". ")
    for part in reversed(name.split(".")):
        outer = part.split("$")[0]
        if outer and outer[0].isupper() and outer.isidentifier():
            return outer
    return None


def _java_files(tests: list[str]) -> list[str]:
    """Java: every `<Class>.java` in the repository, for each test's class."""
    pats = [rf"/{c}\.java$" for c in map(_java_class, tests) if c]
    return _grep_files(pats, f"find . -type f -name '*.java' | grep -E -f \"$_p\" | {_REL}")


def _test_like(dirs: str, names: str, check: str = "") -> str:
    """A loop over found files that prints those under a test dir (`dirs`) or test-named (`names`), as case
    patterns, and passing `check` (a command ending in `&&`)."""
    return ("while IFS= read -r f; do r=${f#./}; b=${r##*/}; d=/${r%\"$b\"}; "
            f"case \"$d\" in {dirs}) ;; *) case \"$b\" in {names}) ;; *) continue;; esac;; esac; "
            f"{check}printf '%s\\n' \"$r\"; done")


def _js_files(tests: list[str]) -> list[str]:
    """JS: a test file's own path; else the test-like files with `it|test('<name>'` (node_modules skipped)."""
    paths = [t for t in tests if t.endswith(_JS_EXTS)]
    pats = []
    for t in set(tests) - set(paths):
        quoted = "|".join(f"{q}{_ere(t)}{q}" for q in "'\"`" if q not in t)
        pats += [rf"(it|test)(\.only|\.skip)?[[:space:]]*\([[:space:]]*({quoted})"] if quoted and "\n" not in t else []
    names = " -o ".join(f"-name '*{e}'" for e in _JS_EXTS)
    loop = _test_like("*/test/*|*/tests/*|*/__tests__/*|*/spec/*|*/specs/*", "*test.*|*spec.*")
    find = f"find . -name node_modules -prune -o -type f \\( {names} \\) -exec grep -lE -f \"$_p\" {{}} + | {loop}"
    return _print(paths) + _grep_files(pats, find)


def _php_files(tests: list[str]) -> list[str]:
    """PHP: the test-like file declaring `class <Short>` in `namespace <NS>` for each `NS\\Short::text`."""
    lines = []
    for fqcn in sorted({t.split("::")[0] for t in tests}):
        ns, _, short = fqcn.rpartition("\\")
        if not _WORD.fullmatch(short):
            continue
        cls = shlex.quote(rf"^[[:space:]]*((abstract|final)[[:space:]]+)?class[[:space:]]+{short}{_NOT_WORD}")
        ns_line = shlex.quote(rf"^[[:space:]]*namespace[[:space:]]+{_ere(ns)}[[:space:]]*;")
        no_ns = "! grep -qE '^[[:space:]]*namespace[[:space:]]' \"$f\" && "
        in_ns = f"grep -qE {ns_line} \"$f\" && " if ns else no_ns
        loop = _test_like("*/test/*|*/tests/*|*/Test/*|*/Tests/*", "*Test.php|test*", in_ns)
        find = f"find . -name vendor -prune -o -name '*.php' -type f -exec grep -lE {cls} {{}} +"
        lines.append(f"{find} | {loop} || true")
    return lines


def test_files_script(language: str, tests: list[str], owner_repo: str = "") -> str:
    """A bash snippet, run in the repository root, that prints (sorted, one a line) the files swesmith's
    `get_test_files` maps `tests` to; nothing for TypeScript, C and C++, which have none. Give it to bash
    on stdin (not as one `-c` argument) when the lists are long: Linux caps one argument at 128 KiB."""
    if language == "python":
        lines = _print(python_test_files(owner_repo, tests))
    else:
        build = {"go": _go_files, "rust": _rust_files, "java": _java_files, "javascript": _js_files, "php": _php_files}
        lines = build.get(language, lambda _: [])(tests)
    return "{\n" + "\n".join(lines) + "\ntrue\n} | sort -u" if lines else "true"


test_files_script.__test__ = False  # not a test, though a test module that imports it would collect it as one
