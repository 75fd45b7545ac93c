"""CEL source text -> `quota.cel.ast` nodes: the grammar and the tree builder.

The grammar is cel-python's `celpy/cel.lark` (itself the cel-spec EBNF) reshaped with
lark's `?rule` inlining so trees stay shallow, plus what the Kubernetes environment
accepts and celpy 0.5 does not: optional field/index selection `a.?b`, `a[?k]` and
optional list/map entries (cel-go OptionalTypes), trailing commas in literals, and
exact int64 bounds for negative literals. Macros (`has`, `all`, `exists`,
`exists_one`, `map`, `filter`, the two-variable forms, `optMap`/`optFlatMap`,
`cel.bind`) are recognised here and `&&`/`||` runs are balanced, as cel-go's parser
does; literals decode in `quota.cel.literals`. `quota.cel.checker` resolves names and
types next; nothing here evaluates.
"""

from __future__ import annotations

from typing import Any

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from quota.cel import ast
from quota.cel.literals import SyntaxProblem, decode_literal
from quota.cel.nesting import ast_depth_problem, lark_depth_problem
from quota.values.work import pause_point

__all__ = ["SyntaxProblem", "parse"]

_GRAMMAR = r"""
?start: expr
?expr: disj
     | disj "?" disj ":" expr                -> cond
?disj: conj | disj "||" conj                 -> or_
?conj: rel | conj "&&" rel                   -> and_
?rel: add
    | rel RELOP add                          -> binop
    | rel "in" add                           -> in_
?add: mul | add ADDOP mul                    -> binop
?mul: unary | mul MULOP unary                -> binop
?unary: member
      | BANG+ member                         -> not_
      | MINUS+ member                        -> neg
?member: primary
       | member "." IDENT                    -> select
       | member ".?" IDENT                   -> opt_select
       | member "." IDENT "(" [args] ")"     -> method
       | member "[" expr "]"                 -> index
       | member "[?" expr "]"                -> opt_index
       | member "{" [fields] "}"             -> message
?primary: IDENT                              -> ident
        | "." IDENT                          -> ident
        | IDENT "(" [args] ")"               -> call
        | "." IDENT "(" [args] ")"           -> call
        | "(" expr ")"                       -> paren
        | "[" [items] "]"                    -> list_lit
        | "{" [entries] "}"                  -> map_lit
        | literal
args: expr ("," expr)*
fields: IDENT ":" expr ("," IDENT ":" expr)* [","]
items: item ("," item)* ","?
item: expr                                   -> item
    | "?" expr                               -> opt_item
entries: entry ("," entry)* ","?
entry: expr ":" expr                         -> entry
     | "?" expr ":" expr                     -> opt_entry
literal: FLOAT_LIT | UINT_LIT | INT_LIT | BYTES_LIT | STRING_LIT

RELOP: "<=" | ">=" | "==" | "!=" | "<" | ">"
BANG: "!"
MINUS: "-"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
FLOAT_LIT.4: /([0-9]+\.[0-9]+([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)/
UINT_LIT.3: /(0x[0-9a-fA-F]+|[0-9]+)[uU]/
INT_LIT.2: /0x[0-9a-fA-F]+|[0-9]+/
BYTES_LIT.6: /[bB][rR]?("{3}(.|\n)*?"{3}|'{3}(.|\n)*?'{3}|"(\\.|[^"\\\n])*"|'(\\.|[^'\\\n])*')/
           | /[rR][bB]("{3}(.|\n)*?"{3}|'{3}(.|\n)*?'{3}|"[^"\n]*"|'[^'\n]*')/
STRING_LIT.5: /[rR]?("{3}(.|\n)*?"{3}|'{3}(.|\n)*?'{3})/
            | /"(\\.|[^"\\\n])*"|'(\\.|[^'\\\n])*'/
            | /[rR]("[^"\n]*"|'[^'\n]*')/
IDENT: /[_a-zA-Z][_a-zA-Z0-9]*/
COMMENT: /\/\/[^\n]*/
%ignore /[\t\n\f\r ]+/
%ignore COMMENT
"""

