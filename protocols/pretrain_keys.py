r"""Key set-up of the pre-training round: the dealer generates the CKKS key, sends the server the
public context and every other client the secret context wrapped for its X25519 key (signed), through
the server; each client's key announcement carries a signature binding its X25519 key to its roster
identity and the session (:func:`check_binding`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedgat.crypto import (
    ContextFormatError,
    KeyHolderContext,
    KeyUnwrapError,
    ServerContext,
    WrapAAD,
    WrappedKey,
)
from fedgat.crypto import SignatureError as CryptoSignatureError
from fedgat.crypto import verify as verify_signature

from .errors import AuthError, KeyFingerprintError, PayloadError, SignatureError, StateError
from .messages import KeyAnnounce, Message, PublicContext, WrappedKeyDelivery, key_binding_bytes
from .party import Handler
from .party_values import PartyReport
from .pretrain_client import ClientPretrain, ClientState
from .pretrain_config import PretrainConfig
from .roster import Roster, Verifier

__all__ = [
    "DealerSide",
    "KeyRelay",
    "check_announce",
    "check_binding",
    "check_wrapped_delivery",
    "load_public_context",
]


def check_binding(msg: KeyAnnounce, session: int) -> None:
    """Verify the announcing party's signature binding its X25519 key to its id and the session.

    Raises:
        SignatureError: the binding signature does not verify.
    """
    try:
        verify_signature(
            msg.ed25519, key_binding_bytes(session, msg.party, msg.x25519, msg.ed25519), msg.binding_signature
        )
    except CryptoSignatureError as exc:
        raise SignatureError(f"party {msg.party}'s key binding signature is invalid") from exc


def check_announce(msg: KeyAnnounce, roster: Roster, session: int) -> None:
    """The server's checks of a client's key announcement before relaying it to the dealer.

    Raises:
        AuthError, PayloadError, SignatureError: from the dealer, for another party, with a key that is
            not the roster's, or with an invalid binding signature.
    """
    if msg.sender == roster.dealer:
        raise AuthError("the dealer holds the key and announces no wrapping key")
    if msg.party != msg.sender:
        raise PayloadError(f"party {msg.sender} announces keys for party {msg.party}")
    if msg.ed25519 != roster.signing_key(msg.party):
        raise AuthError(f"announced Ed25519 key of party {msg.party} is not the roster's")
    check_binding(msg, session)


def load_public_context(msg: PublicContext, roster: Roster, preset: str) -> ServerContext:
    """The server's public CKKS context from the dealer's message (a secret key is refused).

    Raises:
        AuthError: not from the dealer. PayloadError: another preset, or not a public context.
        KeyFingerprintError: the loaded context has another fingerprint than announced.
    """
    if msg.sender != roster.dealer:
        raise AuthError(f"only the dealer sends the public context, not party {msg.sender}")
    if msg.preset != preset:
        raise PayloadError(f"context preset {msg.preset!r} is not the session's {preset!r}")
    try:
        ctx = ServerContext.from_bytes(msg.context, presets=[preset])
    except ContextFormatError as exc:  # NotPublicContextError included: a secret key is refused
        raise PayloadError(f"public context refused: {exc}") from exc
    if ctx.fingerprint() != msg.context_fingerprint:
        raise KeyFingerprintError("loaded context has another fingerprint")
    return ctx


def check_wrapped_delivery(msg: WrappedKeyDelivery, roster: Roster, session: int) -> None:
    """The server's checks of a wrapped key before relaying it (it cannot open it).

    Raises:
        PayloadError: misaddressed, malformed, or bound to other parties, session or key.
    """
    if msg.dealer != msg.sender or msg.target == msg.sender or not roster.is_client(msg.target):
        raise PayloadError(f"wrapped key from {msg.dealer} for {msg.target} is misaddressed")
    try:
        aad = WrappedKey.from_bytes(msg.wrapped).aad
    except KeyUnwrapError as exc:
        raise PayloadError(f"malformed wrapped key: {exc}") from exc
    if aad != WrapAAD(str(msg.dealer), str(msg.target), session, msg.key_fingerprint):
        raise PayloadError("wrapped key is bound to other parties, session or key")


class DealerSide(ClientPretrain):
    """The client that generates the CKKS key (at :meth:`start`), sends the public context to the
    server and the secret context, wrapped and signed, to every other client through the server.
    As a value: a client's spec; its report adds the clients it wrapped the key for."""

    PARTY_KIND = "pretrain.dealer"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.party_id != self.roster.dealer:
            raise ValueError("the dealer's party id must be the roster's dealer")
        self._wrapped_for: set[int] = set()

    def _snapshot(self) -> dict:
        return {**super()._snapshot(), "wrapped_for": tuple(sorted(self._wrapped_for))}

    def _report_values(self) -> tuple[dict[str, int], dict]:
        counters, result = super()._report_values()
        return counters, {**result, "wrapped_for": sorted(self._wrapped_for)}

    def _absorb(self, report: PartyReport) -> None:
        super()._absorb(report)
        self._wrapped_for = {int(p) for p in report.result["wrapped_for"]}

    def start(self) -> list[Message]:
        if self.state is not ClientState.NEW:
            raise StateError("start() was already called")
        with self.clock("keygen"):
            holder = KeyHolderContext.generate(self.config.preset)
        self._keyed(holder)
        return [
            self._new(
                PublicContext,
                self.roster.server,
                preset=self.config.preset,
                context=holder.public_context_bytes(),
                context_fingerprint=holder.fingerprint(),
            ),
            *self._graph_messages(),
        ]

    def _handler(self, msg: Message) -> Handler | None:
        if isinstance(msg, KeyAnnounce) and self.state not in (ClientState.DONE, ClientState.ABORTED):
            return self._on_key_announce
        return super()._handler(msg)

    def _on_key_announce(self, msg: KeyAnnounce) -> list[Message]:
        self._from_server(msg)
        assert self.holder is not None
        if msg.party == self.party_id or not self.roster.is_client(msg.party):
            raise PayloadError(f"keys announced for party {msg.party}, which is no other client")
        if msg.ed25519 != self.roster.signing_key(msg.party):
            raise AuthError(f"announced Ed25519 key of party {msg.party} is not the roster's")
        check_binding(msg, self.session)
        if msg.party in self._wrapped_for:
            raise StateError(f"the key has already been wrapped for party {msg.party}")
        with self.clock("keygen"):
            try:
                wrapped = self.holder.wrap_for(
                    msg.x25519,
                    sender_id=str(self.party_id),
                    recipient_id=str(msg.party),
                    round_id=self.session,
                    signer=self._signer,
                )
            except KeyUnwrapError as exc:  # e.g. a low-order X25519 point
                raise PayloadError(f"cannot wrap for party {msg.party}: {exc}") from exc
        self._wrapped_for.add(msg.party)
        return [
            self._new(
                WrappedKeyDelivery,
                self.roster.server,
                dealer=self.party_id,
                target=msg.party,
                key_fingerprint=self.holder.fingerprint(),
                wrapped=wrapped,
            )
        ]


