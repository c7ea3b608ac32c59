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

A number has no colon: YAML 1.1 also reads an unquoted ``8:00`` as the base-60 (sexagesimal) integer 480,
``1:30:00`` as 5400 and ``1:30.5`` as the float 90.5, so ``decoder_kv_blocks_ttl_s: 8:00`` meant as eight minutes
would silently become 480 and ``0:08:00`` a string; such a value is refused naming its line and field, with the
number YAML 1.1 would have read (write that number, or quote the value to mean the string).
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


def _sexagesimal(text: str) -> str:
    """The number YAML 1.1 reads from a base-60 scalar (``8:00`` -> ``480``, ``1:30.5`` -> ``90.5``), as text."""
    body = text.replace("_", "")
    sign = -1 if body.startswith("-") else 1
    value = 0.0
    for part in body.lstrip("+-").split(":"):
        value = value * 60 + float(part)
    value *= sign
    return f"{int(value)}" if value.is_integer() and "." not in body else f"{value:g}"


def _refuse_sexagesimal(node: yaml.ScalarNode, where: str, path: str) -> None:
    """One-line error for a YAML 1.1 base-60 number (an int or float scalar with a colon), naming its field."""
    field = f" field '{path}'" if path else ""
    raise input_error(f"{where}{_line(node)}{field}",
                      f"'{node.value}' is a YAML 1.1 base-60 number (read as {_sexagesimal(node.value)})",
                      f"write the number itself, e.g. {_sexagesimal(node.value)} if that many seconds is meant, or "
                      f"quote it ('{node.value}') to mean the string")


def _check_scalar(node: yaml.ScalarNode, where: str, path: str) -> None:
    """An integer's length, a YAML 1.1 boolean spelling, a YAML 1.1 base-60 number: one-line errors."""
    field = f" field '{path}'" if path else ""
    if node.tag.endswith(":int") and len(node.value) > MAX_INT_CHARS:
        raise input_error(f"{where}{_line(node)}{field}", f"YAML integer of {len(node.value):,} characters",
                          f"numbers here have at most {MAX_INT_CHARS} digits")
    if node.tag.endswith(":bool") and node.value.lower() not in _BOOLS:
        raise input_error(f"{where}{_line(node)}{field}", f"'{node.value}' is a YAML 1.1 boolean spelling",
                          "write true or false (or quote it to mean the string)")
    if node.tag.endswith((":int", ":float")) and ":" in node.value:
        _refuse_sexagesimal(node, where, path)


def _check(root: yaml.Node, where: str) -> None:
    """Depth, expanded size, cycles, duplicate keys, YAML 1.1 booleans and base-60 numbers of a composed node graph
    (iterative, memoised); ``paths`` holds each node's dotted field path for the errors that name it."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    paths: dict[int, str] = {id(root): ""}
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
        if isinstance(node, yaml.ScalarNode):
            _check_scalar(node, where, paths.get(key, ""))
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
        _child_paths(node, paths.get(key, ""), paths)
        for c in _children(node):
            if id(c) not in size:
                stack.append((c, depth + 1, False))


def _child_paths(node: yaml.Node, path: str, paths: dict[int, str]) -> None:
    """Record the dotted path of each child of ``node`` (a mapping's value: ``path.key``; a key: ``path``; a list
    item: ``path[i]``), the first path a node shared through an alias is reached by."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            paths.setdefault(id(k), path)
            name = k.value if isinstance(k, yaml.ScalarNode) else "?"
            paths.setdefault(id(v), f"{path}.{name}" if path else name)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            paths.setdefault(id(v), f"{path}[{i}]")


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
