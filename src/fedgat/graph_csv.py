"""Graphs from two text tables in a folder: a node table and an edge list (CSV or TSV).

The layout most graphs start in, readable without Python::

    my_graph/
      nodes.csv      id,label,split,f0,f1,...     one row per node
      edges.csv      source,target                one row per edge

``nodes.csv`` (or ``nodes.tsv``, tab-separated) starts with a header line naming its columns:

* ``id`` (or ``node``, ``node_id``): each node's name, any text without the delimiter (a paper id,
  an account number, ``0..N-1``); unique. The rows' order is the nodes' order: row ``k`` is node
  ``k`` for everything that counts nodes by position (the graph's tensors, an ``--owners`` file of
  one column); the ids are kept as :attr:`Graph.node_names <fedgat.graph.Graph.node_names>`, and an
  owners file with a ``node`` column names nodes by these ids (:func:`fedgat.owners.load_owners`).
* ``label`` (or ``class``, ``y``): the node's class. Whole numbers ``>= 0`` are used as they are
  (so ``0..K-1`` keep their meaning; ``2.0`` is ``2``); a negative or fractional number is an
  error; any other text is a class name, and the names are numbered ``0..K-1`` in sorted order (the
  mapping is in ``graph.report.notes``, as is a column that mixes numbers and names: all are then
  names). Every node needs one: give an unlabelled node any class and leave its ``split`` cell
  empty.
* ``split`` (optional): ``train``, ``val`` (or ``valid``, ``validation``), ``test``, or empty (or
  ``-``, ``none``: the node is in no split). Without the column a seeded per-class split is drawn
  (:func:`fedgat.splits.per_class_split`), as for every graph without masks.
* every other column is a feature: numbers (finite; rows are scaled to unit norm, as for every
  graph). At least one.

``edges.csv`` (or ``edges.tsv``): one edge per row, ``source`` and ``target`` as two columns holding
ids of ``nodes.csv`` (further columns, e.g. weights, are ignored); a first line neither of whose two
cells is a node id is read as a header (quietly when it names the columns, e.g. ``source,target`` or
``src,dst``: :data:`EDGE_HEADER_WORDS`; otherwise the report says so). The edges are made undirected, and self-loops and duplicates dropped, as for
every graph (:meth:`Graph.from_pyg <fedgat.graph.Graph.from_pyg>`, reported in ``graph.report``).
An empty edge list is a graph of isolated nodes.

In both files, cells may be quoted (``"a, b"``), spaces around a cell are ignored, blank lines are
skipped, and a ``#`` starts a comment to the end of its line (so ``#`` cannot appear in an id: one right
after the text of an id, label or split cell of ``nodes.csv``, as in ``acct#12``, is refused rather than
cut).
Files are UTF-8 (a leading byte-order mark, as spreadsheets write, is skipped); a ``.csv`` whose first
line is one cell holding semicolons or tabs (a spreadsheet's export where the decimal mark is a comma)
is refused saying so. Every row of
``nodes.csv`` has as many cells as its header names. Every problem raises
:class:`~fedgat.graph_files.DatasetFormatError` naming the file, the line and the column; a missing
table :class:`~fedgat.graph_files.DatasetNotFoundError`.
The tables are read by numpy's C parser (:func:`numpy.loadtxt`) and ids matched by sorting: a
graph the size of ogbn-arxiv (169k nodes, 1.17M edges, 128 features; 214 MB of CSV) reads in 7.6 s
with a peak of 0.94 GB on the 2-core development VM (4-5 s on its later CPU). Every row's width is
checked by counting separators per line in numpy (0.5 s for that ``nodes.csv``); a file with quotes,
comments or a row of another width goes through Python's ``csv`` reader (1.5 s there), which reports
the line.
"""

from __future__ import annotations

import csv
import itertools
import re
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedgat.graph import Graph
from fedgat.graph_files import DatasetFormatError, DatasetNotFoundError

__all__ = ["ID_COLUMNS", "LABEL_COLUMNS", "SPLIT_VALUES", "load_csv_folder", "table_files"]

