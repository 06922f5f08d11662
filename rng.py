"""Seeded random streams, and the draws whose values must be the same bits on every machine.

``stream(seed, "workload")`` always yields the same generator for the same seed and name, and
streams of different names are statistically independent (SeedSequence spawn keys), so adding a
random component never shifts the numbers another component draws.

numpy's uniform, integer, permutation and choice draws are plain integer and IEEE arithmetic, the
same everywhere. Its other distributions call the C library's ``log1p``, ``exp`` or ``pow`` for
some of their *values* — the normal's and the exponential's ziggurat tails (2.6e-4 and 4.5e-4 of
draws), every gamma with shape < 1, beta, Dirichlet and Weibull draw — and glibc's FMA and
non-FMA code paths round those differently (:mod:`deepinfer_sim.fpmath`). The draws below take
the same uniform and ziggurat streams and finish the values with :mod:`~deepinfer_sim.fpmath`:
``normal`` and ``exponential`` keep numpy's draws and redraw only the tail values (a tail value
is, by the memoryless tail, an independent draw from the same tail: the distribution is exact),
the others are built from those. Where the C library only *decides* (accept or reject in a
ziggurat wedge, a Poisson or geometric count) a different rounding changes a draw only when two
numbers agree to the last bit, which is left alone.
"""

from __future__ import annotations

import ctypes
import math
import zlib
from typing import Any

import numpy as np
import numpy.typing as npt

from . import fpmath
from .jit import COMPILED, log, made_by_numba, next_double, next_uint64, njit, power

Array = npt.NDArray[np.float64]

# numpy's ziggurat tails (numpy/random/src/distributions/ziggurat_constants.h): a normal draw
# with |z| >= _NORMAL_TAIL, or an exponential one >= _EXPONENTIAL_TAIL, came from the tail.
_NORMAL_TAIL = 3.6541528853610087963519472518
_EXPONENTIAL_TAIL = 7.69711747013104971368


def stream(seed: int, name: str) -> np.random.Generator:
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))


def normal(rng: np.random.Generator, size: int | tuple[int, ...]) -> Array:
    """Standard normal draws (numpy's, with the ziggurat's tail values drawn portably)."""
    if COMPILED:
        out = np.empty(size)
        normal_fill(bit_source(rng), out.reshape(-1))
        return out
    z = rng.standard_normal(size)
    if not z.size or (z.max() < _NORMAL_TAIL and z.min() > -_NORMAL_TAIL):
        return z
    flat = z.reshape(-1)
    for i in np.flatnonzero(np.abs(flat) >= _NORMAL_TAIL).tolist():
        flat[i] = math.copysign(_normal_tail(rng), flat[i])
    return z


_BIT_SOURCES: dict[int, tuple[Any, npt.NDArray[np.int64]]] = {}


