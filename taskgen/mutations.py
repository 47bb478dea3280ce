"""The bug operators of `taskgen.smith`: AST mutations applied as minimal text edits.

Each `Mutation` replaces one character span of a file (an operator token, a literal, an
operand pair, or the whole lines of one statement), so a diff shows one small change and the
rest of the file keeps its formatting. `spread` orders candidates for trying, seeded.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import io
import random
import re
import tokenize
from dataclasses import dataclass

@dataclass(frozen=True)
class Mutation:
    """One injected bug: `source[start:end]` of `path` becomes `new` (character offsets)."""

    path: str
    kind: str
    scope: str  # the enclosing function or class ("<module>" at top level)
    line: int
    start: int
    end: int
    new: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.new + source[self.end :]

    @property
    def key(self) -> str:
        return hashlib.sha1(f"{self.path}:{self.start}:{self.end}:{self.new}".encode()).hexdigest()[:8]


COMPARE_FLIP = {ast.Lt: ">=", ast.GtE: "<", ast.Gt: "<=", ast.LtE: ">", ast.Eq: "!=", ast.NotEq: "==",
                ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is"}
NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_COMPOUND = (ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.UnaryOp, ast.Await,
             ast.Yield, ast.YieldFrom, ast.Starred)
_NEVER_DROP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global,
               ast.Nonlocal, ast.Pass)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_PLAIN_STR = re.compile(r"""^[rRuU]?(['"])([^'"\\\n]{1,40})\1$""")


class _Text:
    """Maps ast positions (line, UTF-8 byte column) and tokens to character offsets of `text`."""

    def __init__(self, text: str):
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        toks = tokenize.generate_tokens(io.StringIO(text).readline)
        self.ops = [(self.at(*t.start, chars=True), self.at(*t.end, chars=True), t.string) for t in toks
                    if t.type in (tokenize.OP, tokenize.NAME) and t.string not in "()"]
        self.op_starts = [o[0] for o in self.ops]

    def at(self, line: int, col: int, chars: bool = False) -> int:
        start = self.starts[line - 1]
        if not chars:
            end = self.starts[line] if line < len(self.starts) else len(self.text)
            col = len(self.text[start:end].encode()[:col].decode(errors="ignore"))
        return start + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)

    def ops_between(self, a: int, b: int) -> list[tuple[int, int, str]]:
        """Operator / keyword tokens in text[a:b], parentheses left out."""
        return self.ops[bisect.bisect_left(self.op_starts, a) : bisect.bisect_left(self.op_starts, b)]

    def replace_tokens(self, toks: list[tuple[int, int, str]], new: list[str]) -> tuple[int, int, str]:
        """One edit spanning `toks` that rewrites each token and keeps the text between them."""
        out, pos = [], toks[0][0]
        for (s, e, _), n in zip(toks, new):
            out += [self.text[pos:s], n]
            pos = e
        return toks[0][0], toks[-1][1], "".join(out)

    def whole_lines(self, node: ast.stmt) -> tuple[int, int] | None:
        """The span of the full lines `node` occupies alone, or None when it shares them."""
        s, e = self.span(node)
        first = self.starts[node.lineno - 1]
        last = self.starts[node.end_lineno] if node.end_lineno < len(self.starts) else len(self.text)
        rest = self.text[e:last].strip()
        if self.text[first:s].strip() or (rest and not rest.startswith("#")):
            return None
        return first, last


def _walk(node: ast.AST, scope: str = "<module>"):
    """(node, enclosing scope) for every node below `node`; f-strings are not entered."""
    for child in ast.iter_child_nodes(node):
        yield child, scope
        if isinstance(child, ast.JoinedStr):
            continue  # their parts have no positions of their own in 3.11
        yield from _walk(child, _scope_inside(child, scope))


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            ids.add(id(body[0]))
            ids.add(id(body[0].value))
    return ids


def mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate bug in one file, in source order; each a minimal edit that still parses.
    Kinds: flip_compare, off_by_one, swap_operands, drop_statement, wrong_constant, and_or."""
    tree, t = ast.parse(source), _Text(source)
    docs, found = _docstrings(tree), []

    def add(kind, scope, line, start, end, new):
        if source[start:end] != new:
            found.append(Mutation(path, kind, scope, line, start, end, new))

    for node, scope in _walk(tree):
        if isinstance(node, ast.Compare):
            prev = node.left
            for op, right in zip(node.ops, node.comparators):
                toks = t.ops_between(t.span(prev)[1], t.span(right)[0])
                new = COMPARE_FLIP[type(op)].split()
                add("flip_compare", scope, node.lineno, toks[0][0], toks[-1][1], " ".join(new))
                prev = right
        elif isinstance(node, ast.BoolOp):
            toks = [tok for a, b in zip(node.values, node.values[1:]) for tok in t.ops_between(t.span(a)[1], t.span(b)[0])]
            flipped = ["or" if tok[2] == "and" else "and" for tok in toks]
            add("and_or", scope, node.lineno, *t.replace_tokens(toks, flipped))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, NON_COMMUTATIVE):
            if isinstance(node.op, ast.Mod) and isinstance(node.left, (ast.Constant, ast.JoinedStr)):
                continue  # "%s" % x: printf formatting, swapping it is a type error, not a bug
            (ls, le), (rs, re_) = t.span(node.left), t.span(node.right)
            wrap = lambda n, s: f"({s})" if isinstance(n, _COMPOUND) else s  # noqa: E731
            new = wrap(node.right, source[rs:re_]) + source[le:rs] + wrap(node.left, source[ls:le])
            add("swap_operands", scope, node.lineno, ls, re_, new)
        elif isinstance(node, ast.Constant) and id(node) not in docs:
            s, e = t.span(node)
            if isinstance(node.value, bool):
                add("wrong_constant", scope, node.lineno, s, e, str(not node.value))
            elif isinstance(node.value, int) and node.value <= 1000:
                add("off_by_one", scope, node.lineno, s, e, str(node.value + 1))
                if node.value > 0:
                    add("off_by_one", scope, node.lineno, s, e, str(node.value - 1))
            elif isinstance(node.value, str) and (m := _PLAIN_STR.match(source[s:e])):
                q = m.group(1)  # drop the last character: a wrong separator, suffix or key
                add("wrong_constant", scope, node.lineno, s, e, source[s:e][: -len(q) - 1] + q)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or len(block) < 2 or not isinstance(block[0], ast.stmt):
                continue
            for stmt in block:
                top_level_call = isinstance(node, ast.Module) and isinstance(stmt, ast.Expr)
                if isinstance(stmt, _NEVER_DROP) or id(stmt) in docs or (isinstance(node, ast.Module) and not top_level_call):
                    continue
                if stmt is block[-1] and isinstance(stmt, ast.Return) and isinstance(node, _DEFS):
                    continue  # a function that returns None: too blunt a bug to teach much
                if (span := t.whole_lines(stmt)) is not None:
                    add("drop_statement", _scope_inside(node, scope), stmt.lineno, *span, "")
    return [m for m in found if _parses(m.apply(source))]


def _scope_inside(node: ast.AST, scope: str) -> str:
    """The scope of the code inside `node`: a def or class opens its own."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return scope
    return node.name if scope == "<module>" else f"{scope}.{node.name}"


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except SyntaxError:
        return False


def _round_robin(items: list, key, rng: random.Random) -> list:
    """`items` shuffled within each `key` class, the classes taken in turn (a kind with many
    candidates, like dropped statements, does not crowd out the rest)."""
    classes: dict = {}
    for item in items:
        classes.setdefault(key(item), []).append(item)
    lists = list(classes.values())
    for lst in lists:
        rng.shuffle(lst)
    rng.shuffle(lists)
    return [lst[i] for i in range(max(map(len, lists))) for lst in lists if i < len(lst)]


def spread(candidates: list[Mutation], seed: int) -> list[Mutation]:
    """A seeded order that visits every (file, scope) once before any twice, so the kept bugs
    spread over files and functions instead of piling up in the longest one."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Mutation]] = {}
    for m in candidates:
        groups.setdefault((m.path, m.scope), []).append(m)
    order = [_round_robin(g, lambda m: m.kind, rng) for g in groups.values()]
    rng.shuffle(order)
    return [g[i] for i in range(max(map(len, order), default=0)) for g in order if i < len(g)]
