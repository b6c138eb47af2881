"""Graphs from files: the gnn-benchmark ``.npz`` layout and saved PyG ``Data`` (``.pt``).

Both readers check the whole file before building anything and raise :class:`DatasetFormatError`
(a :class:`~fedgat.graph.GraphError`, so a ``ValueError``) naming the file and the problem, or
:class:`DatasetNotFoundError` (a ``FileNotFoundError``) for a missing file. The graph is then prepared
by :meth:`Graph.from_pyg <fedgat.graph.Graph.from_pyg>`, which reports every change in
``graph.report`` and draws the seeded per-class split of :mod:`fedgat.splits` (the files carry none).

``.npz`` (the layout of Shchur et al.'s gnn-benchmark and Bojchevski's graph2gauss files, which PyG's
:func:`torch_geometric.io.read_npz` reads for ``CitationFull``, ``Coauthor`` and ``Amazon``):

* adjacency as a CSR matrix: ``adj_data``, ``adj_indices``, ``adj_indptr``, ``adj_shape`` (``(N, N)``);
  every stored entry ``(i, j)`` is an edge ``i -> j`` (values are ignored, as in PyG);
* features as a CSR matrix (``attr_data``, ``attr_indices``, ``attr_indptr``, ``attr_shape``) or a
  dense ``(N, d)`` array ``features`` or ``attr_matrix``; finite values;
* ``labels``: ``(N,)`` integer class ids ``>= 0`` (integral floats are accepted).

Other arrays (``idx_to_node``, ``class_names``, ...) are not read. The file is opened with
``allow_pickle=False``. PyG's reader also sets every positive feature to 1; this one keeps the values
as stored unless ``binarise=True`` (which :func:`fedgat.data.load_pyg_dataset` passes, so that
``coauthor:cs`` equals PyG's ``Coauthor("cs")``).

``.pt``: an object saved with ``torch.save``: a ``Data`` or a dict of its fields. It is loaded with
``torch.load(weights_only=True)``, allowing only PyG's ``Data`` classes besides tensors and plain
containers, so a file cannot run code while loading. Anything else is refused unless the caller
passes ``trust_pickle=True``, which unpickles without restriction: only for files you made yourself.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Self

import numpy as np
import torch

from fedgat.graph import Graph, GraphError

ADJ_KEYS = ("adj_data", "adj_indices", "adj_indptr", "adj_shape")
ATTR_KEYS = ("attr_data", "attr_indices", "attr_indptr", "attr_shape")
DENSE_FEATURE_KEYS = ("features", "attr_matrix")


class DatasetNotFoundError(FileNotFoundError):
    """The raw files of a dataset are missing and could not be downloaded."""


class DatasetFormatError(GraphError):
    """A dataset file is unreadable or malformed; the message names the file and the problem."""


def read_npz_data(path: str | Path, *, binarise: bool = False):  # -> torch_geometric.data.Data
    """The raw graph of a gnn-benchmark ``.npz`` file, as an unprepared PyG ``Data``.

    Returns ``Data(x, edge_index, y)`` with ``edge_index`` holding every stored adjacency entry in
    row-major order (self-loops, duplicates and one-way edges as in the file) and ``x`` as float32;
    with ``binarise`` every positive feature is set to 1, as PyG's reader does.

    Raises:
        DatasetNotFoundError: no such file.
        DatasetFormatError: not an ``.npz`` archive, or missing, mis-shaped or invalid arrays.
    """
    from torch_geometric.data import Data

    path = _existing(path)
    arrays = _NpzArrays(path)
    with arrays:
        n, edge_index = _adjacency(arrays)
        x = _features(arrays, n)
        y = _labels(arrays, n)
    if binarise:
        x[x > 0] = 1
    return Data(x=torch.from_numpy(x), edge_index=torch.from_numpy(edge_index), y=torch.from_numpy(y))


def load_npz(path: str | Path, *, name: str | None = None, binarise: bool = False, **split) -> Graph:
    """A :class:`Graph` from a gnn-benchmark ``.npz`` file (see the module docstring).

    Args:
        path: the file.
        name: the graph's name; default the file's stem.
        binarise: set positive features to 1 first, as PyG's reader does.
        split: ``split_seed``, ``train_per_class``, ``num_val``, ``num_test`` for
            :meth:`Graph.from_pyg` (the per-class split; defaults 0, 20, 500, 1000).

    Raises:
        DatasetNotFoundError, DatasetFormatError: see :func:`read_npz_data`.
        GraphError: the graph is too small for the split (:class:`fedgat.splits.SplitError`).
    """
    data = read_npz_data(path, binarise=binarise)
    path = Path(path)
    return _named(path, lambda: Graph.from_pyg(data, name=name or path.stem, source=str(path), **split))


def load_pt(path: str | Path, *, name: str | None = None, trust_pickle: bool = False, **split) -> Graph:
    """A :class:`Graph` from a ``torch.save``-d PyG ``Data`` (or dict of its fields).

    Args:
        path: the file.
        name: the graph's name; default ``data.name`` when set, else the file's stem.
        trust_pickle: load with ``weights_only=False``. Unpickling can run arbitrary code: pass it
            only for files you made yourself (a ``Data`` needs no such trust).
        split: the per-class split's arguments, used when the ``Data`` has no masks (see
            :func:`load_npz`).

    Raises:
        DatasetNotFoundError: no such file.
        DatasetFormatError: not a torch file, a file holding objects outside the safe set, or an
            object that is neither a ``Data`` nor a dict.
        GraphError: a malformed field of the ``Data`` (see :meth:`Graph.from_pyg`).
    """
    from torch_geometric.data import Data

    path = _existing(path)
    try:
        if trust_pickle:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        else:
            with torch.serialization.safe_globals(_safe_pyg_globals()):
                obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Unsupported global" not in str(exc):
            raise DatasetFormatError(f"{path} is not a readable torch file ({_first_line(exc)})") from None
        what = str(exc).split("WeightsUnpickler error:")[-1].strip().split(".")[0]
        raise DatasetFormatError(
            f"{path} holds objects that cannot be loaded safely ({what}); save a torch_geometric Data "
            f"or a dict of tensors, or pass trust_pickle=True if you made the file yourself (loading it "
            f"then runs any code it holds)"
        ) from None
    except Exception as exc:  # a corrupt or foreign file fails in many ways (KeyError, RuntimeError, ...)
        raise DatasetFormatError(
            f"{path} is not a readable torch file ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    if not isinstance(obj, (Data, dict)):
        raise DatasetFormatError(
            f"{path} holds a {type(obj).__name__}; save a torch_geometric Data (torch.save(data, path)) "
            f"or a dict of its fields"
        )
    if name is None and not isinstance(obj.get("name"), str):
        name = path.stem
    return _named(path, lambda: Graph.from_pyg(obj, name=name, source=str(path), **split))


# ----------------------------------------------------------------------------------------- helpers
def _named(path: Path, build: Callable[[], Graph]) -> Graph:
    """``build()``, its :class:`~fedgat.graph.GraphError` naming the file (e.g. "edge_index holds node
    150" says nothing of where, on a command line given several files)."""
    try:
        return build()
    except GraphError as exc:
        if not str(exc).startswith(str(path)):
            exc.args = (f"{path}: {exc}", *exc.args[1:])
        raise


def _existing(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise DatasetNotFoundError(f"dataset file {path} not found")
    if not path.is_file():
        raise DatasetFormatError(f"{path} is not a file")
    return path


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _safe_pyg_globals() -> list:
    """The classes a pickled ``Data`` needs beyond torch's safe defaults (PyG registers ``Data``
    itself on import, but not its storage and attribute classes)."""
    import torch_geometric.data.data as pyg_data
    import torch_geometric.data.storage as pyg_storage

    names = [(pyg_data, "Data"), (pyg_data, "DataEdgeAttr"), (pyg_data, "DataTensorAttr")]
    names += [(pyg_storage, "GlobalStorage")]
    return [getattr(module, attr) for module, attr in names if hasattr(module, attr)]


class _NpzArrays:
    """Lazy, checked access to the arrays of an ``.npz`` file opened without pickle support."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            loaded = np.load(path, allow_pickle=False)
        except Exception as exc:  # BadZipFile, ValueError (pickled data), OSError, EOFError
            raise DatasetFormatError(
                f"{path} is not a readable .npz archive ({type(exc).__name__}: {_first_line(exc)})"
            ) from exc
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DatasetFormatError(f"{path} holds a single array, not an .npz archive of named arrays")
        self.file = loaded
        self.keys = set(loaded.files)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def fail(self, problem: str) -> DatasetFormatError:
        return DatasetFormatError(f"{self.path}: {problem}")

    def require(self, keys: tuple[str, ...], what: str) -> None:
        missing = [k for k in keys if k not in self.keys]
        if missing:
            raise self.fail(
                f"{what} needs arrays {', '.join(keys)}; missing {', '.join(missing)} "
                f"(the file holds {', '.join(sorted(self.keys)) or 'no arrays'})"
            )

    def get(self, key: str, *, integer: bool = False, ndim: int = 1) -> np.ndarray:
        try:
            a = self.file[key]
        except Exception as exc:  # object arrays (pickle refused), truncated members
            raise self.fail(f"array {key!r} is unreadable ({_first_line(exc)})") from exc
        if a.ndim != ndim:
            raise self.fail(f"array {key!r} has shape {a.shape}; expected a {ndim}-D array")
        if integer and not np.issubdtype(a.dtype, np.integer):
            raise self.fail(f"array {key!r} has dtype {a.dtype}; expected integers")
        if not integer and not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise self.fail(f"array {key!r} has dtype {a.dtype}; expected numbers")
        return a

    def csr(
        self, prefix: str, shape: tuple[int, int] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
        """``(data, indices, indptr, shape)`` of the CSR matrix ``<prefix>_*``, checked; ``shape``
        constrains the row count (and, when square, the columns)."""
        keys = tuple(f"{prefix}_{part}" for part in ("data", "indices", "indptr", "shape"))
        self.require(keys, "a CSR matrix")
        data, indices = self.get(keys[0]), self.get(keys[1], integer=True)
        indptr, dims = self.get(keys[2], integer=True), self.get(keys[3], integer=True)
        if dims.shape != (2,) or (dims < 1).any():
            raise self.fail(f"{keys[3]} is {dims.tolist()}; expected two positive sizes (rows, columns)")
        rows, cols = int(dims[0]), int(dims[1])
        if shape is not None and rows != shape[0]:
            raise self.fail(f"{keys[3]} is {dims.tolist()} but the graph has {shape[0]} nodes")
        if shape is not None and shape[1] and cols != shape[1]:
            raise self.fail(f"{keys[3]} is {dims.tolist()}; the adjacency matrix must be square")
        if len(indptr) != rows + 1 or indptr[0] != 0 or (np.diff(indptr) < 0).any():
            raise self.fail(
                f"{keys[2]} must be {rows + 1} non-decreasing offsets starting at 0 "
                f"(got {len(indptr)} values)"
            )
        if indptr[-1] != len(indices) or len(data) != len(indices):
            raise self.fail(
                f"{keys[2]} ends at {int(indptr[-1])} but {keys[1]} holds {len(indices)} entries and "
                f"{keys[0]} {len(data)}; the three must agree"
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= cols):
            bad = int(indices.min() if indices.min() < 0 else indices.max())
            raise self.fail(f"{keys[1]} holds column {bad}; columns must lie in [0, {cols})")
        return data, indices.astype(np.int64), indptr.astype(np.int64), (rows, cols)


def _adjacency(arrays: _NpzArrays) -> tuple[int, np.ndarray]:
    if "adj_matrix" in arrays.keys and "adj_data" not in arrays.keys:
        raise arrays.fail("a dense adj_matrix is not supported; store the adjacency as CSR arrays adj_*")
    arrays.require(ADJ_KEYS, "the adjacency matrix")
    shape = arrays.get("adj_shape", integer=True)
    n = int(shape[0]) if shape.shape == (2,) else 0
    _, indices, indptr, _ = arrays.csr("adj", (n, n))
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    return n, np.stack([rows, indices])


def _features(arrays: _NpzArrays, n: int) -> np.ndarray:
    if "attr_data" in arrays.keys or "attr_shape" in arrays.keys:
        data, indices, indptr, (_, d) = arrays.csr("attr", (n, 0))
        if not np.isfinite(data).all():
            bad = np.flatnonzero(~np.isfinite(data))[0]
            node = int(np.searchsorted(indptr, bad, side="right") - 1)
            raise arrays.fail(
                f"features hold NaN or infinite values (e.g. node {node}); pass finite features"
            )
        import scipy.sparse as sp

        return sp.csr_matrix((data.astype(np.float32), indices, indptr), shape=(n, d)).toarray()
    dense = [k for k in DENSE_FEATURE_KEYS if k in arrays.keys]
    if not dense:
        raise arrays.fail(
            f"no node features: expected CSR arrays {', '.join(ATTR_KEYS)} or a dense "
            f"{' or '.join(DENSE_FEATURE_KEYS)} array (the file holds {', '.join(sorted(arrays.keys))})"
        )
    x = arrays.get(dense[0], ndim=2)
    if x.shape[0] != n or x.shape[1] < 1:
        raise arrays.fail(f"{dense[0]} has shape {x.shape}; expected ({n}, num_features) for {n} nodes")
    finite = np.isfinite(x)
    if not finite.all():
        node = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise arrays.fail(f"features hold NaN or infinite values (e.g. node {node}); pass finite features")
    return x.astype(np.float32)


def _labels(arrays: _NpzArrays, n: int) -> np.ndarray:
    if "labels" not in arrays.keys:
        multi = "labels_data" in arrays.keys
        raise arrays.fail(
            "multi-label (CSR) labels are not supported; store one class id per node as 'labels'"
            if multi
            else f"no 'labels' array (the file holds {', '.join(sorted(arrays.keys))})"
        )
    y = arrays.get("labels")
    if y.shape != (n,):
        raise arrays.fail(f"labels have shape {y.shape}; expected ({n},), one class id per node")
    if not np.issubdtype(y.dtype, np.integer) and (
        y.dtype == bool or not np.isfinite(y).all() or (y != np.round(y)).any()
    ):
        raise arrays.fail(f"labels have dtype {y.dtype} with non-integer values; expected class ids")
    if (y < 0).any():
        node = int(np.flatnonzero(y < 0)[0])
        raise arrays.fail(
            f"labels hold {y[node]} (e.g. node {node}); class ids must be >= 0 (unlabelled nodes are "
            f"not supported)"
        )
    return y.astype(np.int64)
