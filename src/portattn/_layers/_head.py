"""One attention head: three projections and :func:`portattn.attention`."""

from __future__ import annotations

import math

import numpy as np

from .._attention import attend
from .._core._masks import Causal
from .._core._variant import build_variant
from .._lib._checks import (
    check_array,
    check_flag,
    check_floating,
    check_int,
    check_real,
    check_same_device,
    dtype_name,
)
from .._lib._compat import array_namespace, device_of, resolve_namespace
from .._lib._random import draw_weights, from_numpy_float64
from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["Head"]


class Head:
    """A single attention head with projections ``wq``, ``wk``, ``wv`` of shape (d_model, d_head).

    ``head(x)`` computes ``attention(x @ wq, x @ wk, x @ wv)``: each token
    asks with its query, is found by its key, and contributes its value.

    Parameters
    ----------
    wq, wk, wv : array, shape (d_model, d_head)
        Real floating projections from one library, on one device.

    Attributes
    ----------
    wq, wk, wv : array
        The projections, as given (never copied or modified).
    d_model, d_head : int
        Input and head widths.

    Examples
    --------
    >>> import numpy as np
    >>> import portattn as pa
    >>> head = pa.Head.random(8, 4, xp=np)
    >>> x = np.ones((5, 8))
    >>> head(x, causal=True).shape
    (5, 4)
    """

    def __init__(self, wq: Array, wk: Array, wv: Array, /) -> None:
        for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
            check_array(name, w)
        xp = array_namespace(wq, wk, wv)
        for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
            check_floating(name, w, xp=xp)
            if w.ndim != 2:
                msg = f"expected {name} to have shape (d_model, d_head), got shape {tuple(w.shape)}"
                raise ValueError(msg)
        if not tuple(wq.shape) == tuple(wk.shape) == tuple(wv.shape):
            msg = (
                "expected wq, wk and wv to share one shape (d_model, d_head), got "
                f"{tuple(wq.shape)}, {tuple(wk.shape)} and {tuple(wv.shape)}"
            )
            raise ValueError(msg)
        check_same_device([("wq", wq), ("wk", wk), ("wv", wv)])
        self.wq, self.wk, self.wv = wq, wk, wv
        self.d_model, self.d_head = int(wq.shape[0]), int(wq.shape[1])

    def __repr__(self) -> str:
        return (
            f"Head(d_model={self.d_model}, d_head={self.d_head}, dtype={dtype_name(self.wq.dtype)})"
        )

    @classmethod
    def random(
        cls,
        d_model: int,
        d_head: int,
        /,
        *,
        seed: int = 0,
        std: float = 1.0,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> Head:
        """Deterministic random projections, bit-identical on every backend.

        The entries of ``wq``, ``wk`` and ``wv`` (in that order, one draw of
        shape (3, d_model, d_head)) are i.i.d. normal with mean 0 and
        standard deviation ``std``, drawn in float64 from NumPy's PCG64
        seeded with ``seed``, then rounded to ``dtype``.

        Parameters
        ----------
        d_model, d_head : int
            Input and head widths.
        seed : int, optional
            Non-negative seed.
        std : float, optional
            Standard deviation; 1.0 (default) as in the chapter, or
            ``1/sqrt(d_model)`` to keep projections at unit scale.
        xp : namespace or module, optional
            Array library; ``None`` means NumPy.
        dtype : dtype, optional
            Real floating dtype of ``xp``; default float32.
        device : optional
            Device in ``xp``'s terms.

        Returns
        -------
        Head

        Examples
        --------
        >>> import portattn as pa
        >>> pa.Head.random(4, 2).wq.dtype
        dtype('float32')
        """
        ns = resolve_namespace(xp)
        rows = check_int("d_model", d_model, minimum=1)
        cols = check_int("d_head", d_head, minimum=1)
        sd = check_real("std", std, minimum=0.0)
        w = draw_weights([(rows, cols)] * 3, [sd] * 3, seed=seed, xp=ns, dtype=dtype, device=device)
        return cls(*w)

    @classmethod
    def identity(
        cls,
        d: int,
        /,
        *,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> Head:
        """A head whose three projections are the dxd identity: ``Q = K = V = x``.

        Examples
        --------
        >>> import portattn as pa
        >>> pa.Head.identity(3).wq.tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
        """
        ns = resolve_namespace(xp)
        n = check_int("d", d, minimum=1)
        eye = from_numpy_float64(np.eye(n), xp=ns, dtype=dtype, device=device)
        return cls(eye, eye, eye)

    def _project(self, x: Array, *, xp: Namespace) -> tuple[Array, Array, Array]:
        check_floating("x", x, xp=xp)
        if x.ndim < 2 or int(x.shape[-1]) != self.d_model:
            msg = (
                f"expected x to have shape (..., seq, d_model={self.d_model}), "
                f"got shape {tuple(x.shape)}"
            )
            raise ValueError(msg)
        check_same_device([("weights", self.wq), ("x", x)])
        return x @ self.wq, x @ self.wk, x @ self.wv  # each (..., seq, d_head)

    def scores(self, x: Array, /, *, scaled: bool = True) -> Array:
        """Raw scores ``Q Kᵀ`` of shape (..., seq, seq), divided by √d_head unless ``scaled=False``.

        Examples
        --------
        >>> import portattn as pa
        >>> import numpy as np
        >>> head = pa.Head.identity(4)
        >>> x = np.full((2, 4), 1.0, dtype=np.float32)
        >>> head.scores(x, scaled=False).tolist(), head.scores(x).tolist()
        ([[4.0, 4.0], [4.0, 4.0]], [[2.0, 2.0], [2.0, 2.0]])
        """
        check_array("x", x)
        xp = array_namespace(x, self.wq)
        scale = check_flag("scaled", scaled)
        q, k, _ = self._project(x, xp=xp)
        s = q @ xp.matrix_transpose(k)  # (..., seq, seq)
        if scale:
            s = s / xp.asarray(math.sqrt(self.d_head), dtype=s.dtype, device=device_of(s))
        return s

    def weights(self, x: Array, /, *, causal: Causal = False) -> Array:
        """Attention weights ``softmax(Q Kᵀ / √d_head)``, (..., seq, seq); rows sum to 1."""
        return self._attend(x, causal, weights=True)

    def __call__(self, x: Array, /, *, causal: Causal = False) -> Array:
        """The head's output for ``x`` of shape (..., seq, d_model): (..., seq, d_head)."""
        return self._attend(x, causal, weights=False)

    def _attend(self, x: Array, causal: object, *, weights: bool) -> Array:
        """The output, or the weights, of the head's attention over ``x``."""
        check_array("x", x)
        xp = array_namespace(x, self.wq)
        q, k, v = self._project(x, xp=xp)
        variant = build_variant(causal=causal)
        out = attend(q, k, None if weights else v, variant=variant, xp=xp)
        assert not isinstance(out, tuple)
        return out
