"""`coreserve python-envs list|prune`: the environments built from models' requirements.txt."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from coreserve_python.server.env.cache import CachedEnvironment, EnvironmentCache, default_cache_dir

HELP = "list or prune the Python environments built from models' requirements.txt"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coreserve python-envs", description=HELP)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--cache-dir",
        "--python-env-cache-dir",
        dest="cache_dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the servers' --python-env-cache-dir (default {default_cache_dir()})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "list", parents=[where], help="path, requirements hash, size, last use and Python of each environment"
    )
    prune = commands.add_parser(
        "prune",
        parents=[where],
        help="remove the environments no running server uses (and what builds cut short left)",
    )
    prune.add_argument(
        "--older-than",
        type=float,
        default=None,
        metavar="DAYS",
        help="remove only those last used more than DAYS days ago",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    cache = EnvironmentCache(args.cache_dir or default_cache_dir())
    if args.command == "list":
        entries = cache.entries()
        if entries:
            _list(entries)
        else:
            print(f"(no environments in {cache.root})")
        return 0
    oldest = None if args.older_than is None else time.time() - args.older_than * 86400
    for entry in cache.entries():
        if oldest is not None and entry.last_used > oldest:
            continue
        removed = cache.remove_unused(entry)
        print(f"{'removed' if removed else 'kept (in use)'} {entry.path}")
    for folder in cache.remove_leftovers():
        print(f"removed {folder} (a build cut short)")
    return 0


def _list(entries: list[CachedEnvironment]) -> None:
    rows = [("PATH", "REQUIREMENTS SHA256", "SIZE", "LAST USED", "PYTHON")]
    for entry in entries:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used))
        size = f"{entry.size() / 2**20:.1f} MiB"
        rows.append((str(entry.path), entry.requirements_hash[:16], size, used, entry.python))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
