"""impl="native": agrees with the generic path where it maps, and says clearly where it does not."""

from __future__ import annotations

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, assert_close_on, option_arrays

CASES = {
    "plain": ({}, 6, 6),
    "causal": ({"causal": True}, 6, 6),
    "top_left": ({"causal": "top_left"}, 4, 7),
    "bottom_right": ({"causal": "bottom_right"}, 4, 7),
    # the first two rows see nothing: 0, whatever the kernel thinks
    "bottom_right_long_q": ({"causal": "bottom_right"}, 7, 5),
    "window": ({"window": (2, 1)}, 7, 7),
    "mask": ({"mask": "m"}, 6, 8),
    "bias_mask_causal": ({"mask": "m", "bias": "b", "causal": "bottom_right"}, 6, 8),
    "bias_causal": ({"bias": "b", "causal": True}, 8, 8),
    "lengths": ({"key_lengths": "kl", "query_lengths": "ql"}, 6, 8),
    "scale": ({"scale": 0.3}, 5, 5),
}


def _has_kernel(backend: Backend) -> bool:
    """torch and JAX have a fused kernel; elsewhere impl='native' must refuse, clearly."""
    if backend.name.startswith("torch") or backend.name == "jax":
        return True
    q = backend.asarray(np.ones((3, 4)), backend.xp.float32)
    with pytest.raises(NotImplementedError, match="impl='native' delegates"):
        pa.attention(q, q, q, impl="native")
    return False


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_agrees_with_generic(backend: Backend, rng, name):
    if not _has_kernel(backend):
        return
    xp = backend.xp
    kw, lq, lk = CASES[name]
    kwargs = option_arrays(backend, rng, kw, lq, lk)
    q, k, v = (rng.standard_normal((2, 3, n, 8)) for n in (lq, lk, lk))
    for dtype in backend.float_dtypes:
        args = [backend.asarray(a, dtype) for a in (q, k, v)]
        if backend.name == "jax" and dtype == xp.float64:
            with pytest.raises(NotImplementedError, match="cannot keep float64"):
                pa.attention(*args, impl="native", **kwargs)
            continue
        got = pa.attention(*args, impl="native", **kwargs)
        want = pa.attention(*args, impl="materialize", **kwargs)
        assert_close_on(backend, got, want, dtype=dtype)
        assert not np.isnan(to_numpy(got)).any()


def test_native_empty(backend: Backend):
    if not _has_kernel(backend):
        return
    xp = backend.xp
    q = backend.asarray(np.ones((3, 4)), xp.float32)
    e = backend.asarray(np.ones((0, 4)), xp.float32)
    out = pa.attention(q, e, e, impl="native")
    np.testing.assert_array_equal(to_numpy(out), 0.0)


def test_native_refuses_lse(backend: Backend):
    if not _has_kernel(backend):
        return
    q = backend.asarray(np.ones((3, 4)), backend.xp.float32)
    with pytest.raises(NotImplementedError, match="log-sum-exp"):
        pa.attention(q, q, q, impl="native", return_lse=True)


def test_native_refuses_libraries_without_a_kernel(backend: Backend):
    assert _has_kernel(backend) == (backend.name.startswith("torch") or backend.name == "jax")


# portattn._core._masks builds position indices as int64, which JAX without x64
# truncates to int32 with a warning; harmless at these sizes.
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64:UserWarning")
def test_native_jax_agrees_with_generic(rng):
    import jax.numpy as jnp  # jax is in the test dependency group, as an oracle

    q, k, v = (rng.standard_normal((2, 5, n, 8)).astype(np.float32) for n in (6, 9, 9))
    mask = rng.random((6, 9)) < 0.6
    mask[2] = False
    for kw in (
        {},
        {"causal": "top_left"},
        {"causal": "bottom_right"},
        {"mask": mask},
        {"window": (1, 2), "causal": "bottom_right"},
    ):
        jkw = {a: jnp.asarray(b) if isinstance(b, np.ndarray) else b for a, b in kw.items()}
        got = pa.attention(*(jnp.asarray(a) for a in (q, k, v)), impl="native", **jkw)
        want = pa.attention(q, k, v, impl="materialize", **kw)
        assert_close(np.asarray(got), want, rtol=1e-5)
    with pytest.raises(NotImplementedError, match="dv="):
        pa.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v[..., :3]), impl="native")


# --- impl="native" hands torch a 4-D problem ------------------------------------------


@pytest.mark.parametrize("shape", [(7, 8), (3, 7, 8), (2, 3, 7, 8), (2, 2, 3, 7, 8)])
def test_native_torch_always_gets_4d(monkeypatch, rng, shape):
    import torch
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        mask = kwargs.get("attn_mask")
        seen.append((q.ndim, k.ndim, v.ndim, None if mask is None else mask.ndim))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    x = torch.from_numpy(rng.standard_normal(shape))
    want = to_numpy(pa.attention(x, x, x, causal=True, impl="materialize"))
    for kwargs in ({"causal": True}, {"causal": "bottom_right", "window": 2}):
        got = pa.attention(x, x, x, impl="native", **kwargs)
        if kwargs == {"causal": True}:
            assert_close(got, want, rtol=1e-12)
        assert tuple(got.shape) == shape
    assert seen and all(s[:3] == (4, 4, 4) and s[3] in (None, 4) for s in seen)


# --- torch's kernel takes the scale itself --------------------------------------------


@pytest.mark.parametrize("impl", ["auto", "native"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_native_torch_takes_the_scale_without_a_pass_over_q(monkeypatch, rng, impl, scale):
    """SDPA gets the caller's query as it is and ``scale=``; the generic paths still scale q."""
    import torch
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((q, kwargs["scale"]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, 4, n, 8))) for n in (5, 7, 7))
    got = pa.attention(q, k, v, scale=scale, impl=impl)
    assert len(seen) == 1 and seen[0][0] is q
    assert seen[0][1] == pytest.approx(8**-0.5 if scale is None else scale, rel=1e-15)
    want = pa.attention(q, k, v, scale=scale, impl="materialize")
    assert_close(got, want, rtol=1e-12)
    # auto on a call the kernel does not take (return_lse) scales q itself
    out, _ = pa.attention(q, k, v, scale=scale, return_lse=True)
    assert len(seen) == 1
    assert_close(out, want, rtol=1e-12)
