"""Build-time helpers for the portattn site.

The pages call these from ``python exec="on"`` blocks (markdown-exec), so every
number, table and figure on the site is computed by portattn while the site
builds. Nothing here is part of the library.
"""
