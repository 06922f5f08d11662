"""Compiled step arithmetic (numba): the decorator, and the pieces of numpy's and fpmath's
arithmetic a compiled step must repeat bit for bit.

A step's arithmetic is compiled where numpy's per-call dispatch (about a microsecond a call)
outweighs the work on a step's few hundred values (DESIGN.md). Each compiled function sits
beside the stage it serves, next to the plain-numpy version it replaces, which stays the
readable reference; tests hold the two to the same bits. Which one runs (``COMPILED``) is
a matter of speed only: a small run takes the references (numba's import costs more than it
saves there), ``DEEPINFER_JIT=0`` or ``1`` forces one side.

Bit for bit means the same IEEE operations in the same order:

- numba compiles without fast-math, so LLVM neither fuses a multiply and an add into an FMA nor
  reorders a sum (the results do not depend on the CPU, as :mod:`deepinfer_sim.fpmath` requires);
- numpy sums a float array pairwise (:func:`pairwise_sum` repeats its order: over the whole
  array in numpy 2, per 8,192-element buffer in numpy 1.x; :func:`sum_block` finds which), and
  ``np.bincount`` with weights adds in index order, as a plain loop does;
- the C library's ``exp`` and ``log`` are not used: :func:`exp` and :func:`log` are
  :mod:`deepinfer_sim.fpmath`'s algorithms, operation for operation.

Compiled functions are cached on disk under ``~/.cache/deepinfer-sim/numba`` (numba's
``cache=True``; :func:`_cache_folder`), so only the first large run after an install or a change
of their source compiles them (~8 s).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np

from . import fpmath
from .cache import cache_folder

__all__ = [
    "COMPILED",
    "MIN_REQUESTS",
    "exp",
    "log",
    "made_by_numba",
    "next_double",
    "next_uint64",
    "njit",
    "pairwise_sum",
    "power",
    "sum_block",
    "use_for_run",
]

F = TypeVar("F", bound=Callable[..., Any])

MIN_REQUESTS = 1_000
"""Runs of fewer requests take the numpy references: importing numba and loading the compiled
functions costs ~0.45 s, more than they save on a few thousand engine steps."""


class _Compiled:
    """Whether stages call their compiled step functions (truthy) or the numpy references.
    Both give the same bits, so the choice is only about speed: ``DEEPINFER_JIT=1`` always
    compiled, ``0`` never (to check one against the other); unset, :func:`use_for_run`
    decides per run by its size."""

    def __init__(self) -> None:
        flag = os.environ.get("DEEPINFER_JIT", "")
        self.forced: bool | None = None if flag == "" else flag != "0"
        self.on = bool(self.forced)  # until a run decides (analyses without one: numpy)

    def __bool__(self) -> bool:
        return self.on

    def __repr__(self) -> str:
        return f"COMPILED({self.on})"


COMPILED = _Compiled()


def use_for_run(requests: int) -> None:
    """Compiled step functions for a run of ``requests`` requests if it is worth their load
    time (at least :data:`MIN_REQUESTS`), unless ``DEEPINFER_JIT`` decides — and only where
    they reproduce this numpy's sums (:func:`sum_block`)."""
    wanted = COMPILED.forced if COMPILED.forced is not None else requests >= MIN_REQUESTS
    COMPILED.on = wanted and _numpy_sum_block() is not None


def njit(fn: F) -> F:
    """``numba.njit`` as every step function here uses it: no fast-math (IEEE order kept),
    numpy's error model (a division by zero gives inf or nan, as numpy's does), cached on disk
    (:func:`_cache_folder`).

    numba (and the scipy it imports) costs ~0.45 s to import and load, so it is imported at
    the first call of any compiled function, not when a module defines one: until then each is a
    :class:`_Deferred` stand-in, and that first call swaps every stand-in, wherever a module
    bound it, for its numba dispatcher (a compiled function calls others by their global name,
    which must be a dispatcher by then)."""
    return _Deferred(fn)  # type: ignore[return-value]


class _Deferred:
    """A compiled function before numba is imported (see :func:`njit`)."""

    registry: ClassVar[list[_Deferred]] = []

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.dispatcher: Callable[..., Any] | None = None
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        _Deferred.registry.append(self)

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher is None:
            _compile_all()
        assert self.dispatcher is not None
        return self.dispatcher(*args)


class _MadeByNumba:
    """A module global that compiled functions read and only numba can make (an intrinsic,
    a table numba ships), before numba is imported (see :func:`made_by_numba`)."""

    registry: ClassVar[list[_MadeByNumba]] = []

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        self.factory = factory
        self.value: Any = None
        _MadeByNumba.registry.append(self)


