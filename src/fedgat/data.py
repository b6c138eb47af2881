"""Dataset loading: the Planetoid citation graphs and the synthetic generator.

Planetoid files are looked up in PyG's raw layout, ``<root>/<Name>/raw/ind.<name>.<part>`` with
``<Name>`` one of ``Cora``, ``CiteSeer``, ``PubMed``. ``root`` defaults to :func:`data_root`
(``$FEDGAT_DATA``, else a per-user cache directory). The files are parsed in memory with PyG's own
Planetoid reader (:func:`torch_geometric.io.read_planetoid_data`, the function
``torch_geometric.datasets.Planetoid`` runs in its ``process`` step), so nothing is ever written
beside them: a read-only data folder works as it is, and no ``processed/`` directory goes stale.
When files are missing they are downloaded from the URL PyG uses into ``<root>/<Name>/raw``; when that
fails, :class:`DatasetNotFoundError` says where it looked.

:func:`load_dataset` takes, besides ``"cora"``, ``"citeseer"``, ``"pubmed"`` and ``"synthetic"``:

* ``"<family>:<name>"`` for a PyG dataset class whose raw files are under ``root``
  (:func:`load_pyg_dataset`): ``citationfull:`` ``cora``, ``cora_ml``, ``citeseer``, ``dblp``,
  ``pubmed`` (PyG's ``CitationFull``, raw file ``<root>/<name>/raw/<name>.npz``); ``coauthor:`` ``cs``,
  ``physics`` (``Coauthor``, ``<root>/CS/raw/ms_academic_cs.npz``, ``<root>/Physics/raw/ms_academic_phy.npz``);
  ``amazon:`` ``computers``, ``photo`` (``Amazon``, ``<root>/Photo/raw/amazon_electronics_photo.npz``,
  ...); and ``planetoid:cora`` etc. for the loaders above. The same layout PyG's classes use, so a
  folder PyG filled works as it is; raw files are read in memory (nothing is written beside them),
  downloaded from PyG's URL when missing and ``download`` is true, and the seeded per-class split of
  :mod:`fedgat.splits` is drawn (these datasets have no public split);
* a path to a gnn-benchmark ``.npz`` or a saved PyG ``Data`` (``.pt``/``.pth``); see
  :mod:`fedgat.graph_files`;
* a path to a folder holding ``nodes.csv`` and ``edges.csv`` (a node table and an edge list; see
  :mod:`fedgat.graph_csv`).

A string is read as a path when it ends in one of those suffixes or contains a path separator, and
as a folder when it names none of the datasets above and an existing folder; relative paths are
taken from the working directory, not ``root``.

Every graph built from these sources carries a :class:`~fedgat.graph_pyg.GraphReport` in
``graph.report`` saying what was changed on the way in (self-loops, duplicates, reverse edges added,
isolated nodes, the split drawn).
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

from torch_geometric.datasets import Amazon, CitationFull, Coauthor, Planetoid
from torch_geometric.io import fs, read_planetoid_data
from torch_geometric.utils import sort_edge_index

from fedgat.graph import Graph
from fedgat.graph_csv import load_csv_folder
from fedgat.graph_files import DatasetFormatError, DatasetNotFoundError, load_npz, load_pt, read_npz_data
from fedgat.splits import NUM_TEST, NUM_VAL, TRAIN_PER_CLASS
from fedgat.synthetic import synthetic_graph

__all__ = [
    "PLANETOID_NAMES",
    "PYG_DATASETS",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "data_root",
    "load_dataset",
    "load_planetoid",
    "load_pyg_dataset",
    "planetoid_raw_files",
]

ENV_VAR = "FEDGAT_DATA"

# lower-case name -> PyG's directory name
PLANETOID_NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}
_RAW_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

#: family -> lower-case name -> (PyG's directory name, raw file name); see the module docstring
PYG_DATASETS: dict[str, dict[str, tuple[str, str]]] = {
    "citationfull": {n: (n, f"{n}.npz") for n in ("cora", "cora_ml", "citeseer", "dblp", "pubmed")},
    "coauthor": {"cs": ("CS", "ms_academic_cs.npz"), "physics": ("Physics", "ms_academic_phy.npz")},
    "amazon": {
        "computers": ("Computers", "amazon_electronics_computers.npz"),
        "photo": ("Photo", "amazon_electronics_photo.npz"),
    },
    "planetoid": {n: (pyg, "ind.*") for n, pyg in PLANETOID_NAMES.items()},
}
_URLS = {
    "citationfull": CitationFull.url.rpartition("/")[0],
    "coauthor": Coauthor.url.rstrip("/"),
    "amazon": Amazon.url.rstrip("/"),
}
_FILE_SUFFIXES = (".npz", ".pt", ".pth")


def data_root() -> Path:
    """Where datasets live: ``$FEDGAT_DATA`` if set, else ``$XDG_CACHE_HOME/fedgat/data``
    (``~/.cache/fedgat/data`` when ``XDG_CACHE_HOME`` is unset). Read at every call."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "fedgat" / "data"


