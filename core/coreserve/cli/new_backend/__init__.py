"""`coreserve new-backend NAME`: writes a backend distribution that passes its tests as written.

The files come from `template/`: `.tmpl` files are `string.Template`s, and `PACKAGE` and `NAME`
in a path become the module's and the backend's names. examples/backends/echo in coreserve's
repository is exactly what `coreserve new-backend echo` writes (a test keeps it so).
"""

from __future__ import annotations

import argparse
import re
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "template"
# A backend name becomes part of a module name and of an entry point: lowercase, no dashes.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class SkeletonNames:
    """The names a new backend's files use, all derived from the backend's name."""

    name: str  # the configuration's `backend` field: "my_format"
    module: str  # the import package: "coreserve_my_format"
    distribution: str  # what pip installs: "coreserve-my-format-backend"
    Class: str  # the prefix of the class names: "MyFormat" (MyFormatBackend, MyFormatInstance)
    platform: str  # the platform it serves: "my_format_platform"
    model_file: str  # the default model file name: "model.my_format"

    @classmethod
    def for_backend(cls, name: str) -> SkeletonNames:
        if not NAME_PATTERN.match(name):
            raise ValueError(
                f"backend name {name!r} must start with a lowercase letter and hold only lowercase "
                "letters, digits and underscores (it becomes part of a Python module name)"
            )
        return cls(
            name=name,
            module=f"coreserve_{name}",
            distribution=f"coreserve-{name.replace('_', '-')}-backend",
            Class="".join(part.capitalize() for part in name.split("_")),
            platform=f"{name}_platform",
            model_file=f"model.{name}",
        )


def write_skeleton(name: str, directory: Path) -> list[Path]:
    """Writes the distribution of backend `name` into `directory`; returns the files written.

    :param name: the backend's name (see `NAME_PATTERN`).
    :param directory: where to write; it must not exist, or be empty.
    """
    names = SkeletonNames.for_backend(name)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"{directory} exists and is not empty; choose another --directory")
    values = asdict(names)
    written = []
    for source in sorted(TEMPLATE.rglob("*")):
        if not source.is_file():
            continue
        relative = source.relative_to(TEMPLATE).as_posix()
        relative = relative.replace("PACKAGE", names.module).replace("NAME", names.name)
        target = directory / relative.removesuffix(".tmpl")
        target.parent.mkdir(parents=True, exist_ok=True)
        text = source.read_text()
        if source.suffix == ".tmpl":
            text = string.Template(text).substitute(values)
        target.write_text(text)
        written.append(target)
    return written


def main(argv: Sequence[str]) -> int:
    """`coreserve new-backend NAME [--directory DIR]`; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="coreserve new-backend",
        description="Writes a new backend distribution: entry point, backend module, a model, "
        "README and a conformance test that passes as written.",
    )
    parser.add_argument("name", help="the backend's name, as a config's `backend` field gives it")
    parser.add_argument(
        "--directory",
        type=Path,
        help="where to write it (default: ./coreserve-NAME-backend, dashes for underscores)",
    )
    arguments = parser.parse_args(argv)
    try:
        names = SkeletonNames.for_backend(arguments.name)
        directory = arguments.directory or Path(names.distribution)
        written = write_skeleton(arguments.name, directory)
    except (ValueError, FileExistsError) as exc:
        parser.error(str(exc))
    print(f"wrote {len(written)} files of {names.distribution} into {directory}")
    print(f"next: cd {directory} && pip install -e '.[test]' && pytest")
    return 0
