"""Bad input: a clear, one-line error naming what was expected and what was received.

The table of bad calls is the one the docs show (``sitegen.errors.CASES``):
every row raises a one-line TypeError or ValueError, every time. The tests
after it check, on every backend, the exact message each kind of bad input gets.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import portattn as pa
from portattn.testing import assert_close, to_numpy

from conftest import Backend, make_qkv, optional_absent

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "_gen"))

from sitegen.errors import CASES, run_case

# --- the table -------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.code for c in CASES])
def test_case_raises_a_clear_error(case):
    got = run_case(case)  # raises RuntimeError if the call stopped raising
    if got.kind == "not run" and case.needs == "longdouble":  # np.longdouble is float64 here
        return
    if got.kind == "not run":  # the library the case imports is absent
        reason = optional_absent(ModuleNotFoundError(got.message, name=case.needs))
        assert reason is not None, got.message
        pytest.skip(reason)
    assert got.kind in ("TypeError", "ValueError", "AttributeError"), got.message
    assert "\n" not in got.message
    assert "expected" in got.message or "ambiguous" in got.message or "overflow" in got.message
    assert run_case(case) == got  # the same call, the same answer


@pytest.fixture
def qkv(backend: Backend, rng):
    return make_qkv(rng, 4, 5, d=3, dv=6, batch=(2,), backend=backend)


# --- TypeError ---------------------------------------------------------------


def test_arrays_from_two_libraries_name_both(backend: Backend, qkv):
    q, k, _ = qkv
    other = np.asarray(np.ones((2, 5, 6)))
    if backend.name.startswith("numpy"):
        import torch  # the oracle, installed in every test session

        other = torch.ones((2, 5, 6), dtype=torch.float64)
    with pytest.raises(TypeError, match=r"one library, got arrays from \w+ and \w+"):
        pa.attention(q, k, other)


@pytest.mark.parametrize("kind", ["int", "bool", "complex"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_non_floating_inputs(backend: Backend, qkv, kind, which):
    xp = backend.xp
    dtype = {"int": xp.int64, "bool": xp.bool, "complex": getattr(xp, "complex128", None)}[kind]
    args = list(qkv)
    args[which] = xp.astype(args[which], dtype)
    name = ("query", "key", "value")[which]
    with pytest.raises(
        TypeError, match=rf"expected {name} to have a real floating dtype, got \w*{kind}"
    ):
        pa.attention(*args)


def test_non_boolean_mask(backend: Backend, qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"expected mask to be a boolean.*got float64.*bias="):
        pa.attention(q, k, v, mask=backend.asarray(np.ones((4, 5))))


def test_non_floating_bias(backend: Backend, qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"expected bias to have a real floating dtype, got bool"):
        pa.attention(q, k, v, bias=backend.asarray(np.ones((4, 5), dtype=bool)))


def test_non_integer_lengths(backend: Backend, qkv):
    q, k, v = qkv
    with pytest.raises(TypeError, match=r"expected key_lengths to be an integer array.*got float"):
        pa.attention(q, k, v, key_lengths=backend.asarray(np.array([3.0, 4.0])))


def test_not_an_array(backend: Backend, qkv):
    q, k, _ = qkv
    with pytest.raises(TypeError, match=r"expected value to be an array, got \[\[1\.0\]\]"):
        pa.attention(q, k, [[1.0]])


# --- ValueError --------------------------------------------------------------


def test_rank_below_two(backend: Backend, qkv):
    q, k, v = qkv
    with pytest.raises(
        ValueError, match=r"expected query to have at least 2 dimensions.*got shape \(3,\)"
    ):
        pa.attention(q[0, 0, ...], k, v)


def test_feature_sizes_differ(backend: Backend, rng, qkv):
    q, _, v = qkv
    k = backend.asarray(rng.standard_normal((2, 5, 4)))
    with pytest.raises(
        ValueError, match=r"expected key to have feature size d=3.*got key shape \(2, 5, 4\)"
    ):
        pa.attention(q, k, v)


def test_key_and_value_lengths_differ(backend: Backend, rng, qkv):
    q, k, _ = qkv
    v = backend.asarray(rng.standard_normal((2, 6, 6)))
    with pytest.raises(
        ValueError, match=r"expected value to have Lk=5 rows.*got value shape \(2, 6, 6\)"
    ):
        pa.attention(q, k, v)


@pytest.mark.parametrize("name", ["mask", "bias"])
@pytest.mark.parametrize("shape", [(4, 6), (3, 4, 5), (5,)])
def test_mask_or_bias_not_broadcastable(backend: Backend, qkv, name, shape):
    q, k, v = qkv
    arr = np.ones(shape, dtype=bool if name == "mask" else np.float64)
    with pytest.raises(ValueError, match=rf"expected {name} to .*got shape"):
        pa.attention(q, k, v, **{name: backend.asarray(arr)})


def test_causal_true_with_lq_ne_lk_names_both_choices(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"Lq=4, Lk=5.*'top_left'.*'bottom_right'"):
        pa.attention(q, k, v, causal=True)


@pytest.mark.parametrize("causal", ["lower", "bottom-right", 1, 2.5])
def test_unknown_causal(qkv, causal):
    q, k, v = qkv
    with pytest.raises(
        ValueError, match=r"expected causal to be False, True, 'top_left' or 'bottom_right'"
    ):
        pa.attention(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [None, 0, 1, "yes"])
def test_attention_and_linear_attention_refuse_the_same_stand_ins(backend: Backend, rng, causal):
    """Neither entry point reads None, 0, 1 or a word as False or True: both refuse it,
    naming what they expected and what they got, where they both accept False and True."""
    x = backend.asarray(rng.standard_normal((3, 2)))
    got = rf"got (\w+ )?{re.escape(repr(causal))}$"
    for entry in (pa.attention, pa.linear_attention):
        for flag in (False, True, np.False_, np.True_):
            assert entry(x, x, x, causal=flag).shape == (3, 2)
        # NumPy's bools mean what Python's do, in both entry points
        for flag in (False, True):
            assert_close(
                entry(x, x, x, causal=np.bool_(flag)), entry(x, x, x, causal=flag), rtol=0.0
            )
        with pytest.raises(ValueError, match=r"expected causal to be (False, )?True.*" + got):
            entry(x, x, x, causal=causal)
    with pytest.raises(ValueError, match=r"expected causal to be False, True.*" + got):
        pa.attention_weights(x, x, causal=causal)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.5", True])
def test_scale_not_finite_number(qkv, scale):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"expected scale to be a finite real number"):
        pa.attention(q, k, v, scale=scale)


def test_arrays_on_different_devices(backend: Backend, qkv):
    q, k, v = qkv
    xp = backend.xp
    if backend.name == "array_api_strict":
        other = xp.asarray(v, device=xp.Device("device1"))
    elif backend.name == "torch":
        other = v.to("meta")
    elif backend.name in ("torch_cuda", "cupy"):
        other = backend.xp.asarray(v, device="cpu") if backend.name == "torch_cuda" else None
        if other is None:
            pytest.skip("cupy arrays live on GPUs only; a second GPU is absent")
    else:
        pytest.skip(f"{backend.name} has a single device (cpu); no second device to mix")
    with pytest.raises(
        ValueError, match=r"different devices: expected all on the device of query.*got value on"
    ):
        pa.attention(q, k, other)


@pytest.mark.parametrize("window", [-1, (2, -1), (1, 2, 3), 1.5])
def test_bad_window(qkv, window):
    q, _, _ = qkv
    with pytest.raises(ValueError, match=r"expected window"):
        pa.attention(q, q, q, window=window)


def test_window_with_lq_ne_lk_needs_alignment(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"window with Lq != Lk is ambiguous"):
        pa.attention(q, k, v, window=2)


def test_unknown_impl(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"expected impl to be one of .* got 'fast'"):
        pa.attention(q, k, v, impl="fast")


@pytest.mark.parametrize("block_size", [0, (4, 0), -2, (1, 2, 3)])
def test_bad_block_size(qkv, block_size):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"expected block_size"):
        pa.attention(q, k, v, impl="blockwise", block_size=block_size)


def test_causal_mask_bad_arguments():
    with pytest.raises(ValueError, match=r"expected align"):
        pa.causal_mask(2, 3, align="middle")
    with pytest.raises(ValueError, match=r"expected lq to be a non-negative int, got -1"):
        pa.causal_mask(-1, 3)


def test_softmax_rejects_integers(backend: Backend):
    with pytest.raises(TypeError, match=r"expected x to have a real floating dtype, got int64"):
        pa.softmax(backend.asarray(np.arange(3)))


def test_head_errors(backend: Backend, rng):
    xp = backend.xp
    w = backend.asarray(rng.standard_normal((4, 2)))
    with pytest.raises(ValueError, match=r"share one shape.*\(4, 2\), \(4, 2\) and \(4, 3\)"):
        pa.Head(w, w, backend.asarray(rng.standard_normal((4, 3))))
    with pytest.raises(
        ValueError, match=r"expected wq to have shape \(d_model, d_head\), got shape \(4,\)"
    ):
        pa.Head(w[:, 0], w[:, 0], w[:, 0])
    head = pa.Head(w, w, w)
    with pytest.raises(
        ValueError, match=r"expected x to have shape \(\.\.\., seq, d_model=4\), got shape \(3, 5\)"
    ):
        head(backend.asarray(rng.standard_normal((3, 5))))
    with pytest.raises(TypeError, match=r"expected dtype to be a real floating dtype"):
        pa.Head.random(4, 2, xp=xp, dtype=xp.int64)
    with pytest.raises(ValueError, match=r"expected d_model to be a positive int, got 0"):
        pa.Head.random(0, 2, xp=xp)
    import json

    with pytest.raises(TypeError, match=r"expected xp to be .* got module 'json'"):
        pa.Head.random(4, 2, xp=json)


# --- the NumPy validation memo -------------------------------------------------


@pytest.fixture
def small_np(rng):
    return tuple(rng.standard_normal((6, 8)).astype(np.float32) for _ in range(3))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"causal": 1}, ValueError),
        ({"causal": "yes"}, ValueError),
        ({"scale": float("nan")}, ValueError),
        ({"scale": float("inf")}, ValueError),
        ({"scale": True}, ValueError),
        ({"scale": np.float32(np.inf)}, ValueError),
        ({"softcap": 0.0}, ValueError),
        ({"window": -1}, ValueError),
    ],
)
def test_a_memoised_valid_call_waves_no_bad_option_through(small_np, kwargs, error):
    """NumPy calls without array options keep what their checks decided, keyed by dtypes,
    shapes and options: the same arrays with a bad option must still be refused."""
    q, k, v = small_np
    pa.attention(q, k, v)
    pa.attention(q, k, v, causal=True, scale=0.5, window=2, softcap=30.0)
    with pytest.raises(error, match="expected"):
        pa.attention(q, k, v, **kwargs)


def test_a_memoised_valid_call_waves_no_bad_array_through(small_np):
    q, k, v = small_np
    pa.attention(q, k, v)
    with pytest.raises(TypeError, match="expected query to have a real floating dtype"):
        pa.attention(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match=r"numpy\.ma\.MaskedArray"):
        pa.attention(np.ma.masked_array(q), k, v)
    with pytest.raises(ValueError, match="expected value to have Lk=6 rows"):
        pa.attention(q, k, v[:5])
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        pa.attention(q, k[0], v)


def test_the_memo_skips_only_repeat_numpy_checks(small_np, monkeypatch):
    """A repeat NumPy or eager torch call skips the checks and gives the same bits.

    Not a tensor subclass (a Parameter, a fake tensor) and not a call that
    differs in dtype: those are validated again.
    """
    import torch

    from portattn._core import _prepare
    from portattn._paths import _auto

    calls = []
    validate = _prepare._validate
    monkeypatch.setattr(
        _prepare, "_validate", lambda *a, **kw: calls.append(1) or validate(*a, **kw)
    )
    _auto.forget_plans()
    q, k, v = small_np
    first = pa.attention(q, k, v, causal=True)
    again = pa.attention(q, k, v, causal=True)
    assert len(calls) == 1
    np.testing.assert_array_equal(first, again)
    pa.attention(q, k, v, causal=True, mask=np.ones((6, 6), dtype=bool))  # an array option
    assert len(calls) == 2
    tq, tk, tv = (torch.from_numpy(x) for x in small_np)
    first = pa.attention(tq, tk, tv)
    again = pa.attention(tq, tk, tv)
    assert len(calls) == 3
    assert torch.equal(first, again)
    pa.attention(torch.nn.Parameter(tq), tk, tv)
    assert len(calls) == 4
    pa.attention(tq.double(), tk.double(), tv.double())
    assert len(calls) == 5


# --- NumPy scalars where Python numbers are accepted ----------------------------------


def test_numpy_scalars_are_numbers(backend: Backend, rng):
    xp = backend.xp
    x = backend.asarray(rng.standard_normal((2, 3)))
    np.testing.assert_array_equal(
        to_numpy(pa.softmax(x, axis=np.int64(0))), to_numpy(pa.softmax(x, axis=0))
    )
    np.testing.assert_array_equal(pa.causal_mask(np.int64(2), np.int32(3)), pa.causal_mask(2, 3))
    np.testing.assert_array_equal(
        pa.window_mask(np.int64(4), 4, window=(np.int64(1), np.uint8(0))),
        pa.window_mask(4, 4, window=(1, 0)),
    )
    np.testing.assert_array_equal(
        to_numpy(pa.sinusoidal_encoding(np.int64(3), np.int64(4), base=np.float32(100.0))),
        to_numpy(pa.sinusoidal_encoding(3, 4, base=100.0)),
    )
    q = backend.asarray(rng.standard_normal((4, 2)))
    rot = pa.apply_rope(q, base=np.float32(500.0))
    np.testing.assert_array_equal(to_numpy(rot), to_numpy(pa.apply_rope(q, base=500.0)))
    np.testing.assert_array_equal(pa.rope_positions(np.int64(3), offset=np.int8(2)), [2, 3, 4])
    a = pa.linear_attention(q, q, q, causal=True, eps=np.float32(0.5), chunk_size=np.int64(2))
    b = pa.linear_attention(q, q, q, causal=True, eps=0.5, chunk_size=2)
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    cache = pa.KVCache(
        np.int64(2),
        np.int64(4),
        batch_shape=(np.int64(1),),
        capacity=np.int64(3),
        xp=xp,
        device=backend.device,
    )
    assert (cache.num_kv_heads, cache.d_head, cache.batch_shape, cache.capacity) == (2, 4, (1,), 3)
    assert all(type(n) is int for n in (cache.num_kv_heads, cache.capacity, *cache.batch_shape))


# --- np.longdouble --------------------------------------------------------------------


@pytest.mark.skipif(
    np.finfo(np.longdouble).bits <= 64, reason="this platform's longdouble is float64"
)
def test_longdouble_is_refused_not_relabelled(rng):
    q = rng.standard_normal((3, 4)).astype(np.longdouble)
    for call in (
        lambda: pa.attention(q, q, q),
        lambda: pa.attention_weights(q, q),
        lambda: pa.softmax(q),
        lambda: pa.linear_attention(q, q, q),
        lambda: pa.apply_rope(q),
    ):
        with pytest.raises(TypeError, match=r"at most 64 bits .* got float128.*cast to float64"):
            call()


# --- options validated before any cache, whatever the path ----------------------------


def test_validation_does_not_depend_on_call_history(rng):
    q = rng.standard_normal((3, 4))
    pa.attention(q, q, q, causal=True)
    pa.attention(q, q, q, window=1)
    with pytest.raises(ValueError, match=r"expected causal"):
        pa.attention(q, q, q, causal=1)
    with pytest.raises(ValueError, match=r"expected window"):
        pa.attention(q, q, q, window=True)


@pytest.mark.parametrize("impl", ["auto", "materialize", "blockwise"])
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"block_size": 0}, r"expected block_size"),
        ({"block_size": -1}, r"expected block_size"),
        ({"block_size": "4"}, r"expected block_size"),
        ({"return_lse": "no"}, r"expected return_lse to be True or False"),
        ({"window": 2**63 + 5.0}, r"expected window"),
    ],
)
def test_options_checked_on_every_path(rng, impl, kwargs, pattern):
    q = rng.standard_normal((3, 4))
    with pytest.raises(ValueError, match=pattern):
        pa.attention(q, q, q, impl=impl, **kwargs)


# --- arrays that are not arrays -------------------------------------------------------


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_none_arrays_are_named(rng, which):
    args = {
        "query": rng.standard_normal((3, 4)),
        "key": rng.standard_normal((3, 4)),
        "value": rng.standard_normal((3, 4)),
    }
    args[which] = None
    with pytest.raises(TypeError, match=rf"expected {which} to be an array, got None"):
        pa.attention(args["query"], args["key"], args["value"])


def test_masked_arrays_are_refused(rng):
    q = rng.standard_normal((3, 4))
    with pytest.raises(
        TypeError, match=r"expected query to be a plain array, got a numpy.ma.MaskedArray"
    ):
        pa.attention(np.ma.masked_array(q, mask=q > 0), q, q)
    with pytest.raises(TypeError, match=r"expected value to be a plain array"):
        pa.attention(q, q, np.ma.masked_array(q))


# --- every argument is named, every entry refuses masked arrays ----------------------

ARRAY_ARGS = ("query", "key", "value", "mask", "bias", "key_lengths", "query_lengths")


@pytest.mark.parametrize("name", ARRAY_ARGS)
@pytest.mark.parametrize("bad", [[[1.0, 0.0, 0.0]], 3.0], ids=["list", "number"])
def test_a_non_array_is_named(backend: Backend, qkv, name, bad):
    q, k, v = qkv
    arrays = {"query": q, "key": k, "value": v}
    options = {}
    if name in arrays:
        arrays[name] = bad
    else:
        options[name] = bad
    want = rf"expected {name} to be an array, got {re.escape(repr(bad))}; .*array API library"
    with pytest.raises(TypeError, match=want):
        pa.attention(*arrays.values(), **options)
    if name != "value":
        del arrays["value"]
        with pytest.raises(TypeError, match=want):
            pa.attention_weights(*arrays.values(), **options)


def _masked_calls():
    x = np.ones((4, 3))
    m = np.ma.masked_array(x, mask=x > 0)
    lse = np.zeros(4)
    return {
        "attention mask": lambda: pa.attention(x, x, x, mask=np.ma.masked_array(x[:, :1] > 0)),
        "attention_weights": lambda: pa.attention_weights(x, m),
        "softmax": lambda: pa.softmax(m),
        "linear_attention": lambda: pa.linear_attention(x, x, m),
        "linear_attention_step": lambda: pa.linear_attention_step(x[0], x[0], m[0]),
        "elu_feature_map": lambda: pa.elu_feature_map(m),
        "apply_rope": lambda: pa.apply_rope(np.ones((4, 2)), np.ma.masked_array(np.arange(4))),
        "merge_attention": lambda: pa.merge_attention([m], [lse]),
        "merge_attention stacked": lambda: pa.merge_attention(m[None], lse[None]),
    }


@pytest.mark.parametrize("entry", list(_masked_calls()))
def test_masked_arrays_are_refused_wherever_arrays_enter(entry):
    """Every array operation would ignore the mask: each entry refuses it, naming the argument."""
    with pytest.raises(TypeError, match=r"expected \w.* to be a plain array, got a numpy\.ma"):
        _masked_calls()[entry]()


# --- the user's vocabulary: torch's names, pointed to portattn's ---------------------


SDPA_CASES = [
    ("attn_mask", np.ones((4, 5), dtype=bool), r"expected mask= \(a boolean array.* or bias="),
    ("is_causal", True, r"expected causal=: SDPA's is_causal=True is causal='top_left'"),
    ("dropout_p", 0.1, r"expected no dropout.*pa\.attention_weights\(q, k, \.\.\.\).*\(1 - p\)"),
    ("enable_gqa", True, r"expected nothing: grouped-query attention is implicit"),
]


@pytest.mark.parametrize(("name", "value", "pattern"), SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
@pytest.mark.parametrize("entry", ["attention", "attention_weights"])
def test_sdpa_keywords_point_to_portattn_equivalents(qkv, entry, name, value, pattern):
    q, k, v = qkv
    call = pa.attention if entry == "attention" else pa.attention_weights
    arrays = (q, k, v) if entry == "attention" else (q, k)
    with pytest.raises(TypeError, match=rf"^{entry}\(\) got torch SDPA's {name}=; {pattern}"):
        call(*arrays, **{name: value})


def test_other_unknown_keywords_keep_pythons_error_and_the_typed_signature(qkv):
    """Only SDPA's four names are caught: a typo gets Python's error; the signature is intact."""
    import inspect

    q, k, v = qkv
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'maks'"):
        pa.attention(q, k, v, maks=None)
    for fn in (pa.attention, pa.attention_weights):
        params = inspect.signature(fn).parameters
        assert params["mask"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["query"].kind is inspect.Parameter.POSITIONAL_ONLY
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    # SDPA's names that portattn shares are not refused
    assert pa.attention(q, k, v, scale=0.5).shape == (2, 4, 6)


def test_torch_block_mask_points_to_create_block_mask():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    x = torch.ones((1, 2, 8, 4), dtype=torch.float64)
    theirs = create_block_mask(causal, None, None, 8, 8, device="cpu")
    with pytest.raises(TypeError, match=r"got torch's BlockMask .*pa\.create_block_mask\(mask_mod"):
        pa.attention(x, x, x, block_mask=theirs)
    # and the pointer holds: the same mask_mod builds portattn's, which does what torch's does
    ours = pa.create_block_mask(causal, None, None, 8, 8, block_size=4, xp=torch)
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 8, 4))) for _ in range(3))
    assert_close(
        pa.attention(q, k, v, block_mask=ours),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        rtol=1e-12,
    )


def test_gqa_head_mismatch_names_the_head_multiples(backend: Backend, rng):
    q, _, _ = make_qkv(rng, 4, d=3, batch=(2, 8), backend=backend)
    _, k, v = make_qkv(rng, 4, 5, d=3, batch=(2, 3), backend=backend)
    with pytest.raises(
        ValueError,
        match=r"the query's 8 heads must be a multiple of the key's 3, "
        r"got query shape \(2, 8, 4, 3\) and key shape \(2, 3, 5, 3\)$",
    ):
        pa.attention(q, k, v)
    with pytest.raises(ValueError, match=r"the query's 8 heads must be a multiple of the key's 3"):
        pa.attention_weights(q, k)
    # one query head still broadcasts over the key's three; two over four is refused alike
    assert pa.attention(q[:, :1, ...], k, v).shape == (2, 3, 4, 3)
    k4, v4 = (backend.xp.concat([a, a[:, :1, ...]], axis=1) for a in (k, v))  # (2, 4, 5, 3)
    with pytest.raises(ValueError, match=r"the query's 2 heads must be a multiple of the key's 4"):
        pa.attention(q[:, :2, ...], k4, v4)


class _WrongCall:
    def __call__(self, score, b, h):
        return score


def _kwonly_mod(score, b, h, q_idx, *, kv_idx):
    return score


SCORE_MODS_REFUSED = {
    "lambda of 4": (lambda score, b, h, q_idx: score, r"<lambda>\(score, b, h, q_idx\)"),
    "keyword-only kv_idx": (_kwonly_mod, r"_kwonly_mod\(score, b, h, q_idx, \*, kv_idx\)"),
    "callable object": (_WrongCall(), r"_WrongCall\(score, b, h\)"),
    "partial binding too many": (
        functools.partial(lambda bias, score, b, h, q_idx, kv_idx: score, 1.0, 2.0),
        r"functools\.partial\(<lambda>, \.\.\.\)\(b, h, q_idx, kv_idx\)",
    ),
}


@pytest.mark.parametrize("case", list(SCORE_MODS_REFUSED))
def test_score_mod_of_the_wrong_arity_is_refused_at_the_call(case):
    mod, shown = SCORE_MODS_REFUSED[case]
    x = np.ones((1, 2, 8, 4))
    five = r"5 positional arguments \(score, b, h, q_idx, kv_idx\)"
    want = rf"^expected score_mod to take {five}, got {shown}$"
    with pytest.raises(TypeError, match=want):
        pa.attention(x, x, x, score_mod=mod)


def test_mask_mod_of_the_wrong_arity_is_refused_where_it_enters():
    three = lambda b, h, q_idx: q_idx >= 0  # noqa: E731
    four = r"4 positional arguments \(b, h, q_idx, kv_idx\)"
    want = rf"^expected mask_mod to take {four}, got <lambda>\(b, h, q_idx\)$"
    with pytest.raises(TypeError, match=want):
        pa.create_block_mask(three, None, None, 8, 8)
    with pytest.raises(TypeError, match=want):
        pa.and_masks(pa.mods.causal, three)
    with pytest.raises(TypeError, match=want):
        pa.or_masks(three)


def test_mods_of_the_right_arity_pass_in_every_spelling():
    """Defaults, *args, partials and callable objects that take the five arguments all run."""

    class Shift:
        def __call__(self, score, b, h, q_idx, kv_idx):
            return score + 1.0

    x = np.ones((1, 2, 8, 4))
    want = pa.attention(x, x, x)
    mods = [
        lambda score, b, h, q_idx, kv_idx, extra=0.0: score + extra,
        lambda score, *rest: score,
        functools.partial(lambda shift, score, b, h, q_idx, kv_idx: score + shift, 0.0),
        Shift(),
        pa.mods.softcap(30.0),
    ]
    for mod in mods:
        assert pa.attention(x, x, x, score_mod=mod).shape == want.shape
    bm = pa.create_block_mask(lambda *idx: idx[2] >= idx[3], None, None, 8, 8, block_size=4)
    assert_close(pa.attention(x, x, x, block_mask=bm), pa.attention(x, x, x, causal=True), rtol=0)


# --- mixed input dtypes: promoted, as the array API says (SDPA raises) ---------------


def test_mixed_dtypes_promote_as_the_array_api_says(backend: Backend, rng):
    xp = backend.xp
    pairs = [(xp.float32, xp.float64), *((h, xp.float32) for h in backend.half_dtypes)]
    for narrow_dtype, wide_dtype in pairs:
        q, k, v = make_qkv(rng, 4, 5, d=3, batch=(2,), backend=backend, dtype=wide_dtype)
        q_narrow = xp.astype(q, narrow_dtype)
        out = pa.attention(q_narrow, k, v, causal="top_left")
        assert out.dtype == xp.result_type(narrow_dtype, wide_dtype) == wide_dtype
        # as if the query had been cast first, bit for bit
        assert_close(
            out,
            pa.attention(xp.astype(q_narrow, wide_dtype), k, v, causal="top_left"),
            rtol=0,
        )


def test_a_repeat_bare_call_fails_as_a_first_call_does(small_np, monkeypatch):
    """The bare-call shortcut keys on every dtype, shape and device: a call that differs from a
    memoised one in any of them goes the whole way, and gets the first call's very error."""
    import torch

    from portattn import _attention
    from portattn._paths import _auto

    taken = []
    real = _attention.plain_native
    monkeypatch.setattr(
        _attention, "plain_native", lambda *a, **kw: taken.append("plain_native") or real(*a, **kw)
    )
    # 4-D, as the shortcut takes them: (B, H, L, d)
    q, k, v = (torch.from_numpy(x).reshape(1, 1, *x.shape[-2:]) for x in small_np)
    bad = {
        "value rows": (q, k, v[..., :5, :]),
        "key features": (q, k[..., :-1], v),
        "key device": (q, k.to("meta"), v),
        "value device": (q, k, v.to("meta")),
        "integer key": (q, k.to(torch.int64), v),
        "value missing": (q, k, None),
    }
    for name, args in bad.items():
        _auto.forget_plans()
        with pytest.raises((TypeError, ValueError)) as fresh:
            pa.attention(*args)
        pa.attention(q, k, v)
        taken.clear()
        pa.attention(q, k, v)
        assert taken == ["plain_native"]  # memoised: a repeat takes the shortcut
        with pytest.raises(type(fresh.value)) as repeat:
            pa.attention(*args)
        assert str(repeat.value) == str(fresh.value), name
