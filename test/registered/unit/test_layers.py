"""The package's layers, read from its import statements.

- ``ops/`` imports nothing of the package outside ``ops/`` and never SGLang;
- the bag (``config.py``) imports only the torch-free kernel choice, the split kernels' bounds and the family rule;
- the plugin's hook modules import only ``ops``, the bag, the plugin's
  ``positions`` and ``channels`` modules, the request-seed rules (``seeds``), the
  request-field rules (``request_rules``), SGLang's KV-move rules (``kv_move_warmup``)
  and SGLang; ``positions`` imports only ``ops``
  and ``channels``; ``channels`` nothing of the package, ``request_rules`` only the torch-free
  seed encoding (its seed rule is that range check's); the bag's resolution from
  SGLang (``resolve``, with the start-up hooks in ``startup``) only the bag, the family rule and the
  start-up notes (``startup_notes``), which import of the package only the bag and the family rule;
- no module imports a hook module except the registration (``sglang_plugin/__init__.py``);
- kernels live in ``ops/``: no ``@triton.jit`` (or ``@triton.autotune``, ``@triton.heuristics``) anywhere else;
- position rules live in ``positions.py``: no hook module adds to or subtracts from a
  position (see :func:`position_arithmetic` for the exact rule).
"""

import ast
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

PACKAGE = Path(__file__).resolve().parents[3] / "python" / "sglang_detspec"
PLUGIN = PACKAGE / "sglang_plugin"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from x import y`` also as ``x.y``)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return out


