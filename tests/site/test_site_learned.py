"""The page "What attention learns" in a browser: its numbers are the training code's, its
loss curves are drawn, and its head view follows the layer, the head and the hovered token.

Each check runs at phone width in the dark scheme and at desktop width in the
light one, on the English page; the Japanese page is checked once. (Both
schemes at both widths, readability included, are the page-wide checks of
test_site.py; the head view does not behave differently by scheme.)
"""

from __future__ import annotations

from typing import Any

import pytest
from browsing import DESKTOP, PHONE, table
from sitegen import exercises, heads, learned

LAYOUTS = [(PHONE, "dark"), (DESKTOP, "light")]


# One page per layout, shared by the checks below in file order: the two that
# read the page come before the one that clicks its head view. The page-wide
# checks of test_site.py have read it at the same layout already, and left it
# open (browsing.KEPT).
@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"{w}-{s}" for w, s in LAYOUTS])
def learned_page(request: Any, shared_pages: Any) -> Any:
    width, scheme = request.param
    page, visit = shared_pages.open("learned/", width, scheme)
    visit.assert_clean()
    return page


def _head_rows(task: str) -> list[list[str]]:
    """The rows of a task's head table, as sitegen.heads computes them."""
    s = learned.trained(task).settings
    return [
        [
            heads.head_name(li, h),
            *(heads.fmt(heads.scores(task)[n][li][h]) for n in heads.SCORES[task]),
        ]
        for li in range(s.layers)
        for h in range(s.heads)
    ]


def _summary_cells(task: str) -> list[str]:
    """The summary table's parameters, steps, portattn accuracy, SDPA accuracy and gap."""
    r = learned.trained(task)
    return [
        str(r.parameters),
        str(r.settings.steps),
        f"{100 * r.accuracy['portattn']:.1f}%",
        f"{100 * r.accuracy['sdpa']:.1f}%",
        heads.gap(r.largest_gap),
    ]


def test_summary_and_head_tables_are_the_training_codes(learned_page: Any) -> None:
    page = learned_page
    rows = table(page, "learned-summary")
    for task in learned.TASKS:
        assert any(row[1:6] == _summary_cells(task) for row in rows), (task, rows)
        assert table(page, f"heads-{task}") == _head_rows(task)
    text = page.locator("article").inner_text()
    name, score = heads.strongest("induction", "induction", layer=1)
    assert f"head {name} puts {heads.fmt(score)} of its" in text
    name, score = heads.strongest("induction", "previous", layer=0)
    assert f"head {name} puts {heads.fmt(score)} of its" in text
    # The exercises' answers (folded away) carry the model's own numbers.
    answers = " ".join(
        page.locator("article details.question").evaluate_all("ds => ds.map(d => d.textContent)")
    )
    v = exercises.values("learned")
    for number in (f"{v['best_score']:.3f}", f"{v['weight']:.2f}", f"{v['attn']:,}"):
        assert number in answers, (number, answers)


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


def _lines(view: Any) -> dict[tuple[int, int, int], float]:
    """(head, query, key) -> the opacity its line is drawn with."""
    got = view.locator("line").evaluate_all(
        "ls => ls.map(l => [+l.dataset.h, +l.dataset.q, +l.dataset.k,"
        " +l.getAttribute('stroke-opacity')])"
    )
    return {(h, q, k): w for h, q, k, w in got}


def _assert_drawn(view: Any, weights: Any, layer: int, picked: set[int]) -> None:
    """The ticked heads' lines carry their weights; the others are not drawn."""
    lines = _lines(view)
    for (h, q, k), w in lines.items():
        want = weights[layer][h][q][k] if h in picked else 0
        assert w == pytest.approx(want), (layer, h, q, k)


