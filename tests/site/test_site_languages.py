"""Both editions of the built site: every English page has a Japanese sibling, reached by the
language switcher, and written in Japanese (not the English page served as a fallback).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

KANA = re.compile(r"[\u3040-\u30ff]")


def _article(page: str) -> str:
    body = page[page.index("<article") : page.index("</article>")]
    body = re.sub(r"<(script|style|pre|code)\b.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def test_every_english_page_has_a_japanese_sibling(site_dir: Path, english_path: str) -> None:
    """``english_path`` is every page of the English edition (conftest.py)."""
    path = english_path
    english = (site_dir / path / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'<a\b[^>]*\bhref="([^"]*)"[^>]*\bhreflang="ja"', english)
    links += re.findall(r'<a\b[^>]*\bhreflang="ja"[^>]*\bhref="([^"]*)"', english)
    assert links, f"/{path} has no link to its Japanese edition"
    target = urlsplit(urljoin(f"http://site/{path}", links[0])).path.lstrip("/")
    assert target == f"ja/{path}", f"the switcher on /{path} leads to /{target}"
    japanese = (site_dir / target / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<html lang="ja"', japanese)
    # Written in Japanese: the page's own prose, not the English fallback.
    # The API reference keeps English docstrings under a Japanese introduction.
    prose = _article(japanese)
    share = len(KANA.findall(prose)) / max(1, len(re.findall(r"\w", prose)))
    least = 0.01 if path == "api/" else 0.1
    assert share >= least, f"/{target} reads as English ({share:.0%} kana)"


def test_japanese_api_page_documents_the_same_names() -> None:
    """api.ja.md repeats api.md's ::: directives under its Japanese introduction."""
    docs = Path(__file__).resolve().parents[2] / "docs"

    def directives(name: str) -> str:
        text = (docs / name).read_text(encoding="utf-8")
        return text[text.index(":::") :]

    assert directives("api.ja.md") == directives("api.md")