def planetoid_raw_files(name: str) -> list[str]:
    """The eight raw file names of Planetoid dataset ``name`` (e.g. ``ind.cora.x``)."""
    return [f"ind.{_pyg_name(name).lower()}.{part}" for part in _RAW_PARTS]


def load_planetoid(name: str, root: str | Path | None = None, *, download: bool = True) -> Graph:
    """Load Cora, CiteSeer or PubMed (``name`` case-insensitive) with the standard public split.

    Args:
        name: ``"cora"``, ``"citeseer"`` or ``"pubmed"``.
        root: folder holding ``<Name>/raw/``; default :func:`data_root`.
        download: fetch missing raw files from PyG's source URL into ``<root>/<Name>/raw``.

    Returns:
        A :class:`Graph` named ``name.lower()``: ``x`` rows scaled to unit L2 norm (all-zero rows, such
        as CiteSeer's 15 isolated test nodes, stay zero); ``edge_index`` symmetric, sorted, without
        self-loops or duplicates; the public masks (20 training nodes per class, 500 validation,
        1000 test). Results are cached per ``(name, resolved root, download)`` in this process, so
        repeated calls return the same object: treat its tensors as read-only.

    Raises:
        ValueError: unknown ``name``.
        DatasetNotFoundError: raw files missing and not downloadable (offline, or ``download=False``).
    """
    pyg_name = _pyg_name(name)
    root = Path(root).expanduser() if root is not None else data_root()
    return _load_planetoid(pyg_name, root.resolve(), download)


def load_dataset(name: str | os.PathLike, root: str | Path | None = None, **kwargs) -> Graph:
    """Load a dataset by name or path (the forms are listed in the module docstring).

    * ``"cora"``, ``"citeseer"``, ``"pubmed"``: :func:`load_planetoid` (``kwargs``: ``download``);
    * ``"synthetic"``: :func:`fedgat.synthetic.synthetic_graph` (``kwargs`` go there; ``root`` unused);
    * ``"<family>:<name>"``: :func:`load_pyg_dataset` (``kwargs``: ``download`` and the split's
      ``split_seed``, ``train_per_class``, ``num_val``, ``num_test``);
    * a path ending in ``.npz``: :func:`fedgat.graph_files.load_npz`; ``.pt`` or ``.pth``:
      :func:`fedgat.graph_files.load_pt` (``kwargs``: ``name``, the split's arguments and, for
      ``.pt``, ``trust_pickle``; ``root`` unused);
    * a folder: :func:`fedgat.graph_csv.load_csv_folder` (``kwargs``: ``name`` and the split's
      arguments).

    Raises:
        TypeError: ``name`` is neither a string nor a path (e.g. a PyG ``Data``: that one is
            :meth:`Graph.from_pyg`'s).
        ValueError: an unknown name or family, or an unsupported file suffix.
        DatasetNotFoundError: missing raw files (not downloadable) or a missing file.
        DatasetFormatError: a malformed file (a :class:`~fedgat.graph.GraphError`, so a ValueError).
        GraphError: a graph that cannot be prepared (e.g. too small for the split).
    """
    if not isinstance(name, (str, os.PathLike)):
        hint = (
            "it is a Graph already"
            if isinstance(name, Graph)
            else "for a PyG Data (or a dict of its fields) use fedgat.Graph.from_pyg(data)"
        )
        raise TypeError(
            f"load_dataset takes a dataset name or a file path, not a {type(name).__name__}: {hint}"
        )
    if isinstance(name, os.PathLike) or _looks_like_path(name):
        return _load_file(Path(name), **kwargs)
    key = name.lower()
    if key == "synthetic":
        return synthetic_graph(**kwargs)
    if key in PLANETOID_NAMES:
        return load_planetoid(key, root, **kwargs)
    if ":" in key:
        return load_pyg_dataset(key, root=root, **kwargs)
    if Path(name).expanduser().is_dir():
        return load_csv_folder(name, **kwargs)
    raise ValueError(
        f"unknown dataset {name!r}; expected one of {[*PLANETOID_NAMES, 'synthetic']}, a PyG dataset as "
        f"<family>:<name> ({', '.join(f'{f}:' for f in PYG_DATASETS)}), a path to a .npz or .pt file, or "
        "a folder holding nodes.csv and edges.csv"
    )


