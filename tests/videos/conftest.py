"""A safety net for every test here: no real DNS, no real connection."""

from __future__ import annotations

import socket

import pytest


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a test in tests/videos tried to use the network: {args!r}")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", _refuse)
    monkeypatch.setattr(socket, "gethostbyname", _refuse)
    monkeypatch.setattr(socket, "create_connection", _refuse)
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse)
