"""Writing output files: atomically, and a failure is one clear error, not a traceback.

Design notes
------------
- **Atomic.** Every output file is written under a temporary name beside it
  (``.<name>.<pid>.tmp``) and renamed over its final name, so a folder never holds half a file,
  and a reader (a resumed sweep, ``report``) never sees one. A write that fails, or is
  interrupted, removes its temporary file.
- **One error.** A failed write is an :class:`OutputError` (a :class:`UserError`: the CLI shows
  one ``error:`` line and exits 2) naming the file and why. Libraries do not always say which
  file failed (pyarrow's ``OSError`` has no file name), so the writer says it.
- **A full disk says how much is needed.** On ENOSPC (or a quota) the error also says how many
  bytes the outputs not yet written need and how many are free there. The sizes are measured
  only after a failure, by writing those outputs again to a sink that counts bytes and keeps
  none (pyarrow's ``MockOutputStream``, a counting text stream, an in-memory PNG).
- **Small first.** A run's files go out as one ordered list of :class:`Output` (config and
  summary before the time series and the per-request table, plots last), so a full disk costs
  the least valuable ones; the error lists what was written and what was not.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import UserError

FULL = tuple(c for c in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if c is not None)
"""The errors a freed byte cures: the disk (or the user's quota) is full."""


def size_text(n: float) -> str:
    """Bytes as people read them: ``512 B``, ``52.1 kB``, ``1.3 MB``, ``2.0 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the filesystem of ``path`` (or of its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


class OutputError(UserError):
    """An output file could not be written: which one, why, and on a full disk the space the
    outputs not yet written need (``needed``) against the space free there (``free``)."""

    def __init__(
        self,
        path: str | Path,
        reason: str,
        code: int | None = None,
        needed: int | None = None,
        free: int | None = None,
        written: Sequence[str] = (),
        missing: Sequence[str] = (),
    ) -> None:
        self.path, self.reason, self.errno = str(path), reason, code
        self.needed, self.free = needed, free
        self.written, self.missing = tuple(written), tuple(missing)
        text = f"{path}: cannot write ({reason})"
        if needed is not None:
            what = "the outputs not written need" if len(self.missing) > 1 else "it needs"
            text += f"; {what} {size_text(needed)}"
            if free is not None:
                text += f", {size_text(free)} free there"
        if written:
            text += f"; written: {', '.join(self.written)}"
        if len(self.missing) > 1:
            text += f"; not written: {', '.join(self.missing)}"
        super().__init__(text)

    @property
    def disk_full(self) -> bool:
        return self.errno in FULL

    def within(
        self, written: Sequence[str], missing: Sequence[str], needed: int | None
    ) -> OutputError:
        """The same failure, as one of several outputs: what was written before it, what was
        not, and (disk full) what those not written need."""
        return OutputError(
            self.path,
            self.reason,
            self.errno,
            needed if self.disk_full else None,
            self.free if needed is None else free_bytes(self.path),
            written,
            missing,
        )


def output_error(path: str | Path, exc: OSError, size: Callable[[], int] | None) -> OutputError:
    """``exc`` (raised writing ``path``) as an OutputError; on a full disk with the bytes
    ``size()`` says the file needs and the bytes free."""
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    needed = free = None
    if exc.errno in FULL:
        free = free_bytes(path)
        if size is not None:
            needed = size()
    return OutputError(path, reason, exc.errno, needed, free)


def atomic_write(
    path: str | Path, write: Callable[[Path], Any], size: Callable[[], int] | None = None
) -> Path:
    """``write(tmp)`` then rename ``tmp`` to ``path``. Whatever happens the temporary file does
    not stay; an OSError becomes an :class:`OutputError` naming ``path`` (``size``: the bytes
    the file needs, asked for only when the disk is full)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        try:
            write(tmp)
            os.replace(tmp, p)
        finally:  # before the error is built: the free space it states counts this file's
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise output_error(p, exc, size) from None
    return p


def write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda t: t.write_bytes(data), lambda: len(data))


def write_text(path: str | Path, text: str) -> Path:
    """``text`` as UTF-8, atomically; a failure is an :class:`OutputError`."""
    return write_bytes(path, text.encode("utf-8"))


