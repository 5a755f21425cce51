"""Bridges from portattn to other libraries' model code, one module per library.

Each bridge imports its library on import and is absent from ``portattn``'s
own namespace, so ``import portattn`` never pulls a model framework in.
"""