def made_by_numba(factory: Callable[[Any], Any]) -> Any:
    """A global for compiled functions that ``factory(numba)`` makes when numba is imported
    (:func:`_compile_all` binds it wherever a module bound this stand-in, as it does the
    compiled functions). Plain Python never reads it."""
    return _MadeByNumba(factory)


def _compile_all() -> None:
    """Give every stand-in its dispatcher (and every :func:`made_by_numba` global its value)
    and rebind the stand-ins in every loaded module of this package to them (numba compiles
    each function at its first call, from the disk cache if there)."""
    import sys

    import numba
    from numba.core import config

    numba_config: Any = config  # its settings are set at run time (mypy sees none)

    folder = _cache_folder()
    previous = numba_config.CACHE_DIR
    if folder is not None:  # numba reads it when a dispatcher is made, so only ours go there
        numba_config.CACHE_DIR = folder
    try:
        for d in _Deferred.registry:
            if d.dispatcher is None:
                d.dispatcher = _dispatcher(numba, d.fn, cache=bool(numba_config.CACHE_DIR))
    finally:
        numba_config.CACHE_DIR = previous
    swap: dict[int, Any] = {id(d): d.dispatcher for d in _Deferred.registry}
    for made in _MadeByNumba.registry:
        if made.value is None:
            made.value = made.factory(numba)
        swap[id(made)] = made.value
    for name, module in list(sys.modules.items()):
        if module is None or not (name == __package__ or name.startswith(f"{__package__}.")):
            continue
        space = vars(module)
        for key, value in list(space.items()):
            if isinstance(value, (_Deferred, _MadeByNumba)):
                space[key] = swap[id(value)]


def _dispatcher(numba: Any, fn: Callable[..., Any], cache: bool) -> Callable[..., Any]:
    options = {"error_model": "numpy", "fastmath": False}
    if cache:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # the cache folder cannot be used: compile in each process
            pass
    return numba.njit(**options)(fn)


def _cache_folder() -> str | None:
    """Where the compiled functions are cached: ``NUMBA_CACHE_DIR`` if the user set one (numba
    then uses it as it is: None here), else the package's cache folder ``numba``
    (:func:`~deepinfer_sim.cache.cache_folder`) — never beside the installed modules, where numba
    would put them and ``pip uninstall`` would leave them behind (a later editable install then
    found a stale ``deepinfer_sim`` folder in site-packages). "" (no cache) when that folder
    cannot be made."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    return cache_folder("numba")


_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE


@njit
def _pairwise_block(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise_sum over a[lo:lo + n] for n <= 128 (one block, no split)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit
def _pairwise(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise_sum over a[lo:lo + n] (numpy/_core/src/umath/loops_utils.h.src): blocks
    of at most 128, halves (rounded down to 8) added as numpy's recursion adds them. An explicit
    stack, since numba cannot cache a recursive function."""
    if n <= _PAIRWISE_BLOCK:
        return _pairwise_block(a, lo, n)
    starts = np.empty(192, np.int64)
    sizes = np.empty(192, np.int64)
    combine = np.empty(192, np.bool_)
    values = np.empty(64)
    top = 0
    nv = 0
    starts[0], sizes[0], combine[0] = lo, n, False
    top = 1
    while top:
        top -= 1
        start, size = starts[top], sizes[top]
        if combine[top]:  # both halves are done: left + right
            nv -= 1
            values[nv - 1] = values[nv - 1] + values[nv]
        elif size <= _PAIRWISE_BLOCK:
            values[nv] = _pairwise_block(a, start, size)
            nv += 1
        else:
            half = size // 2
            half -= half % 8
            starts[top], sizes[top], combine[top] = start, size, True
            starts[top + 1], sizes[top + 1], combine[top + 1] = start + half, size - half, False
            starts[top + 2], sizes[top + 2], combine[top + 2] = start, half, False
            top += 3
    return values[0]


@njit
def pairwise_sum(a: np.ndarray, block: int) -> float:
    """``a.sum()`` of a contiguous float64 array, in numpy's order: pairwise (8 lanes) over
    the whole array (``block`` 0: numpy 2), or over each ``block`` elements with the blocks'
    sums added in turn (numpy 1.x, which reduces through its 8,192-element buffer). The
    caller passes :func:`sum_block`."""
    flat = a if a.ndim == 1 else a.ravel()  # ravel makes a new array object: ~30 ns a call
    n = flat.size
    if block <= 0 or n <= block:
        return _pairwise(flat, 0, n)
    res = _pairwise(flat, 0, block)
    start = block
    while start < n:
        size = min(block, n - start)
        res += _pairwise(flat, start, size)
        start += size
    return res


