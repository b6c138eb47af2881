"""The body of a Ray actor that hosts many parties (:class:`PartyHost`). Plain Python: made a Ray
actor by :class:`fedgat.protocols.ray_engine.RayEngine`, tested without Ray as an ordinary object.

Parties arrive as the bytes of their :class:`~fedgat.protocols.party_values.PartySpec` (built here),
leave as the bytes of their :class:`~fedgat.protocols.party_values.PartyReport`, and errors cross as
values (:func:`~fedgat.protocols.party_values.error_to_value`): nothing here pickles a party, a result
or an exception."""

from __future__ import annotations

import importlib
import os
import resource
from collections.abc import Mapping

from .party import Party
from .party_values import PartySpec, error_from_value, error_to_value

__all__ = ["Frame", "PartyHost", "RayEngineError", "failure", "raise_failure", "rss_bytes"]

Frame = tuple[int, int, bytes]  # (sender, recipient, data)


class RayEngineError(RuntimeError):
    """An actor died or a hosted run could not proceed (not a protocol error: those are re-raised
    as the party raised them)."""


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 when unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def failure(party: int | None, exc: BaseException) -> dict:
    """An error raised in an actor, as the value its reply carries."""
    return {"party": party, "exception": error_to_value(exc)}


def raise_failure(error: dict) -> None:
    """Raise (in the coordinator) the error a :func:`failure` value describes: a protocol error as the
    party raised it, anything that is not rebuilt as itself as :class:`RayEngineError`."""
    exc = error_from_value(error["exception"], fallback=RayEngineError)
    remote = error["exception"].get("traceback")
    exc.add_note(f"raised in a Ray actor by party {error['party']}")
    if remote:
        exc.add_note(f"actor traceback:\n{remote.rstrip()}")
    raise exc


# ----------------------------------------------------------------------------------------- actor
class PartyHost:
    """Actor body: hosts many parties and runs their state machines on the frames it is given.

    Made a Ray actor by :class:`RayEngine` (``ray.remote(PartyHost)``); a plain object otherwise,
    which is how its logic is tested without Ray.
    """

    def __init__(self, threads: int | None = 1, preload: tuple[str, ...] = ()) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        for module in preload:  # pay the imports (torch_geometric: seconds) before the first run
            importlib.import_module(module)
        self.parties: dict[int, Party] = {}
        self._turn = 0

    def ping(self) -> int:
        return os.getpid()

    def place(self, specs: Mapping[int, bytes]) -> dict:
        """Host the parties whose :meth:`PartySpec.to_bytes` are given (party id -> bytes). Returns
        ``{"parties": every hosted party id, "error": None or a failure}`` (see :meth:`deliver`)."""
        pid = None
        try:
            for pid, blob in specs.items():
                spec = PartySpec.from_bytes(blob)
                if spec.party_id != pid:
                    raise RayEngineError(f"the spec for party {pid} describes party {spec.party_id}")
                self.parties[pid] = spec.build()
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator, which raises it
            return {"parties": sorted(self.parties), "error": failure(pid, exc)}
        return {"parties": sorted(self.parties), "error": None}

    def _emit(self, pid: int, messages: list) -> list[Frame]:
        party = self.parties[pid]
        return [(pid, msg.recipient, party.encode(msg)) for msg in messages]

    def start(self, pids: list[int]) -> dict:
        """``{"frames": the opening frames of each of pids, in that order, "error": None or a
        failure}``."""
        frames: list[list[Frame]] = []
        try:
            for pid in pids:
                frames.append(self._emit(pid, self.parties[pid].start()))
        except Exception as exc:  # noqa: BLE001
            return {"frames": frames, "error": failure(pids[len(frames)], exc)}
        return {"frames": frames, "error": None}

    def has_work(self) -> bool:
        return any(p.has_work() for p in self.parties.values())

    def deliver(self, frames: list[Frame], step: bool) -> dict:
        """Hand each frame to its recipient, in order; then, with ``step``, one step of the next
        party with streamed work. Returns ``{"replies": [frames per delivered frame], "step":
        frames of the step, "work": any work left, "error": None or a failure}``, a failure being
        ``{"party": the party that raised, "exception": error_to_value(exc)}``; after an error the
        remaining frames are not delivered."""
        replies: list[list[Frame]] = []
        current: int | None = None
        try:
            for _sender, recipient, data in frames:
                current = recipient
                if type(data) is not bytes:
                    raise TypeError("frames cross as bytes only")
                party = self.parties.get(recipient)
                if party is None:
                    raise KeyError(f"frame for party {recipient}, which this actor does not host")
                replies.append(self._emit(recipient, party.receive(data)))
            stepped: list[Frame] = []
            if step:
                pids = sorted(self.parties)
                for k in range(len(pids)):
                    current = pids[(self._turn + k) % len(pids)]
                    if self.parties[current].has_work():
                        self._turn = (self._turn + k + 1) % len(pids)
                        stepped = self._emit(current, self.parties[current].step())
                        break
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator, which raises it
            return {"replies": replies, "step": [], "work": False, "error": failure(current, exc)}
        return {"replies": replies, "step": stepped, "work": self.has_work(), "error": None}

    def report(self, pids: list[int], drop: bool = True) -> dict:
        """``{"reports": party id -> its PartyReport.to_bytes(), "error": None or a failure}``; the
        reported parties are dropped with ``drop``."""
        out: dict[int, bytes] = {}
        try:
            for pid in pids:
                out[pid] = self.parties[pid].report().to_bytes()
        except Exception as exc:  # noqa: BLE001
            return {"reports": out, "error": failure(pids[len(out)], exc)}
        if drop:
            for pid in pids:
                del self.parties[pid]
        return {"reports": out, "error": None}

    def reset(self) -> None:
        """Drop every hosted party (after a failed run)."""
        self.parties.clear()
        self._turn = 0

    def memory(self) -> dict:
        """``{"pid", "rss", "peak_rss", "parties"}`` of this actor's process (bytes)."""
        return {
            "pid": os.getpid(),
            "rss": rss_bytes(),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "parties": len(self.parties),
        }
