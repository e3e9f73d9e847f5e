"""CURVE on the trainer hop: key pairs, and which endpoints may go without them.

ZeroMQ's CURVE (built into pyzmq) authenticates both ends and encrypts the traffic.
The trainer (``GroupReceiver``) is the CURVE server: it has a key pair, and it accepts
only the workers whose public keys are in its allow-list directory (checked by pyzmq's
ZAP authenticator at the handshake, before a single message is read). A worker
(``GroupSender``) has its own key pair and the trainer's public key: it completes the
handshake only with the trainer that holds the matching secret key. A connection with a
wrong key carries nothing.

Key files are the ZPL certificates ``zmq.auth.create_certificates`` writes: ``NAME.key``
(the public key: hand it out) and ``NAME.key_secret`` (both keys: keep it, mode 0600).

Without keys, plain TCP is allowed only where no one else can listen in: a loopback
address (``127.0.0.0/8``, ``::1``, ``localhost``) or ``ipc://``. Any other endpoint
(``tcp://*:5555``, ``tcp://trainer-host:5555``) needs keys, or an explicit
``insecure=True`` (``--insecure``).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

from vf_mm.errors import TransportError


def write_key_pair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` into ``directory``; return their paths.

    Args:
        directory: Where (made if missing).
        name: The pair's name.

    Raises:
        FileExistsError: The pair exists (it is never overwritten).
    """
    import zmq.auth

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"a key name is a plain file name, not {name!r}")
    folder = Path(directory)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    if public.exists() or secret.exists():
        raise FileExistsError(
            f"{public} or {secret} exists already: pick another name (keys are never overwritten)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        made_public, made_secret = zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old)
    os.chmod(made_public, 0o644)
    os.chmod(made_secret, 0o600)
    return Path(made_public), Path(made_secret)


def read_public_key(path: str | os.PathLike[str]) -> bytes:
    """The public key in a key file (``NAME.key`` or ``NAME.key_secret``)."""
    public, _ = _load(path)
    return public


def read_secret_key(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """``(public, secret)`` from a ``NAME.key_secret`` file."""
    public, secret = _load(path)
    if secret is None:
        raise TransportError(f"{path} holds no secret key (give the NAME.key_secret file)")
    return public, secret


def _load(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not Path(path).is_file():
        raise TransportError(
            f"the CURVE key file {path} does not exist (vf-mm keys NAME writes NAME.key and "
            "NAME.key_secret)"
        )
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read the CURVE key file {path}: {exc}") from None
    if not public:
        raise TransportError(f"{path} is not a CURVE key file (no public key in it)")
    return public, secret


def check_plain_endpoint(endpoint: str, *, insecure: bool) -> None:
    """Refuse plain TCP to or from anywhere but loopback unless ``insecure``."""
    if insecure or endpoint.startswith("ipc://"):
        return
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass  # a host name, or "*": reachable from elsewhere
    raise TransportError(
        f"{endpoint} is reachable from other machines and carries training data: give CURVE "
        "keys (vf-mm keys NAME; the trainer's secret key and allow-list, each worker's secret "
        "key and the trainer's public key), or insecure=True (--insecure) to send it in the clear"
    )


def allow_list(directory: str | os.PathLike[str]) -> Path:
    """The allow-list directory, checked: it exists and holds at least one public key."""
    folder = Path(directory)
    if not folder.is_dir():
        raise TransportError(f"the CURVE allow-list {folder} is not a directory")
    if not any(p.suffix == ".key" for p in folder.iterdir()):
        raise TransportError(
            f"the CURVE allow-list {folder} holds no public key (NAME.key): no worker could connect"
        )
    return folder


def start_authenticator(context: Any, allowed: Path) -> Any:
    """A ZAP authenticator on ``context`` that accepts the CURVE public keys in
    ``allowed`` (pyzmq's, in a thread of its own); stop it with ``.stop()``."""
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(allowed))
    return authenticator
