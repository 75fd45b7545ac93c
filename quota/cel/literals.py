"""Decoding CEL literal tokens (numbers, strings, bytes) for `quota.cel.syntax`.

cel-spec lexical rules: decimal and hex ints (an int literal may be one past INT64_MAX
only under a unary minus, which the parser folds), `u` suffixes, doubles, raw and
triple-quoted strings, and the escapes `\\a \\b \\f \\n \\r \\t \\v \\\\ \\' \\" \\` \\?`,
octal `\\ooo`, hex `\\xhh`/`\\Xhh`, `\\uhhhh`, `\\Uhhhhhhhh` (bytes keep octal and hex
escapes as raw octets). celpy's own decoder drops newlines in triple-quoted strings,
hence this one. Errors are `SyntaxProblem`s with the token's position.
"""

from __future__ import annotations

import re

import lark

from quota.cel import ast
from quota.cel.values import INT64_MAX, UINT64_MAX, Uint, go_parse_float


class SyntaxProblem(Exception):
    """A parse or macro error; `quota.cel.selector` turns it into CelCompileError."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


def _pos(token: lark.Token) -> tuple[int, int]:
    return (token.line or 1, token.column or 1)


_ESCAPE = re.compile(r"\\(?:[abfnrtv\"'`?\\]|[0-3][0-7]{2}|[xX][0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})|\\|.", re.S)
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _unescape(body: str, *, as_bytes: bool, pos: tuple[int, int]) -> list[int] | str:
    """Decode cel-spec escapes; bytes literals keep \\x and octal escapes as raw octets."""
    out: list[int] = []
    chars: list[str] = []
    for match in _ESCAPE.finditer(body):
        piece = match.group()
        if piece == "\\":
            raise SyntaxProblem("Syntax error: invalid escape sequence", *pos)
        if len(piece) == 1 or piece[0] != "\\":
            chars.append(piece)
            out.extend(piece.encode())
            continue
        kind = piece[1]
        if kind in _SIMPLE or kind in "\"'`?\\":
            text = _SIMPLE.get(kind, kind)
            chars.append(text)
            out.extend(text.encode())
        elif kind in "xX" or kind.isdigit():
            code = int(piece[2:], 16) if kind in "xX" else int(piece[1:], 8)
            chars.append(chr(code))
            out.append(code)
        else:
            code = int(piece[2:], 16)
            if as_bytes:
                raise SyntaxProblem("Syntax error: unicode escape in bytes literal", *pos)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise SyntaxProblem("Syntax error: invalid unicode code point", *pos)
            chars.append(chr(code))
    return out if as_bytes else "".join(chars)


def _whole(text: str) -> int | None:
    """A decimal or 0x literal, or None when it has more digits than any 64-bit value
    (checked first: Python refuses to convert more than 4300 digits at all)."""
    base, digits = (16, text[2:]) if text.startswith("0x") else (10, text)
    digits = digits.lstrip("0") or "0"
    if len(digits) > (16 if base == 16 else 20):
        return None
    return int(digits, base)


def decode_literal(token: lark.Token) -> ast.Lit:
    """The value of an INT/UINT/FLOAT/STRING/BYTES token."""
    text = str(token)
    pos = _pos(token)
    if token.type == "INT_LIT":
        value = _whole(text)
        if value is None or value > INT64_MAX + 1:
            raise SyntaxProblem("invalid int literal", *pos)
        # INT64_MAX + 1 is only valid under a unary minus; `neg` folds it.
        return ast.Lit(value, negatable=True)
    if token.type == "UINT_LIT":
        value = _whole(text[:-1])
        if value is None or value > UINT64_MAX:
            raise SyntaxProblem("invalid uint literal", *pos)
        return ast.Lit(Uint(value))
    if token.type == "FLOAT_LIT":
        try:
            return ast.Lit(go_parse_float(text), negatable=True)
        except ValueError:
            raise SyntaxProblem("invalid double literal", *pos) from None
    is_bytes = token.type == "BYTES_LIT"
    prefix_len = 0
    while text[prefix_len] not in "\"'":
        prefix_len += 1
    prefix = text[:prefix_len].lower()
    quote = 3 if text[prefix_len : prefix_len + 3] in ('"""', "'''") else 1
    body = text[prefix_len + quote : len(text) - quote]
    if "r" in prefix:
        return ast.Lit(body.encode() if is_bytes else body)
    if "\\" not in body:  # the common case: nothing to decode
        return ast.Lit(body.encode() if is_bytes else body)
    decoded = _unescape(body, as_bytes=is_bytes, pos=pos)
    if isinstance(decoded, list):
        return ast.Lit(bytes(decoded))
    return ast.Lit(decoded)
