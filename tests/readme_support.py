"""The README's fenced blocks, for the tests that run its examples as written."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = REPO / "README.md"


def readme_block(language: str, containing: str) -> str:
    """The one fenced block of `language` in README.md that contains `containing`."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.M | re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"README.md: {len(found)} {language} blocks contain {containing!r}"
    return str(found[0])
