"""Remove sandbox containers left behind by runs that died.

    python -m sandbox.sweep            # those whose owning process on this host is gone
    python -m sandbox.sweep --run-id ID
    python -m sandbox.sweep --all      # every sandbox container, live runs included
"""

import argparse
import sys

from sandbox.base import SandboxError
from sandbox.docker import sweep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandbox.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id")
    p.add_argument("--all", action="store_true")
    args = p.parse_args(argv)
    try:
        removed = sweep(run_id=args.run_id, everything=args.all)
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"removed {len(removed)} sandbox container(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