_SUM_BLOCK: list[int | None] = []


def _numpy_sum_block() -> int | None:
    """How the installed numpy sums a long float array, as :func:`pairwise_sum`'s ``block``:
    0 (pairwise over all of it), the buffer size (pairwise per buffer), or None when neither
    reproduces it. Found once, by summing a probe array both ways."""
    if not _SUM_BLOCK:
        buffer = np.getbufsize()
        probe = np.random.default_rng(20261206).standard_normal(3 * buffer + 17)
        probe *= 10.0 ** np.random.default_rng(7).uniform(-6, 6, probe.size)
        want = float(probe.sum())
        found = [b for b in (0, buffer) if pairwise_sum(probe, b) == want]
        _SUM_BLOCK.append(found[0] if len(found) == 1 else None)
    return _SUM_BLOCK[0]


def sum_block() -> int:
    """:func:`pairwise_sum`'s ``block`` for the installed numpy (0 if it sums some other way:
    then no run takes the compiled steps, :func:`use_for_run`)."""
    return _numpy_sum_block() or 0


_LN2_HI = fpmath._LN2_HI
_LN2_LO = fpmath._LN2_LO
_INV_LN2 = fpmath._INV_LN2
_P1, _P2, _P3, _P4, _P5 = fpmath._P1, fpmath._P2, fpmath._P3, fpmath._P4, fpmath._P5
_EXP_CLIP = fpmath._EXP_CLIP
_POW2_SPAN = 1000
_POW2 = np.ldexp(1.0, np.arange(-_POW2_SPAN, _POW2_SPAN + 1))  # exact powers of two: a constant


@njit
def exp(x: float) -> float:
    """:func:`deepinfer_sim.fpmath.exp` of one float, the same operations in the same order."""
    if x != x:
        return x
    x = min(max(x, -_EXP_CLIP), _EXP_CLIP)
    kf = np.rint(x * _INV_LN2)
    hi = x - kf * _LN2_HI
    lo = kf * _LN2_LO
    r = hi - lo
    t = r * r
    c = r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    k = int(kf)
    if -_POW2_SPAN <= k <= _POW2_SPAN:  # y·2^k rounds as ldexp does: both are correctly rounded
        return y * _POW2[k + _POW2_SPAN]
    return math.ldexp(y, k)


log = njit(fpmath._log_scalar)
""":func:`deepinfer_sim.fpmath.log` of one float: its scalar algorithm, compiled as it is (plain
IEEE arithmetic, ``math.frexp``)."""


@njit
def power(x: float, y: float) -> float:
    """:func:`deepinfer_sim.fpmath.power` of one base x >= 0, the same operations in the same
    order (a negative base gives nan here; fpmath refuses it)."""
    if x < 0.0:
        return math.nan
    if x == 0.0:
        return 1.0 if y == 0.0 else (0.0 if y > 0.0 else math.inf)
    return exp(y * log(x))


def _bit_generator_call(name: str, returns: str) -> Callable[[Any], Any]:
    """A factory of the numba intrinsic ``name(function address, state address)``: one call of
    a numpy bit generator's C function (``BitGenerator.ctypes``: ``next_uint64`` or
    ``next_double``) on its state, so a compiled draw advances the generator's own stream —
    the addresses are arguments, not constants, so the cached machine code holds none."""

    def factory(numba: Any) -> Any:
        from llvmlite import ir
        from numba.core import types
        from numba.extending import intrinsic

        result = ir.IntType(64) if returns == "uint64" else ir.DoubleType()
        result_type = types.uint64 if returns == "uint64" else types.float64

        def typer(typingctx: Any, function: Any, state: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                address, state_address = args
                pointer = ir.IntType(8).as_pointer()
                kind = ir.FunctionType(result, [pointer])
                target = builder.inttoptr(address, kind.as_pointer())
                return builder.call(target, [builder.inttoptr(state_address, pointer)])

            return result_type(types.int64, types.int64), codegen

        typer.__name__ = name
        return intrinsic(typer)

    return factory


next_uint64 = made_by_numba(_bit_generator_call("next_uint64", "uint64"))
"""``next_uint64(function, state)`` in compiled code: the bit generator's next 64 random bits
(:func:`deepinfer_sim.rng.bit_source` gives the two addresses)."""
next_double = made_by_numba(_bit_generator_call("next_double", "double"))
"""``next_double(function, state)`` in compiled code: the bit generator's next uniform in [0, 1),
what ``Generator.random()`` returns."""