def load_pyg_dataset(
    spec: str,
    name: str | None = None,
    root: str | Path | None = None,
    *,
    download: bool = True,
    split_seed: int = 0,
    train_per_class: int = TRAIN_PER_CLASS,
    num_val: int = NUM_VAL,
    num_test: int = NUM_TEST,
) -> Graph:
    """Load a PyG ``CitationFull``, ``Coauthor``, ``Amazon`` or ``Planetoid`` graph from its raw file.

    Args:
        spec: ``"<family>:<name>"`` (e.g. ``"coauthor:cs"``), or the family alone with ``name``.
        name: the dataset within the family, when ``spec`` is only the family.
        root: folder holding PyG's layout, ``<root>/<dir>/raw/<file>`` (:data:`PYG_DATASETS`); default
            :func:`data_root`.
        download: fetch a missing raw file from PyG's URL into the raw folder.
        split_seed, train_per_class, num_val, num_test: the seeded per-class split
            (:func:`fedgat.splits.per_class_split`); ignored for ``planetoid:``, which has its public
            split.

    Returns:
        The graph, named ``"<family>-<name>"`` (``"cora"`` etc. for Planetoid), prepared as PyG's class
        prepares it (features binarised as PyG's ``read_npz`` does, then scaled to unit norm; edges
        without self-loops or duplicates, undirected), with ``graph.report``. Cached per arguments in
        this process (the same object is returned again: treat its tensors as read-only).

    Raises:
        ValueError: unknown family or name.
        DatasetNotFoundError: the raw file is missing and could not be downloaded.
        DatasetFormatError: the raw file is malformed.
    """
    family, _, rest = spec.lower().partition(":")
    name = (name or rest).lower()
    if family not in PYG_DATASETS:
        raise ValueError(f"unknown dataset family {family!r}; expected one of {list(PYG_DATASETS)}")
    if name not in PYG_DATASETS[family]:
        raise ValueError(
            f"unknown {family} dataset {name!r}; expected one of "
            f"{[f'{family}:{n}' for n in PYG_DATASETS[family]]}"
        )
    if family == "planetoid":
        return load_planetoid(name, root, download=download)
    root = Path(root).expanduser() if root is not None else data_root()
    split = (split_seed, train_per_class, num_val, num_test)
    return _load_pyg_npz(family, name, root.resolve(), download, split)


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith(_FILE_SUFFIXES) or "/" in name or os.sep in name


def _load_file(path: Path, **kwargs) -> Graph:
    if path.expanduser().is_dir():
        return load_csv_folder(path, **kwargs)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return load_npz(path, **kwargs)
    if suffix in (".pt", ".pth"):
        return load_pt(path, **kwargs)
    if not path.exists():
        raise DatasetNotFoundError(f"dataset file {path} not found")
    hint = " (give the folder holding nodes.csv and edges.csv)" if suffix in (".csv", ".tsv") else ""
    raise DatasetFormatError(
        f"{path}: unsupported file type {suffix or '(no suffix)'!r}{hint}; fedgat reads .npz (gnn-benchmark "
        f"layout), .pt/.pth (a saved torch_geometric Data) and graph folders (nodes.csv, edges.csv)"
    )


