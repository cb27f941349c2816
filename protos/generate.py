"""Regenerates coreserve's Python protobuf and gRPC modules from the .proto files here.

Run `python protos/generate.py` (needs the grpcio-tools version pinned in
tests/requirements.txt). The generated modules register their descriptors in a
private descriptor pool instead of protobuf's default pool: tritonclient's own
generated modules define the same `inference.*` names, and both must be
importable in one process (a test, or a user's client that embeds a server).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
OUTPUT_DIR = PROTO_DIR.parent / "core" / "coreserve" / "protos"
PROTO_FILES = ("model_config.proto", "grpc_service.proto", "health.proto", "traffic.proto")
MODULE_NAMES = ("model_config_pb2", "grpc_service_pb2", "health_pb2", "traffic_pb2")
POOL_IMPORT = "from coreserve.protos._pool import POOL as _POOL\n"


def _postprocess(name: str, text: str) -> str:
    # Sibling imports become package-relative imports.
    for module in MODULE_NAMES:
        text = re.sub(rf"^import {module} as ", f"from . import {module} as ", text, flags=re.M)
    if name.endswith("_pb2.py"):
        text = text.replace("_descriptor_pool.Default()", "_POOL")
        text = text.replace(
            "from google.protobuf.internal import builder as _builder\n",
            "from google.protobuf.internal import builder as _builder\n" + POOL_IMPORT,
        )
    return text


def render() -> dict[str, str]:
    """Returns the generated modules as {file name: text}, without writing them."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTO_FILES,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        outputs = {}
        for path in sorted(Path(tmp).iterdir()):
            if path.name == "model_config_pb2_grpc.py":
                continue  # model_config.proto defines no service
            outputs[path.name] = _postprocess(path.name, path.read_text())
        return outputs


def main() -> int:
    for name, text in render().items():
        (OUTPUT_DIR / name).write_text(text)
        print(f"wrote {OUTPUT_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
