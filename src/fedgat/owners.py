"""Node owners given by the user: which client (organisation) holds which node.

An owners file gives one client id per node, in node order:

* ``.npy``: a 1-D integer array of length ``N`` (an ``(N, 1)`` column is accepted; float arrays are
  accepted when every value is a whole number). Opened with ``allow_pickle=False``.
* ``.csv``, ``.tsv`` or ``.txt``: one id per line (a single column), optionally under a header line. With more
  than one column a header is required: the ids are taken from the column named ``client``
  (or ``client_id``, ``owner``, ``party``), and a column named ``node`` (or ``node_id``, ``id``) may
  give each row's node, in any order (it must then list every node exactly once; further columns are
  ignored). Several columns and none of them a node column is an error: a node column under another
  name, e.g. ``name``, would otherwise leave the rows in file order, unnoticed. The node column holds
  the graph's node ids where it has them (``node_names``: a graph folder's ``id`` column, kept as
  :attr:`Graph.node_names <fedgat.graph.Graph.node_names>`; matched as text, so ``007`` is not
  ``7``), else node numbers ``0..N-1``. Lines starting with ``#`` and trailing blank lines are
  skipped; a blank line inside the data is an error.

:func:`load_owners` reads and checks a file, :func:`check_owners` an array: the length equals the
number of nodes, the ids are whole numbers in ``0..K-1`` (``K`` given, or ``max + 1``), finite, and
every client owns at least one node. Every failure raises :class:`OwnersError` (a ``ValueError``)
naming the file and the problem, before anything else runs. The checked array goes to
:func:`fedgat.partition.make_partition` as ``owner=`` (with ``num_clients=K``), which then applies the
minimum-cross rule and the neighbour cap exactly as for the default Dirichlet split.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

CLIENT_COLUMNS = ("client", "client_id", "owner", "party")
NODE_COLUMNS = ("node", "node_id", "id")  # a graph folder's id column may keep its name
SUFFIXES = (".csv", ".tsv", ".txt", ".npy")


class OwnersError(ValueError):
    """An owners file or array is unreadable or invalid; the message names the problem."""


def load_owners(
    path: str | Path, num_nodes: int, num_clients: int | None = None, *, node_names: np.ndarray | None = None
) -> np.ndarray:
    """Read and check an owners file (format in the module docstring).

    Args:
        path: a ``.csv``, ``.tsv``, ``.txt`` or ``.npy`` file.
        num_nodes: the graph's node count ``N``.
        num_clients: ``K``; default ``max(id) + 1``.
        node_names: ``(N,)`` the nodes' ids (:attr:`Graph.node_names <fedgat.graph.Graph.node_names>`),
            which a ``node`` column then holds; None: it holds node numbers ``0..N-1``.

    Returns:
        ``(N,)`` int64 client ids in ``0..K-1``, every client owning at least one node.

    Raises:
        OwnersError: a missing or unreadable file, an unsupported suffix, or owners that fail
            :func:`check_owners`.
    """
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise OwnersError(
            f"owners file {path}: unsupported type {suffix or '(no suffix)'!r}; use {', '.join(SUFFIXES)}"
        )
    if not path.is_file():
        raise OwnersError(f"owners file {path} not found" + (" (a directory)" if path.is_dir() else ""))
    if node_names is not None and len(node_names) != num_nodes:
        raise ValueError(f"node_names holds {len(node_names)} names for {num_nodes} nodes")
    owners = _read_npy(path) if suffix == ".npy" else _read_text(path, num_nodes, node_names)
    return check_owners(owners, num_nodes, num_clients, source=f"owners file {path}", node_names=node_names)


def owner_clients(owner: object, num_clients: int | None, num_nodes: int) -> tuple[np.ndarray, int]:
    """A user's ``owner`` array (:func:`check_owners`) and the client count it names (``max + 1``).

    Raises:
        OwnersError: a malformed owner array, or a ``num_clients`` given that differs from its count.
    """
    owners = check_owners(owner, num_nodes, source="owner")
    k = int(owners.max()) + 1
    if num_clients is not None and int(num_clients) != k:
        raise OwnersError(
            f"num_clients is {num_clients} but owner names {k} clients (ids 0..{k - 1}); leave "
            "num_clients out (it follows the owners) or give the owners' count"
        )
    return owners, k


def check_owners(
    owners: object,
    num_nodes: int,
    num_clients: int | None = None,
    *,
    source: str = "owners",
    node_names: np.ndarray | None = None,
) -> np.ndarray:
    """Check an owner array: ``(N,)`` whole numbers in ``0..K-1``, each client owning a node.

    Args:
        owners: anything :func:`numpy.asarray` takes (an ``(N, 1)`` column is flattened).
        num_nodes: ``N``.
        num_clients: ``K``; default ``max + 1``.
        source: how messages name the owners (e.g. the file).
        node_names: ``(N,)`` the nodes' ids, which messages then give beside each node's number.

    Returns:
        the owners as ``(N,)`` int64.

    Raises:
        OwnersError: naming the first problem found.
    """
    a = np.asarray(owners)

    def node(i: int) -> str:
        return f"node {i}" if node_names is None else f"node {i}, {str(node_names[i])!r}"

    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise OwnersError(f"{source}: shape {a.shape}; give a 1-D array, one client id per node")
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise OwnersError(f"{source}: dtype {a.dtype}; give integer client ids")
    if len(a) != num_nodes:
        raise OwnersError(
            f"{source} gives {len(a)} owners but the graph has {num_nodes} nodes; give one client id per "
            f"node, in node order"
        )
    if num_nodes == 0:
        raise OwnersError(f"{source}: the graph has no nodes")
    if np.issubdtype(a.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(a))
        if len(bad):
            raise OwnersError(f"{source} holds {a[bad[0]]} ({node(bad[0])}); client ids must be finite")
        bad = np.flatnonzero(a != np.round(a))
        if len(bad):
            raise OwnersError(
                f"{source} holds {a[bad[0]]} ({node(bad[0])}); client ids must be whole numbers"
            )
    if a.min() < 0:
        i = int(np.flatnonzero(a < 0)[0])
        raise OwnersError(f"{source} holds client id {a[i]:g} ({node(i)}); ids must be >= 0")
    k = int(a.max()) + 1 if num_clients is None else num_clients
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise OwnersError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if a.max() >= k:
        i = int(np.flatnonzero(a >= k)[0])
        raise OwnersError(
            f"{source} holds client id {a[i]:g} ({node(i)}) but there are {k} clients; ids must lie "
            f"in 0..{k - 1}"
        )
    owners64 = a.astype(np.int64)
    empty = np.flatnonzero(np.bincount(owners64, minlength=k) == 0)
    if len(empty):
        shown = ", ".join(map(str, empty[:10])) + (", ..." if len(empty) > 10 else "")
        named = int(a.max()) + 1
        if num_clients is not None and empty.min() >= named:  # the count asked for, not the owners, is off
            raise OwnersError(
                f"{source} names clients 0..{named - 1} but {k} clients were asked for "
                f"(client{'s' if len(empty) > 1 else ''} {shown} would own no nodes); leave the client count "
                "out (--clients, num_clients): it follows the owners"
            )
        hint = (
            "; client ids start at 0: subtract 1 from every id"
            if empty[0] == 0 and a.min() == 1 and len(empty) == 1
            else ""
        )
        raise OwnersError(
            f"{source}: client{'s' if len(empty) > 1 else ''} {shown} own{'' if len(empty) > 1 else 's'} "
            f"no nodes; every client in 0..{k - 1} must own at least one node{hint}"
        )
    return owners64


def _read_npy(path: Path) -> np.ndarray:
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as exc:  # pickled objects, a truncated or foreign file
        raise OwnersError(f"owners file {path} is not a readable .npy array ({exc})") from exc
    if not isinstance(a, np.ndarray):
        raise OwnersError(f"owners file {path} holds several arrays (an .npz?); save one array with np.save")
    return a


def _read_text(path: Path, num_nodes: int, node_names: np.ndarray | None) -> np.ndarray:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise OwnersError(f"owners file {path} is unreadable ({exc})") from exc
    rows = [(i + 1, line) for i, line in enumerate(text.splitlines()) if not line.lstrip().startswith("#")]
    while rows and not rows[-1][1].strip():
        rows.pop()
    if not rows:
        raise OwnersError(f"owners file {path} is empty; give one client id per node")
    for lineno, line in rows:
        if not line.strip():
            raise OwnersError(f"owners file {path}, line {lineno} is empty; give one client id per line")
    cells = [
        (lineno, [c.strip() for c in cols]) for lineno, cols in _split(rows, path.suffix.lower() == ".tsv")
    ]
    width = len(cells[0][1])
    header = [c.lower() for c in cells[0][1]] if any(_number(c) is None for c in cells[0][1]) else None
    body = cells[1:] if header else cells
    for lineno, cols in body:
        if len(cols) != width:
            raise OwnersError(f"owners file {path}, line {lineno} has {len(cols)} columns; expected {width}")

    client_col, node_col = 0, None
    if width > 1:
        if header is None:
            raise OwnersError(
                f"owners file {path} has {width} columns and no header; name the client id column "
                f"{CLIENT_COLUMNS[0]!r} (and optionally a node column {NODE_COLUMNS[0]!r}) in a header line"
            )
        found = [c for c in CLIENT_COLUMNS if c in header]
        if not found:
            raise OwnersError(
                f"owners file {path} has columns {header}; name the client id column one of {list(CLIENT_COLUMNS)}"
            )
        client_col = header.index(found[0])
        nodes = [c for c in NODE_COLUMNS if c in header]
        node_col = header.index(nodes[0]) if nodes else None
        if node_col is None:  # e.g. a "name" column: reading the rows in file order would go unnoticed
            other = next(c for i, c in enumerate(header) if i != client_col)
            raise OwnersError(
                f"owners file {path} has columns {header} and none names the nodes: call the node column "
                f"one of {list(NODE_COLUMNS)} (rename {other!r} if it holds them), or give the client ids "
                "alone, one per line in node order"
            )

    ids = np.array([_id(path, lineno, cols[client_col], "client id") for lineno, cols in body])
    if node_col is None:
        return ids
    lines = np.array([lineno for lineno, _ in body])
    node_cells = [cols[node_col] for _, cols in body]
    if node_names is None:
        try:
            node = np.array([_id(path, lineno, cols[node_col], "node id") for lineno, cols in body])
        except OwnersError as exc:
            raise OwnersError(
                f"{exc}; node numbers 0..{num_nodes - 1} are expected here, as this graph has no node ids "
                "of its own (a graph folder's id column gives them, also through Graph.to_pyg and .pt; "
                "from Python, pass node_names=graph.node_names)"
            ) from None
        outside = np.flatnonzero((node < 0) | (node >= num_nodes))
        if len(outside):
            row = int(outside[0])
            raise OwnersError(
                f"owners file {path}, line {lines[row]}: node {node[row]:g} outside 0..{num_nodes - 1}"
            )
        node = node.astype(np.int64)
    else:
        names = np.asarray(node_names)
        order = np.argsort(names, kind="stable")
        wanted = np.array(node_cells, dtype=str)  # not names.dtype: that would cut longer cells to fit
        at = np.minimum(np.searchsorted(names[order], wanted), num_nodes - 1)
        unknown = np.flatnonzero(names[order][at] != wanted)
        if len(unknown):
            row = int(unknown[0])
            raise OwnersError(
                f"owners file {path}, line {lines[row]}: node {node_cells[row]!r} is no id of the graph's nodes"
            )
        node = order[at]
    by_node = np.argsort(node, kind="stable")
    repeated = np.flatnonzero(node[by_node][1:] == node[by_node][:-1])
    if len(repeated):
        first, second = by_node[repeated[0]], by_node[repeated[0] + 1]
        raise OwnersError(
            f"owners file {path}: node {node_cells[first]} listed twice (lines {lines[first]} and {lines[second]})"
        )
    if len(node) != num_nodes:
        missing = np.setdiff1d(np.arange(num_nodes), node)
        named = node_names[missing[0]] if node_names is not None else missing[0]
        raise OwnersError(
            f"owners file {path} lists {len(node)} of the graph's {num_nodes} nodes (node {named} is missing); "
            "give every node one client id"
        )
    owners = np.empty(num_nodes, dtype=ids.dtype)
    owners[node] = ids
    return owners


def _split(rows: list[tuple[int, str]], tabs: bool = False) -> list[tuple[int, list[str]]]:
    """CSV cells of each line: tab-separated with ``tabs`` (a ``.tsv``), else comma-, semicolon- or
    tab-separated, whichever the first lines show first (a single column has none)."""
    sample = "\n".join(line for _, line in rows[:50])
    delimiter = "\t" if tabs else next((d for d in (",", ";", "\t") if d in sample), ",")
    parsed = csv.reader([line for _, line in rows], delimiter=delimiter)
    return [(lineno, cols) for (lineno, _), cols in zip(rows, parsed, strict=True)]


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _id(path: Path, lineno: int, cell: str, what: str) -> float:
    try:
        return int(cell)
    except ValueError:
        pass
    value = _number(cell)
    if value is None:
        hint = (
            "; clients are numbered 0..K-1 (number your organisations, e.g. in sorted order)"
            if what == "client id"
            else ""
        )
        raise OwnersError(f"owners file {path}, line {lineno} holds {cell!r}, not a {what}{hint}")
    if not math.isfinite(value) or value != round(value):
        raise OwnersError(
            f"owners file {path}, line {lineno} holds {cell!r}; a {what} must be a finite whole number"
        )
    return value
