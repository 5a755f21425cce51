"""The Hugging Face page as built: its support table was measured by the build, and passed."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

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


def _section(site_dir: Path, lang: str, title: str) -> str:
    prefix = "ja/" if lang == "ja" else ""
    page = (site_dir / prefix / "huggingface" / "index.html").read_text(encoding="utf-8")
    start = re.search(rf"<h2[^>]*>{title}", page).end()  # type: ignore[union-attr]
    end = page.find("<h2", start)
    return html.unescape(re.sub(r"<[^>]+>", "", page[start : end if end > 0 else None]))


def test_the_limits_say_what_attention_forward_does(site_dir: Path):
    """The Limits are the integration's own answers: what it honours, passes and refuses."""
    import torch

    from portattn.integrations import transformers as hf

    for lang, title in (("en", "Limits"), ("ja", "制限")):
        text = _section(site_dir, lang, title)
        honoured = set(re.findall(r"\w+", text.split("TypeError")[0])) & hf._HONOURED
        assert honoured == hf._HONOURED, (lang, honoured)
        # The refusal quoted is the one a head mask gets now, word for word.
        q = torch.randn(1, 2, 3, 4)
        with pytest.raises(TypeError) as refused:
            hf.attention_forward(torch.nn.Module(), q, q, q, None, head_mask=torch.ones(1, 2, 3, 3))
        assert str(refused.value) in text, lang
        # What the table maps (T5's bias, gpt-oss's sinks) is never among the refused.
        refused_names = re.search(r"keyword argument\(s\) (.*?) that", text)
        assert refused_names is not None, lang
        assert {"position_bias", "s_aux"}.isdisjoint(refused_names.group(1).split(", ")), lang