# Positions come from tokens (and nodes built from them), not from propagate_positions,
# which doubles parse time for no gain in the messages.
_PARSER = lark.Lark(_GRAMMAR, parser="lalr", maybe_placeholders=True)

# cel-spec: these may not be used as identifiers.
_RESERVED = frozenset(
    "as break const continue else for function if import in let loop package namespace return var void while".split()
)
_KEYWORD_VALUES: dict[str, Any] = {"true": True, "false": False, "null": None}


def parse(text: str) -> ast.Node:
    """Parse one CEL expression; raise SyntaxProblem with cel-go style wording."""
    try:
        # Token by token, so a long expression's parse can pause (`quota.values.work`).
        parser = _PARSER.parse_interactive(text)
        for _ in parser.iter_parse():
            pause_point()
        tree = parser.resume_parse()  # type: ignore[no-untyped-call]
    except UnexpectedInput as exc:
        raise SyntaxProblem(_describe(exc), exc.line if exc.line > 0 else 1, exc.column if exc.column > 0 else 1) from None
    # cel-go checks nesting while parsing, before any error of the tree builder.
    problem = lark_depth_problem(tree)
    if problem is not None:
        raise SyntaxProblem(problem)
    try:
        root = _Builder().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, SyntaxProblem):
            raise exc.orig_exc from None
        raise
    if isinstance(root, _Chain):
        root = root.balanced()
    problem = ast_depth_problem(root)
    if problem is not None:
        raise SyntaxProblem(problem)
    return root


class _Chain:
    """A run of `||` or `&&` operands; cel-go's parser balances such runs into a tree
    of logarithmic depth, so a long list of alternatives is not deep nesting."""

    def __init__(self, rule: str, terms: list[ast.Node]) -> None:
        self.rule = rule
        self.terms = terms

    def balanced(self) -> ast.Node:
        return self._build(0, len(self.terms))

    def _build(self, start: int, stop: int) -> ast.Node:
        if stop - start == 1:
            return self.terms[start]
        middle = (start + stop + 1) // 2
        left, right = self._build(start, middle), self._build(middle, stop)
        return ast.Or(left, right) if self.rule == "or_" else ast.And(left, right)


def _describe(exc: UnexpectedInput) -> str:
    if isinstance(exc, UnexpectedCharacters):
        return f"Syntax error: token recognition error at: '{exc.char}'"
    if isinstance(exc, UnexpectedEOF):
        return "Syntax error: mismatched input '<EOF>'"
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        shown = "<EOF>" if token.type == "$END" else str(token)
        return f"Syntax error: mismatched input '{shown}'"
    return "Syntax error"  # pragma: no cover - lark raises only the kinds above


def _at(node: Any) -> tuple[int, int]:
    """Where a sub-expression starts, as far as its nodes know (for error carets)."""
    while isinstance(node, ast.Node):
        pos = getattr(node, "pos", None)
        if pos is not None:
            return (pos[0], pos[1])
        children = ast.children(node)
        node = children[0] if children else None
    return (1, 1)


def _pos(meta_or_token: Any) -> tuple[int, int]:
    line = getattr(meta_or_token, "line", 1) or 1
    column = getattr(meta_or_token, "column", 1) or 1
    return (line, column)


