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

    page, visit = open_page(browser, f"{base_url}/ja/", width=1400, search=True)
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


def _numbers(text: str) -> list[str]:
    return sorted(re.findall(r"[+-]?\d+(?:\.\d+)?", text))


def _kept(english: str, japanese: str) -> bool:
    """Every number of the English text is in the Japanese one (which may count 1枚, 1つ)."""
    from collections import Counter

    return not Counter(_numbers(english)) - Counter(_numbers(japanese))


def test_japanese_performance_sentences_keep_the_records_numbers() -> None:
    """The pool paragraph and every "not measured" sentence, in Japanese, with the same numbers."""
    from sitegen import performance

    en, ja = (performance.pool_cost_markdown(lang=lang) for lang in ("en", "ja"))
    assert "The cost" in en and "The cost" not in ja
    assert re.search(r"[\u3040-\u30ff]", ja)
    assert _kept(en, ja), (en, ja)
    for sentence in performance.record().get("skipped", []):
        said = performance.skipped_words(sentence, "ja")
        assert re.search(r"[\u3040-\u30ff]", said), said
        assert _kept(sentence, said), said


def test_japanese_transforms_table_has_japanese_cells(site_dir: Path) -> None:
    """Every cell the checks describe is in Japanese; the marks are the English page's."""
    from html.parser import HTMLParser

    def cells(lang: str) -> list[str]:
        prefix = "ja/" if lang == "ja" else ""
        page = (site_dir / prefix / "transforms" / "index.html").read_text(encoding="utf-8")
        table = page[page.index("<table") : page.index("</table>")]

        class Cells(HTMLParser):
            def __init__(self) -> None:
                super().__init__()
                self.out: list[str] = []
                self.inside = False

            def handle_starttag(self, tag: str, attrs: object) -> None:
                if tag == "td":
                    self.inside = True
                    self.out.append("")

            def handle_endtag(self, tag: str) -> None:
                self.inside = self.inside and tag != "td"

            def handle_data(self, data: str) -> None:
                if self.inside:
                    self.out[-1] += data

        parser = Cells()
        parser.feed(table)
        return parser.out

    en, ja = cells("en"), cells("ja")
    assert len(en) == len(ja) > 0
    english = re.compile(r"\b(grads|graph|breaks|computes|max dev|stays lazy|export|run in)\b")
    for e, j in zip(en, ja, strict=True):
        assert e[:1] == j[:1], (e, j)  # ✓, — or ✗ alike
        if e[:1] == "✓":
            assert not english.search(j), j
            assert _kept(e, j), (e, j)
