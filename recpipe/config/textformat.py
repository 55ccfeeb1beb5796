"""A reader of protobuf's text format without the message's schema: the form EasyRec writes its
pipeline configs in (``*.config``), so that ``recpipe config import`` can map them field by
field.

The grammar is protobuf's text format (protobuf.dev, "Text Format Language Specification"):
``name: value`` for a scalar, ``name { ... }`` or ``name < ... >`` (the colon optional) for a
message, ``name: [v, v]`` for a list of either, optional ``,`` or ``;`` after a field, ``#``
comments to the end of the line. Scalars: numbers (decimal, ``0x`` hex, floats with an
exponent, ``inf`` / ``nan``, an ``f`` suffix), strings in ``"`` or ``'`` with C escapes
(adjacent strings joined), and identifiers (enum values, ``true`` / ``false``).

With no schema, a field that appears once cannot be told from a repeated field with one
item: every field maps to the list of its values in order, and the caller, which knows the
target schema, takes the one item of a singular field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from recpipe.config.errors import ConfigError

Message = dict[str, list]  # field name -> its values (scalars or Messages), in file order

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?)(?![\w.]))
  | (?P<name>-?[A-Za-z_][\w.]*|\[[A-Za-z_][\w./]*\])
  | (?P<punct>[{}<>\[\]:,;])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "?": "?"}  # fmt: skip
_SPECIAL = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}


@dataclass(frozen=True)
class Identifier:
    """A bare identifier value: an enum's name (``CSVInput``) or ``true`` / ``false``."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass
class _Token:
    kind: str
    text: str
    line: int
    column: int


def _tokens(text: str, source: str) -> list[_Token]:
    out, at, line, start = [], 0, 1, 0
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None:
            raise ConfigError(f"{source}:{line}:{at - start + 1}: unexpected {text[at]!r}")
        kind = found.lastgroup
        if kind != "space":
            out.append(_Token(kind, found.group(), line, at - start + 1))
        newlines = found.group().count("\n")
        if newlines:
            line += newlines
            start = at + found.group().rindex("\n") + 1
        at = found.end()
    return out


def _unquote(token: _Token, source: str) -> str:
    body, out, i = token.text[1:-1], [], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif octal := re.match(r"[0-7]{1,3}", body[i + 1 :]):
            out.append(chr(int(octal.group(), 8)))
            i += 1 + octal.end()
        elif nxt in "xX" and (hexa := re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :])):
            out.append(chr(int(hexa.group(), 16)))
            i += 2 + hexa.end()
        else:
            raise ConfigError(f"{source}:{token.line}:{token.column}: unknown escape \\{nxt} in a string")
    return "".join(out)


def _number(text: str) -> int | float:
    if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text):
        return int(text, 16)
    body = text.rstrip("fF")  # a float's suffix (a hex digit above)
    return int(body) if re.fullmatch(r"[-+]?\d+", body) else float(body)


class _Parser:
    def __init__(self, tokens: list[_Token], source: str):
        self.tokens, self.source, self.at = tokens, source, 0

    def _peek(self) -> _Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _where(self, token: _Token | None) -> str:
        if token is None:
            last = self.tokens[-1] if self.tokens else _Token("", "", 1, 1)
            return f"{self.source}:{last.line}:{last.column}: at the end of the file (after its last token)"
        return f"{self.source}:{token.line}:{token.column}: at {token.text!r}"

    def _take(self, text: str | None = None, kind: str | None = None) -> _Token:
        token = self._peek()
        if token is None or (text is not None and token.text != text) or (kind and token.kind != kind):
            want = repr(text) if text else f"a {kind}"
            raise ConfigError(f"{self._where(token)}: expected {want}")
        self.at += 1
        return token

    def message(self, close: str | None) -> Message:
        out: Message = {}
        while True:
            token = self._peek()
            if token is None:
                if close is not None:
                    raise ConfigError(f"{self._where(None)}: expected {close!r}")
                return out
            if close is not None and token.text == close:
                self.at += 1
                return out
            name = self._take(kind="name").text
            if name.startswith("-"):
                raise ConfigError(f"{self._where(token)}: a field name")
            out.setdefault(name, []).extend(self._field_values())
            if (sep := self._peek()) is not None and sep.text in ",;":
                self.at += 1

    def _field_values(self) -> list:
        token = self._peek()
        if token is not None and token.text == ":":
            self.at += 1
            token = self._peek()
            if token is not None and token.text == "[":
                self.at += 1
                return self._list()
            return [self._value(allow_scalar=True)]
        return [self._value(allow_scalar=False)]

    def _list(self) -> list:
        items: list = []
        if (token := self._peek()) is not None and token.text == "]":
            self.at += 1
            return items
        while True:
            items.append(self._value(allow_scalar=True))
            token = self._take()
            if token.text == "]":
                return items
            if token.text != ",":
                self.at -= 1
                raise ConfigError(f"{self._where(token)}: expected ',' or ']' in a list")

    def _value(self, allow_scalar: bool):
        token = self._peek()
        if token is not None and token.text in "{<":
            self.at += 1
            return self.message("}" if token.text == "{" else ">")
        if not allow_scalar:
            raise ConfigError(f"{self._where(token)}: expected ':' or a message's '{{'")
        if token is None:
            raise ConfigError(f"{self._where(None)}: expected a value")
        self.at += 1
        if token.kind == "string":
            parts = [_unquote(token, self.source)]
            while (nxt := self._peek()) is not None and nxt.kind == "string":  # "a" "b" is "ab"
                parts.append(_unquote(nxt, self.source))
                self.at += 1
            return "".join(parts)
        if token.kind == "number":
            return _number(token.text)
        if token.kind == "name" and not token.text.startswith("["):
            sign, word = ("-", token.text[1:]) if token.text.startswith("-") else ("", token.text)
            if word.lower() in _SPECIAL:
                value = _SPECIAL[word.lower()]
                return -value if sign else value
            if sign:
                raise ConfigError(f"{self._where(token)}: expected a number after '-'")
            if word in ("true", "True", "t"):
                return True
            if word in ("false", "False", "f"):
                return False
            return Identifier(word)
        self.at -= 1
        raise ConfigError(f"{self._where(token)}: expected a value")


def parse(text: str, source: str = "<text>") -> Message:
    """A protobuf text-format document as nested ``Message`` dicts: each field name maps to
    the list of its values in file order (ints, floats, strs, bools, ``Identifier`` for enum
    values, ``Message`` for messages).

    Raises:
        ConfigError: the text is not text format; names ``source:line:column`` and what was
            expected there.
    """
    return _Parser(_tokens(text, source), source).message(None)
