"""The run's one console (stderr; long paths stay whole in a log) and how a user's error is said."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, soft_wrap=True)


def say_error(error: BaseException | str) -> None:
    """`error: ...` in red, the message as it is (no markup read into it)."""
    console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
