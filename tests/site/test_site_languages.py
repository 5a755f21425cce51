"""Both editions of the built site: every English page has a Japanese sibling, reached by the
language switcher, and written in Japanese (not the English page served as a fallback).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

KANA = re.compile(r"[\u3040-\u30ff]")


def _paragraphs(page: str) -> list[str]:
    """The article's paragraphs of prose: tables, code and scripts left out."""
    body = page[page.index("<article") : page.index("</article>")]
    body = re.sub(r"<(table|pre|code|script|style)\b.*?</\1>", " ", body, flags=re.S)
    return re.findall(r"<p\b[^>]*>(.*?)</p>", body, flags=re.S)


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
    # Written in Japanese, not the English page served as a fallback: the
    # first paragraph, and most of them (tables and code may stay English; the
    # API reference keeps its English docstrings under a Japanese introduction).
    prose = _paragraphs(japanese)
    assert prose and KANA.search(prose[0]), f"/{target} does not open in Japanese"
    if path != "api/":
        share = sum(bool(KANA.search(p)) for p in prose) / len(prose)
        assert share >= 0.6, f"/{target}: {share:.0%} of its paragraphs are in Japanese"


def test_japanese_api_page_documents_the_same_names(site_dir: Path) -> None:
    """The Japanese API reference shows every entry of the English one (hooks.py fills it in)."""

    def entries(path: str) -> list[str]:
        page = (site_dir / path / "index.html").read_text(encoding="utf-8")
        return re.findall(r'<h\d id="([^"]+)" class="doc doc-heading"', page)

    english = entries("api")
    assert len(english) > 10
    assert entries("ja/api") == english


def test_japanese_prose_is_in_the_plain_form(site_dir: Path) -> None:
    """だ/である throughout: no です/ます sentence in any Japanese page or widget string."""
    polite = re.compile(r"(です|ます|ました|ません|ください)[。、)]")
    found = []
    for page in sorted((site_dir / "ja").rglob("index.html")):
        text = " ".join(_paragraphs(page.read_text(encoding="utf-8")))
        found += [f"{page.parent.name}: …{m.group(0)}" for m in polite.finditer(text)]
    root = Path(__file__).resolve().parents[2] / "docs"
    for source in [*root.glob("assets/*.js"), *root.glob("_gen/sitegen/*.py")]:
        found += [f"{source.name}: …{m.group(0)}" for m in polite.finditer(source.read_text())]
    assert found == [], found[:10]


def test_a_japanese_search_finds_the_chapter_first_in_japanese(
    browser: object, base_url: str
) -> None:
    """因果マスク is one compound with no spaces: the search must still find the chapter."""
    from browsing import open_page

    page, visit = open_page(browser, f"{base_url}/ja/", width=1400)
    try:
        box = page.locator("input.md-search__input")
        box.click()  # the header's search field, shown at desktop width
        box.fill("因果マスク")  # typed as an input method commits it: one insertion
        box.press("End")  # and a keyup, which Material's search listens for
        items = page.locator(".md-search-result__item > a")
        items.first.wait_for(timeout=90_000)  # the worker indexes both editions first
        links = items.evaluate_all("as => as.map(a => new URL(a.href).pathname)")
        assert "/ja/chapter/" in links, links
        # The reader's language first: every Japanese page before any English one.
        langs = ["ja" if p.startswith("/ja/") else "en" for p in links]
        assert langs == sorted(langs, key=lambda lang: lang != "ja"), links
        visit.assert_clean()
    finally:
        page.context.close()
