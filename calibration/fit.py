"""Fitting step-cost models to measurements, scored on off-grid shapes.

Every fit minimizes *relative* error (a 10 µs kernel and a 100 ms kernel count alike), keeps
coefficients non-negative, trains on ALL grid points and is scored on a separate set of off-grid
shapes (between and beyond the grid points, see ``sweep.Grid``) that it never saw:
``offgrid_mape`` is the number a calibration is judged by. (A random hold-out inside the grid,
as version 1 profiles used, cannot show a form that misses between or beyond the grid.)

Model forms (per layer; see ``profile.py``):
    prefill  t = a + b·n + c·W(n)·p + d·n² + e·p + [p > 0]·(f + g·n)   linear in its coefficients
             W(n) = n, or n in whole waves of the attention's query tiles; forms (f, g, waves)
             chosen by k-fold cross-validation on the training grid
    decode   t = a + max(w, g(⌈T/τ⌉)) + c·K + d·B + e·v·K + h·K/B + q·T   weights vs GEMM;
             g(k) = b·τ·k, or a measured staircase over k tiles   v·K: query tokens × context
             form and τ ∈ DECODE_TILES chosen by k-fold cross-validation on the training grid
    moe      t = a + ((e·E_act)^k + (f·rows)^k)^(1/k)   active experts' weight reads ⊕ GEMMs
             rows = R                                (exp)
             rows = τ·E_act·⌈R/(E_act·τ)⌉            (tile)      per-expert row tiles
             k = 1: the two add up (t = a + e·E_act + f·rows, the additive form); larger k: they
             overlap, k → ∞ being their max; form, τ and additive (k = 1) vs smooth (k fitted in
             [1, 8]) chosen by k-fold cross-validation on the training grid

τ = 1 means "no tiling": the count is used as is (no rounding up), which is exactly the version 1
form — so a profile without ``tile`` keys predicts what it always did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np
from scipy.optimize import least_squares, lsq_linear

from ..models.profile import (
    DECODE_TILES,
    MOE_TILES,
    DecodeCoef,
    FitError,
    MoeCoef,
    PrefillCoef,
    tiled_verify,
    wave_rows,
)

Predict = Callable[[np.ndarray], np.ndarray]


def ape(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.abs(pred - t) / t


def score(
    predict: Predict,
    X: np.ndarray,
    t: np.ndarray,
    X_off: np.ndarray | None = None,
    t_off: np.ndarray | None = None,
) -> FitError:
    """Training MAPE on (X, t); off-grid MAPE and max APE on (X_off, t_off) only."""
    train = ape(predict(X), t)
    if X_off is None or t_off is None or len(t_off) == 0:
        return FitError(train_mape=float(train.mean()), n_train=int(t.size))
    off = ape(predict(X_off), t_off)
    return FitError(
        train_mape=float(train.mean()),
        offgrid_mape=float(off.mean()),
        offgrid_max_ape=float(off.max()),
        n_train=int(t.size),
        n_offgrid=int(t_off.size),
    )


def tiled(count: np.ndarray | float, tile: int) -> np.ndarray:
    """``count`` rounded up to whole tiles of ``tile`` rows (tile 1: unchanged, not rounded)."""
    c = np.asarray(count, dtype=float)
    return c if tile == 1 else tile * np.ceil(c / tile)


def kfold(n: int, k: int = 5, seed: int = 0) -> list[np.ndarray]:
    """``k`` disjoint index sets covering 0..n-1 (a seeded permutation dealt round robin)."""
    order = np.random.default_rng(seed).permutation(n)
    return [order[i::k] for i in range(min(k, n))]


def group_kfold(keys: np.ndarray, k: int = 5, seed: int = 0) -> list[np.ndarray]:
    """``k`` disjoint index sets, each holding every point of some of the distinct ``keys``
    (so a held-out key is never seen in training)."""
    _, group = np.unique(keys, return_inverse=True)
    return [np.flatnonzero(np.isin(group, g)) for g in kfold(int(group.max()) + 1, k, seed)]


# ---- prefill: t = a + b n + c W(n) p + d n^2 + e p (+ [p > 0] (f + g n)) ------------------------


@dataclass(frozen=True)
class PrefillTerms:
    """Which of the optional prefill terms a form has: ``f`` per chunk with a prefix; ``g`` per
    new token of such a chunk; n of the n·p term in whole waves of ``wave_tile``-row query tiles,
    ``wave_tiles`` at once (0: n as is; ``models.profile.wave_rows``)."""

    f: bool = True
    g: bool = False
    wave_tile: int = 1
    wave_tiles: float = 0.0

    @property
    def extended(self) -> bool:
        """Whether the form has a term the smooth and prefix forms lack."""
        return self.g or self.wave_tiles > 0


def prefill_features(X: np.ndarray, terms: PrefillTerms = PrefillTerms()) -> np.ndarray:
    n, p = X[:, 0], X[:, 1]
    has_prefix = (p > 0).astype(float)
    cols = [np.ones_like(n), n, wave_rows(n, terms.wave_tile, terms.wave_tiles) * p, n * n, p]
    if terms.f:
        cols.append(has_prefix)
    if terms.g:
        cols.append(n * has_prefix)
    return np.stack(cols, axis=1)


def _predict_prefill(x: np.ndarray, terms: PrefillTerms, X: np.ndarray) -> np.ndarray:
    """The times at ``X`` of coefficients ``x`` = (a, b, c, d, e, f, g) of the form ``terms``."""
    return prefill_features(X, replace(terms, f=True, g=True)) @ x


def prefill_model(coef: PrefillCoef, X: np.ndarray) -> np.ndarray:
    x = np.array([coef.a, coef.b, coef.c, coef.d, coef.e, coef.f, coef.g])
    return _predict_prefill(
        x, PrefillTerms(wave_tile=coef.wave_tile, wave_tiles=coef.wave_tiles), X
    )


def _fit_prefill_form(X: np.ndarray, t: np.ndarray, terms: PrefillTerms) -> np.ndarray:
    """Non-negative least squares in relative error; the coefficients (a, b, c, d, e, f, g)."""
    F = prefill_features(X, terms)
    w = 1.0 / t
    scale = np.abs(F).max(axis=0)
    scale[scale == 0] = 1.0
    res = lsq_linear((F / scale) * w[:, None], np.ones_like(w), bounds=(0, np.inf))
    x = list(res.x / scale)
    if not terms.f:
        x.insert(5, 0.0)
    if not terms.g:
        x.append(0.0)
    return np.array(x)


PrefillForm = Literal["smooth", "prefix", "merge", "waves"]
PREFILL_FORMS: tuple[PrefillForm, ...] = ("smooth",)  # what calibrate and refit.py fit
PREFILL_WAVE_TILES = (64, 128)  # query rows per tile a wave form may choose
# a form with a term the smooth and prefix forms lack must lower the cross-validated error by
# this share of it: below that, the extra term fits noise
PREFILL_EXTENSION_GAIN = 0.05


def prefill_terms(
    forms: tuple[PrefillForm, ...], wave_tiles: float = 0.0, n: np.ndarray | None = None
) -> list[PrefillTerms]:
    """The forms ``fit_prefill`` chooses from: ``smooth`` (f = 0) and/or ``prefix``, each also
    with the merge term g (``merge``) and with n in waves of each tile in
    ``PREFILL_WAVE_TILES`` (``waves``, where ``wave_tiles`` — SMs ÷ query heads — is known and
    the grid's new-token counts ``n`` span more than one wave: else W(n)·p is e's p)."""
    base = {"smooth", "prefix"} & set(forms)
    if not base or set(forms) - set(get_args(PrefillForm)):
        raise ValueError(
            f"prefill forms must be smooth and/or prefix, with merge and waves, got {forms}"
        )
    merges = (False, True) if "merge" in forms else (False,)
    waves = [(1, 0.0)]
    if "waves" in forms and wave_tiles > 0:
        waves += [
            (tile, wave_tiles)
            for tile in PREFILL_WAVE_TILES
            if n is None or np.unique(wave_rows(n, tile, wave_tiles)).size > 1
        ]
    return [
        PrefillTerms(f == "prefix", g, tile, tiles)
        for f in ("smooth", "prefix")
        if f in base
        for g in merges
        for tile, tiles in waves
    ]


def fit_prefill(
    X: np.ndarray,
    t: np.ndarray,
    X_off: np.ndarray | None = None,
    t_off: np.ndarray | None = None,
    folds: int = 5,
    forms: tuple[PrefillForm, ...] = PREFILL_FORMS,
    wave_tiles: float = 0.0,
) -> tuple[PrefillCoef, FitError]:
    """X columns: (n new tokens, p computed prefix); t seconds. Non-negative least squares in
    relative error, of each form of :func:`prefill_terms` — ``smooth`` (f = 0) and ``prefix``,
    with ``f`` the fixed cost of a chunk that has a prefix (kernels only such a chunk runs:
    reading back its window and compressed entries, scoring them), each also with ``g`` per
    new token of such a chunk (``merge``: attention split in a call over the chunk and one over
    the prefix merges their outputs) and with the prefix attention's waves (``waves``) — the one
    with the lowest k-fold cross-validated MAPE on the training grid, refitted on all of it. A
    form with g or waves is taken only where it lowers that error by ``PREFILL_EXTENSION_GAIN``
    of the best form without them."""
    parts = kfold(len(t), folds)

    def cross_validated(terms: PrefillTerms) -> float:
        errs = []
        for held in parts:
            train = np.setdiff1d(np.arange(len(t)), held)
            x = _fit_prefill_form(X[train], t[train], terms)
            errs.append(ape(_predict_prefill(x, terms, X[held]), t[held]))
        return float(np.concatenate(errs).mean())

    def best_of(candidates: list[PrefillTerms]) -> tuple[float, PrefillTerms] | None:
        best: tuple[float, PrefillTerms] | None = None
        for terms in candidates:
            cv = cross_validated(terms)
            if best is None or cv < best[0] * (1 - 1e-6):
                best = (cv, terms)
        return best

    candidates = prefill_terms(forms, wave_tiles, X[:, 0])
    base = best_of([c for c in candidates if not c.extended])
    assert base is not None
    chosen = base[1]
    extended = best_of([c for c in candidates if c.extended])
    if extended is not None and extended[0] < base[0] * (1 - PREFILL_EXTENSION_GAIN):
        chosen = extended[1]
    a, b, c, d, e, f, g = (float(v) for v in _fit_prefill_form(X, t, chosen))
    coef = PrefillCoef(
        a=a,
        b=b,
        c=c,
        d=d,
        e=e,
        f=f,
        g=g,
        wave_tile=chosen.wave_tile,
        wave_tiles=chosen.wave_tiles,
    )
    return coef, score(lambda Xq: prefill_model(coef, Xq), X, t, X_off, t_off)


# ---- decode: t = a + max(w, g(ceil(T/τ))) + c K + d B + e v K ---------------------------------


def stair_cost(g: np.ndarray, k: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """GEMM cost at ``k`` row tiles of a staircase known at tile counts ``knots`` (values ``g``):
    linear between knots, proportional to k beyond the last one."""
    inside = np.interp(k, knots, g)
    return np.where(k > knots[-1], g[-1] * k / knots[-1], inside)


def decode_model(
    x: np.ndarray,
    X: np.ndarray,
    tile: int = 1,
    knots: np.ndarray | None = None,
    verify_tile: int = 1,
) -> np.ndarray:
    """x = (a, w, c, d, e, h, q, *gemm); X columns (B sequences, T = B·v query tokens, K context).
    ``gemm`` is (b,) for g = b·τ·⌈T/τ⌉, or, with ``knots``, the staircase's increments from one
    knot to the next (non-negative, so the staircase never descends); ``verify_tile``: the
    context term counts v in whole tiles of that many tokens (``DecodeCoef.verify_tile``)."""
    a, w, c, d, e, h, q = x[:7]
    B, T, K = X[:, 0], X[:, 1], X[:, 2]
    v = np.divide(T, B, out=np.zeros_like(K, dtype=float), where=B > 0)
    vK = tiled_verify(v, verify_tile) * K
    ctx = np.divide(K, B, out=np.zeros_like(K, dtype=float), where=B > 0)
    if knots is None:
        gemm = x[7] * tiled(T, tile)
    else:
        gemm = stair_cost(np.cumsum(x[7:]), np.ceil(T / tile), knots)
    return a + np.maximum(w, gemm) + c * K + d * B + e * vK + h * ctx + q * T


def decode_coef_model(coef: DecodeCoef, X: np.ndarray) -> np.ndarray:
    B, T, K = X[:, 0], X[:, 1], X[:, 2]
    return coef.seconds(B, K, np.divide(T, B, out=np.zeros_like(T, dtype=float), where=B > 0))


def _fit_nonlinear(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    X: np.ndarray,
    t: np.ndarray,
    x0: np.ndarray,
    upper: np.ndarray | None = None,
    starts: tuple[np.ndarray, ...] = (),
) -> tuple[np.ndarray, float]:
    """Non-negative least squares of relative residuals from three starts (``x0`` × 1, 0.3, 3)
    and any further ``starts``; (coef, cost). ``upper``: upper bounds of the coefficients
    (none: unbounded)."""
    scale = np.where(x0 > 0, x0, 1e-9)
    hi = np.full(x0.size, np.inf) if upper is None else upper / scale

    def residual(u: np.ndarray) -> np.ndarray:
        return (model(u * scale, X) - t) / t

    best = None
    units = [np.full(x0.size, jitter) for jitter in (1.0, 0.3, 3.0)]
    for u0 in [*units, *(s / scale for s in starts)]:
        start = np.clip(u0, 0, hi)
        r = least_squares(residual, start, bounds=(0, hi), method="trf")
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return best.x * scale, float(best.cost)


def _decode_x0(X: np.ndarray, t: np.ndarray, tile: int, knots: np.ndarray | None) -> np.ndarray:
    B, T, K = X[:, 0], X[:, 1], X[:, 2]
    vK = T * K / np.maximum(B, 1)
    tmin = float(t.min())

    def per(unit: np.ndarray, share: float) -> float:
        return share * float(np.median(t / np.maximum(unit, 1)))

    b = per(T, 0.5)
    if knots is None:
        gemm = [b]
    else:
        g = b * tile * knots
        gemm = list(np.diff(g, prepend=0.0))
    ctx = K / np.maximum(B, 1)
    linear = [per(K, 0.1), per(B, 0.1), per(vK, 0.05), per(ctx, 0.05), per(T, 0.05)]
    return np.array([tmin / 2, tmin / 2, *linear, *gemm])


DecodeForm = tuple[int, bool]  # (row tile τ, staircase table or b·τ·k)


def _fit_decode_form(
    X: np.ndarray, t: np.ndarray, form: DecodeForm, verify_tile: int = 1
) -> tuple[np.ndarray, np.ndarray | None]:
    tile, table = form
    knots = np.unique(np.ceil(X[:, 1] / tile)) if table else None

    def model(x: np.ndarray, Xq: np.ndarray) -> np.ndarray:
        return decode_model(x, Xq, tile, knots, verify_tile)

    x, _ = _fit_nonlinear(model, X, t, _decode_x0(X, t, tile, knots))
    return x, knots


def decode_forms(tiles: tuple[int, ...] = DECODE_TILES, staircase: bool = True) -> list[DecodeForm]:
    """The candidate forms: each tile with g = b·τ·k, and each tile > 1 with a staircase."""
    return [(k, False) for k in tiles] + [(k, True) for k in tiles if k > 1 and staircase]


def fit_decode(
    X: np.ndarray,
    t: np.ndarray,
    X_off: np.ndarray | None = None,
    t_off: np.ndarray | None = None,
    tiles: tuple[int, ...] = DECODE_TILES,
    folds: int = 5,
    staircase: bool = True,
    verify_tile: int = 1,
) -> tuple[DecodeCoef, FitError]:
    """X columns: (B sequences, T query tokens = B·v, K context tokens); t seconds;
    ``verify_tile``: the attention kernel's verify tokens per query tile (DecodeCoef). The form
    (row tile τ; the GEMM term linear in tiles or a measured staircase) with the lowest
    cross-validated MAPE on the training grid is refitted on all of it (ties: the earlier, simpler
    form). The folds hold out whole row counts T, so each form is scored where it must
    interpolate between the row counts it saw — which is where a too-fine tile goes wrong (random
    folds keep every T in training and favour the finest staircase). A staircase is interpolated
    between the tile counts the grid has."""
    parts = group_kfold(X[:, 1], folds)
    best: tuple[float, DecodeForm] | None = None
    for form in decode_forms(tiles, staircase):
        errs = []
        for held in parts:
            train = np.setdiff1d(np.arange(len(t)), held)
            x, knots = _fit_decode_form(X[train], t[train], form, verify_tile)
            errs.append(ape(decode_model(x, X[held], form[0], knots, verify_tile), t[held]))
        cv = float(np.concatenate(errs).mean())
        if best is None or cv < best[0] * (1 - 1e-6):
            best = (cv, form)
    assert best is not None
    form = best[1]
    tile = form[0]
    x, knots = _fit_decode_form(X, t, form, verify_tile)
    a, w, c, d, e, h, q = (float(v) for v in x[:7])
    vt = verify_tile
    if knots is None:
        out = DecodeCoef(
            a=a, w=w, b=float(x[7]), c=c, d=d, e=e, h=h, q=q, tile=tile, verify_tile=vt
        )
    else:
        g = np.cumsum(x[7:])
        top = int(knots[-1])
        steps = stair_cost(g, np.arange(1, top + 1, dtype=float), knots)
        steps = np.maximum.accumulate(steps)  # float rounding only: g is non-decreasing
        b = float(g[-1] / (tile * top))
        out = DecodeCoef(
            a=a,
            w=w,
            b=b,
            c=c,
            d=d,
            e=e,
            h=h,
            q=q,
            tile=tile,
            steps=tuple(float(s) for s in steps),
            verify_tile=vt,
        )
    return out, score(lambda Xq: decode_coef_model(out, Xq), X, t, X_off, t_off)


# ---- moe: t = a + ((e E_active)^k + (f rows)^k)^(1/k) --------------------------------------------


def active_experts(E: np.ndarray | float, R: np.ndarray | float) -> np.ndarray | float:
    """Expected experts hit at least once when R routed pairs spread over E experts."""
    return E * (1 - np.exp(-np.asarray(R, dtype=float) / E))


def moe_rows(E: np.ndarray, R: np.ndarray, tile: int) -> np.ndarray:
    """GEMM rows of R routed pairs spread evenly over the active experts, each expert's rows
    rounded up to whole tiles (tile 1: R itself)."""
    R = np.asarray(R, dtype=float)
    if tile == 1:
        return R
    act = np.maximum(np.asarray(active_experts(E, R), dtype=float), 1e-12)
    return tile * act * np.ceil(R / (act * tile))


MOE_K_MAX = 8.0  # the smooth form's exponent is fitted in [1, MOE_K_MAX] (8: within 9 % of max())


def smooth_sum(w: np.ndarray, g: np.ndarray, k: float) -> np.ndarray:
    """(w^k + g^k)^(1/k) of non-negative ``w``, ``g``: their sum at k = 1 (exactly w + g),
    tending to their max as k grows; computed as m·((w/m)^k + (g/m)^k)^(1/k), m = max(w, g),
    so that no power under- or overflows. ``ProfileStepCost.moe_s`` is its scalar twin."""
    if k == 1:
        return w + g
    m = np.maximum(w, g)
    safe = np.where(m > 0, m, 1.0)
    return m * ((w / safe) ** k + (g / safe) ** k) ** (1 / k)


def moe_model(x: np.ndarray, X: np.ndarray, tile: int = 1, k: float = 1.0) -> np.ndarray:
    """x = (a, e, f); X columns (E local experts, R routed pairs). The active experts' weight
    reads e·E_act and the grouped GEMMs f·rows combine by ``smooth_sum`` with exponent ``k``:
    k = 1 adds them up, larger k lets them overlap (k → ∞: their max). Measured on the H200 with
    k = 1 against max(): 3.7 % against 12 % MAPE (small per-expert GEMMs mostly add up); a
    fitted k between 1 and 8 catches the middle, neither memory- nor compute-bound, where the
    sum overestimates by ~10 %."""
    a, e, f = x
    E, R = X[:, 0], X[:, 1]
    if k == 1:  # the additive form, summed in the same order as before k existed
        return a + e * active_experts(E, R) + f * moe_rows(E, R, tile)
    w = e * np.asarray(active_experts(E, R), dtype=float)
    return a + smooth_sum(w, f * moe_rows(E, R, tile), k)


def moe_coef_model(coef: MoeCoef, X: np.ndarray) -> np.ndarray:
    return moe_model(np.array([coef.a, coef.e, coef.f]), X, coef.tile, coef.k)


def _moe_x0(X: np.ndarray, t: np.ndarray) -> np.ndarray:
    tmin = float(t.min())
    return np.array(
        [tmin / 4, tmin / float(X[:, 0].min()), float(np.median(t / np.maximum(X[:, 1], 1)))]
    )


MoeForm = tuple[int, bool]  # (row tile τ, 1 for the exp form; smooth: k fitted, else k = 1)


def _fit_moe_form(X: np.ndarray, t: np.ndarray, form: MoeForm) -> tuple[np.ndarray, float]:
    """((a, e, f), k) of ``form`` fitted to (X, t). The smooth form fits k − 1 in
    [0, MOE_K_MAX − 1] alongside a, e, f, from k = 2, 1.3 and 4 (``_fit_nonlinear``'s starts)
    and from the additive fit (k = 1), so it fits the training points at least as well."""
    tile, smooth = form
    x0 = _moe_x0(X, t)
    x, _ = _fit_nonlinear(lambda xx, Xq: moe_model(xx, Xq, tile), X, t, x0)
    if not smooth:
        return x, 1.0

    def model(xx: np.ndarray, Xq: np.ndarray) -> np.ndarray:
        return moe_model(xx[:3], Xq, tile, 1.0 + float(xx[3]))

    upper = np.array([np.inf, np.inf, np.inf, MOE_K_MAX - 1.0])
    xs, _ = _fit_nonlinear(model, X, t, np.append(x0, 1.0), upper, (np.append(x, 0.0),))
    return xs[:3], 1.0 + float(xs[3])


def moe_forms(tiles: tuple[int, ...] = MOE_TILES, smooth: bool = True) -> list[MoeForm]:
    """The candidate forms, simplest first: exp and each tile, additive (k = 1), then each
    of them smooth (k fitted) unless ``smooth`` is False."""
    shapes = [1, *tiles]  # 1: the exp form
    combos = (False, True) if smooth else (False,)
    return [(tile, s) for s in combos for tile in shapes]


def fit_moe(
    X: np.ndarray,
    t: np.ndarray,
    X_off: np.ndarray | None = None,
    t_off: np.ndarray | None = None,
    tiles: tuple[int, ...] = MOE_TILES,
    folds: int = 5,
    smooth: bool = True,
) -> tuple[MoeCoef, FitError]:
    """X columns: (E local experts, R routed token-expert pairs); t seconds. The form (exp, or
    tile with τ in ``tiles``; each additive, k = 1, or — with ``smooth`` — smooth, k fitted in
    [1, MOE_K_MAX]) with the lowest k-fold cross-validated MAPE on the training grid is refitted
    on all of it (ties: the earlier, simpler form)."""
    parts = kfold(len(t), folds)
    best: tuple[float, MoeForm] | None = None
    for form in moe_forms(tiles, smooth):
        errs = []
        for held in parts:
            train = np.setdiff1d(np.arange(len(t)), held)
            x, k = _fit_moe_form(X[train], t[train], form)
            errs.append(ape(moe_model(x, X[held], form[0], k), t[held]))
        cv = float(np.concatenate(errs).mean())
        if best is None or cv < best[0] * (1 - 1e-6):
            best = (cv, form)
    assert best is not None
    tile = best[1][0]
    x, k = _fit_moe_form(X, t, best[1])
    a, e, f = (float(v) for v in x)
    coef = MoeCoef(a=a, e=e, f=f, form="exp" if tile == 1 else "tile", tile=tile, k=k)
    return coef, score(lambda Xq: moe_coef_model(coef, Xq), X, t, X_off, t_off)


def fit_linear_latency(nbytes: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """t = latency + bytes / bandwidth (least squares, relative) -> (latency_s, bytes_per_s)."""
    F = np.stack([np.ones_like(nbytes), nbytes], axis=1) / t[:, None]
    res = lsq_linear(F, np.ones_like(t), bounds=(0, np.inf))
    latency, inv_bw = res.x
    return float(latency), float(1.0 / inv_bw) if inv_bw > 0 else float("inf")
