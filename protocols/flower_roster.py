"""Identity files, roster JSON and roster fingerprints of the Flower engine.

The protocol assumes the roster (party id -> Ed25519 key) is pinned out of band: each party keeps
its private key in an identity file (:func:`generate_identity`, :func:`read_identity`), one party
assembles the roster every party pins (:func:`write_roster`), and a session's roster is checked
against it (:func:`check_pinned`). Without a pinned roster every party logs the
:func:`roster_fingerprint` to compare out of band (see :mod:`fedgat.protocols.flower_app`).
Nothing here imports ``flwr``.

Files written before the dealer was removed still read: an identity file's ``x25519_private`` (the
key a client received the dealer's CKKS key with) is ignored, and so is a roster's ``"dealer"``
(deprecated: :func:`roster_from_json` warns). Such a roster pins the same parties as a new one; its
:func:`roster_fingerprint` is computed without the entry, so it differs from the one printed when the
file was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedgat.crypto import SigningIdentity

from .flower_config import RosterMismatchError
from .roster import Identity, Roster

__all__ = [
    "check_pinned",
    "generate_identity",
    "read_identity",
    "roster_fingerprint",
    "roster_from_json",
    "roster_to_json",
    "write_roster",
]


def generate_identity(path: str | Path) -> dict[str, str]:
    """Write a fresh private key (JSON, mode 0600) to ``path``; return the public key (hex) to
    publish for the roster. Clients and the server have the same kind of identity (one Ed25519 key)."""
    ident = Identity.generate()
    data = {"ed25519_private": ident.signer.private_bytes().hex()}
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return {"ed25519": ident.signer.public_bytes().hex()}


def read_identity(path: str | Path) -> Identity:
    """The private identity :func:`generate_identity` wrote (an older file's ``x25519_private`` is
    ignored: no key is received with it any more)."""
    data = json.loads(Path(path).read_text())
    return Identity(SigningIdentity.from_private_bytes(bytes.fromhex(data["ed25519_private"])))


def write_roster(path: str | Path, *, server: int, signing_keys: Mapping[int, str | bytes]) -> str:
    """Write a roster JSON (party id -> Ed25519 public key, hex); returns its fingerprint."""
    keys = {int(k): (v.hex() if isinstance(v, bytes) else v) for k, v in signing_keys.items()}
    roster = roster_from_json({"server": server, "signing_keys": keys})
    Path(path).write_text(json.dumps(roster_to_json(roster), indent=2))
    return roster_fingerprint(roster)


def roster_to_json(roster: Roster) -> dict:
    """The roster's JSON object (keys hex, party ids as strings, sorted)."""
    return {
        "server": roster.server,
        "clients": list(roster.clients),
        "signing_keys": {str(p): roster.signing_keys[p].hex() for p in sorted(roster.signing_keys)},
    }


def roster_from_json(data: Mapping[str, Any]) -> Roster:
    """Read :func:`roster_to_json`'s object back (``clients`` defaults to every non-server party).

    A ``"dealer"`` entry (rosters written before the dealer was removed) is deprecated and ignored:
    nothing deals a key any more, and it is neither required nor written.

    Raises:
        RosterMismatchError: a malformed roster.
    """
    if "dealer" in data:
        warnings.warn(
            "the roster's 'dealer' entry is deprecated and ignored (pre-training has no dealer any more); "
            "write the roster again without it",
            DeprecationWarning,
            stacklevel=2,
        )
    try:
        keys = {int(p): bytes.fromhex(k) for p, k in data["signing_keys"].items()}
        server = int(data["server"])
        clients = tuple(int(c) for c in data.get("clients", sorted(p for p in keys if p != server)))
        return Roster(server=server, clients=clients, signing_keys=keys)
    except (KeyError, TypeError, ValueError) as exc:
        raise RosterMismatchError(f"malformed roster: {exc}") from exc


def roster_fingerprint(roster: Roster) -> str:
    """SHA-256 of the canonical roster JSON (compare it out of band when rosters are not pinned)."""
    blob = json.dumps(roster_to_json(roster), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def check_pinned(roster: Roster, pinned_path: str) -> None:
    """Refuse a session's ``roster`` unless it is the one pinned in ``pinned_path``.

    Raises:
        RosterMismatchError: the rosters differ (or the pinned one is malformed).
    """
    pinned = roster_from_json(json.loads(Path(pinned_path).read_text()))
    if roster_to_json(pinned) != roster_to_json(roster):
        raise RosterMismatchError(
            f"the session's roster {roster_fingerprint(roster)[:16]} is not the pinned "
            f"roster {roster_fingerprint(pinned)[:16]} ({pinned_path})"
        )