#: accepted names (any case) of the node table's columns
ID_COLUMNS = ("id", "node", "node_id")
LABEL_COLUMNS = ("label", "class", "y")
SPLIT_COLUMNS = ("split",)
#: a ``split`` cell, lower-cased, and the mask it selects (None: no split)
SPLIT_VALUES: dict[str, str | None] = {
    "train": "train_mask",
    "val": "val_mask",
    "valid": "val_mask",
    "validation": "val_mask",
    "test": "test_mask",
    "": None,
    "-": None,
    "none": None,
}
#: an edge list's first line of two of these (any case) is its header, read without a note
EDGE_HEADER_WORDS = frozenset(
    {"source", "target", "src", "dst", "from", "to", "u", "v", "head", "tail", "citing", "cited"}
    | {"source_id", "target_id", "src_id", "dst_id", "node1", "node2", "node_1", "node_2"}
)
_DELIMITERS = {".csv": ",", ".tsv": "\t"}
_TABLES = ("nodes", "edges")
_CLASS_NAMES_SHOWN = 8


@dataclass(frozen=True)
class _Table:
    """One text table: its path, delimiter and the line (1-based) its data starts after."""

    path: Path
    delimiter: str
    skip: int  # physical lines before the data (comments, blank lines, a header)
    header: tuple[str, ...] = ()

    def load(self, columns: Sequence[int], dtype: type | np.dtype) -> np.ndarray:
        """``(rows, len(columns))`` cells of ``columns``, as ``dtype``; numpy's errors re-raised
        naming the file's line and column."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            warnings.filterwarnings("ignore", message="Input line .* contained no data")  # a blank line
            try:
                cells = np.loadtxt(
                    self.path,
                    dtype=dtype,
                    delimiter=self.delimiter,
                    comments="#",
                    skiprows=self.skip,
                    usecols=list(columns),
                    ndmin=2,
                    quotechar='"',
                    encoding="utf-8-sig",
                )
            except UnicodeDecodeError as exc:
                raise DatasetFormatError(f"{self.path} is not UTF-8 text ({exc.reason})") from None
            except ValueError as exc:
                raise DatasetFormatError(f"{self.path}: {self._located(str(exc))}") from None
        if cells.dtype.kind == "U":
            cells = np.char.strip(cells)
        return cells

    def _located(self, message: str) -> str:
        """numpy's message with its data row as a file line (numpy counts data rows only, from 0 in
        conversion errors and from 1 in column-count errors)."""
        message = message.rstrip(".")
        found = re.search(r" at row (\d+)(?:, column (\d+)| with (\d+) columns)", message)
        if found is None:
            return message
        if found.group(2) is not None:
            column = int(found.group(2))
            name = f" ({self.header[column - 1]})" if column <= len(self.header) else ""
            line = self.line_of(int(found.group(1)))
            return f"line {line}, column {column}{name}: {message[: found.start()]}"
        line = self.line_of(int(found.group(1)) - 1)
        return f"line {line} has {found.group(3)} column(s), fewer than the columns read"

    def line_of(self, row: int) -> int:
        """The file line (1-based) of data row ``row`` (0-based), counting only the rows numpy reads:
        for error messages (one pass over the file, only when there is an error to report)."""
        seen, number = -1, self.skip
        with self.path.open(encoding="utf-8-sig") as lines:
            for number, text in enumerate(lines, start=1):
                if number > self.skip and text.split("#", 1)[0].strip():
                    seen += 1
                    if seen == row:
                        return number
        return number + 1  # not reached for a row numpy read


def table_files(folder: str | Path) -> tuple[Path, Path]:
    """The node table and the edge list of a graph folder (``nodes.csv``/``.tsv``, ``edges.csv``/``.tsv``).

    Raises:
        DatasetNotFoundError: no such folder, or a table missing.
        DatasetFormatError: ``folder`` is a file, or a table given both as ``.csv`` and ``.tsv``.
    """
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise DatasetNotFoundError(f"graph folder {folder} not found")
    if not folder.is_dir():
        raise DatasetFormatError(f"{folder} is not a folder")
    found = []
    for table in _TABLES:
        paths = [
            folder / f"{table}{suffix}" for suffix in _DELIMITERS if (folder / f"{table}{suffix}").is_file()
        ]
        if not paths:
            raise DatasetNotFoundError(
                f"graph folder {folder} has no {table}.csv (or {table}.tsv); a graph folder holds "
                "nodes.csv (id,label[,split],features...) and edges.csv (source,target)"
            )
        if len(paths) > 1:
            raise DatasetFormatError(
                f"graph folder {folder} has both {paths[0].name} and {paths[1].name}; keep one"
            )
        found.append(paths[0])
    return found[0], found[1]


def load_csv_folder(folder: str | Path, *, name: str | None = None, **split) -> Graph:
    """A :class:`Graph` from a folder holding ``nodes.csv`` and ``edges.csv`` (the module docstring).

    Args:
        folder: the folder.
        name: the graph's name; default the folder's name.
        split: ``split_seed``, ``train_per_class``, ``num_val``, ``num_test`` for the per-class split
            drawn when ``nodes.csv`` has no ``split`` column (defaults 0, 20, 500, 1000).

    Raises:
        DatasetNotFoundError: see :func:`table_files`.
        DatasetFormatError: a malformed table (the message names the file, line and column).
        GraphError: a graph that cannot be prepared (e.g. too small for the split).
    """
    from fedgat.graph_pyg import from_pyg

    nodes_path, edges_path = table_files(folder)
    folder = nodes_path.parent
    fields, notes = _read_nodes(nodes_path)
    ids = fields.pop("ids").copy()  # its own array, not a view holding the label and split columns
    fields["edge_index"], note = _read_edges(edges_path, ids, nodes_path.name)
    if note:
        notes.append(note)
    return from_pyg(
        fields, name=name or folder.name, source=str(folder), reader_notes=notes, node_names=ids, **split
    )


# ------------------------------------------------------------------------------------- node table


def _read_nodes(path: Path) -> tuple[dict, list[str]]:
    """``x``, ``y``, the masks when a ``split`` column is given, ``ids``; and notes for the report."""
    table, header = _headed(path)
    roles = _roles(path, header)
    id_col, label_col, split_col = roles["id"], roles["label"], roles.get("split")
    text_cols = [id_col, label_col] + ([split_col] if split_col is not None else [])
    features = [i for i in range(len(header)) if i not in text_cols]
    if not features:
        raise DatasetFormatError(
            f"{path}: no feature columns; besides {', '.join(header[i] for i in text_cols)} every column "
            "is a feature (a number per node)"
        )
    _check_widths(table, len(header), text_cols)
    text = table.load(text_cols, str)
    if text.shape[0] == 0:
        raise DatasetFormatError(f"{path} lists no nodes (only its header)")
    ids, labels = text[:, 0], text[:, 1]
    _check_unique(table, ids)
    try:
        x = table.load(features, np.float64)
    except DatasetFormatError as exc:
        raise DatasetFormatError(f"{exc}{_feature_hint(str(exc), [header[i] for i in text_cols])}") from None
    finite = np.isfinite(x)
    if not finite.all():
        row, col = (int(v[0]) for v in np.nonzero(~finite))
        raise DatasetFormatError(
            f"{path}: line {table.line_of(row)}, column {features[col] + 1} ({header[features[col]]}): "
            f"{x[row, col]} is not a finite number; features must be finite"
        )
    fields: dict = {"x": x, "ids": ids}
    notes = []
    fields["y"], note = _labels(table, labels, header[label_col])
    if note:
        notes.append(note)
    if split_col is not None:
        fields.update(_masks(table, text[:, 2], header[split_col]))
    return fields, notes


def _feature_hint(message: str, text_columns: list[str]) -> str:
    """What to do about a feature cell numpy could not read (its message, located)."""
    if "column" in message and " (): " in message:
        return "; the header gives this column no name: a separator at the end of the header line?"
    missing = re.search(r"could not convert string '(|na|n/a|null|none|\?|-)' ", message, re.IGNORECASE)
    if missing is not None:
        what = "empty" if not missing.group(1) else "a missing value"
        return f"; the cell is {what}: features cannot be missing (fill it in, e.g. with 0)"
    if re.search(r"could not convert string '-?\d+,\d+' ", message):
        return "; a decimal comma? write numbers with a point (0.5)"
    if "could not convert string" in message:
        return (
            f"; every column besides {', '.join(text_columns[:-1])} and {text_columns[-1]} is read as a feature "
            "(a number): remove other text columns"
        )
    return ""


def _headed(path: Path) -> tuple[_Table, list[str]]:
    """The table after its header line, and the header's column names (stripped)."""
    delimiter = _DELIMITERS[path.suffix.lower()]
    first = _first_data_line(path, delimiter)
    if first is None:
        raise DatasetFormatError(
            f"{path} is empty; its first line names the columns: id,label[,split],features..."
        )
    number, names = first
    _check_separator(path, number, names, delimiter)
    return _Table(path, delimiter, number, tuple(names)), names


