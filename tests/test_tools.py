"""The agent's tools on a real sandbox: viewing, editing, undo, refused paths, bash and bad calls."""

import pytest

from agent.tools import DEFAULT_TOOLS, ToolBox, load_definitions
from conftest import RUN_ID
from sandbox.base import TRUNCATION_MARK
from sandbox.docker import DockerSandbox

docker = pytest.mark.docker
CUT = TRUNCATION_MARK.split("{n}")[1].strip()  # "bytes cut from the middle of this output ...]"


@pytest.fixture(scope="module")
def sandbox(docker_client):
    """One container for the whole module (tests work in their own directories), always closed."""
    with DockerSandbox(run_id=RUN_ID, docker_client=docker_client) as sb:
        yield sb


@pytest.fixture
def tools(sandbox):
    return ToolBox(sandbox)


def edit(tools, **args):
    r = tools.run("str_replace_editor", args)
    assert not r.submitted
    return r


def ok(tools, **args):
    r = edit(tools, **args)
    assert not r.error, r.output
    return r.output


def err(tools, **args):
    r = edit(tools, **args)
    assert r.error and r.output.startswith("Error: "), r.output
    return r.output


def test_definitions_are_openai_style_with_the_limits_filled_in():
    defs = load_definitions(default_timeout_s=30.0, max_timeout_s=90.0)
    assert [d["function"]["name"] for d in defs] == list(DEFAULT_TOOLS)
    for d in defs:
        assert d["type"] == "function" and set(d["function"]) == {"name", "description", "parameters"}
        assert d["function"]["parameters"]["type"] == "object" and d["function"]["description"]
    bash = defs[0]["function"]
    assert "(default 30, at most\n  90)" in bash["description"] and "{" not in bash["description"]
    assert bash["parameters"]["properties"]["timeout"]["description"].endswith("(default 30, at most 90).")
    assert defs[1]["function"]["parameters"]["properties"]["command"]["enum"][0] == "view"
    with pytest.raises(ValueError, match="no tool named \\['nope'\\]"):
        load_definitions(names=("nope",))


@docker
def test_view_file_with_line_numbers_and_ranges(tools, sandbox):
    sandbox.write_file("view/f.txt", "a\nb\nc\nd\ne\n")
    out = ok(tools, command="view", path="/testbed/view/f.txt")
    assert out.endswith("     1\ta\n     2\tb\n     3\tc\n     4\td\n     5\te")
    assert ok(tools, command="view", path="view/f.txt", view_range=[2, 3]).endswith("(lines 2-3 of 5):\n     2\tb\n     3\tc")
    assert ok(tools, command="view", path="view/f.txt", view_range=[4, -1]).endswith("     4\td\n     5\te")
    assert ok(tools, command="view", path="view/f.txt", view_range="[5, 99]").endswith(":\n     5\te")  # clamped
    assert "out of range" in err(tools, command="view", path="view/f.txt", view_range=[0, 2])
    assert "out of range" in err(tools, command="view", path="view/f.txt", view_range=[6, -1])
    assert "before its start" in err(tools, command="view", path="view/f.txt", view_range=[3, 2])
    assert "does not exist" in err(tools, command="view", path="view/missing.txt")
    sandbox.write_file("view/empty.txt", "")
    assert ok(tools, command="view", path="view/empty.txt") == "/testbed/view/empty.txt is empty."


@docker
def test_view_directory_lists_two_levels_without_hidden_items(tools, sandbox):
    for path in ("tree/a.py", "tree/sub/b.py", "tree/sub/deep/c.py", "tree/.git/config", "tree/sub/.env"):
        sandbox.write_file(path, "x\n")
    out = ok(tools, command="view", path="tree")
    listing = out.split("\n")[1:]
    assert listing == ["/testbed/tree/a.py", "/testbed/tree/sub/", "/testbed/tree/sub/b.py", "/testbed/tree/sub/deep/"]
    assert "only applies to files" in err(tools, command="view", path="tree", view_range=[1, 2])


@docker
def test_create_makes_parents_and_never_overwrites(tools, sandbox):
    assert "created" in ok(tools, command="create", path="new/x/y/z.py", file_text="print('hi')\n")
    assert sandbox.read_file("/testbed/new/x/y/z.py") == "print('hi')\n"
    assert "already exists (a file)" in err(tools, command="create", path="/testbed/new/x/y/z.py", file_text="")
    assert "already exists (a directory)" in err(tools, command="create", path="new/x", file_text="")
    assert sandbox.read_file("new/x/y/z.py") == "print('hi')\n"
    sandbox.write_file("new/plain", "a file\n")
    assert "could not make the directory" in err(tools, command="create", path="new/plain/under.txt", file_text="")


