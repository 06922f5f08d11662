"""Floating-point functions that give the same bits on every machine.

A simulation replays thousands of steps, and a last-bit difference in one step time can move an
event before another, send a request to another rank and change every later number. Three parts
of a stock Python stack give different last bits on different x86-64 machines:

- numpy's ``exp``, ``log``, ``power``, ``expm1`` and ``log1p`` take AVX-512 kernels where the CPU
  has AVX-512 and glibc's scalar ``libm`` elsewhere (measured: numpy 2.4.6, AMD EPYC, with and
  without ``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"``);
- glibc's ``libm`` (``math.exp``, ``math.log``, Python's ``**`` on floats, numpy's scalar loops)
  has FMA and non-FMA variants chosen at load time (``GLIBC_TUNABLES=glibc.cpu.hwcaps=-FMA``:
  ~0.07 % of ``exp`` results change);
- BLAS (``@`` and ``np.dot`` on float arrays) runs OpenBLAS kernels chosen per CPU family, which
  add in different orders (``OPENBLAS_CORETYPE=Prescott`` moved 133 requests of a 2,000-request
  run to other decode ranks).

Everything here is built from IEEE-754 additions, multiplications, divisions, ``rint``, ``frexp``
and ``ldexp`` — each correctly rounded or exact on every machine, and never fused (numpy applies
one operation per ufunc call; CPython one per operator) — so its results are the same bits
everywhere. The algorithms are fdlibm's (Sun Microsystems, 1993; the basis of most libms), with
its constants; accuracy is about one unit in the last place, which is all a simulation needs.
Each function takes a float or an ndarray; the scalar and the array paths do the same operations
in the same order, so they agree bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
ArrayIn = npt.NDArray[Any]  # any real dtype; computed in float64

# exp (fdlibm e_exp.c)
_LN2_HI = 6.93147180369123816490e-01  # 32 trailing zero bits: k * _LN2_HI is exact for |k| < 2^20
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
_EXP_CLIP = 1100.0  # beyond ±1100 the result is 0 or inf anyway; keeps 2^k an int

# log (fdlibm e_log.c)
_SQRT_HALF = 0.7071067811865476
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01

# cos (fdlibm k_cos.c, k_sin.c; argument reduction by pi/2 in two parts)
_INV_PIO2 = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e00  # first 33 bits of pi/2: n * _PIO2_1 exact for |n| < 2^20
_PIO2_1T = 6.07710050650619224932e-11
_COS_MAX_ARG = 1.0e5  # the two-part reduction keeps ~1 ulp up to here
_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11
_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10


@overload
def exp(x: float) -> float: ...
@overload
def exp(x: ArrayIn) -> Array: ...
def exp(x: float | ArrayIn) -> float | Array:
    """e**x."""
    if isinstance(x, np.ndarray):
        return _exp_array(x)
    return _exp_scalar(float(x))


def _exp_scalar(x: float) -> float:
    if x != x:
        return x
    x = min(max(x, -_EXP_CLIP), _EXP_CLIP)
    k = round(x * _INV_LN2)  # round half to even, as np.rint
    hi = x - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    try:
        return math.ldexp(y, k)
    except OverflowError:
        return math.inf


def _exp_array(x: ArrayIn) -> Array:
    # Hot path (DSpark's confidences, once per decode step): the same operations as
    # _exp_scalar, in place on three buffers (an allocation per operation costs more than the
    # arithmetic at a step's few hundred values).
    r = np.clip(np.asarray(x, dtype=np.float64), -_EXP_CLIP, _EXP_CLIP)
    kf = np.multiply(r, _INV_LN2)
    np.rint(kf, out=kf)
    lo = np.multiply(kf, _LN2_LO)
    hi = np.multiply(kf, _LN2_HI)
    np.subtract(r, hi, out=hi)  # hi = x - k*ln2_hi
    np.subtract(hi, lo, out=r)  # r = hi - lo
    t = np.multiply(r, r)
    c = np.multiply(t, _P5)
    for p in (_P4, _P3, _P2, _P1):
        c += p
        c *= t
    np.subtract(r, c, out=c)  # c = r - t*(P1 + t*(...))
    np.multiply(r, c, out=r)  # r*c
    np.subtract(2.0, c, out=t)
    np.divide(r, t, out=r)  # (r*c)/(2-c)
    np.subtract(lo, r, out=lo)
    lo -= hi
    np.subtract(1.0, lo, out=lo)  # y
    if np.isnan(kf).any():
        kf[np.isnan(kf)] = 0.0
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(lo, kf.astype(np.int64))


@overload
def log(x: float) -> float: ...
@overload
def log(x: ArrayIn) -> Array: ...
def log(x: float | ArrayIn) -> float | Array:
    """Natural logarithm (``-inf`` at 0, ``nan`` below)."""
    if isinstance(x, np.ndarray):
        return _log_array(x)
    return _log_scalar(float(x))


def _log_scalar(x: float) -> float:
    if x != x or x == math.inf:
        return x
    if x <= 0.0:
        return -math.inf if x == 0.0 else math.nan
    m, e = math.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    if m < _SQRT_HALF:
        m += m
        e -= 1
    f = m - 1.0  # exact: m is within a factor 2 of 1
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    hfsq = 0.5 * f * f
    return e * _LN2_HI - ((hfsq - (s * (hfsq + r) + e * _LN2_LO)) - f)


def _log_array(x: ArrayIn) -> Array:
    x = np.asarray(x, dtype=np.float64)
    special = ~(np.isfinite(x) & (x > 0.0))
    m, e = np.frexp(np.where(special, 1.0, x))
    low = m < _SQRT_HALF
    m = np.where(low, m + m, m)
    ef = e.astype(np.float64) - low
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    hfsq = 0.5 * f * f
    out = ef * _LN2_HI - ((hfsq - (s * (hfsq + r) + ef * _LN2_LO)) - f)
    if special.any():
        xs = x[special]
        out[special] = np.where(xs == 0.0, -np.inf, np.where(xs == np.inf, np.inf, np.nan))
    return out


@overload
def power(x: float, y: float) -> float: ...
@overload
def power(x: ArrayIn, y: float | ArrayIn) -> Array: ...
@overload
def power(x: float, y: ArrayIn) -> Array: ...
def power(x: float | ArrayIn, y: float | ArrayIn) -> float | Array:
    """x**y for x >= 0, as exp(y·log x) (a few ulp: enough for rates and shares)."""
    if not isinstance(x, np.ndarray) and not isinstance(y, np.ndarray):
        xf, yf = float(x), float(y)
        if xf < 0.0:
            raise ValueError(f"power: base {xf} < 0")
        if xf == 0.0:
            return 1.0 if yf == 0.0 else (0.0 if yf > 0.0 else math.inf)
        return _exp_scalar(yf * _log_scalar(xf))
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if (xa < 0.0).any():
        raise ValueError("power: a base is < 0")
    xa, ya = np.broadcast_arrays(xa, ya)
    zero = xa == 0.0
    safe = np.where(zero, 1.0, xa)
    out = _exp_array(ya * _log_array(safe))
    if zero.any():
        out[zero] = np.where(ya[zero] == 0.0, 1.0, np.where(ya[zero] > 0.0, 0.0, np.inf))
    return out


def ipow(x: float, n: int) -> float:
    """x**n for a whole n >= 0 by repeated multiplication (Python's float ``**`` calls libm)."""
    out = 1.0
    for _ in range(n):
        out *= x
    return out


@overload
def cos(x: float) -> float: ...
@overload
def cos(x: ArrayIn) -> Array: ...
def cos(x: float | ArrayIn) -> float | Array:
    """Cosine of |x| <= 1e5 (radians)."""
    xa = np.asarray(x, dtype=np.float64)
    if (np.abs(xa) > _COS_MAX_ARG).any():
        raise ValueError(f"cos: argument beyond ±{_COS_MAX_ARG:g}")
    n = np.rint(xa * _INV_PIO2)
    r = (xa - n * _PIO2_1) - n * _PIO2_1T
    z = r * r
    cos_r = 1.0 - (
        0.5 * z - z * (z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6))))))
    )
    sin_r = r + (z * r) * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    quadrant = np.mod(n, 4.0)
    out = np.where(
        quadrant == 0.0,
        cos_r,
        np.where(quadrant == 1.0, -sin_r, np.where(quadrant == 2.0, -cos_r, sin_r)),
    )
    if isinstance(x, np.ndarray):
        return out
    return float(out)


