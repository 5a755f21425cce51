"""The Hugging Face page as built: its support table was measured by the build, and passed."""

from __future__ import annotations

import html
import re
from pathlib import Path

from portattn.integrations.transformers import ARCHITECTURES


def _cells(site_dir: Path) -> list[list[str]]:
    page = (site_dir / "huggingface" / "index.html").read_text(encoding="utf-8")
    start = page.index('id="what-each-architecture-does-with-it"')
    table = page[page.index("<table>", start) : page.index("</table>", start)]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]  # without the header
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.S)
        ]
        for r in rows
    ]


def test_every_architecture_has_a_measured_row_within_the_tests_tolerance(site_dir: Path):
    rows = _cells(site_dir)
    assert len(rows) == len(ARCHITECTURES)
    for arch_cell, _heads, _features, eager, sdpa, generate, grads in rows:
        assert "refused" not in eager, arch_cell
        numbers = [eager, grads] + ([] if sdpa.startswith("n/a") else [sdpa])
        assert all(float(x) <= 1e-5 for x in numbers), (arch_cell, numbers)
        assert generate.startswith("same as"), arch_cell


def test_the_heads_figure_is_drawn_by_the_build(site_dir: Path):
    page = (site_dir / "huggingface" / "index.html").read_text(encoding="utf-8")
    assert page.count('aria-label="Mistral attention weights per head"') == 1