@docker
def test_str_replace_needs_exactly_one_match(tools, sandbox):
    sandbox.write_file("rep/f.py", "foo = 1\nbar = 2\nfoo = 1\naaa\n")
    two = err(tools, command="str_replace", path="rep/f.py", old_str="foo = 1", new_str="foo = 3")
    assert "occurs 2 times" in two and "line(s) [1, 3]" in two
    assert "occurs 0 times" in err(tools, command="str_replace", path="rep/f.py", old_str="baz", new_str="q")
    assert "occurs 2 times" in err(tools, command="str_replace", path="rep/f.py", old_str="aa", new_str="b")  # overlapping
    assert "same as" in err(tools, command="str_replace", path="rep/f.py", old_str="bar", new_str="bar")
    assert "does not exist" in err(tools, command="str_replace", path="rep/nope.py", old_str="a", new_str="b")
    assert "is a directory" in err(tools, command="str_replace", path="rep", old_str="a", new_str="b")
    out = ok(tools, command="str_replace", path="rep/f.py", old_str="bar = 2", new_str="bar = 20\nbaz = 3")
    assert "     2\tbar = 20\n     3\tbaz = 3\n" in out and "Review the changes" in out
    assert sandbox.read_file("rep/f.py") == "foo = 1\nbar = 20\nbaz = 3\nfoo = 1\naaa\n"
    ok(tools, command="str_replace", path="rep/f.py", old_str="baz = 3\n")  # no new_str: delete
    assert sandbox.read_file("rep/f.py") == "foo = 1\nbar = 20\nfoo = 1\naaa\n"


@docker
def test_insert_at_top_middle_and_end(tools, sandbox):
    sandbox.write_file("ins/f.txt", "a\nb")  # no newline at the end
    ok(tools, command="insert", path="ins/f.txt", insert_line=0, new_str="top")
    ok(tools, command="insert", path="ins/f.txt", insert_line=2, new_str="mid1\nmid2\n")
    out = ok(tools, command="insert", path="ins/f.txt", insert_line=5, new_str="end")
    assert sandbox.read_file("ins/f.txt") == "top\na\nmid1\nmid2\nb\nend\n"
    assert out.split(":\n", 1)[1].startswith("     2\ta\n")  # the snippet starts 4 lines above
    assert "0 to 6" in err(tools, command="insert", path="ins/f.txt", insert_line=7, new_str="x")
    assert "0 to 6" in err(tools, command="insert", path="ins/f.txt", insert_line=-1, new_str="x")
    assert "needs the `new_str`" in err(tools, command="insert", path="ins/f.txt", insert_line=1)


@docker
def test_undo_edit_walks_back_each_files_history(tools, sandbox):
    assert "no edit of /testbed/undo/f.py to undo" in err(tools, command="undo_edit", path="undo/f.py")
    ok(tools, command="create", path="undo/f.py", file_text="one\n")
    ok(tools, command="str_replace", path="undo/f.py", old_str="one", new_str="two")
    ok(tools, command="insert", path="undo/f.py", insert_line=1, new_str="three")
    sandbox.write_file("undo/other.py", "x\n")
    ok(tools, command="str_replace", path="undo/other.py", old_str="x", new_str="y")
    assert sandbox.read_file("undo/f.py") == "two\nthree\n"
    assert ok(tools, command="undo_edit", path="undo/f.py").endswith("     1\ttwo")
    assert ok(tools, command="undo_edit", path="/testbed/undo/../undo/f.py").endswith("     1\tone")
    assert sandbox.read_file("undo/other.py") == "y\n"  # another file's history is its own
    assert "removed" in ok(tools, command="undo_edit", path="undo/f.py")
    assert "does not exist" in err(tools, command="view", path="undo/f.py")
    assert "no edit" in err(tools, command="undo_edit", path="undo/f.py")


