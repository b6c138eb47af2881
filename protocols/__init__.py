"""Message formats, sans-IO protocol state machines and transports.

* :mod:`~fedgat.protocols.messages` -- typed, versioned, signed frames: :func:`decode_message`,
  :func:`encode_message` and the message table.
* :mod:`~fedgat.protocols.roster` -- :class:`Roster` (party id -> Ed25519 key, pinned out of band) and
  :class:`Verifier` (signature, recipient, session, replay and key-fingerprint checks).
* :mod:`~fedgat.protocols.pretrain` -- :class:`ClientPretrain`,
  :class:`ServerPretrain`: the encrypted pre-training round.
* :mod:`~fedgat.protocols.fedavg` -- :class:`ServerRounds`, :class:`ClientRounds`: FedAvg rounds.
* :mod:`~fedgat.protocols.transport` -- :class:`Transport`, :class:`InProcessTransport`,
  :class:`Transcript`; :class:`Driver` / :func:`run_parties` (:mod:`~fedgat.protocols.driver`)
  connect them. Engines that host parties elsewhere -- worker processes
  (:mod:`~fedgat.protocols.process_engine`) and Ray actors (:mod:`~fedgat.protocols.ray_engine`) --
  share one coordinator (:mod:`~fedgat.protocols.hosting`); both are imported on demand.
* :mod:`~fedgat.protocols.errors` -- :class:`ProtocolError` and one subclass per cause.

State machines never touch sockets: they take bytes and return messages, raise a typed error and
change nothing when a message is rejected.
"""

from .driver import Clock, Driver, ManualClock, MonotonicClock, run_parties
from .errors import (
    AuthError,
    ConfigMismatchError,
    FaultError,
    FrameError,
    KeyFingerprintError,
    MissingPartyError,
    PayloadError,
    ProtocolError,
    QuorumError,
    ReplayError,
    ResultRejectedError,
    SignatureError,
    SizeLimitError,
    StateError,
    TrainingRefusedError,
    UnknownTypeError,
    VersionError,
    WrongRecipientError,
)
from .fedavg import ClientRounds, RoundsState, RoundTimeouts, ServerRounds
from .messages import (
    MESSAGE_TYPES,
    Abort,
    AbortCode,
    EdgeClaims,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    EvaluateRequest,
    EvaluationReport,
    FeatureUpload,
    GlobalModel,
    GraphAnnounce,
    KeyAnnounce,
    LocalUpdate,
    Message,
    NeighbourhoodStatement,
    PrivacyTerms,
    PublicContext,
    ResultItem,
    RosterReady,
    SealedCheckKeys,
    SplitCounts,
    UploadDone,
    UploadGrant,
    UploadItem,
    decode_message,
    encode_message,
)
from .party import Party
from .pretrain import (
    ClientPretrain,
    ClientState,
    PretrainConfig,
    PretrainLimits,
    PretrainTimeouts,
    ServerPretrain,
    ServerState,
    validate_features,
)
from .roster import Identity, Roster, Verifier
from .transport import Delivery, InProcessTransport, Link, Transcript, TranscriptEntry, Transport

__all__ = [
    "MESSAGE_TYPES",
    "Abort",
    "AbortCode",
    "AuthError",
    "ClientPretrain",
    "ClientRounds",
    "ClientState",
    "Clock",
    "ConfigMismatchError",
    "Delivery",
    "Driver",
    "EdgeClaims",
    "EncodingBases",
    "EncodingResults",
    "EncodingsDone",
    "EvaluateRequest",
    "EvaluationReport",
    "FaultError",
    "FeatureUpload",
    "FrameError",
    "GlobalModel",
    "GraphAnnounce",
    "Identity",
    "InProcessTransport",
    "KeyAnnounce",
    "KeyFingerprintError",
    "Link",
    "LocalUpdate",
    "ManualClock",
    "Message",
    "MissingPartyError",
    "MonotonicClock",
    "NeighbourhoodStatement",
    "Party",
    "PayloadError",
    "PretrainConfig",
    "PretrainLimits",
    "PretrainTimeouts",
    "PrivacyTerms",
    "ProtocolError",
    "PublicContext",
    "QuorumError",
    "ReplayError",
    "ResultItem",
    "ResultRejectedError",
    "Roster",
    "RosterReady",
    "RoundTimeouts",
    "RoundsState",
    "SealedCheckKeys",
    "ServerPretrain",
    "ServerRounds",
    "ServerState",
    "SignatureError",
    "SizeLimitError",
    "SplitCounts",
    "StateError",
    "TrainingRefusedError",
    "Transcript",
    "TranscriptEntry",
    "Transport",
    "UnknownTypeError",
    "UploadDone",
    "UploadGrant",
    "UploadItem",
    "Verifier",
    "VersionError",
    "WrongRecipientError",
    "decode_message",
    "encode_message",
    "run_parties",
    "validate_features",
]
