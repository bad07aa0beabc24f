"""Lines of code of Python files: physical lines, and code lines (without blank lines,
comments and docstrings), for docs/benchmarks.md's size figures.

    find pg2sink -name '*.py' | .venv/bin/python scripts/loc.py
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize

#: token types that are no code
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every string statement (docstrings, attribute docstrings)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            assert node.end_lineno is not None
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def code_lines(text: str) -> int:
    """The lines of `text` holding a code token outside docstrings."""
    docs = _docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _NOT_CODE:
            continue
        lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docs)
    return len(lines)


def main() -> None:
    physical = code = 0
    for name in (line.strip() for line in sys.stdin):
        if name:
            with open(name, encoding="utf-8") as f:
                text = f.read()
            physical += len(text.splitlines())
            code += code_lines(text)
    print(f"{physical} physical lines, {code} code lines")


if __name__ == "__main__":
    main()
