"""The documentation names everything a user can set or read (datasette's habit).

A `coreserve` flag (from the parser the command builds), a model-configuration `parameters` key
that the server or a shipped plugin reads (found in their source, where it is read), and a
metric family the server exports (scraped from a real server, plus the GPU families, which need
a GPU to be scraped) must each appear somewhere in the site built from docs/, with what the
pages include (README's sections, the plugins' READMEs) resolved as MkDocs resolves them.
The flags of `coreserve analyze` must each appear on its own page, docs/analyze.md.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coreserve.analyze._flags import parser as analyze_parser
from coreserve.backend import parameters as parameter_readers
from coreserve.cli._flags import serve_parser
from coreserve.server.metrics._system_metrics import GPU_FAMILIES
from coreserve.testing import ServerProcess
from support.paths import EXAMPLES, REPO
from support.servers.openai_repository import openai_url

DOCS = REPO / "docs"
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', flags=re.M)
# Families that prometheus-client adds by itself; the metrics page names them by these prefixes.
CLIENT_COLLECTORS = ("process_", "python_")


def _included(reference: str) -> str:
    """What a `--8<-- "path[:section]"` line stands for (pymdownx.snippets, base path: the root)."""
    path, _, section = reference.partition(":")
    text = (REPO / path).read_text()
    if not section:
        return text
    start, end = f"--8<-- [start:{section}]", f"--8<-- [end:{section}]"
    assert start in text and end in text, f"{path} has no section '{section}'"
    return text.split(start, 1)[1].split(end, 1)[0]


def site_text() -> str:
    """Every page of the site, with its includes in place."""
    pages = sorted(DOCS.rglob("*.md"))
    assert pages, "docs/ holds no pages"
    return "\n".join(_INCLUDE.sub(lambda m: _included(m.group(1)), page.read_text()) for page in pages)


def _named(text: str, word: str) -> bool:
    """`word` stands on its own: not as the start or end of a longer name."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# --- flags ---------------------------------------------------------------------------------


def test_every_flag_of_the_serving_command_is_documented() -> None:
    text = site_text()
    flags = [option for action in serve_parser()._actions for option in action.option_strings]
    assert "--model-repository" in flags and "--openai-port" in flags
    missing = sorted(flag for flag in flags if flag.startswith("--") and not _named(text, flag))
    assert not missing, f"flags of `coreserve` that no page of docs/ names: {missing}"


def test_every_flag_of_coreserve_ray_is_documented() -> None:
    from coreserve.cli._ray import _parser

    text = site_text()
    flags = [option for action in _parser()._actions for option in action.option_strings]
    missing = sorted(flag for flag in flags if flag.startswith("--") and not _named(text, flag))
    assert not missing, f"flags of `coreserve ray` that no page of docs/ names: {missing}"


def test_every_flag_of_coreserve_analyze_is_documented_on_its_page() -> None:
    page = (DOCS / "analyze.md").read_text()
    flags = [option for action in analyze_parser()._actions for option in action.option_strings]
    assert "--latency-budget-ms" in flags and "--server-url" in flags
    missing = sorted(flag for flag in flags if flag.startswith("--") and not _named(page, flag))
    assert not missing, f"flags of `coreserve analyze` that docs/analyze.md does not name: {missing}"


# --- model-configuration parameters ---------------------------------------------------------

# The helpers of coreserve.backend that read one key of a configuration's `parameters`.
READERS = frozenset(
    name
    for name, function in vars(parameter_readers).items()
    if inspect.isfunction(function) and list(inspect.signature(function).parameters)[:2] == ["config", "key"]
)


def _source_roots() -> list[Path]:
    return [REPO / "core" / "coreserve", *sorted((REPO / "plugins").glob("*/coreserve_*"))]


@dataclass
class _Module:
    """One source file: its tree, its module-level string constants and what it imports."""

    name: str
    path: Path
    tree: ast.Module
    constants: dict[str, list[str]] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name: (module, name)