_SEPARATORS = {",": "commas", "\t": "tabs", ";": "semicolons"}


def _check_separator(path: Path, number: int, cells: list[str], delimiter: str) -> None:
    """A first line read as one cell that holds another separator: a semicolon-separated export (as
    spreadsheets write where the decimal mark is a comma) or a tab-separated ``.csv``."""
    seen = next((d for d in (";", "\t") if len(cells) == 1 and d in cells[0] and d != delimiter), None)
    if seen is not None:
        raise DatasetFormatError(
            f"{path}: line {number} ({cells[0][:60]!r}) is one column: the file looks separated by "
            f"{_SEPARATORS[seen]}, but a {path.suffix} file is read as separated by {_SEPARATORS[delimiter]}; "
            f"save it with {_SEPARATORS[delimiter]}" + (" or name it .tsv" if seen == "\t" else "")
        )


def _roles(path: Path, header: list[str]) -> dict[str, int]:
    """The column index of ``id``, ``label`` and, when present, ``split``."""
    lower = [name.lower() for name in header]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise DatasetFormatError(
            f"{path}: line 1 names column {repeated[0]!r} twice; column names must differ"
        )
    roles: dict[str, int] = {}
    for role, names, needed in (
        ("id", ID_COLUMNS, True),
        ("label", LABEL_COLUMNS, True),
        ("split", SPLIT_COLUMNS, False),
    ):
        hits = [i for i, name in enumerate(lower) if name in names]
        if len(hits) > 1:
            raise DatasetFormatError(
                f"{path}: the header has {len(hits)} {role} columns ({', '.join(header[i] for i in hits)}); keep one"
            )
        if hits:
            roles[role] = hits[0]
        elif needed:
            raise DatasetFormatError(
                f"{path}: the header ({', '.join(header[:6])}{', ...' if len(header) > 6 else ''}) has no "
                f"{role} column; name it {' or '.join(names)}"
            )
    return roles


