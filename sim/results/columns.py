"""A run's tables (requests, time series) as named numpy columns.

A run writes ``requests.parquet`` and ``timeseries.parquet`` through Arrow straight from its numpy
columns, a row group at a time, so a run that asks for no DataFrame never imports pandas (~0.3 s
of a short run's start). :meth:`Columns.to_pandas` gives the DataFrame those files read back as,
for the API's ``Result.requests`` and ``Result.timeseries``, the plots and the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


@dataclass(frozen=True)
class Categorical:
    """A column of labels: integer ``codes`` into ``categories`` (a negative code: no label)."""

    codes: np.ndarray
    categories: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.codes)


Column = np.ndarray | Categorical


class Columns:
    """Equal-length named columns, in order; no columns at all is an empty table."""

    def __init__(self, columns: dict[str, Column] | None = None) -> None:
        self.columns: dict[str, Column] = dict(columns or {})
        sizes = {len(c) for c in self.columns.values()}
        if len(sizes) > 1:
            raise ValueError(f"columns of different lengths: {sorted(sizes)}")
        self.rows = sizes.pop() if sizes else 0

    def __len__(self) -> int:
        return self.rows

    @property
    def empty(self) -> bool:
        """No rows (or no columns), as a DataFrame's ``empty``."""
        return not self.columns or not self.rows

    def __getitem__(self, name: str) -> np.ndarray:
        """A numeric column's values, or a categorical one's labels (None where it has none)."""
        col = self.columns[name]
        if isinstance(col, Categorical):
            labels = np.array([*col.categories, None], dtype=object)
            return labels[np.where(col.codes < 0, len(col.categories), col.codes)]
        return col

    def to_pandas(self) -> pd.DataFrame:
        """The table as a DataFrame (the numeric columns are not copied)."""
        import pandas as pd

        if not self.columns:
            return pd.DataFrame()
        return pd.DataFrame(
            {
                name: pd.Categorical.from_codes(col.codes, pd.Index(list(col.categories)))
                if isinstance(col, Categorical)
                else col
                for name, col in self.columns.items()
            },
            copy=False,
        )

    def arrow_parts(self, rows: int) -> Iterator[pa.Table]:
        """The table as Arrow tables of at most ``rows`` rows each (at least one, maybe empty),
        as ``pyarrow.Table.from_pandas`` converts its DataFrame: NaN floats become nulls, a
        categorical a dictionary column."""
        for start in range(0, max(self.rows, 1), rows):
            yield self._arrow(start, start + rows)

    def _arrow(self, start: int, stop: int) -> pa.Table:
        import pyarrow as pa

        arrays = []
        for col in self.columns.values():
            if isinstance(col, Categorical):
                arrays.append(
                    pa.DictionaryArray.from_arrays(
                        _numeric(col.codes[start:stop], nulls=col.codes[start:stop] < 0),
                        _strings(col.categories),
                    )
                )
            else:
                part = col[start:stop]
                arrays.append(
                    _numeric(part, nulls=np.isnan(part) if part.dtype.kind == "f" else None)
                )
        return pa.Table.from_arrays(arrays, names=list(self.columns))


# Arrow arrays are built from their buffers: ``pyarrow.array`` imports pandas to ask whether its
# argument is a pandas object.


def _numeric(values: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """A numeric or boolean numpy array as an Arrow array (null where ``nulls``)."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    kind = pa.from_numpy_dtype(values.dtype)
    data = np.packbits(values, bitorder="little") if values.dtype == np.bool_ else values
    validity, count = None, 0
    if nulls is not None and nulls.any():
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
        count = int(nulls.sum())
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(data)], count)


def _strings(values: tuple[str, ...]) -> pa.Array:
    """Strings as an Arrow string array."""
    import pyarrow as pa

    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    chunks = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), chunks)