def own(names: set[str]) -> set[str]:
    """The package's own modules among ``names`` (names that are functions or classes dropped)."""
    found = set()
    for name in names:
        if not name.startswith("sglang_detspec"):
            continue
        rel = Path(*name.split(".")[1:])
        if (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists():
            found.add(name)
    return found


def allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


ALL = sorted(PACKAGE.rglob("*.py"))
HOOK_MODULES = sorted(p for p in PLUGIN.glob("*.py") if p.name not in ("__init__.py", "resolve.py", "startup.py",
                                                                      "startup_notes.py",
                                                                      "positions.py", "channels.py", "request_rules.py",
                                                                      "decode_attention.py", "shape_rules.py",
                                                                      "fa3_split.py", "fa3_own_calls.py",
                                                                      "kv_move_warmup.py", "forward_sizes.py",
                                                                      "moe_tables.py"))


@pytest.mark.parametrize("path", sorted((PACKAGE / "ops").glob("*.py")), ids=lambda p: p.name)
def test_ops_import_only_ops(path):
    names = imports(path)
    assert not any(n == "sglang" or n.startswith("sglang.") for n in names)
    bad = {n for n in own(names) if not allowed(n, ("sglang_detspec.ops",))}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_bag_imports_only_the_kernel_choice_and_the_family_rule():
    # The family rule and the split kernels' bounds are part of the claim the bag makes (torch- and
    # SGLang-free, like the bag); the error wording is shared with every op.
    assert own(imports(PACKAGE / "config.py")) <= {"sglang_detspec.ops", "sglang_detspec.ops.kernel_choice",
                                                   "sglang_detspec.ops.split_limits", "sglang_detspec.model_family",
                                                   "sglang_detspec.ops.choices"}


@pytest.mark.parametrize("path", HOOK_MODULES, ids=lambda p: p.name)
def test_hook_modules_import_ops_the_bag_positions_and_the_rules(path):
    keep = ("sglang_detspec.ops", "sglang_detspec.config", "sglang_detspec.sglang_plugin.positions",
            "sglang_detspec.sglang_plugin.channels", "sglang_detspec.seeds", "sglang_detspec.ops.seed_encoding",
            "sglang_detspec.sglang_plugin.request_rules", "sglang_detspec.sglang_plugin.decode_attention",
            "sglang_detspec.sglang_plugin.shape_rules", "sglang_detspec.sglang_plugin.fa3_split",
            "sglang_detspec.sglang_plugin.fa3_own_calls", "sglang_detspec.sglang_plugin.kv_move_warmup",
            "sglang_detspec.sglang_plugin.forward_sizes", "sglang_detspec.sglang_plugin.moe_tables")
    bad = {n for n in own(imports(path)) if not allowed(n, keep)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


@pytest.mark.parametrize("name, keep", [
    ("positions.py", ("sglang_detspec.ops", "sglang_detspec.sglang_plugin.channels")),
    ("channels.py", ()),
    # shape_rules: the parallel layout that keeps a draft shape fixed, a bag field (one rule for the server and bag).
    ("resolve.py", ("sglang_detspec.config", "sglang_detspec.model_family", "sglang_detspec.sglang_plugin.startup_notes",
                    "sglang_detspec.sglang_plugin.shape_rules")),
    ("startup_notes.py", ("sglang_detspec.config", "sglang_detspec.model_family")),
    ("decode_attention.py", ()),
    ("fa3_split.py", ("sglang_detspec.ops",)),
    ("startup.py", ("sglang_detspec.config", "sglang_detspec.sglang_plugin.resolve",
                    "sglang_detspec.sglang_plugin.startup_notes")),
    ("request_rules.py", ("sglang_detspec.ops.seed_encoding",)),
    ("shape_rules.py", ("sglang_detspec.config",)),  # the settings' names, written once there
    ("kv_move_warmup.py", ()),
    ("forward_sizes.py", ()),
    ("moe_tables.py", ()),
])
def test_shared_plugin_modules(name, keep):
    bad = {n for n in own(imports(PLUGIN / name)) if not allowed(n, keep)}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_registration_imports_hook_modules(path):
    if path == PLUGIN / "__init__.py":
        return
    hooks = {module_name(p) for p in HOOK_MODULES} | {"sglang_detspec.sglang_plugin.startup"}
    bad = own(imports(path)) & hooks
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", [p for p in ALL if p.parent != PACKAGE / "ops"], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_package_imports_each_op_from_its_module(path):
    """``ops/__init__`` is the users' face; inside the package every hook -> op edge names its module."""
    lazy = [n for n in imports(path) if n.startswith("sglang_detspec.ops.") and n.count(".") == 2
            and not own({n})]
    assert not lazy, f"{path.relative_to(PACKAGE)} imports {lazy} through ops/__init__"


def test_the_reader_sees_relative_and_absolute_imports():
    names = own(imports(PLUGIN / "topk_draft_hook.py"))
    assert "sglang_detspec.ops.draft_children" in names and "sglang_detspec.sglang_plugin.positions" in names
    # A name bound by ops/__init__ is not a module: the check above would see it.
    assert not own({"sglang_detspec.ops.exponential_race"}) and own({"sglang_detspec.ops.race"})
    assert "sglang_detspec.sglang_plugin.resolve" in own(imports(PLUGIN / "startup.py"))


def import_cycles() -> list[list[str]]:
    """Every import cycle among the package's modules (imports anywhere in a file, function bodies included).

    An edge from a module to a package that contains it (``from . import triton_config``) is left out:
    Python runs a package's ``__init__`` before any of its modules, whatever they import.
    """
    def inside(module: str, package: str) -> bool:
        return module.startswith(package + ".")

    graph = {module_name(p): {n for n in own(imports(p)) if n != module_name(p) and not inside(module_name(p), n)}
             for p in ALL}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, set())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycles():
    cycles = import_cycles()
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


TRITON_DECORATORS = {"jit", "autotune", "heuristics"}


def triton_decorators(path: Path) -> list[int]:
    """Lines of ``@triton.jit`` / ``@triton.autotune`` / ``@triton.heuristics`` (called or not) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if (isinstance(target, ast.Attribute) and target.attr in TRITON_DECORATORS
                        and isinstance(target.value, ast.Name) and target.value.id == "triton"):
                    found.append(dec.lineno)
    return found


@pytest.mark.parametrize("path", [p for p in ALL if p.parent != PACKAGE / "ops"], ids=lambda p: str(p.relative_to(PACKAGE)))
def test_kernels_live_in_ops(path):
    lines = triton_decorators(path)
    assert not lines, f"{path.relative_to(PACKAGE)} defines a Triton kernel (lines {lines}): move it to ops/"


# Names (variables, attributes, arguments) that hold token positions or the lengths positions are derived from.
POSITION_WORDS = ("pos", "seq_len", "accept", "key", "draft_step")


def _names_position(node: ast.AST) -> str | None:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name is None and isinstance(node, ast.Subscript):
        return _names_position(node.value)
    if name is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _names_position(node.func.value)  # x.to(dtype), x.view(-1), ...
    return name if name and any(w in name.lower() for w in POSITION_WORDS) else None


def position_arithmetic(path: Path) -> list[str]:
    """Every ``+`` / ``-`` (also ``+=`` / ``-=``) in ``path`` with an operand that names a position.

    An operand names a position when it is a name or attribute (or a subscript
    or method call of one, ``x[:bs]``, ``x.to(...)``) whose identifier contains
    one of :data:`POSITION_WORDS` (``positions``, ``seq_lens``,
    ``accept_lens``, ``num_accept_tokens``, ``key``, ``draft_step``, ...).
    Returns ``"line: source"`` for each.
    """
    text = path.read_text()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            operands = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            operands = (node.target, node.value)
        else:
            continue
        if any(_names_position(op) for op in operands):
            found.append(f"{node.lineno}: {ast.get_source_segment(text, node)}")
    return found


def test_per_call_state_goes_through_channels():
    """Hook modules create no context variable and name no kept attribute themselves: channels.py does.

    A kept attribute is a string constant starting ``detspec_`` or ``_detspec_`` (the names the plugin sets
    on SGLang objects).
    """
    for path in HOOK_MODULES + [PLUGIN / "positions.py"]:
        tree = ast.parse(path.read_text())
        bad = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "ContextVar"]
        bad += [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.startswith(("detspec_", "_detspec_"))]
        assert not bad, f"{path.name} lines {bad}: publish through sglang_plugin/channels.py"


@pytest.mark.parametrize("path", HOOK_MODULES, ids=lambda p: p.name)
def test_position_rules_live_in_positions(path):
    found = position_arithmetic(path)
    assert not found, f"{path.name} computes positions (move the rule to positions.py): {found}"


def test_the_position_check_sees_position_arithmetic(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("a = batch.seq_lens + 1\nb = key - width\nc = accepted.to(k.dtype) + positions[:bs]\n"
                     "d = rows + 1\ne = batch.accept_lens.to(x) - 1\n")
    assert [f.split(":")[0] for f in position_arithmetic(probe)] == ["1", "2", "3", "5"]
    assert position_arithmetic(PLUGIN / "positions.py"), "positions.py holds the rules, so the check must see them"


def test_the_kernel_check_sees_kernels(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import triton\n@triton.jit\ndef k(x):\n    pass\n@triton.jit(do_not_specialize=['x'])\n"
                     "def k2(x):\n    pass\n@functools.cache\ndef f():\n    pass\n")
    assert triton_decorators(probe) == [2, 5]
    assert triton_decorators(PACKAGE / "ops" / "node_rows_triton.py")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