def _check_widths(table: _Table, width: int, text_columns: Collection[int] = ()) -> None:
    """Every data row has ``width`` cells: numpy reads only the columns asked for, so a row's extra
    cells, or a header one name short of its rows, would pass unseen. Counted in numpy where that
    settles it (:func:`_widths_hold`); otherwise, and to report a row, by Python's ``csv`` reader."""
    if _widths_hold(table, width):
        return
    with table.path.open(encoding="utf-8-sig", newline="") as lines:
        bodies = (
            _uncommented(table, number, line, text_columns)
            for number, line in enumerate(itertools.islice(lines, table.skip, None), start=table.skip + 1)
        )
        reader = csv.reader(bodies, delimiter=table.delimiter, quotechar='"')
        for row in reader:
            if len(row) != width and any(cell.strip() for cell in row):
                raise DatasetFormatError(
                    f"{table.path}: line {table.skip + reader.line_num} has {len(row)} cells; its header "
                    f"names {width} columns"
                )


#: bytes :func:`_widths_hold` reads at a time
_WIDTH_BLOCK = 1 << 24
_BLANK = frozenset(b" \t\r\n\v\f")


def _widths_hold(table: _Table, width: int) -> bool:
    """Whether every data line of ``table`` is blank or has ``width - 1`` separators, counted in numpy a
    block at a time (ogbn-arxiv's 208 MB ``nodes.csv``: 1.56 s in the ``csv`` reader). False where only
    the ``csv`` reader can tell (a quote or a ``#`` anywhere, a line of another count, a ``\r``-only
    line end): it then checks the file and reports the line."""
    separator, blank = ord(table.delimiter), _BLANK - {ord(table.delimiter)}
    with table.path.open("rb") as raw:
        for _ in range(table.skip):
            if b"\r" in raw.readline().rstrip(b"\r\n"):  # lines the text reader splits at a lone \r
                return False
        rest = b""
        while True:
            block = raw.read(_WIDTH_BLOCK)
            data = rest + block
            if not block:  # the end: what is left is the last line, without its line end
                return _lines_hold(data, separator, width - 1, blank)
            cut = data.rfind(b"\n") + 1  # whole lines now, the rest with the next block
            if not _lines_hold(data[:cut], separator, width - 1, blank):
                return False
            rest = data[cut:]