@docker
@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "/testbed/../etc", "/testbed2/x", "a/../../tmp/x", "//etc"])
def test_paths_outside_the_workspace_are_refused(tools, sandbox, path):
    for args in ({"command": "view"}, {"command": "create", "file_text": "pwned\n"},
                 {"command": "str_replace", "old_str": "root", "new_str": "toor"}):
        assert "outside the workspace" in err(tools, path=path, **args)
    assert sandbox.exec("test -e /x || test -e /tmp/x || test -e /testbed2").exit_code == 1
    assert "toor" not in sandbox.read_file("/etc/passwd")


@docker
def test_bash_reports_exit_codes_empty_output_and_timeouts(sandbox):
    tools = ToolBox(sandbox, max_timeout_s=1.5)
    assert tools.run("bash", {"command": "echo hello"}).output == "hello"
    assert tools.run("bash", {"command": "true"}).output == "(no output; exit code 0)"
    failed = tools.run("bash", {"command": "echo oops >&2; exit 3"})
    assert failed.output == "oops\n(exit code 3)" and not failed.error  # the tool worked; the command failed
    assert tools.run("bash", {"command": "pwd", "timeout": "5"}).output == "/testbed"  # a numeric string is fine
    slow = tools.run("bash", {"command": "echo started; sleep 30", "timeout": 100})  # capped at 1.5s
    assert slow.output == "started\n(the command timed out: killed after 1.5s)"
    assert tools.run("bash", {"command": "sleep 30", "timeout": 1}).output == "(no output; the command timed out: killed after 1s)"


@docker
def test_long_observations_keep_head_and_tail_and_mark_the_cut(sandbox):
    tools = ToolBox(sandbox, max_output_bytes=2000)
    out = tools.run("bash", {"command": "seq 1 100000"}).output
    assert out.startswith("1\n2\n3\n") and out.endswith("99999\n100000") and CUT in out
    assert len(out.encode()) < 2100
    sandbox.write_file("long/f.txt", "".join(f"line {i}\n" for i in range(5000)))
    view = tools.run("str_replace_editor", {"command": "view", "path": "long/f.txt"}).output
    assert view.startswith("Here's the result") and CUT in view and view.endswith("  5000\tline 4999")


@docker
@pytest.mark.parametrize("name, args, says", [
    ("rm_rf", {}, "no tool named 'rm_rf'"),
    ("bash", "ls", "must be a JSON object"),
    ("bash", {}, "missing required argument(s) ['command']"),
    ("bash", {"command": 5}, "`command` must be a string, got int 5"),
    ("bash", {"command": "ls", "cwd": "/"}, "unknown argument(s) ['cwd']"),
    ("bash", {"command": "  "}, "`command` is empty"),
    ("bash", {"command": "ls", "timeout": "soon"}, "`timeout` must be a number"),
    ("bash", {"command": "ls", "timeout": -1}, "positive number of seconds"),
    ("bash", {"command": "ls", "timeout": True}, "`timeout` must be a number"),
    ("str_replace_editor", {"command": "delete", "path": "a"}, "must be one of ['view', 'create'"),
    ("str_replace_editor", {"command": "view"}, "missing required argument(s) ['path']"),
    ("str_replace_editor", {"command": "view", "path": "."}, None),
    ("str_replace_editor", {"command": "view", "path": "", "view_range": None}, "`path` is empty"),
    ("str_replace_editor", {"command": "view", "path": "a", "view_range": [1]}, "exactly 2 items, got 1"),
    ("str_replace_editor", {"command": "view", "path": "a", "view_range": ["a", 2]}, "`view_range[0]` must be an integer"),
    ("str_replace_editor", {"command": "create", "path": "bad.txt"}, "`create` needs the `file_text` argument"),
    ("str_replace_editor", {"command": "str_replace", "path": "a", "new_str": "b"}, "needs the `old_str`"),
    ("str_replace_editor", {"command": "insert", "path": "a", "new_str": "b"}, "needs the `insert_line`"),
    ("str_replace_editor", {"command": "insert", "path": "a", "insert_line": 1.5, "new_str": "b"}, "must be an integer"),
    ("submit", {"now": True}, "it takes no arguments"),
])
def test_bad_calls_are_error_observations(tools, name, args, says):
    r = tools.run(name, args)
    if says is None:
        assert not r.error
        return
    assert r.error and not r.submitted and r.output.startswith("Error: ") and says in r.output, r.output


@docker
def test_submit_ends_the_episode(tools):
    r = tools.run("submit", {})
    assert r.submitted and not r.error and "Submitted" in r.output
