"""Other ways to build a :class:`~portattn.MultiHeadAttention`: random weights, torch's module.

They are the class's alternative constructors (and ``to_torch``, the way
back), kept apart from it so that the attention itself reads on one screen.
The class inherits them from :class:`Builders`; the arrays come from
:func:`._mha_weights.random_weights` and :mod:`._torch_convert`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .._lib._compat import resolve_namespace
from .._lib._typing import Array, Device, DType, Namespace
from ._mha_weights import random_weights
from ._positions import RopeLayout
from ._torch_convert import Layers, from_torch, from_torch_weights, to_torch

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Builders"]


class Builders:
    """:class:`~portattn.MultiHeadAttention`'s alternative constructors and its torch export."""

    if TYPE_CHECKING:  # the signature of MultiHeadAttention's own constructor, for cls(...)

        def __init__(
            self, wq: Array, wk: Array, wv: Array, wo: Array, /, **options: Any
        ) -> None: ...

    @classmethod
    def random(
        cls,
        d_model: int,
        num_heads: int,
        /,
        *,
        num_kv_heads: int | None = None,
        d_head: int | None = None,
        bias: bool = False,
        seed: int = 0,
        rope: RopeLayout | None = None,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> Self:
        """Deterministic random weights, bit-identical on every backend.

        One float64 draw of i.i.d. standard normals from NumPy's PCG64 seeded
        with ``seed`` fills, in order, ``wq``, ``wk``, ``wv``, ``wo`` and (with
        ``bias``) ``bq``, ``bk``, ``bv``, ``bo``. Each entry is scaled by
        ``1/sqrt(fan_in)``: ``1/sqrt(d_model)`` for the input projections and
        their biases, ``1/sqrt(H * d_head)`` for ``wo`` and ``bo``, so
        activations stay at unit scale. Values are rounded to ``dtype`` only
        at the end.

        Parameters
        ----------
        d_model, num_heads : int
            Model width and number of query heads.
        num_kv_heads : int, optional
            Number of key/value heads; must divide ``num_heads``. Default
            ``num_heads``.
        d_head : int, optional
            Head width. Default ``d_model // num_heads``, which requires
            ``num_heads`` to divide ``d_model``.
        bias : bool, optional
            Also draw the four biases.
        seed : int, optional
            Non-negative seed.
        rope : {None, "half", "interleaved"}, optional
            As in the constructor.
        xp : namespace or module, optional
            Array library; ``None`` means NumPy.
        dtype : dtype, optional
            Real floating dtype; default float32.
        device : optional
            Device in ``xp``'s terms.

        Returns
        -------
        MultiHeadAttention

        Raises
        ------
        ValueError
            ``num_heads`` does not divide ``d_model`` and no ``d_head`` is
            given; ``num_kv_heads`` does not divide ``num_heads``.

        Examples
        --------
        >>> import portattn as pa
        >>> pa.MultiHeadAttention.random(6, 3).d_head
        2
        """
        arrays, options = random_weights(
            d_model,
            num_heads,
            num_kv_heads=num_kv_heads,
            d_head=d_head,
            bias=bias,
            seed=seed,
            xp=resolve_namespace(xp),
            dtype=dtype,
            device=device,
        )
        return cls(*arrays, **options, rope=rope)

    @classmethod
    def from_torch_weights(
        cls,
        in_proj_weight: Array,
        out_proj_weight: Array,
        /,
        *,
        num_heads: int,
        in_proj_bias: Array | None = None,
        out_proj_bias: Array | None = None,
    ) -> Self:
        """Build from ``torch.nn.MultiheadAttention``'s packed weights, in any array library.

        torch computes ``x @ W.T + b`` with ``in_proj_weight`` stacking the
        query, key and value weights as (3 * d_model, d_model); here the
        three blocks are transposed into ``wq``, ``wk``, ``wv`` and
        ``out_proj.weight`` into ``wo``. Works on the tensors themselves or
        on NumPy copies of a ``state_dict`` (torch need not be installed).

        Parameters
        ----------
        in_proj_weight : array, shape (3 * d_model, d_model)
            torch's ``in_proj_weight``: the query, key and value weights stacked.
        out_proj_weight : array, shape (d_model, d_model)
            torch's ``out_proj.weight``.
        num_heads : int
            Number of heads; must divide ``d_model``.
        in_proj_bias : array, shape (3 * d_model,), optional
            torch's ``in_proj_bias``; ``None`` for a layer built with ``bias=False``.
        out_proj_bias : array, shape (d_model,), optional
            torch's ``out_proj.bias``; ``None`` for a layer built with ``bias=False``.

        Returns
        -------
        MultiHeadAttention
            With ``num_kv_heads == num_heads``; the arrays are views or
            transposes of the inputs, in their library.

        Examples
        --------
        >>> import numpy as np
        >>> import portattn as pa
        >>> w_in, w_out = np.zeros((12, 4)), np.eye(4)
        >>> pa.MultiHeadAttention.from_torch_weights(w_in, w_out, num_heads=2).d_head
        2
        """
        arrays, options = from_torch_weights(
            in_proj_weight,
            out_proj_weight,
            num_heads=num_heads,
            in_proj_bias=in_proj_bias,
            out_proj_bias=out_proj_bias,
        )
        return cls(*arrays, **options)

    @classmethod
    def from_torch(
        cls,
        module: Any,
        /,
        *,
        xp: Namespace | None = None,
        dtype: DType | None = None,
        device: Device | None = None,
    ) -> Self:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` into ``xp`` arrays.

        Parameters
        ----------
        module : torch.nn.MultiheadAttention
            Without ``add_bias_kv`` or ``add_zero_attn`` (they have no
            counterpart here); ``kdim == vdim`` when they differ from
            ``embed_dim`` (one context feeds keys and values).
        xp : namespace or module, optional
            Target library; ``None`` means NumPy.
        dtype : dtype, optional
            Target dtype; default: the module's precision (float32 stays
            float32, float64 stays float64).
        device : optional
            Target device.

        Returns
        -------
        MultiHeadAttention
            Call it with ``batch_first`` layout, (..., L, d_model).

        Raises
        ------
        ValueError
            A module using ``add_bias_kv``, ``add_zero_attn``, or
            ``kdim != vdim``.
        """
        arrays, options = from_torch(module, xp=xp, dtype=dtype, device=device)
        return cls(*arrays, **options)

    def to_torch(self) -> Any:
        """A ``torch.nn.MultiheadAttention`` (``batch_first=True``, CPU) holding these weights.

        Requires ``num_kv_heads == num_heads`` (torch's module has no GQA) and
        no RoPE. Missing biases become zeros when only some are present.

        Returns
        -------
        torch.nn.MultiheadAttention
        """
        return to_torch(cast("Layers", self))
