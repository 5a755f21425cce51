"""MkDocs hooks: make ``sitegen`` importable for the pages, and render math at build time.

Math is written as ``$...$`` and ``$$...$$`` in the pages (marked up by
``pymdownx.arithmatex`` in generic mode) and as ``:math:`...``` in numpydoc
docstrings. Both become MathML here, which browsers draw natively, so the site
ships no math renderer and fetches nothing.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

os.environ.setdefault("MPLBACKEND", "Agg")


# Pages call JAX eagerly (the Transforms page's ``jax.grad`` cells compile
# every operation once per shape): keep its compiled programs where the test
# sessions keep theirs. Set before any page imports JAX, which reads them then.
from jaxcache import jax_cache_env  # noqa: E402

os.environ.update(jax_cache_env())

from sitegen.mathml import render_math, tidy_roles  # noqa: E402


def on_pre_build(*, config: Any) -> None:
    """Run torch on one thread while the pages compute.

    Every tensor the pages make is tiny: a second intra-op thread only waits
    on the first, and on a busy machine it waits for a core. The ALiBi
    training on the Programmable page took 1.6 s a step on two threads and
    0.09 s on one (2 shared cores); the Hugging Face and "What attention
    learns" generators already pinned one thread for the same reason.
    """
    import torch

    torch.set_num_threads(1)


def on_page_content(html: str, /, *, page: Any, config: Any, files: Any) -> str:
    """Replace arithmatex spans and docstring ``:math:`` roles with MathML."""
    return tidy_roles(render_math(html))


# Japanese, like Chinese, puts no space between words: a line break inside a
# paragraph of a .ja.md page must vanish instead of becoming a space.
_CJK = "\u3000-\u30ff\u4e00-\u9fff\uff00-\uffef"
_CJK_BREAK = re.compile(rf"(?<=[{_CJK}])\n[ \t]*(?=[{_CJK}])")


# The Japanese API reference is a Japanese introduction above this line; the
# entries themselves are api.md's, so that a name added there shows in both.
API_ENTRIES = "<!-- the entries of api.md -->"


def on_page_markdown(markdown: str, /, *, page: Any, config: Any, files: Any) -> str:
    """Join wrapped lines between two CJK characters on Japanese pages; fill in api.ja.md."""
    if not page.file.src_uri.endswith(".ja.md"):
        return markdown
    if API_ENTRIES in markdown:
        english = (Path(config["docs_dir"]) / "api.md").read_text(encoding="utf-8")
        markdown = markdown.replace(API_ENTRIES, english[english.index(":::") :])
    return _CJK_BREAK.sub("", markdown)


_HEAD_ALTERNATE = re.compile(r'<link rel="alternate" href="[^"]*" hreflang="[^"]*">\n?')


def on_post_page(output: str, /, *, page: Any, config: Any) -> str:
    """Drop the ``<link rel="alternate" hreflang>`` head tags of the language switcher.

    Material's script fetches ``sitemap.xml`` next to each such link, assuming
    it points at a language's root; mkdocs-static-i18n points it at the same
    page in the other language, so every page logged two 404s. The switcher
    in the header keeps its page-to-page links, which need no script.
    """
    return _HEAD_ALTERNATE.sub("", output)