@functools.lru_cache(maxsize=8)
def _load_pyg_npz(family: str, name: str, root: Path, download: bool, split: tuple) -> Graph:
    directory, file = PYG_DATASETS[family][name]
    raw_dir = root / directory / "raw"
    if not (raw_dir / file).is_file():
        what = f"{family}:{name} raw file"
        if not download:
            raise DatasetNotFoundError(_not_found_message(raw_dir, [file], "download=False", what))
        _download(raw_dir, [file], _URLS[family], what)
    data = read_npz_data(raw_dir / file, binarise=True)
    seed, per_class, num_val, num_test = split
    return Graph.from_pyg(
        data,
        name=f"{family}-{name}",
        source=f"{family}:{name} ({raw_dir / file})",
        split_seed=seed,
        train_per_class=per_class,
        num_val=num_val,
        num_test=num_test,
    )


def _pyg_name(name: str) -> str:
    try:
        return PLANETOID_NAMES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown Planetoid dataset {name!r}; expected one of {list(PLANETOID_NAMES)}"
        ) from None


@functools.lru_cache(maxsize=8)
def _load_planetoid(pyg_name: str, root: Path, download: bool) -> Graph:
    raw_dir = root / pyg_name / "raw"
    missing = [f for f in planetoid_raw_files(pyg_name) if not (raw_dir / f).is_file()]
    if missing:
        if not download:
            raise DatasetNotFoundError(_not_found_message(raw_dir, missing, "download=False"))
        _download(raw_dir, missing)

    data = read_planetoid_data(str(raw_dir), pyg_name)
    # the same preparation as every other source (self-loops removed, duplicates merged, undirected),
    # on edges sorted by (source, target) first: from_pyg keeps the order of an input that is already
    # clean, and the stored Planetoid graphs have always been sorted so
    data.edge_index = sort_edge_index(data.edge_index, num_nodes=data.num_nodes)
    return Graph.from_pyg(data, name=pyg_name.lower(), source=f"Planetoid {pyg_name} ({raw_dir})")


def _download(
    raw_dir: Path, files: list[str], url: str = Planetoid.url, what: str = "Planetoid raw files"
) -> None:
    """Fetch ``files`` from ``url`` into ``raw_dir``. On failure nothing is left behind: the partial
    file, and the folders this call created (only those, and only when empty), are removed; the error
    names every missing file and the failure's kind, not the network library's whole exception."""
    created = [d for d in (raw_dir, *raw_dir.parents) if not d.exists()]  # deepest first
    for f in files:
        try:
            raw_dir.mkdir(parents=True, exist_ok=True)
            fs.cp(f"{url}/{f}", str(raw_dir))
        except Exception as exc:  # noqa: BLE001 - network, SSL, permission, fsspec: all "not available"
            (raw_dir / f).unlink(missing_ok=True)
            for d in created:
                with contextlib.suppress(OSError):  # not empty, or not ours to remove: keep it
                    d.rmdir()
            missing = [g for g in files if not (raw_dir / g).is_file()]
            reason = f"downloading them from {url} failed ({type(exc).__name__}: offline?)"
            # without the network library's chained traceback: an offline user reads one error
            raise DatasetNotFoundError(_not_found_message(raw_dir, missing, reason, what)) from None


def _not_found_message(
    raw_dir: Path, missing: list[str], reason: str, what: str = "Planetoid raw files"
) -> str:
    env = os.environ.get(ENV_VAR)
    setting = f"{ENV_VAR}={env!r}" if env else f"{ENV_VAR} is not set"
    named = ", ".join(missing) if len(missing) == 1 else f"({len(missing)}: {', '.join(missing)})"
    # Planetoid's files share one prefix: ind.cora.x, ind.cora.tx, ... -> ind.cora.*
    wanted = ".".join(missing[0].split(".")[:2]) + ".*" if what.startswith("Planetoid") else missing[0]
    return (
        f"{what} {named} not found in {raw_dir} ({setting}; {reason}). "
        f"Point {ENV_VAR} (in Python: root=) at the folder that holds "
        f"{raw_dir.parent.name}/raw/{wanted}, or run once online."
    )