def _strings(node: ast.expr | None) -> list[str] | None:
    """A string, or the strings of a tuple, list, set or dict's keys; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        values = [_strings(element) for element in node.elts]
        return None if None in values else [v for value in values if value for v in value]
    if isinstance(node, ast.Dict):
        keys = [
            key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)
        ]
        return keys or None
    return None


def _modules() -> dict[str, _Module]:
    modules = {}
    for root in _source_roots():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(), str(path))
            module = _Module(name, path, tree)
            for node in tree.body:
                target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
                if isinstance(node, ast.AnnAssign):
                    target = node.target
                if isinstance(target, ast.Name) and (values := _strings(node.value)) is not None:  # type: ignore[union-attr]
                    module.constants[target.id] = values
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        module.imports[alias.asname or alias.name] = (node.module, alias.name)
                for child in ast.iter_child_nodes(node):
                    child.parent = node  # type: ignore[attr-defined]
            modules[name] = module
    return modules


class _Keys:
    """Resolves the key expression of each `parameters` read to the strings it can be."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules
        self.unresolved: list[str] = []

    def read_sites(self, module: _Module) -> Iterator[ast.expr]:
        """The key expression of each read of a configuration's `parameters` in `module`."""
        for node in ast.walk(module.tree):
            function = _enclosing(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function is not None and function.name in READERS:
                continue  # the helpers' own bodies read whatever key their caller names
            if isinstance(node, ast.Call):
                callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if callee in READERS and len(node.args) >= 2:
                    yield node.args[1]
                elif callee == "get" and _is_config_parameters(node.func.value) and node.args:  # type: ignore[attr-defined]
                    yield node.args[0]
            elif isinstance(node, ast.Subscript) and _is_config_parameters(node.value):
                yield node.slice

    def resolve(self, node: ast.expr, module: _Module, depth: int = 0) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name) and depth < 4:
            loop = _loop_over(node)
            if loop is not None:
                return self.resolve(loop, module, depth + 1)
            function = _enclosing(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function is not None and node.id in [a.arg for a in function.args.args]:
                return self._from_callers(function, node.id, module, depth)
            found = self._constant(node.id, module)
            if found is not None:
                return found
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("items", "keys")
        ):
            return self.resolve(node.func.value, module, depth + 1)
        self.unresolved.append(f"{module.path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        return []

    def _constant(self, name: str, module: _Module) -> list[str] | None:
        if name in module.constants:
            return module.constants[name]
        source = module.imports.get(name)
        if source is not None and source[0] in self.modules:
            return self._constant(source[1], self.modules[source[0]])
        return None

    def _from_callers(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef, parameter: str, module: _Module, depth: int
    ) -> list[str]:
        """A parameter of the reading function: the keys its callers in the module hand it."""
        index = [a.arg for a in function.args.args].index(parameter)
        keys = []
        for call in ast.walk(module.tree):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == function.name
            ):
                given = next((k.value for k in call.keywords if k.arg == parameter), None)
                if given is None and index < len(call.args):
                    given = call.args[index]
                if given is not None:
                    keys += self.resolve(given, module, depth + 1)
        if not keys:
            self.unresolved.append(
                f"{module.path.relative_to(REPO)}: no caller of {function.name} names a key"
            )
        return keys


def _enclosing(node: ast.AST, kind: type | tuple[type, ...]) -> ast.AST | None:
    parent = getattr(node, "parent", None)
    while parent is not None and not isinstance(parent, kind):
        parent = getattr(parent, "parent", None)
    return parent


def _loop_over(name: ast.Name) -> ast.expr | None:
    """What a `for` loop around `name` iterates over, when `name` is (the first part of) its target."""
    loop = _enclosing(name, ast.For)
    while loop is not None:
        target = loop.target  # type: ignore[attr-defined]
        first = target.elts[0] if isinstance(target, ast.Tuple) else target
        if isinstance(first, ast.Name) and first.id == name.id:
            return loop.iter  # type: ignore[attr-defined,no-any-return]
        loop = _enclosing(loop, ast.For)
    return None


