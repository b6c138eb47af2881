"""Progress bars on stderr: live on a terminal, a line every half minute in a log.

tqdm redraws a bar up to ten times a second; written to a file or a pipe (``fedgat demo 2> log``) each
redraw is another line, thousands in a Cora demo. Off a terminal (and outside Jupyter, which draws
bars in place) a bar here redraws at most every :data:`LOG_INTERVAL_S` seconds, and still prints its
first and last state.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm

#: seconds between two redraws of a bar whose stream is not a terminal
LOG_INTERVAL_S = 30.0


def _redraws_in_place(stream: Any) -> bool:
    """True on a terminal and in a Jupyter kernel (a widget, or ``\\r`` that its output area honours)."""
    if "ipykernel" in sys.modules:
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(
    desc: str, *, total: float | None = None, unit: str = "it", enabled: bool = True, **kw: Any
) -> tqdm:
    """A tqdm bar on stderr, or a disabled one (``enabled=False``) that accepts the same calls.

    Args:
        desc: the bar's label.
        total: the count at which the phase is done (None: not known yet; tqdm then shows a counter).
        unit: what one step counts.
        enabled: False for ``--quiet``.
        **kw: more tqdm options (``leave``, ``position``, ...), these win over the defaults here.
    """
    stream = kw.pop("file", sys.stderr)
    options: dict[str, Any] = {"dynamic_ncols": True}
    if not _redraws_in_place(stream):
        options["mininterval"] = LOG_INTERVAL_S
    options.update(kw)
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=stream, **options)
