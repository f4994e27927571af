"""A renderer for the subset of Helm's template language the chart uses (no helm binary here).

Supported: `{{ .Values.a.b }}`, `.Release.Name`, `.Release.Namespace`, `.Chart.Name`,
`.Chart.AppVersion`, `.` inside `range`; `if` / `else` / `end`; `range LIST` / `end`; pipelines
with `toYaml`, `nindent N`, `quote`; `{{-` and `-}}` whitespace trimming; `{{/* comments */}}`.
Anything else is an error, so the templates stay plain. A value path that does not exist is an
error too (Helm would render it empty), and every path looked up is recorded in `used`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class TemplateError(ValueError):
    pass


@dataclass
class Node:
    kind: str  # text | expr | if | range
    value: str = ""
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(text):
        before = text[pos : m.start()]
        if trim_next:
            before = before.lstrip()
        if m.group(1):
            before = before.rstrip()
        out.append(("text", before))
        out.append(("action", m.group(2)))
        pos, trim_next = m.end(), bool(m.group(3))
    rest = text[pos:]
    out.append(("text", rest.lstrip() if trim_next else rest))
    return out


def parse(text: str) -> list[Node]:
    root: list[Node] = []
    stack: list[tuple[Node | None, list[Node]]] = [(None, root)]
    for kind, value in _tokens(text):
        target = stack[-1][1]
        if kind == "text":
            if value:
                target.append(Node("text", value))
        elif value.startswith("/*"):
            continue
        elif value.startswith(("if ", "range ")):
            word, expr = value.split(" ", 1)
            node = Node(word, expr.strip())
            target.append(node)
            stack.append((node, node.body))
        elif value == "else":
            node = stack[-1][0]
            if node is None or node.kind != "if":
                raise TemplateError("else outside if")
            stack[-1] = (node, node.orelse)
        elif value == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        else:
            target.append(Node("expr", value))
    if len(stack) != 1:
        raise TemplateError("a block is not closed")
    return root


@dataclass
class Context:
    values: Mapping[str, Any]
    release: Mapping[str, str]
    chart: Mapping[str, str]
    used: set[str] = field(default_factory=set)


def _split(text: str, sep: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p]


def _term(term: str, ctx: Context, dot: Any) -> Any:
    if term == ".":
        return dot
    if term.startswith('"') and term.endswith('"'):
        return json.loads(term)
    if re.fullmatch(r"-?[0-9]+", term):
        return int(term)
    if term.startswith(".Values."):
        path = term[len(".Values.") :]
        node: Any = ctx.values
        for key in path.split("."):
            if not isinstance(node, Mapping) or key not in node:
                raise TemplateError(f"no value {path}")
            node = node[key]
        ctx.used.add(path)
        return node
    tables = {".Release.": ctx.release, ".Chart.": ctx.chart}
    for prefix, table in tables.items():
        if term.startswith(prefix) and term[len(prefix) :] in table:
            return table[term[len(prefix) :]]
    raise TemplateError(f"unsupported term {term!r}")


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _nindent(n: int, text: str) -> str:
    return "\n" + "\n".join(" " * n + line if line else line for line in str(text).split("\n"))


def _quote(value: Any) -> str:
    return json.dumps(_print(value))


FUNCTIONS = {"toYaml": _to_yaml, "nindent": _nindent, "quote": _quote}


def _eval(expr: str, ctx: Context, dot: Any) -> Any:
    result: Any = None
    for i, stage in enumerate(_split(expr, "|")):
        words = _split(stage, " ")
        if words[0] in FUNCTIONS:
            args = [_term(w, ctx, dot) for w in words[1:]] + ([result] if i else [])
            result = FUNCTIONS[words[0]](*args)
        elif i == 0 and len(words) == 1:
            result = _term(words[0], ctx, dot)
        else:
            raise TemplateError(f"unsupported pipeline stage {stage!r}")
    return result


def _print(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise TemplateError("rendering a missing value")
    if isinstance(value, Mapping | list):
        raise TemplateError(f"rendering a {type(value).__name__} without toYaml")
    return str(value)


def _truthy(value: Any) -> bool:
    return bool(value)  # Go templates: empty, zero, false and nil are false, as in Python


def _render(nodes: list[Node], ctx: Context, dot: Any) -> str:
    out = []
    for node in nodes:
        if node.kind == "text":
            out.append(node.value)
        elif node.kind == "expr":
            out.append(_print(_eval(node.value, ctx, dot)))
        elif node.kind == "if":
            out.append(_render(node.body if _truthy(_eval(node.value, ctx, dot)) else node.orelse, ctx, dot))
        elif node.kind == "range":
            items = _eval(node.value, ctx, dot)
            if not isinstance(items, list):
                raise TemplateError(f"range over a {type(items).__name__}")
            out.extend(_render(node.body, ctx, item) for item in items)
    return "".join(out)


def render(text: str, ctx: Context) -> str:
    return _render(parse(text), ctx, None)