class KeyRelay:
    """The server's part of key set-up (mixed into
    :class:`~fedgat.protocols.pretrain_server.ServerPretrain`): it checks and relays each client's key
    announcement to the dealer and each wrapped key back, and loads the public context; it can open
    none of them."""

    roster: Roster
    session: int
    config: PretrainConfig
    context: ServerContext | None
    verifier: Verifier
    dropped: dict[int, str]
    _relayed_keys: set[int]
    _relayed_wraps: set[int]

    if TYPE_CHECKING:  # provided by the server (and Party): declared for the type checker only

        def _require_client(self, msg: Message) -> None: ...

        def _after_key_event(self) -> list[Message]: ...

        def _maybe_open_spool(self) -> None: ...

        def _new(self, cls: type[Message], recipient: int, **fields: Any) -> Message: ...

    def _on_key_announce(self, msg: KeyAnnounce) -> list[Message]:
        self._require_client(msg)
        check_announce(msg, self.roster, self.session)
        if msg.party in self._relayed_keys:
            raise StateError(f"party {msg.party} has already announced its keys")
        self._relayed_keys.add(msg.party)
        self._after_key_event()
        return [
            self._new(
                KeyAnnounce,
                self.roster.dealer,
                party=msg.party,
                x25519=msg.x25519,
                ed25519=msg.ed25519,
                binding_signature=msg.binding_signature,
            )
        ]

    def _on_public_context(self, msg: PublicContext) -> list[Message]:
        if self.context is not None:
            raise StateError("the public context has already been received")
        ctx = load_public_context(msg, self.roster, self.config.preset)
        self.context = ctx
        self.verifier.fingerprint = ctx.fingerprint()
        self._maybe_open_spool()
        return self._after_key_event()

    def _on_wrapped_key(self, msg: WrappedKeyDelivery) -> list[Message]:
        if msg.sender != self.roster.dealer:
            raise AuthError(f"only the dealer sends wrapped keys, not party {msg.sender}")
        if self.context is None:
            raise StateError("a wrapped key before the public context")
        if msg.target in self._relayed_wraps:
            raise StateError(f"a wrapped key for party {msg.target} has already been relayed")
        check_wrapped_delivery(msg, self.roster, self.session)
        if msg.target in self.dropped:
            raise StateError(f"party {msg.target} was dropped; its wrapped key is not relayed")
        self._relayed_wraps.add(msg.target)
        self._after_key_event()
        return [
            self._new(
                WrappedKeyDelivery,
                msg.target,
                dealer=msg.dealer,
                target=msg.target,
                key_fingerprint=msg.key_fingerprint,
                wrapped=msg.wrapped,
            )
        ]