def _lines_hold(chunk: bytes, separator: int, separators: int, blank: frozenset[int]) -> bool:
    """:func:`_widths_hold` for whole lines ``chunk`` (the last may lack its line end)."""
    if not chunk:
        return True
    if b'"' in chunk or b"#" in chunk or (b"\r" in chunk and chunk.count(b"\r") != chunk.count(b"\r\n")):
        return False  # quotes and comments need the csv reader; a lone \r ends a line there too
    codes = np.frombuffer(chunk, np.uint8)
    starts = np.flatnonzero(codes == ord("\n")) + 1
    bounds = np.concatenate([[0], starts[starts < len(chunk)], [len(chunk)]])  # each line's first byte, end
    # separators per line: how many lie before each bound (np.add.reduceat over the mask: 2.5x slower)
    counts = np.diff(np.searchsorted(np.flatnonzero(codes == separator), bounds))
    odd = np.flatnonzero(counts != separators)
    return all(counts[i] == 0 and set(chunk[bounds[i] : bounds[i + 1]]) <= blank for i in odd)


def _uncommented(table: _Table, number: int, line: str, text_columns: Collection[int]) -> str:
    """Line ``number`` without its comment; a ``#`` right after the text of an id, label or split
    cell (``acct#12``; ``text_columns``) is refused: the comment would cut the cell silently (a number
    cut by a comment, ``0.5#note``, reads as the number)."""
    body, hash_, _ = line.partition("#")
    touching = hash_ and body.strip() and not (body[-1].isspace() or body[-1] == table.delimiter)
    cells = next(csv.reader([body], delimiter=table.delimiter, quotechar='"')) if touching else []
    if touching and len(cells) - 1 in text_columns:  # the cell the '#' ends (quotes respected)
        cell = cells[-1].strip() + "#" + line[len(body) + 1 :].split(table.delimiter, 1)[0].strip()
        raise DatasetFormatError(
            f"{table.path}: line {number}: {cell!r} holds '#', which starts a comment in these tables and "
            f"would cut it to {cell.split('#', 1)[0]!r}; replace the '#' (a comment needs a space or a "
            "separator before it)"
        )
    return body


def _check_unique(table: _Table, ids: np.ndarray) -> None:
    empty = np.flatnonzero(ids == "")
    if empty.size:
        raise DatasetFormatError(f"{table.path}: line {table.line_of(int(empty[0]))}: the node has no id")
    order = np.argsort(ids, kind="stable")
    same = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if same.size:
        first, second = sorted(order[same[0] : same[0] + 2])
        raise DatasetFormatError(
            f"{table.path}: line {table.line_of(int(second))} repeats node id {str(ids[second])!r} "
            f"(line {table.line_of(int(first))}); ids must be unique"
        )


def _labels(table: _Table, labels: np.ndarray, column: str) -> tuple[np.ndarray, str | None]:
    """int64 class ids, and a note naming the classes when the labels were names."""
    empty = np.flatnonzero(labels == "")
    if empty.size:
        raise DatasetFormatError(
            f"{table.path}: line {table.line_of(int(empty[0]))} has no {column}; every node needs a class "
            "(give an unlabelled node any class and leave its split cell empty)"
        )
    if np.char.isdigit(labels).all() and np.char.str_len(labels).max() <= 18:  # fits int64
        return labels.astype(np.int64), None
    try:
        numbers = labels.astype(np.float64)  # e.g. 2.0, -1: numbers, not names
    except ValueError:
        numbers = None
    if numbers is not None:
        bad = np.flatnonzero(
            ~np.isfinite(numbers) | (numbers < 0) | (numbers != np.round(numbers)) | (numbers > 2**53)
        )
        if bad.size:
            row = int(bad[0])
            raise DatasetFormatError(
                f"{table.path}: line {table.line_of(row)}: {column} {str(labels[row])!r} is not a whole number "
                ">= 0; classes are 0..K-1 or names (give an unlabelled node any class and leave its split "
                "cell empty)"
            )
        return numbers.astype(np.int64), None
    names, y = np.unique(labels, return_inverse=True)
    shown = ", ".join(f"{name}={i}" for i, name in enumerate(names[:_CLASS_NAMES_SHOWN]))
    more = ", ..." if len(names) > _CLASS_NAMES_SHOWN else ""
    note = f"{len(names)} class names numbered in sorted order: {shown}{more}"
    numeric = np.char.isdigit(np.char.lstrip(names, "+-"))
    if numeric.any():
        note += f" ({column} mixes numbers and names, e.g. {str(names[numeric][0])!r}: all are read as names)"
    return y.astype(np.int64), note