class _CountingText:
    """A text stream that keeps nothing and counts the UTF-8 bytes written to it."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, s: str) -> int:
        self.bytes += len(s.encode("utf-8"))
        return len(s)


def json_bytes(dump: Callable[[Any], None]) -> int:
    """Bytes ``dump(stream)`` writes (``lambda f: json.dump(doc, f)``), without keeping them."""
    sink = _CountingText()
    dump(sink)
    return sink.bytes


def write_json(path: str | Path, dump: Callable[[Any], None]) -> Path:
    """``dump(stream)`` (``lambda f: json.dump(doc, f)``) into ``path``, atomically."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            dump(f)

    return atomic_write(path, write, lambda: json_bytes(dump))


@dataclass(frozen=True)
class Output:
    """One output of several: ``write(path)`` writes it at ``folder / name`` (atomically, an
    OSError as an :class:`OutputError`); ``size()`` is the bytes it needs, measured without
    writing, asked for only when the disk fills."""

    name: str
    write: Callable[[Path], Any]
    size: Callable[[], int]


def text_output(name: str, text: str) -> Output:
    data = text.encode("utf-8")
    return Output(name, lambda p: write_bytes(p, data), lambda: len(data))


def write_outputs(folder: str | Path, outputs: Sequence[Output]) -> list[Path]:
    """Write ``outputs`` into ``folder`` in their order (put the small, valuable ones first).
    The first that fails stops the rest: an :class:`OutputError` naming it, what was written
    before it, what was not, and on a full disk the bytes those not written need."""
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(out, exc, None) from None
    paths: list[Path] = []
    for i, o in enumerate(outputs):
        try:
            o.write(out / o.name)
        except (OutputError, OSError) as exc:  # OSError: a folder a writer makes
            err = exc if isinstance(exc, OutputError) else output_error(out / o.name, exc, None)
            left = outputs[i:]
            needed = sum(x.size() for x in left) if err.disk_full else None
            raise err.within(
                [x.name for x in outputs[:i]], [x.name for x in left], needed
            ) from None
        paths.append(out / o.name)
    return paths


def folder_bytes(folder: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def copy_folder(src: str | Path, dst: str | Path) -> Path:
    """Copy folder ``src`` to ``dst`` (replacing it) through a temporary sibling, so ``dst`` is
    either the old folder or the whole new one; a failure removes the partial copy and is an
    :class:`OutputError` (on a full disk, with the bytes the copy needs)."""
    s, d = Path(src), Path(dst)
    tmp = d.with_name(f".{d.name}.{os.getpid()}.tmp")
    old = d.with_name(f".{d.name}.{os.getpid()}.old")
    moved = False
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(s, tmp)
        if d.exists():
            os.replace(d, old)
            moved = True
        os.replace(tmp, d)
        moved = False
    except OSError as exc:
        if moved:  # the old folder back where it was
            os.replace(old, d)
        raise output_error(d, _one_error(exc), lambda: folder_bytes(s)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return d


def _one_error(exc: OSError) -> OSError:
    """copytree's ``shutil.Error`` lists a (src, dst, why) per failed file, as text, and has no
    errno: the first one, with a full disk's errno when its text names one."""
    if not isinstance(exc, shutil.Error) or not exc.args or not isinstance(exc.args[0], list):
        return exc
    whys = [str(e[-1]) for e in exc.args[0]]
    for code in FULL:
        if any(os.strerror(code) in w for w in whys):
            return OSError(code, os.strerror(code))
    return OSError(None, whys[0] if whys else str(exc))


def close_png(fig: Any, path: Path | None, dpi: int = 110) -> int:
    """Save matplotlib ``fig`` as a PNG to ``path`` atomically and close it; without a path, only
    its size. Returns the PNG's bytes (how a plot's size is known before a disk is written)."""
    import io

    import matplotlib.pyplot as plt

    try:
        if path is None:
            buf = io.BytesIO()
            fig.savefig(buf, dpi=dpi, format="png")
            return buf.tell()
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
        return path.stat().st_size
    finally:
        plt.close(fig)
