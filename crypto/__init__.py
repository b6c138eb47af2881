"""CKKS parameters, packing and key handling (TenSEAL + cryptography).

Recipes (safe defaults, typed errors -- start here):

* :class:`KeyHolderContext` -- a client's own CKKS key pair, holds the secret key
  (``generate``, ``public_context_bytes``, ``secret_context_bytes`` / ``from_secret_bytes`` for the
  client's own saved state, ``fingerprint``).
* :class:`ServerContext` -- ``from_bytes`` loads a public context and refuses secret keys.
* :func:`encrypt_rows` / :func:`decrypt_rows` -- feature rows <-> enveloped ciphertext bytes in the
  rotation-free :class:`SlotLayout`; :class:`fedgat.crypto.encrypt_pool.EncryptionPool` -- the same
  encryptions on several worker processes holding public contexts only (a client's uploads).
* :func:`linear_combination` / :func:`linear_map_rows` -- the server's plaintext multiply-adds through
  TenSEAL (the reference); :class:`fedgat.crypto.evaluator.SealEvaluator` -- the same sums through
  SEAL's evaluator with one encoding per coefficient vector and one rescale per result (what the
  server runs).
* :func:`serialize` / :func:`deserialize` -- ciphertext envelope (fingerprint + digest), in the
  context's session wire (:data:`WIRES`: ``"compact"``, the default, or ``"tenseal"``).
* :class:`SigningIdentity` / :func:`verify` -- Ed25519.

Primitives live in the submodules (``params``, ``context``, ``packing``, ``evaluator``, ``keys``, ``measure``).
"""

from .context import KeyHolderContext, ServerContext, fingerprint_of
from .errors import (
    CiphertextFormatError,
    ContextFormatError,
    CryptoError,
    KeyMismatchError,
    NotPublicContextError,
    PresetError,
    SignatureError,
)
from .keys import SigningIdentity, verify
from .packing import (
    SlotLayout,
    decrypt_rows,
    deserialize,
    encrypt_rows,
    linear_combination,
    linear_map_rows,
    serialize,
)
from .params import DEFAULT_PRESET, DEFAULT_WIRE, PRESETS, WIRES, CkksPreset, check_wire, get_preset

__all__ = [
    "DEFAULT_PRESET",
    "DEFAULT_WIRE",
    "PRESETS",
    "WIRES",
    "CiphertextFormatError",
    "CkksPreset",
    "ContextFormatError",
    "CryptoError",
    "KeyHolderContext",
    "KeyMismatchError",
    "NotPublicContextError",
    "PresetError",
    "ServerContext",
    "SignatureError",
    "SigningIdentity",
    "SlotLayout",
    "check_wire",
    "decrypt_rows",
    "deserialize",
    "encrypt_rows",
    "fingerprint_of",
    "get_preset",
    "linear_combination",
    "linear_map_rows",
    "serialize",
    "verify",
]
