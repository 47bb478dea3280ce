"""git on the host with a fixed identity and fixed dates, so the same bug gives the same commit
hash on every machine (the generator's tasks and the built-in suite's rebuilt repositories)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# Every commit this module makes carries these, so the same bug gives the same hash anywhere.
FIXED_DATE = "2024-01-01T00:00:00+0000"
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "sao-smith", "GIT_AUTHOR_EMAIL": "smith@sao.invalid", "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_NAME": "sao-smith", "GIT_COMMITTER_EMAIL": "smith@sao.invalid", "GIT_COMMITTER_DATE": FIXED_DATE,
}
_FAILED = ("FAILED", "ERROR")


def git(repo: Path, *args: str, input: str | bytes | None = None, env: dict | None = None) -> str:
    """Run git in `repo` with the fixed identity; stdout, or a RuntimeError with git's stderr."""
    full_env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    data = input.encode() if isinstance(input, str) else input
    r = subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
                       input=data, capture_output=True, env=full_env)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {repo}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout.decode(errors="replace")


def bug_message(instance_id: str) -> str:
    return f"Inject bug {instance_id}"


def commit_tree(repo: Path, tree: str, parent: str | None, message: str) -> str:
    """A commit of `tree` on `parent` (None: a root commit) with the fixed identity and dates:
    the same inputs give the same hash on every machine."""
    return git(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message).strip()


def commit_file(repo: Path, parent: str, path: str, content: str, message: str) -> str:
    """Commit `parent` with `path` replaced by `content`, without touching HEAD or the worktree."""
    mode = git(repo, "ls-tree", parent, "--", path).split()[0]
    blob = git(repo, "hash-object", "-w", "--stdin", input=content).strip()
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", parent, env=index)
        git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=index)
        tree = git(repo, "write-tree", env=index).strip()
    return commit_tree(repo, tree, parent, message)


def diff(repo: Path, old: str, new: str) -> str:
    """`git diff old new` as a patch `git apply` takes (a/ b/ prefixes, no colour, plain paths)."""
    return git(repo, "-c", "core.quotepath=false", "diff", "--no-color", "--no-ext-diff",
               "--src-prefix=a/", "--dst-prefix=b/", old, new)