def _masks(table: _Table, cells: np.ndarray, column: str) -> dict[str, np.ndarray]:
    lower = np.char.lower(cells)
    known = np.isin(lower, list(SPLIT_VALUES))
    if not known.all():
        row = int(np.flatnonzero(~known)[0])
        raise DatasetFormatError(
            f"{table.path}: line {table.line_of(row)}: {column} {str(cells[row])!r} is none of train, val, test "
            "(or empty: in no split)"
        )
    masks = {
        mask: np.isin(lower, [value for value, m in SPLIT_VALUES.items() if m == mask])
        for mask in ("train_mask", "val_mask", "test_mask")
    }
    if not masks["train_mask"].any():
        raise DatasetFormatError(
            f"{table.path}: no node has {column} train; mark the training nodes train (and others val or "
            f"test), or remove the {column} column for a seeded per-class split"
        )
    return masks


# -------------------------------------------------------------------------------------- edge list


def _read_edges(path: Path, ids: np.ndarray, nodes_name: str) -> tuple[np.ndarray, str | None]:
    """``(2, E)`` int64 node positions of the edge list's ``source, target`` ids, and a note when
    its first line was read as a header."""
    table, note = _Table(path, _DELIMITERS[path.suffix.lower()], 0), None
    order = np.argsort(ids)
    sorted_ids = ids[order]
    first = _first_data_line(path, table.delimiter)
    if first is not None:
        number, cells = first
        _check_separator(path, number, cells, table.delimiter)
        if len(cells) < 2:
            raise DatasetFormatError(
                f"{path}: line {number}: one column; an edge is two ids, source and target"
            )
        if not np.isin(cells[:2], sorted_ids).any():  # neither is a node: a header line
            table = _Table(path, table.delimiter, number, tuple(cells))
            if not {c.lower() for c in cells[:2]} <= EDGE_HEADER_WORDS:  # a header of its own making
                note = (
                    f"{path.name}: line {number} ({', '.join(cells[:2])}) read as a header, since neither is a "
                    f"node of {nodes_name} (if it is an edge, its nodes are missing there)"
                )
    pairs = table.load((0, 1), str)
    if pairs.shape[0] == 0:
        return np.zeros((2, 0), dtype=np.int64), note
    flat = pairs.reshape(-1)
    at = np.minimum(np.searchsorted(sorted_ids, flat), len(sorted_ids) - 1)
    unknown = np.flatnonzero(sorted_ids[at] != flat)
    if unknown.size:
        row, col = divmod(int(unknown[0]), 2)
        raise DatasetFormatError(
            f"{path}: line {table.line_of(row)}, column {col + 1}: node {str(flat[unknown[0]])!r} is not in "
            f"{nodes_name} ({unknown.size} unknown ids in all)"
        )
    return order[at].reshape(-1, 2).T.astype(np.int64), note


def _first_data_line(path: Path, delimiter: str) -> tuple[int, list[str]] | None:
    """The first line that is neither blank nor a comment: its number and its cells (stripped)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as lines:
            for number, text in enumerate(lines, start=1):
                body = text.split("#", 1)[0]
                if body.strip():
                    cells = next(csv.reader([body], delimiter=delimiter))
                    return number, [cell.strip() for cell in cells]
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"{path} is not UTF-8 text ({exc.reason})") from None
    return None