def test_head_view_overlays_heads_and_follows_hover(learned_page: Any) -> None:
    page = learned_page
    view = page.locator('[data-pa-headview="induction"]')
    data = heads.view_data("induction")
    n, both = len(data["tokens"]), {0, 1}
    # At first every head of layer 1 is drawn, each in its own colour.
    assert view.get_attribute("data-layer") == "0" and view.get_attribute("data-heads") == "0,1"
    _assert_drawn(view, data["weights"], 0, both)
    colours = view.locator("g.pa-hv-lines").evaluate_all(
        "gs => gs.map(g => g.getAttribute('stroke'))"
    )
    assert colours == data["colours"][:2]
    view.locator(".pa-hv-pick").nth(1).click()  # layer 2
    boxes = view.locator("input.pa-hv-box")
    boxes.nth(0).uncheck()  # head 1 off: head 2 alone
    assert view.get_attribute("data-layer") == "1" and view.get_attribute("data-heads") == "1"
    _assert_drawn(view, data["weights"], 1, {1})
    # Hover a query: only its row stays, and the sentence names its strongest key.
    q = n - 2
    view.locator(f'.pa-hv-query[data-q="{q}"]').hover()
    assert view.get_attribute("data-query") == str(q)
    lines = _lines(view)
    assert all(w == 0 for (_, qq, _), w in lines.items() if qq != q)
    row = data["weights"][1][1][q]
    best = max(range(n), key=row.__getitem__)
    assert lines[(1, q, best)] == pytest.approx(row[best])
    said = view.locator(".pa-hv-sentence").inner_text()
    assert f"{data['tokens'][best]} ({best + 1}) {round(100 * row[best])}%" in said
    boxes.nth(0).check()  # both heads of layer 2: the sentence names each
    view.locator(f'.pa-hv-query[data-q="{q}"]').hover()  # the pointer left for the box
    said = view.locator(".pa-hv-sentence").inner_text()
    assert "head 2.1:" in said and "head 2.2:" in said, said
    page.mouse.move(0, 0)


def test_thumbnails_are_the_weights_and_select_their_head(learned_page: Any) -> None:
    page = learned_page
    for task in learned.TASKS:
        view = page.locator(f'[data-pa-headview="{task}"]')
        data = heads.view_data(task)
        layers, nheads = len(data["weights"]), len(data["weights"][0])
        thumbs = view.locator(".pa-hv-model .pa-hv-thumb")
        assert thumbs.count() == layers * nheads
        # Each thumbnail paints one cell per (query, key), hatched where the mask hides it.
        n = len(data["tokens"])
        cells = view.locator(".pa-hv-thumb").first.evaluate(
            "b => [...b.querySelectorAll('path')].reduce((s, p) => s"
            " + (p.getAttribute('d').match(/M/g) || []).length, 0)"
        )
        assert cells == n * n
        hatched = view.locator(".pa-hv-thumb [id*=pa-attn-masked] path").count()
        assert hatched == (layers * nheads if data["causal"] else 0)
        layer, head = layers - 1, nheads - 1
        view.locator(f'.pa-hv-thumb[data-layer="{layer}"][data-head="{head}"]').click()
        assert view.get_attribute("data-layer") == str(layer)
        assert view.get_attribute("data-heads") == str(head)
        _assert_drawn(view, data["weights"], layer, {head})
        pressed = view.locator(".pa-hv-thumb[aria-pressed=true]")
        assert pressed.count() == 1
        assert pressed.get_attribute("data-head") == str(head)
        # On phones the grid sits under the lines, in the column; on desktops beside them.
        svg = view.locator("svg.pa-hv-svg").bounding_box()
        grid = view.locator(".pa-hv-grid").bounding_box()
        assert svg is not None and grid is not None
        width = page.viewport_size["width"]
        assert grid["x"] + grid["width"] <= width
        if width == DESKTOP:
            assert grid["x"] >= svg["x"] + svg["width"], (svg, grid)


def test_japanese_page_has_the_same_numbers(shared_pages: Any) -> None:
    ja, visit = shared_pages.open("ja/learned/", PHONE, "dark")
    visit.assert_clean()
    for task in learned.TASKS:
        assert table(ja, f"heads-{task}") == _head_rows(task)
    summary = [r[1:6] for r in table(ja, "learned-summary")]
    assert summary == [_summary_cells(task) for task in learned.TASKS]
    view = ja.locator('[data-pa-headview="reverse"]')
    view.locator(".pa-hv-query").first.hover()
    assert "注目先" in view.locator(".pa-hv-sentence").inner_text()
    grid = view.locator(".pa-hv-model").inner_text()
    assert "層 1" in grid and "ヘッド 2" in grid and "注目の重み" in grid, grid
    heads_box = view.locator(".pa-hv-choice").nth(1)
    assert heads_box.get_attribute("aria-label") == "重ねて描くヘッド"
