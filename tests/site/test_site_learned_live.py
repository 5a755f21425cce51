"""The trained models of "What attention learns", run in the page by docs/assets/learnedlive.js:
their forward pass is portattn's, and typing redraws the model's output and the head view.

One page load per width and language (phone in the dark scheme, desktop in the
light one; English and Japanese), with every check of this file run on it: the
forward pass on 20 random sequences of both tasks, typing a sequence, and
typing a bad one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from browsing import DESKTOP, PHONE, open_page
from sitegen import learned, learnedlive
from sitegen.figures import viridis

CASES = [
    (PHONE, "dark", "en"),
    (DESKTOP, "light", "en"),
    (PHONE, "dark", "ja"),
    (DESKTOP, "light", "ja"),
]
TOLERANCE = 1e-6


@pytest.fixture(scope="module", params=CASES, ids=[f"{w}-{lang}" for w, _, lang in CASES])
def live_page(request: Any, layouts: Any, base_url: str) -> Iterator[tuple[Any, Any, str]]:
    width, scheme, lang = request.param
    prefix = "ja/" if lang == "ja" else ""
    page, visit = open_page(None, f"{base_url}/{prefix}learned/", context=layouts(width, scheme))
    yield page, visit, lang
    page.close()


@functools.cache
def _data(task: str, lang: str) -> dict[str, Any]:
    return learnedlive.data(task, lang=lang)


@functools.cache
def _sequences() -> list[tuple[str, list[int]]]:
    """20 random sequences, the tasks in turn, induction's of random length.

    The same for every layout and language, so that portattn runs each once.
    """
    rng = np.random.default_rng(30)
    out = []
    for k in range(20):
        task = tuple(learned.TASKS)[k % 2]
        lo, hi = learnedlive.lengths(task)
        n = int(rng.integers(lo, hi + 1))
        out.append((task, [int(t) for t in rng.integers(0, learned.TASKS[task].vocab, n)]))
    return out


@functools.cache
def _portattn(task: str, ids: tuple[int, ...]) -> dict[str, np.ndarray]:
    return learnedlive.forward(task, ids)


def _same_argmax(got: list[int], logits: np.ndarray) -> bool:
    """The page's argmax is portattn's, except where the two best logits tie within 1e-9."""
    top = np.sort(logits, axis=-1)
    tie = top[:, -1] - top[:, -2] <= 1e-9
    return all(t or g == int(r) for g, r, t in zip(got, logits.argmax(-1), tie, strict=True))


def test_forward_pass_equals_portattns(live_page: tuple[Any, Any, str]) -> None:
    """20 random sequences, both tasks: attention weights and logits within 1e-6, same argmax."""
    page, visit, _ = live_page
    visit.assert_clean()
    runs = page.evaluate(
        "cases => cases.map(([t, ids]) => window.portattnLearned.forward[t](ids))", _sequences()
    )
    worst = 0.0
    for (task, ids), got in zip(_sequences(), runs, strict=True):
        ref = _portattn(task, tuple(ids))
        for name in ("weights", "logits"):
            ours = np.asarray(got[name])
            assert ours.shape == ref[name].shape, (task, ids, name, ours.shape)
            err = float(np.max(np.abs(ours - ref[name])))
            assert err <= TOLERANCE, (task, ids, name, err)
            worst = max(worst, err)
        assert _same_argmax(got["predicted"], ref["logits"]), (task, ids, got["predicted"])
    print(f"learned live model: largest |page - portattn| over 20 sequences = {worst:.1e}")


def _typed(page: Any, task: str, value: str) -> Any:
    page.locator(f"#pa-ll-{task}").fill(value)
    return page.locator(f'[data-pa-learnedlive="{task}"]')


def _assert_head_view(page: Any, task: str, letters: list[str], weights: np.ndarray) -> None:
    """The head view shows the typed sequence: its tokens, its lines, its thumbnails."""
    view = page.locator(f'[data-pa-headview="{task}"]')
    n = len(letters)
    queries = view.locator(".pa-hv-query text").evaluate_all("ts => ts.map(t => t.textContent)")
    assert queries == letters
    layer = int(view.get_attribute("data-layer") or 0)
    picked = {int(h) for h in (view.get_attribute("data-heads") or "").split(",") if h}
    lines = view.locator("line").evaluate_all(
        "ls => ls.map(l => [+l.dataset.h, +l.dataset.q, +l.dataset.k,"
        " +l.getAttribute('stroke-opacity')])"
    )
    assert len(lines) == weights.shape[1] * n * n
    for h, q, k, w in lines:
        want = weights[layer, h, q, k] if h in picked else 0.0
        assert abs(w - want) <= TOLERANCE, (task, layer, h, q, k, w, want)
    # Every thumbnail repainted: one cell per (query, key) in the colormap's
    # nearest stop, the cells the causal mask hides hatched.
    stops = viridis(64)
    cells = view.locator(".pa-hv-thumb").evaluate_all(
        "bs => bs.map(b => [+b.dataset.layer, +b.dataset.head, [...b.querySelectorAll('path')]"
        ".map(p => [p.getAttribute('fill'), p.getAttribute('d')])])"
    )
    causal = learned.TASKS[task].causal
    for li, h, paths in cells:
        painted = {}
        for fill, d in paths:
            for cell in d.split("M")[1:]:
                k, q = (int(v) for v in cell.split("h")[0].split())
                painted[q, k] = fill
        assert len(painted) == n * n, (task, li, h, len(painted))
        for (q, k), fill in painted.items():
            if causal and k > q:
                assert fill.startswith("url(#"), (task, li, h, q, k, fill)
            else:
                assert fill == stops[round(weights[li, h, q, k] * 63)], (task, li, h, q, k)


def test_typing_runs_the_model_and_redraws_the_head_view(live_page: tuple[Any, Any, str]) -> None:
    page, visit, lang = live_page
    letters = _data("reverse", lang)["letters"]
    # Induction: five distinct letters, then the first four again; reversal: eight random ones.
    rng = np.random.default_rng(7)
    first = [int(t) for t in rng.permutation(len(letters))[:5]]
    sequences = {
        "induction": [*first, *first[:4]],
        "reverse": [
            int(t) for t in rng.integers(0, len(letters), learnedlive.lengths("reverse")[0])
        ],
    }
    for task, ids in sequences.items():
        typed = [letters[t] for t in ids]
        box = _typed(page, task, " ".join(typed).lower() if task == "reverse" else "".join(typed))
        ref = learnedlive.forward(task, ids)
        want = "".join(letters[t] for t in ref["predicted"])
        assert box.get_attribute("data-state") == "ok"
        assert box.get_attribute("data-predicted") == want
        outputs = box.locator(".pa-ll-out").all_inner_texts()
        assert "".join(outputs) == want
        said = box.locator(".pa-ll-said").inner_text()
        template = _data(task, lang)["text"]["said"]
        if task == "induction":
            expected = template.format(last=typed[-1], next=want[-1])
        else:
            right = sum(int(p) == ids[len(ids) - 1 - i] for i, p in enumerate(ref["predicted"]))
            expected = template.format(out=" ".join(want), right=right, n=len(ids))
        assert said == expected
        # Right letters are marked; for reversal the wrong ones are struck through.
        if task == "induction":
            right = sum(int(p) == t for p, t in zip(ref["predicted"], ids[1:], strict=False))
        assert box.locator(".pa-ll-right").count() == right
        wrong = len(ids) - right if task == "reverse" else 0
        assert box.locator(".pa-ll-wrong").count() == wrong
        _assert_head_view(page, task, typed, ref["weights"])
        # The rebuilt lines still answer the pointer: hovering a query reads its row.
        view = page.locator(f'[data-pa-headview="{task}"]')
        view.locator(f'.pa-hv-query[data-q="{len(ids) - 1}"]').hover()
        assert view.get_attribute("data-query") == str(len(ids) - 1)
        assert view.locator(".pa-hv-said").count() == 1
        page.mouse.move(0, 0)
    # The model learned its task: the repeat is continued, the sequence reversed.
    ind = page.locator('[data-pa-learnedlive="induction"]').get_attribute("data-predicted") or ""
    assert ind[-1] == letters[first[4]], ind
    width = page.viewport_size["width"]
    for task in sequences:
        for part in (f"#pa-ll-{task}", f'[data-pa-learnedlive="{task}"] .pa-ll-grid'):
            b = page.locator(part).bounding_box()
            assert b is not None and b["x"] >= 0 and b["x"] + b["width"] <= width, (part, b)
    visit.assert_clean()


def test_bad_input_is_named_in_the_pages_language(live_page: tuple[Any, Any, str]) -> None:
    page, visit, lang = live_page
    for task, value, key, fill in (
        ("reverse", "ABC", "length", {"n": 3}),
        ("induction", "A B Z 1 z", "unknown", {"bad": ("Z", "1")}),
        ("induction", "", "length", {"n": 0}),
        ("induction", "ABCDEFGHIJKLMNOPA", "length", {"n": 17}),
    ):
        box = _typed(page, task, value)
        words = _data(task, lang)["text"]
        text = words[key]
        if key == "unknown":  # each letter quoted in the page's own quotation marks
            fill = {"bad": words["bad_sep"].join(words["bad"].format(c=c) for c in fill["bad"])}
        assert box.get_attribute("data-state") == "invalid", (task, value)
        assert box.locator(".pa-ll-said").inner_text() == text.format(**fill)
        assert page.locator(f"#pa-ll-{task}").get_attribute("aria-invalid") == "true"
        # The message says what the model reads: its longest input, or its letters.
        letters = _data(task, lang)["letters"]
        named = (
            (letters[0], letters[-1]) if key == "unknown" else (str(learnedlive.lengths(task)[1]),)
        )
        assert all(word in text for word in named), (text, named)
    if lang == "ja":
        said = page.locator('[data-pa-learnedlive="induction"] .pa-ll-said').inner_text()
        assert said.endswith("だ。"), said
    # A valid sequence again clears the message.
    box = _typed(page, "reverse", "ABCDEFGH")
    assert box.get_attribute("data-state") == "ok"
    assert page.locator("#pa-ll-reverse").get_attribute("aria-invalid") is None
    visit.assert_clean()