def matmul(a: ArrayIn, b: ArrayIn) -> Array:
    """a @ b without BLAS: each entry summed in the order of the shared axis, the same on every
    machine. For the small matrices of a step (a few rows by a few columns); O(rows·k·cols)."""
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)


def nonnegative_least_squares(a: list[list[float]], b: list[float]) -> list[float]:
    """x >= 0 minimizing |a·x − b|, for a few columns, without LAPACK: the best unconstrained
    least-squares fit over every subset of the columns whose fit is nonnegative (the optimum's
    support is one of them, so this is exact; 2^columns small fits). Python floats with
    correctly rounded sums (``math.fsum``), so the same bits everywhere."""
    n = len(a[0])
    best_x, best = [0.0] * n, math.fsum(v * v for v in b)
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        fit = _least_squares([[row[j] for row in a] for j in cols], b)
        if fit is None or min(fit) < 0.0:
            continue
        resid = math.fsum(
            (math.fsum(row[j] * v for j, v in zip(cols, fit, strict=True)) - y) ** 2
            for row, y in zip(a, b, strict=True)
        )
        if resid < best:
            best, best_x = resid, [0.0] * n
            for j, v in zip(cols, fit, strict=True):
                best_x[j] = v
    return best_x


def _least_squares(columns: list[list[float]], b: list[float]) -> list[float] | None:
    """Unconstrained least squares by Householder QR (``columns``: the matrix by column);
    None when the columns are dependent."""
    cols = [list(c) for c in columns]
    y = list(b)
    k, m = len(cols), len(y)
    for j in range(k):
        head = cols[j][j:]
        norm = math.sqrt(math.fsum(v * v for v in head))
        if norm == 0.0:
            return None
        v = list(head)
        v[0] += norm if v[0] >= 0.0 else -norm  # reflect onto -sign(v0)·norm·e1
        v_sq = math.fsum(t * t for t in v)
        for target in [*cols[j:], y]:
            f = 2.0 * math.fsum(v[i] * target[j + i] for i in range(m - j)) / v_sq
            for i in range(m - j):
                target[j + i] -= f * v[i]
    x = [0.0] * k
    for j in reversed(range(k)):
        diag = cols[j][j]
        if abs(diag) <= 1e-12 * max(abs(cols[i][i]) for i in range(k)):
            return None
        x[j] = (y[j] - math.fsum(cols[i][j] * x[i] for i in range(j + 1, k))) / diag
    return x