def _is_config_parameters(node: ast.expr) -> bool:
    """`<a model configuration>.parameters`: the name holding it says it is a config."""
    if not (isinstance(node, ast.Attribute) and node.attr == "parameters"):
        return False
    owner = node.value
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    return "config" in name.lower()


def configuration_parameter_keys() -> dict[str, set[str]]:
    """Each key read from a model configuration's `parameters`, with the modules that read it."""
    modules = _modules()
    keys = _Keys(modules)
    found: dict[str, set[str]] = {}
    for module in modules.values():
        for site in keys.read_sites(module):
            for key in keys.resolve(site, module):
                found.setdefault(key, set()).add(module.name)
    assert not keys.unresolved, "reads of `parameters` whose key this test cannot tell:\n" + "\n".join(
        keys.unresolved
    )
    return found


def test_the_parameter_reads_are_found() -> None:
    """The collector sees reads of each kind: a helper, a constant, a loop, a caller's argument."""
    keys = configuration_parameter_keys()
    assert {"inline_execution_below_us", "chat_template", "pipeline_depth", "EXECUTION_ENV_PATH"} <= set(keys)
    assert {"TF_NUM_INTRA_THREADS", "threads_per_tree", "cudnn_conv_algo_search"} <= set(keys)
    assert "sequence_id" not in keys  # a request's parameter, not the configuration's


def test_every_configuration_parameter_read_is_documented() -> None:
    text = site_text()
    missing = sorted(
        f"{key} (read in {', '.join(sorted(readers))})"
        for key, readers in configuration_parameter_keys().items()
        if f"`{key}`" not in text and f'"{key}"' not in text
    )
    assert not missing, "model-configuration parameters that no page of docs/ names:\n" + "\n".join(missing)


# --- metric families -------------------------------------------------------------------------

# Everything that makes a family appear: a cached model, a decoupled one (first-response
# histogram), every latency family, the OpenAI frontend. The GPU families need NVML and a GPU.
SCRAPED_FLAGS = [
    "--cache-config=local,size=1048576",
    "--metrics-config=summary_latencies=true",
    "--metrics-config=histogram_latencies=true",
    "--openai-port=0",
]


@pytest.fixture(scope="module")
def exported_families(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    repository = tmp_path_factory.mktemp("families")
    shutil.copytree(EXAMPLES / "simple", repository / "simple")
    shutil.copytree(EXAMPLES / "toy_chat", repository / "toy_chat")
    with (repository / "simple" / "config.pbtxt").open("a") as config:
        config.write("\nresponse_cache { enable: true }\n")
    server = ServerProcess([repository], SCRAPED_FLAGS).start(timeout=120)
    try:
        # The OpenAI families hold a model's metrics from its first request on.
        chat = {"model": "toy_chat", "messages": [{"role": "user", "content": "count me"}]}
        request = urllib.request.Request(
            openai_url(server) + "/chat/completions",
            data=json.dumps(chat).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.load(answer)["choices"][0]["message"]["content"] == "You said: count me"
        with urllib.request.urlopen(server.metrics_url, timeout=30) as answer:
            scraped = answer.read().decode()
    finally:
        server.close()
    # Each family as its TYPE line names it (a parser would take a counter's `_total` off).
    return set(re.findall(r"^# TYPE (\S+) ", scraped, flags=re.M))


def test_every_exported_metric_family_is_documented(exported_families: set[str]) -> None:
    text = site_text()
    families = {f for f in exported_families if not f.startswith(CLIENT_COLLECTORS)}
    families |= {name for name, _kind, _help in GPU_FAMILIES}
    assert {"nv_inference_request_success", "nv_cache_num_hits_per_model"} <= families
    assert any(f.startswith("coreserve_openai_") for f in families), families
    missing = sorted(f for f in families if not _named(text, f))
    assert not missing, f"metric families that no page of docs/ names: {missing}"
    for prefix in CLIENT_COLLECTORS:
        assert f"`{prefix}*`" in text, f"docs/ does not name prometheus-client's {prefix}* families"
