"""A bounded YAML reader for user files (scenarios, grids): no expansion bombs, no deep nesting, no duplicate keys.

PyYAML's safe loader already refuses arbitrary objects, but three things a hostile or mistyped file can
do still get through it: an alias "billion laughs" (a few hundred bytes that expand to gigabytes once a
consumer walks the shared structure), nesting thousands deep (a ``RecursionError`` traceback in the
constructor), and a key given twice (the last silently wins, e.g. a duplicated sweep axis). This module
composes the node graph first (libyaml when available), walks it once with the limits below, and only
then constructs Python objects. Errors are one-line :class:`~kvplan.errors.KvplanInputError`.

A boolean is written ``true`` or ``false``: PyYAML follows YAML 1.1, which also reads an unquoted ``yes``,
``no``, ``on`` or ``off`` (any case) as a boolean (``country: no`` becomes false), so those spellings are
refused naming their line; quoted, they are strings (and a switch field refuses a string).
"""

from __future__ import annotations

from typing import Any

import yaml

from kvplan.errors import input_error

MAX_DEPTH = 100
#: Longest YAML integer read (Python refuses int() of over 4,300 digits; no field needs more than 20).
MAX_INT_CHARS = 40
MAX_EXPANDED_NODES = 250_000  # nodes after alias expansion (inline empirical lists hold at most 100,000 values)

_BOOLS = ("true", "false")  # YAML 1.2's only spellings (any case); 1.1 also reads yes/no/on/off

_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line(node: yaml.Node) -> str:
    mark = getattr(node, "start_mark", None)
    return f" line {mark.line + 1}" if mark is not None else ""


def _check(root: yaml.Node, where: str) -> None:
    """Depth, expanded size, cycles and duplicate keys of a composed node graph (iterative, memoised)."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_EXPANDED_NODES:
                raise input_error(
                    f"{where}{_line(node)}", f"YAML expands to more than {MAX_EXPANDED_NODES:,} values (anchors/aliases?)",
                    "write the values out or put large samples in an empirical 'path' file",
                )
            continue
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":int") and len(node.value) > MAX_INT_CHARS:
            raise input_error(f"{where}{_line(node)}", f"YAML integer of {len(node.value):,} characters",
                              f"numbers here have at most {MAX_INT_CHARS} digits")
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":bool") and node.value.lower() not in _BOOLS:
            raise input_error(f"{where}{_line(node)}", f"'{node.value}' is a YAML 1.1 boolean spelling",
                              "write true or false (or quote it to mean the string)")
        if depth > MAX_DEPTH:
            raise input_error(f"{where}{_line(node)}", f"YAML nested deeper than {MAX_DEPTH} levels", "flatten the file")
        if key in size:
            continue
        if key in on_path:
            raise input_error(f"{where}{_line(node)}", "recursive YAML alias (a value that contains itself)")
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, _v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in seen:
                        raise input_error(
                            f"{where}{_line(k)}", f"key '{k.value}' given twice", "keep one (YAML would keep the last)"
                        )
                    seen.add(k.value)
        on_path.add(key)
        stack.append((node, depth, True))
        for c in _children(node):
            if id(c) not in size:
                stack.append((c, depth + 1, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml_text(text: str, where: str) -> Any:
    """Parse ``text`` (one YAML document) within the limits; ``None`` for an empty document."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "invalid YAML"
            if "nesting depth" in problem:
                raise input_error(
                    f"{where}{line}", f"YAML nested deeper than {MAX_DEPTH} levels", "flatten the file"
                ) from None
            raise input_error(f"{where}{line}", f"YAML error: {problem} (truncated or mis-indented file?)") from None
        except RecursionError:
            raise input_error(where, f"YAML nested deeper than {MAX_DEPTH} levels", "flatten the file") from None
        if node is None:
            return None
        _check(node, where)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise input_error(f"{where}{_line(node)}", f"YAML error: {problem}") from None
    finally:
        loader.dispose()
