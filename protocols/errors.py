"""Typed errors raised by :mod:`fedgat.protocols`.

Everything that can go wrong because of bytes received from another party is a subclass of
:class:`ProtocolError`, one class per cause, so that a party (or a test) can tell a truncated frame
from a replay or a forged signature. A party that raises any of them has changed no state: the
message is rejected as a whole (see :mod:`fedgat.protocols.party`). The exception are *terminal*
refusals (``terminal = True``, e.g. :class:`ResultRejectedError`): a signed message that proves its
sender cheated ends the receiver's session (it is aborted and refuses everything after).

=====================  ====================================================================
error                  cause
=====================  ====================================================================
FrameError             bad magic, inconsistent lengths, truncated or trailing bytes, a payload
                       whose structure does not parse
VersionError           a frame of another protocol version
UnknownTypeError       a message type id this version does not define
SizeLimitError         a declared size (frame, field, list, array) above its limit -- checked
                       before anything of that size is allocated or parsed
AuthError              unknown sender, a sender not allowed to send this message type, a
                       wrapped key that does not open
SignatureError         missing or invalid Ed25519 signature (a tampered message), or a ciphertext
                       whose bytes differ from the SHA-256 ending it, which the signature covers
                       (tampered, or sent so: since frame version 14 the two look alike)
ReplayError            wrong session/round id, a sequence number not above the last one seen
WrongRecipientError    the message is addressed to another party
KeyFingerprintError    bound to another CKKS key (header fingerprint or ciphertext envelope)
StateError             a message that is not valid in the receiver's current state
PayloadError           bad field values: shapes disagreeing with the announced dimension, NaN or
                       infinite values, features that are not unit-norm, node ids the sender does
                       not own, duplicates, malformed ciphertexts
ConfigMismatchError    (a PayloadError) the peer runs the session with other parameters than
                       the receiver's :class:`~fedgat.protocols.pretrain.PretrainConfig`, e.g.
                       other differential-privacy terms, or none
=====================  ====================================================================

Faults are not about a message but about messages that did *not* come: a party's deadline for a
phase passed (time is an input, :meth:`fedgat.protocols.party.Party.tick`). They are raised by
:meth:`~fedgat.protocols.party.Party.raise_for_failure` (and the driver) once the party gave up;
the party is then aborted and has told its peers (:class:`~fedgat.protocols.messages.Abort`).

=====================  ====================================================================
FaultError             base class; ``phase`` and ``missing`` (party ids that did not answer)
MissingPartyError      a party whose contribution others need did not answer in time (e.g. a
                       client whose ciphertexts are needed by other clients' encodings)
QuorumError            fewer clients answered a FedAvg round than the minimum participation
=====================  ====================================================================
"""

from __future__ import annotations

from typing import ClassVar

from fedgat.crypto import SignatureError as _CryptoSignatureError
from fedgat.crypto import verify as _verify

__all__ = [
    "AuthError",
    "ConfigMismatchError",
    "FaultError",
    "FrameError",
    "KeyFingerprintError",
    "MissingPartyError",
    "PayloadError",
    "PrivacyBudgetError",
    "ProtocolError",
    "QuorumError",
    "ReplayError",
    "ResultRejectedError",
    "SignatureError",
    "SizeLimitError",
    "StateError",
    "TrainingRefusedError",
    "UnknownTypeError",
    "VersionError",
    "WrongRecipientError",
    "check_signature",
]


class ProtocolError(Exception):
    """Base class of every error raised for a rejected message.

    ``terminal`` (a class attribute): the refusal proves that a signed peer misbehaved (e.g. a result
    that fails its check), so the receiving party ends its session instead of waiting for a better
    message: it consumes the frame, goes to its aborted state, drops what it decrypted and refuses
    everything after (:meth:`fedgat.protocols.party.Party.receive`). A peer that could probe with
    refused messages would otherwise learn one answer per probe.
    """

    terminal: ClassVar[bool] = False


class FrameError(ProtocolError):
    """Malformed frame: magic, lengths, truncation, trailing bytes, unparsable payload."""


class VersionError(ProtocolError):
    """The frame's protocol version is not supported."""


class UnknownTypeError(ProtocolError):
    """The frame's message type id is not defined."""


class SizeLimitError(ProtocolError):
    """A declared size exceeds its limit (checked before allocating or parsing)."""


class AuthError(ProtocolError):
    """Unknown sender, a sender without the role for this message, or a key that fails to open."""


class SignatureError(AuthError):
    """Missing or invalid Ed25519 signature."""


