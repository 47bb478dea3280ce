"""The offline sandbox base image: Debian bookworm (minbase) with python3, pytest, git and patch.

No registry is needed: the root filesystem comes from `debootstrap` against a Debian mirror and
is imported with `docker import`. The image is cached by tag; a present tag is never rebuilt
unless asked (`--force`).

    python -m sandbox.images [--tag sao-sandbox:bookworm] [--mirror URL] [--force]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker.errors
from rich.console import Console

from sandbox.base import SandboxError
from sandbox.docker import DEFAULT_IMAGE, client

PACKAGES = ["python3", "python3-pytest", "git", "patch", "procps", "ca-certificates"]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Written into the image so git works on any copied-in repository and commits need no setup.
GITCONFIG = """[safe]
\tdirectory = *
[user]
\tname = sandbox
\temail = sandbox@localhost
[init]
\tdefaultBranch = main
[advice]
\tdetachedHead = false
"""

console = Console(stderr=True)


def image_exists(tag: str) -> bool:
    try:
        client().images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def pull_image(name: str, docker_client=None, show_progress: bool = True) -> None:
    """Pull `name` with a progress bar (bytes over all layers). Raises SandboxError naming the
    image and how to provide it when no registry answers (this is the usual case offline)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    api = (docker_client or client()).api
    repository, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    layers: dict[str, tuple[int, int]] = {}
    try:
        with Progress(TextColumn(f"pulling {name}"), BarColumn(), DownloadColumn(), console=console,
                      disable=not show_progress, transient=True) as progress:
            bar = progress.add_task("pull", total=None)
            for event in api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    raise docker.errors.APIError(event["error"])
                detail = event.get("progressDetail") or {}
                if event.get("id") and detail.get("total"):
                    layers[event["id"]] = (detail.get("current", 0), detail["total"])
                    progress.update(bar, completed=sum(c for c, _ in layers.values()),
                                    total=sum(t for _, t in layers.values()))
    except (docker.errors.APIError, docker.errors.DockerException) as e:
        raise SandboxError(
            f"image {name!r} is not on this Docker engine and could not be pulled ({str(e).strip()[:300]}). "
            f"Provide it: `docker pull {name}` where a registry is reachable (then `docker save` / "
            f"`docker load` to carry it here), or build it with swebench's harness "
            f"(`python -m swebench.image_builder.prepare_images`); the built-in tasks use `python -m sandbox.images`."
        ) from e


def build_base_image(tag: str = DEFAULT_IMAGE, mirror: str = DEFAULT_MIRROR, suite: str = "bookworm") -> str:
    """Build the base image with debootstrap + docker import; returns the tag."""
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed: `apt-get install -y debootstrap` (setup.sh does this)")
    engine = client()
    with tempfile.TemporaryDirectory(prefix="sao-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root), mirror,
        ]
        lines: list[str] = []
        with console.status(f"debootstrap {suite} into {root} (about a minute)") as status:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                lines.append(line.rstrip())
                status.update(f"debootstrap: {line.strip()[:100]}")
            if proc.wait() != 0:
                tail = "\n".join(lines[-20:])
                raise SandboxError(f"debootstrap failed (exit {proc.returncode}) with mirror {mirror}:\n{tail}")
        (root / "etc" / "gitconfig").write_text(GITCONFIG)
        # apt caches are dead weight in a sandbox that has no network
        shutil.rmtree(root / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar_path = Path(tmp) / "rootfs.tar"
        with console.status(f"packing and importing as {tag}"):
            subprocess.run(["tar", "-C", str(root), "-cf", str(tar_path), "."], check=True)
            repo, _, version = tag.partition(":")
            engine.api.import_image_from_file(
                str(tar_path), repository=repo, tag=version or "latest",
                changes=['WORKDIR /testbed', 'CMD ["sleep", "infinity"]', "ENV LC_ALL=C.UTF-8"],
            )
    console.print(f"[green]built sandbox base image {tag}[/green]")
    return tag


def ensure_base_image(tag: str = DEFAULT_IMAGE, mirror: str = DEFAULT_MIRROR, force: bool = False) -> str:
    """Return `tag`, building it first when the engine does not have it."""
    if not force and image_exists(tag):
        return tag
    return build_base_image(tag, mirror)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.images", description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", default=DEFAULT_IMAGE)
    p.add_argument("--mirror", default=DEFAULT_MIRROR)
    p.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    args = p.parse_args(argv)
    try:
        tag = ensure_base_image(args.tag, args.mirror, args.force)
    except SandboxError as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    console.print(f"sandbox base image: {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