def bit_source(rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """The addresses a compiled draw advances ``rng``'s own stream with: its bit generator's
    ``next_uint64`` and ``next_double`` functions and its state (``BitGenerator.ctypes``),
    as int64 (kept per generator: reading them costs a microsecond). They are valid while
    ``rng`` lives: keep it alive as long as a compiled draw may use them."""
    interface = rng.bit_generator.ctypes  # made once per bit generator, which keeps it
    entry = _BIT_SOURCES.get(id(interface))
    if entry is None or entry[0] is not interface:
        if len(_BIT_SOURCES) >= 4096:  # generators of finished runs
            _BIT_SOURCES.clear()
        functions = (interface.next_uint64, interface.next_double)
        address = [ctypes.cast(f, ctypes.c_void_p).value or 0 for f in functions]
        source = np.array([*address, interface.state_address], dtype=np.int64)
        entry = (interface, source)
        _BIT_SOURCES[id(interface)] = entry
    return entry[1]


def _ziggurat_table(name: str) -> Any:
    """numpy's ziggurat table ``name`` (wi, ki or fi), as numba ships it for its own
    ``Generator`` support; the tests hold the draws to numpy's bit for bit."""

    def load(numba: Any) -> Any:
        from numba.np.random import _constants

        return np.asarray(getattr(_constants, f"{name}_double"))

    return made_by_numba(load)


_WI = _ziggurat_table("wi")
_KI = _ziggurat_table("ki")
_FI = _ziggurat_table("fi")
_NORMAL_TAIL_INV = 0.27366123732975827203338247596  # numpy's ziggurat_nor_inv_r


@njit
def normal_fill(source: npt.NDArray[np.int64], out: Array) -> None:
    """:func:`normal`, compiled, into ``out``: ``Generator.standard_normal``'s ziggurat on the
    generator's own stream (``source``: :func:`bit_source`) — the same values and the same
    words taken from the stream — then the tail values redrawn portably, in order."""
    word, uniform, state = source[0], source[1], source[2]
    for i in range(out.size):
        out[i] = _ziggurat(word, uniform, state)
    for i in range(out.size):
        if out[i] >= _NORMAL_TAIL or out[i] <= -_NORMAL_TAIL:
            out[i] = math.copysign(_normal_tail_compiled(uniform, state), out[i])


@njit
def _ziggurat(word: int, uniform: int, state: int) -> float:
    """One draw of numpy's standard normal ziggurat (``random_standard_normal``), taking the
    same words from the stream: the C library's log1p and exp only decide (a wedge or tail
    acceptance), and a tail value is redrawn by the caller."""
    while True:
        r = next_uint64(word, state)
        idx = r & 0xFF
        r >>= 8
        sign = r & 0x1
        rabs = (r >> 1) & 0x000FFFFFFFFFFFFF
        x = rabs * _WI[idx]
        if sign & 0x1:
            x = -x
        if rabs < _KI[idx]:
            return x
        if idx == 0:
            while True:
                xx = -_NORMAL_TAIL_INV * math.log1p(-next_double(uniform, state))
                yy = -math.log1p(-next_double(uniform, state))
                if yy + yy > xx * xx:
                    return -(_NORMAL_TAIL + xx) if (rabs >> 8) & 0x1 else _NORMAL_TAIL + xx
        if (_FI[idx - 1] - _FI[idx]) * next_double(uniform, state) + _FI[idx] < math.exp(
            -0.5 * x * x
        ):
            return x


@njit
def _standard_normal_compiled(word: int, uniform: int, state: int) -> float:
    """:func:`standard_normal` on the generator's own stream."""
    z = _ziggurat(word, uniform, state)
    if z >= _NORMAL_TAIL or z <= -_NORMAL_TAIL:
        return math.copysign(_normal_tail_compiled(uniform, state), z)
    return z


@njit
def _normal_tail_compiled(uniform: int, state: int) -> float:
    """:func:`_normal_tail` on the generator's own stream."""
    while True:
        x = -log(1.0 - next_double(uniform, state)) / _NORMAL_TAIL
        y = -log(1.0 - next_double(uniform, state))
        if y + y > x * x:
            return _NORMAL_TAIL + x


def standard_normal(rng: np.random.Generator) -> float:
    """One standard normal draw, as :func:`normal`."""
    z = float(rng.standard_normal())
    if abs(z) >= _NORMAL_TAIL:
        return math.copysign(_normal_tail(rng), z)
    return z


def _normal_tail(rng: np.random.Generator) -> float:
    """|Z| given |Z| >= r (Marsaglia's method: x = E1/r accepted when 2·E2 > x²). A step's
    draw holds about one such value, so this is scalar."""
    while True:
        x = -fpmath.log(1.0 - rng.random()) / _NORMAL_TAIL
        y = -fpmath.log(1.0 - rng.random())
        if y + y > x * x:
            return _NORMAL_TAIL + x


def exponential(rng: np.random.Generator, scale: float, size: int) -> Array:
    """Exponential draws of mean ``scale`` (numpy's, with the ziggurat's tail drawn portably)."""
    e = rng.standard_exponential(size)
    if e.size and e.max() >= _EXPONENTIAL_TAIL:
        for i in np.flatnonzero(e >= _EXPONENTIAL_TAIL).tolist():
            e[i] = _EXPONENTIAL_TAIL - fpmath.log(1.0 - rng.random())
    return e * scale


def standard_gamma(rng: np.random.Generator, shape: float, size: int) -> Array:
    """Gamma(shape, 1) draws: Marsaglia and Tsang (2000) for shape >= 1; for shape < 1 a
    Gamma(shape + 1) draw times U^(1/shape) (their boost)."""
    if not shape > 0:
        raise ValueError(f"gamma shape must be > 0, got {shape}")
    a = shape + 1.0 if shape < 1.0 else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = np.empty(size)
    todo = np.arange(size)
    while todo.size:
        x = normal(rng, todo.size)
        v = 1.0 + c * x
        positive = v > 0.0
        v = v * v * v
        u = rng.random(todo.size)
        x2 = x * x
        squeeze = u < 1.0 - 0.0331 * (x2 * x2)
        safe_v = np.where(positive, v, 1.0)
        log_u = fpmath.log(np.where(u > 0.0, u, 1.0))
        full = (u > 0.0) & (log_u < 0.5 * x2 + d * (1.0 - safe_v + fpmath.log(safe_v)))
        ok = positive & (squeeze | full)
        out[todo[ok]] = d * v[ok]
        todo = todo[~ok]
    if shape < 1.0:
        out *= fpmath.power(rng.random(size), 1.0 / shape)
    return out


def gamma(rng: np.random.Generator, shape: float, scale: float, size: int) -> Array:
    """Gamma draws of the given shape and scale."""
    return standard_gamma(rng, shape, size) * scale


def beta(rng: np.random.Generator, a: float, b: float) -> float:
    """One Beta(a, b) draw, as Ga / (Ga + Gb)."""
    if COMPILED:
        return float(beta_compiled(bit_source(rng), a, b))
    ga, gb = _gamma_one(rng, a), _gamma_one(rng, b)
    total = ga + gb
    if total == 0.0:  # both underflowed (tiny shapes): the draw sits at an end, by the ratio a:b
        return 1.0 if rng.random() * (a + b) < a else 0.0
    return ga / total


@njit
def beta_compiled(source: npt.NDArray[np.int64], a: float, b: float) -> float:
    """:func:`beta`, compiled, on the generator's own stream (``source``: :func:`bit_source`)."""
    word, uniform, state = source[0], source[1], source[2]
    ga = _gamma_one_compiled(word, uniform, state, a)
    gb = _gamma_one_compiled(word, uniform, state, b)
    total = ga + gb
    if total == 0.0:
        return 1.0 if next_double(uniform, state) * (a + b) < a else 0.0
    return ga / total


@njit
def _gamma_one_compiled(word: int, uniform: int, state: int, shape: float) -> float:
    """:func:`_gamma_one` on the generator's own stream."""
    a = shape + 1.0 if shape < 1.0 else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = _standard_normal_compiled(word, uniform, state)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = next_double(uniform, state)
        x2 = x * x
        if u < 1.0 - 0.0331 * (x2 * x2) or (u > 0.0 and log(u) < 0.5 * x2 + d * (1.0 - v + log(v))):
            break
    if shape < 1.0:
        return d * v * power(next_double(uniform, state), 1.0 / shape)
    return d * v


def _gamma_one(rng: np.random.Generator, shape: float) -> float:
    """One Gamma(shape, 1) draw, as :func:`standard_gamma` (scalar: a draw per admitted
    request costs microseconds this way, hundreds through the array path)."""
    a = shape + 1.0 if shape < 1.0 else shape
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = standard_normal(rng)
        v = 1.0 + c * x
        if v <= 0.0:
            continue
        v = v * v * v
        u = rng.random()
        x2 = x * x
        if u < 1.0 - 0.0331 * (x2 * x2) or (
            u > 0.0 and fpmath.log(u) < 0.5 * x2 + d * (1.0 - v + fpmath.log(v))
        ):
            break
    if shape < 1.0:
        return d * v * fpmath.power(rng.random(), 1.0 / shape)
    return d * v


def log_dirichlet(rng: np.random.Generator, alpha: Array, rows: int) -> Array:
    """log of ``rows`` Dirichlet(alpha) draws, shape (rows, len(alpha)), computed in log space
    (a tiny alpha gives components far below the smallest float without a row of zeros)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    logs = np.empty((rows, alpha.size))
    shapes = np.unique(alpha)
    for a in shapes.tolist():  # one draw per distinct shape (often one: a symmetric Dirichlet)
        cols = np.flatnonzero(alpha == a)
        n = rows * cols.size
        if a < 1.0:
            g = fpmath.log(standard_gamma(rng, a + 1.0, n))
            g += fpmath.log(1.0 - rng.random(n)) / a
        else:
            g = fpmath.log(standard_gamma(rng, a, n))
        logs[:, cols] = g.reshape(rows, cols.size)
    logs -= logs.max(axis=1, keepdims=True)
    total = fpmath.exp(logs).sum(axis=1, keepdims=True)
    return logs - fpmath.log(total)


def weibull(rng: np.random.Generator, shape: float, size: int) -> Array:
    """Weibull(shape) draws of scale 1, as E^(1/shape) for exponential E (numpy's method)."""
    return fpmath.power(exponential(rng, 1.0, size), 1.0 / shape)