class _Builder(lark.visitors.Transformer_NonRecursive[lark.Token, ast.Node]):
    """Turn the lark tree into ast nodes, expanding macros on the way. Non-recursive:
    a 10 KiB expression can nest deeper than Python's recursion limit."""

    def _call_userfunc(self, tree: Any, new_children: Any = None) -> Any:
        # Close every `||`/`&&` run when it becomes the operand of anything else; the
        # left operand of the same operator extends the run instead.
        pause_point()
        children = list(tree.children if new_children is None else new_children)
        for i, child in enumerate(children):
            if isinstance(child, _Chain) and not (i == 0 and child.rule == tree.data):
                children[i] = child.balanced()
        return super()._call_userfunc(tree, children)  # type: ignore[no-untyped-call]

    def cond(self, c: list[ast.Node]) -> ast.Node:
        return ast.Cond(c[0], c[1], c[2])

    def or_(self, c: list[Any]) -> Any:
        return self._chain("or_", c)

    def and_(self, c: list[Any]) -> Any:
        return self._chain("and_", c)

    @staticmethod
    def _chain(rule: str, c: list[Any]) -> _Chain:
        if isinstance(c[0], _Chain):
            c[0].terms.append(c[1])
            return c[0]
        return _Chain(rule, [c[0], c[1]])

    def binop(self, c: list[Any]) -> ast.Node:
        return ast.Binary(str(c[1]), c[0], c[2], _pos(c[1]))

    def in_(self, c: list[ast.Node]) -> ast.Node:
        return ast.Binary("in", c[0], c[1], _at(c[0]))

    def paren(self, c: list[ast.Node]) -> ast.Node:
        return c[0]

    # cel-go's VisitLogicalNot / VisitNegate: a run of `!` or `-` before a member
    # collapses by parity, so `!!x` is `x` and a long run is no nesting at all.
    def not_(self, c: list[Any]) -> ast.Node:
        operand = _checked(c[-1])
        return operand if len(c) % 2 else ast.Not(operand)

    def neg(self, c: list[Any]) -> ast.Node:
        operand = _checked(c[-1])
        if len(c) % 2:
            return operand
        # cel-go folds `-` into numeric literals, which is how -9223372036854775808 parses;
        # an unfolded int literal above INT64_MAX is rejected by the checker.
        if isinstance(operand, ast.Lit) and operand.negatable:
            return ast.Lit(-operand.value)
        return ast.Neg(operand, _at(operand))

    def select(self, c: list[Any]) -> ast.Node:
        return ast.Select(_checked(c[0]), str(c[1]), False, _pos(c[1]))

    def opt_select(self, c: list[Any]) -> ast.Node:
        return ast.Select(_checked(c[0]), str(c[1]), True, _pos(c[1]))

    def index(self, c: list[ast.Node]) -> ast.Node:
        return ast.Index(_checked(c[0]), _checked(c[1]), False, _at(c[0]))

    def opt_index(self, c: list[ast.Node]) -> ast.Node:
        return ast.Index(_checked(c[0]), _checked(c[1]), True, _at(c[0]))

    def message(self, c: list[Any]) -> ast.Node:
        raise SyntaxProblem("message construction is not supported: the DRA environment declares no message types", *_at(c[0]))

    def method(self, c: list[Any]) -> ast.Node:
        target, name, args = c[0], str(c[1]), tuple(c[2] or ())
        return _expand_method(target, name, args, _pos(c[1]))

    def call(self, c: list[Any]) -> ast.Node:
        name, args = str(c[0]), tuple(c[1] or ())
        _check_ident(c[0])
        if name == "has":
            return _expand_has(args, _pos(c[0]))
        return ast.Call(name, None, tuple(_checked(a) for a in args), _pos(c[0]))

    def ident(self, c: list[lark.Token]) -> ast.Node:
        name = str(c[0])
        if name in _KEYWORD_VALUES:
            return ast.Lit(_KEYWORD_VALUES[name])
        _check_ident(c[0])
        return ast.Ident(name, _pos(c[0]))

    def list_lit(self, c: list[Any]) -> ast.Node:
        items = c[0] or ()
        return ast.ListLit(tuple(node for node, _ in items), tuple(i for i, (_, opt) in enumerate(items) if opt))

    def map_lit(self, c: list[Any]) -> ast.Node:
        entries = c[0] or ()
        return ast.MapLit(tuple((k, v) for k, v, _ in entries), tuple(i for i, (_, _, opt) in enumerate(entries) if opt))

    def items(self, c: list[tuple[ast.Node, bool]]) -> list[tuple[ast.Node, bool]]:
        return c

    def item(self, c: list[ast.Node]) -> tuple[ast.Node, bool]:
        return (_checked(c[0]), False)

    def opt_item(self, c: list[ast.Node]) -> tuple[ast.Node, bool]:
        return (_checked(c[0]), True)

    def args(self, c: list[ast.Node]) -> list[ast.Node]:
        return c

    def entries(self, c: list[Any]) -> list[Any]:
        return c

    def entry(self, c: list[ast.Node]) -> tuple[ast.Node, ast.Node, bool]:
        return (_checked(c[0]), _checked(c[1]), False)

    def opt_entry(self, c: list[ast.Node]) -> tuple[ast.Node, ast.Node, bool]:
        return (_checked(c[0]), _checked(c[1]), True)

    def literal(self, c: list[lark.Token]) -> ast.Node:
        return decode_literal(c[0])


