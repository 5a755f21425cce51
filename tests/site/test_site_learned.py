"""The page "What attention learns" in a browser: its numbers are the training code's, its
loss curves are drawn, and its head view follows the layer, the head and the hovered token.

Each check runs at phone and desktop width, in both colour schemes, on the
English and the Japanese page.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from browsing import DESKTOP, PHONE, open_page, table
from sitegen import heads, learned

LAYOUTS = [(w, s) for w in (PHONE, DESKTOP) for s in ("light", "dark")]


# One page per layout, shared by the checks below in file order: the two that
# read the page come before the one that clicks its head view.
@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"{w}-{s}" for w, s in LAYOUTS])
def learned_page(request: Any, layouts: Any, base_url: str) -> Iterator[Any]:
    width, scheme = request.param
    page, visit = open_page(None, f"{base_url}/learned/", context=layouts(width, scheme))
    visit.assert_clean()
    yield page
    page.close()


def test_summary_and_head_tables_are_the_training_codes(learned_page: Any) -> None:
    page = learned_page
    for task in learned.TASKS:
        r = learned.trained(task)
        row = next(c for c in table(page, "learned-summary") if c[2] == str(r.settings.steps))
        assert row[1] == str(r.parameters)
        assert row[3] == f"{100 * r.accuracy['portattn']:.1f}%"
        assert row[5] == heads.gap(r.largest_gap)
        want = [
            [
                heads.head_name(li, h),
                *(heads.fmt(heads.scores(task)[n][li][h]) for n in heads.SCORES[task]),
            ]
            for li in range(r.settings.layers)
            for h in range(r.settings.heads)
        ]
        assert table(page, f"heads-{task}") == want
    text = page.locator("article").inner_text()
    name, score = heads.strongest("induction", "induction", layer=1)
    assert f"head {name} puts {heads.fmt(score)} of its" in text
    name, score = heads.strongest("induction", "previous", layer=0)
    assert f"head {name} puts {heads.fmt(score)} of its" in text


def test_both_loss_curves_are_drawn(learned_page: Any) -> None:
    page = learned_page
    for task in learned.TASKS:
        for impl in learned.IMPLS:
            paths = page.locator(f'g[id$="pa-loss-{impl}-{task}"] path')
            boxes = [
                b
                for b in paths.evaluate_all(
                    "ps => ps.map(p => p.getBoundingClientRect()).map(r => [r.width, r.height])"
                )
                if b[0] > 0
            ]
            # One drawing is shown (wide or phone layout); its curve spans the panel.
            assert len(boxes) == 1, (task, impl, boxes)
            assert boxes[0][0] > 100 and boxes[0][1] > 20, (task, impl, boxes)


def _lines(view: Any) -> dict[tuple[int, int], float]:
    got = view.locator("line").evaluate_all(
        "ls => ls.map(l => [+l.dataset.q, +l.dataset.k, +l.getAttribute('stroke-opacity')])"
    )
    return {(q, k): w for q, k, w in got}


def test_head_view_follows_layer_head_and_hover(learned_page: Any) -> None:
    page = learned_page
    view = page.locator('[data-pa-headview="induction"]')
    data = heads.view_data("induction")
    n = len(data["tokens"])
    assert view.get_attribute("data-layer") == "0" and view.get_attribute("data-head") == "0"
    lines = _lines(view)
    assert lines[(3, 2)] == pytest.approx(data["weights"][0][0][3][2])
    picks = view.locator(".pa-hv-pick")
    picks.nth(1).click()  # layer 2
    picks.nth(3).click()  # head 2
    assert view.get_attribute("data-layer") == "1" and view.get_attribute("data-head") == "1"
    assert view.locator(".pa-hv-pick[aria-pressed=true]").count() == 2
    lines = _lines(view)
    for (q, k), w in lines.items():
        assert w == pytest.approx(data["weights"][1][1][q][k]), (q, k)
    # Hover a query: only its row stays, and the sentence names its strongest key.
    q = n - 2
    view.locator(f'.pa-hv-query[data-q="{q}"]').hover()
    assert view.get_attribute("data-query") == str(q)
    lines = _lines(view)
    assert all(w == 0 for (qq, _), w in lines.items() if qq != q)
    row = data["weights"][1][1][q]
    best = max(range(n), key=row.__getitem__)
    assert lines[(q, best)] == pytest.approx(row[best])
    said = view.locator(".pa-hv-sentence").inner_text()
    assert f"{data['tokens'][best]} ({best + 1}) {round(100 * row[best])}%" in said


def test_japanese_page_has_the_same_numbers(layouts: Any, base_url: str) -> None:
    en, _ = open_page(None, f"{base_url}/learned/", context=layouts(DESKTOP, "light"))
    ja, visit = open_page(None, f"{base_url}/ja/learned/", context=layouts(PHONE, "dark"))
    try:
        visit.assert_clean()
        for name in ("heads-reverse", "heads-induction"):
            assert table(ja, name) == table(en, name)
        rows_en, rows_ja = table(en, "learned-summary"), table(ja, "learned-summary")
        assert [r[1:] for r in rows_ja] == [r[1:] for r in rows_en]
        view = ja.locator('[data-pa-headview="reverse"]')
        view.locator(".pa-hv-query").first.hover()
        assert "注目先" in view.locator(".pa-hv-sentence").inner_text()
    finally:
        en.close()
        ja.close()