def check_signature(public_key: bytes, data: bytes, signature: bytes, refusal: str) -> None:
    """Verify ``signature`` over ``data`` under the Ed25519 key ``public_key``.

    Raises:
        SignatureError: with the message ``refusal`` (what the receiver refuses, in its words),
            chained to the cryptographic failure: a bad signature, or a malformed key or signature.
    """
    try:
        _verify(public_key, data, signature)
    except _CryptoSignatureError as exc:
        raise SignatureError(refusal) from exc


class ReplayError(ProtocolError):
    """Wrong session or round id, or a sequence number that is not fresh."""


class WrongRecipientError(ProtocolError):
    """The message is addressed to another party."""


class KeyFingerprintError(ProtocolError):
    """The message or a ciphertext in it is bound to another CKKS key."""


class StateError(ProtocolError):
    """The message is not valid in the receiver's current state."""


class PayloadError(ProtocolError):
    """Field values are invalid (shapes, non-finite values, ownership, duplicates, ciphertexts)."""


class ConfigMismatchError(PayloadError):
    """The peer runs the session with other parameters (e.g. differential-privacy terms)."""


class ResultRejectedError(PayloadError):
    """A decrypted encoding is not the announced linear map of the rows released to the recipient,
    or out of range (:mod:`fedgat.crypto.tags`): it is never trained on. ``node`` is the result's
    node, ``owners`` the parties whose rows it should have combined (the server computed it).

    The message is the same whatever failed -- which check, which node, which owner -- and names no
    decrypted value: an engine may send an error's text back to the server (Flower returns a
    ClientApp's exception as the reply's reason), and a norm or a tag miss in it would make every
    forged result a decryption query; a node or owner in it would say which of several probes failed
    first (a fourteenth review pass). ``node``, ``owners`` and ``detail`` (what failed, with its
    values) are for local logs only: never send them.

    Terminal (see :class:`ProtocolError`), and raised once the results are complete
    (``EncodingsDone``), not at the result that failed: the recipient answers that result as any
    other and keeps its first failure only, so a forger learns per session whether some result
    failed, not which (known break 22), and gets one try, not one query per probe.
    """

    terminal = True

    #: the text of every such refusal (see above)
    TEXT: ClassVar[str] = (
        "a result of the server's fails its check against the tags and range of its owner's rows; "
        "refused (which result and owner: in the recipient's local log)"
    )

    def __init__(self, node: int, owners: tuple[int, ...], *, detail: str = "") -> None:
        super().__init__(self.TEXT)
        self.node = node
        self.owners = owners
        self.detail = detail


class TrainingRefusedError(PayloadError):
    """Local training or evaluation on a global model gave values a client cannot send (NaN,
    infinite, or above the wire's bounds): the model is refused and the client rolled back.

    The text is the same whatever failed and names no value: the values come from training on the
    client's private data, and an engine may send the text back to the server (see
    :class:`ResultRejectedError`). ``detail`` keeps them for local logs only. Terminal: the client
    leaves the run at the first refusal. Raised only without secure aggregation (where the update
    itself is seen): under it a client sends the global weights unchanged instead (under DP-FedAvg,
    the zero update's release), since every round it answers, and the first it refuses, told a
    server choosing weights one bit of its data per round (a fourteenth review pass).
    """

    terminal = True

    def __init__(self, round_: int, *, detail: str = "") -> None:
        super().__init__(
            f"GlobalModel of round {round_}: local training or evaluation on it gave values this client "
            "cannot send; the model is refused and the client leaves the run"
        )
        self.round = round_
        self.detail = detail


class PrivacyBudgetError(StateError):
    """The server asked a client to train in more rounds than its DP-FedAvg budget pays for
    (:class:`fedgat.dp_fedavg.UpdateDP`): nothing is sent and, terminal, the client leaves the run."""

    terminal = True


class FaultError(ProtocolError):
    """A phase timed out: the parties in :attr:`missing` did not answer before the deadline.

    Attributes:
        phase: the protocol phase that timed out (e.g. "keys", "upload", "download", "fit", "evaluate").
        missing: ids of the parties that did not answer, sorted.
    """

    def __init__(self, message: str, *, phase: str, missing: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__(message)
        self.phase = phase
        self.missing = tuple(sorted(int(p) for p in missing))


class MissingPartyError(FaultError):
    """A party whose contribution other parties need did not answer in time (the session stops)."""


class QuorumError(FaultError):
    """Fewer clients than the minimum participation answered a FedAvg round (the run stops).

    Attributes:
        round: the FedAvg round; answered: the clients that answered; required: the minimum.
    """

    def __init__(
        self,
        message: str,
        *,
        phase: str,
        missing: tuple[int, ...] | list[int] = (),
        round: int = 0,
        answered: tuple[int, ...] | list[int] = (),
        required: int = 0,
    ) -> None:
        super().__init__(message, phase=phase, missing=missing)
        self.round = round
        self.answered = tuple(sorted(int(p) for p in answered))
        self.required = required