def _checked(node: Any) -> ast.Node:
    if not isinstance(node, ast.Node):  # pragma: no cover - grammar guarantees nodes here
        raise SyntaxProblem("Syntax error")
    return node


def _check_ident(token: lark.Token) -> None:
    if str(token) in _RESERVED or str(token) in _KEYWORD_VALUES:
        raise SyntaxProblem(f"Syntax error: reserved identifier '{token}'", *_pos(token))


def _expand_has(args: tuple[ast.Node, ...], pos: tuple[int, int]) -> ast.Node:
    if len(args) != 1 or not isinstance(args[0], ast.Select) or args[0].optional:
        raise SyntaxProblem("invalid argument to has() macro", *pos)
    return ast.Has(args[0].operand, args[0].field, pos)


# Macro name -> accepted argument counts (one- and two-variable forms).
_COMPREHENSIONS: dict[str, tuple[int, ...]] = {
    "all": (2, 3), "exists": (2, 3), "exists_one": (2, 3), "existsOne": (2, 3), "filter": (2,), "map": (2, 3),
    "transformList": (3, 4), "transformMap": (3, 4), "transformMapEntry": (3, 4),
    "optMap": (2,), "optFlatMap": (2,), "sortBy": (2,),
}
# Function namespaces of the Kubernetes environment: `optional.of(x)` is one function.
_NAMESPACES = ("optional", "sets", "strings", "lists", "math", "format")


def _expand_method(target: ast.Node, name: str, args: tuple[ast.Node, ...], pos: tuple[int, int]) -> ast.Node:
    if isinstance(target, ast.Ident) and target.name == "cel" and name == "bind":
        if len(args) != 3 or not isinstance(args[0], ast.Ident):
            raise SyntaxProblem("cel.bind() variable name must be a simple identifier", *pos)
        return ast.Bind(args[0].name, args[1], args[2])
    if isinstance(target, ast.Ident) and (target.name in _NAMESPACES or (target.name, name) == ("ip", "isCanonical")):
        return ast.Call(f"{target.name}.{name}", None, args, pos)
    if len(args) in _COMPREHENSIONS.get(name, ()):
        return _comprehension(name, target, args, pos)
    return ast.Call(name, target, args, pos)


def _comprehension(name: str, target: ast.Node, args: tuple[ast.Node, ...], pos: tuple[int, int]) -> ast.Node:
    kind = "exists_one" if name == "existsOne" else name
    two_vars = kind.startswith("transform") or (kind != "map" and len(args) == 3)
    count = 2 if two_vars else 1
    names = [n.name for n in args[:count] if isinstance(n, ast.Ident)]
    if len(names) != count:
        raise SyntaxProblem(f"{name}() variable name must be a simple identifier", *pos)
    var, var2 = names[0], (names[1] if two_vars else None)
    if var2 == var:
        raise SyntaxProblem(f"{name}() variable names must be different", *pos)
    rest = args[count:]
    body, pred = (rest[-1], rest[0] if len(rest) == 2 else None)
    return ast.Comprehension(kind, target, var, body, pred, pos, var2)
