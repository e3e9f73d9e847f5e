"""Sending each image's tensors to a server once: what a server says it keeps, and what
``VLLMBackend`` has sent it.

vLLM's token-in/token-out protocol lets a ``kwargs_data`` entry be ``null``: "take the
item of this ``mm_hash`` from your cache". A real vLLM server must never be sent one it
may not hold: its engine core asserts that a ``null`` item is in its receiver cache
(``MultiModalReceiverCache.get_and_update_item``, ``vllm/multimodal/cache.py``; the
shared-memory cache asserts it always), so a miss (an eviction, a restart, the cache
turned off) is an ``AssertionError`` in the engine core, which vllm-project/vllm#31404
reports crashing the engine (#34749 proposes a per-request error), never an answer a
client could act on. And that cache is keyed by ``mm_hash`` alone, and vf_mm's image
hash is of the pixels: another client's tensors for the same picture (other processor
settings) would be used silently.

So ``VLLMBackend`` sends a ``null`` only to a server that says, on each generate answer,
that it keeps items and answers a miss so (``vf-mm serve``; header ``ITEM_CACHE_HEADER``:
``instance=<id>; items=<bound>``), and only for an item it has sent that very server
instance, in an answer that came back 200. With each ``null`` goes the digest of the
string it sent (``sent_digest``; top-level field ``DIGESTS_FIELD``, parallel to
``mm_hashes``): the server resolves it only to an item decoded from those same bytes.
A server without the item answers 400 with error type ``MISS_ERROR_TYPE``; the client
then forgets what that server holds and sends the request again in full, once. A
server whose header names another instance (a restart) or that sends none is assumed to
hold nothing. A real vLLM server sends no such header, so it is always sent every item.

``HeldItems`` is one server's record on the client, bounded by the server's own item
bound: an item forgotten is only sent again, never wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = [
    "DIGESTS_FIELD",
    "ITEM_CACHE_HEADER",
    "MISS_ERROR_TYPE",
    "HeldItems",
    "item_cache_advert",
]

#: the response header by which a server says it keeps items (``vf-mm serve``)
ITEM_CACHE_HEADER = "vf-mm-item-cache"
#: the error ``type`` of a 400 for a ``null`` entry the server does not hold
MISS_ERROR_TYPE = "MultiModalCacheMissError"
#: the request field: per modality, the digest of each ``null`` entry's string (or null)
DIGESTS_FIELD = "vf_mm_kwargs_digests"

#: the most items a client records per server, whatever the server says it keeps
_MAX_RECORDED = 1 << 16

ItemKey = tuple[str, str]  # (modality, mm_hash)


def item_cache_advert(instance: str, max_items: int) -> str:
    """The header value of a server whose cache instance is ``instance``."""
    return f"instance={instance}; items={max_items}"


def _parse_advert(value: str | None) -> tuple[str, int] | None:
    """(instance, item bound) of a header value; None for none or a malformed one."""
    if not value:
        return None
    fields: dict[str, str] = {}
    for part in value.split(";"):
        name, sep, text = part.strip().partition("=")
        if sep:
            fields[name.strip()] = text.strip()
    instance, items = fields.get("instance"), fields.get("items", "")
    if not instance or not items.isdigit() or int(items) <= 0:
        return None
    return instance, int(items)


@dataclass(slots=True)
class HeldItems:
    """What one server holds of what this client sent it: per ``(modality, mm_hash)``,
    the item's fingerprint (``item_fingerprint``) and the digest of the string sent.

    Only answers that came back 200 from a server that advertised its cache add items
    (``confirm``); a miss, another instance or no advert forgets them all. ``sent`` and
    ``skipped`` count items sent with tensors and as ``null``; ``misses`` the requests
    sent again in full after a miss."""

    instance: str | None = None
    answered: bool = False  # any 200 yet: until then the server may keep items
    capacity: int = 0
    items: OrderedDict[ItemKey, tuple[str, str]] = field(default_factory=OrderedDict)
    sent: int = 0
    skipped: int = 0
    misses: int = 0

    @property
    def may_keep(self) -> bool:
        """Whether the server may keep items: it said so in its last answer, or has not
        answered yet (what is sent then is recorded, in case it does)."""
        return self.instance is not None or not self.answered

    def confirm(self, advert: str | None, held: dict[ItemKey, tuple[str, str]]) -> None:
        """A 200 answer with header value ``advert`` to a request whose items were
        ``held`` (key -> (fingerprint, digest)): the server now holds them."""
        self.answered = True
        parsed = _parse_advert(advert)
        if parsed is None:
            self.forget()
            self.instance = None
            return
        instance, capacity = parsed
        if instance != self.instance:
            self.forget()
            self.instance = instance
        self.capacity = min(capacity, _MAX_RECORDED)
        for key, value in held.items():
            self.items[key] = value
            self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def forget(self) -> None:
        self.items.clear()
