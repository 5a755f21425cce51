"""LaTeX to MathML at build time (latex2mathml), for pages and docstrings."""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

# pymdownx.arithmatex (generic mode) marks math up like this.
_BLOCK = re.compile(r'<div class="arithmatex">\s*\\\[(.*?)\\\]\s*</div>', re.S)
_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
# A numpydoc ``:math:`x``` role, after Markdown has turned the backticks into <code>.
_ROLE_MATH = re.compile(r":math:<code>(.*?)</code>", re.S)
# Sphinx cross-reference roles that mkdocstrings leaves as text.
_ROLE_REF = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|obj):<code>~?(.*?)</code>")


def to_mathml(latex: str, *, block: bool) -> str:
    """One formula as a ``<math>`` element, with the LaTeX kept as ``alttext``."""
    source = html.unescape(latex).strip()
    out = convert(source, display="block" if block else "inline")
    alt = html.escape(source, quote=True)
    return out.replace("<math ", f'<math alttext="{alt}" class="pa-math" ', 1)


def render_math(page_html: str) -> str:
    """Replace every arithmatex block, inline formula and ``:math:`` role with MathML."""
    # A wide display formula scrolls inside its own box instead of being cut off.
    page_html = _BLOCK.sub(
        lambda m: f'<div class="pa-math-block">{to_mathml(m.group(1), block=True)}</div>',
        page_html,
    )
    page_html = _INLINE.sub(lambda m: to_mathml(m.group(1), block=False), page_html)
    return _ROLE_MATH.sub(lambda m: to_mathml(m.group(1), block=False), page_html)


def tidy_roles(page_html: str) -> str:
    """Turn ``:func:`name``` into a link to ``name``'s entry when this page documents it."""

    def link(m: re.Match[str]) -> str:
        name = m.group(1)
        target = name if name.startswith("portattn.") else f"portattn.{name}"
        if f'id="{target}"' in page_html:
            return f'<a href="#{target}"><code>{name}</code></a>'
        return f"<code>{name}</code>"

    return _ROLE_REF.sub(link, page_html)
