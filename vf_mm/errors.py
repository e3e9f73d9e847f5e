"""Every error vf_mm raises on purpose, in one tree.

Catch ``VfMmError`` to handle anything vf_mm refuses; catch a leaf to handle one
kind of fault. Errors about bad *values* also subclass ``ValueError`` and errors
about a missing optional library subclass ``ImportError``, so code written
against the standard exceptions keeps working.

::

    VfMmError
    ├── BackendError                           an inference request that failed (after retries)
    │   ├── BackendUnavailableError            no answer: connection refused or reset, timeout
    │   ├── BackendHTTPError                   the server answered an error status (and its message)
    │   ├── BackendProtocolError               an answer that does not parse or breaks the schema
    │   ├── PromptTooLongError (ValueError)    refused before sending: longer than the model allows
    │   └── BackendOutOfMemoryError (MemoryError)  the local backend's KV pool (or the GPU) cannot hold
    │                                          this request: it fails alone, the backend goes on
    ├── EnvError                               an environment that cannot be loaded, or fails its checks
    │   ├── EnvironmentNotFoundError (LookupError)  no installed package or environments/<id> for an id
    │   ├── EnvironmentLoadError               its module fails to import, or load_environment raises
    │   │   ├── EnvironmentArgsError (TypeError)  env_args load_environment does not take (an unknown
    │   │   │                                  keyword, a required one missing): names it and the rest
    │   │   └── UnsupportedEnvironmentError    another framework's environment vf_mm cannot run (a
    │   │                                      verifiers env on the completions API, verifiers v1)
    │   ├── EnvironmentCheckError (AssertionError)  check_environment found problems (all listed)
    │   ├── MessageError (ValueError)          a message from environment code that is not a message
    │   ├── MissingColumnError (KeyError)      a reward function names a column its dataset row lacks
    │   └── RewardFunctionError (TypeError)    a reward function the rubric cannot call: an argument
    │                                          name it does not supply, a value that is not callable
    ├── GroupFrameError (ValueError)           a training group frame (pack_group / unpack_group) refused:
    │   │                                      one hash for two tensors, a missing image, bad placeholders
    │   └── ImageRebuildError                  the trainer could not rebuild an image of an encoded/ref group
    │       ├── ImageRefError                  a reference missing, unreadable, outside the roots, or whose
    │       │                                  bytes do not match its sha256 (or an encoded image corrupt)
    │       └── ProcessingMismatchError        rebuilt inputs differ from the sampler's: names which of
    │                                          config, backend or versions differ
    ├── MediaError (ValueError)                an image or a video that cannot be loaded
    │   ├── ImageError                         an image that vf_mm.images cannot load
    │   │   ├── UnsafeImageSourceError         the ImagePolicy refused where it comes from
    │   │   ├── ImageFetchError                reading it failed (network, HTTP status, timeout)
    │   │   ├── ImageDecodeError               the bytes are not a whole image we decode
    │   │   └── ImageTooLargeError             over the policy's byte or pixel limit
    │   └── VideoError                         a video that vf_mm.videos cannot load
    │       ├── UnsafeVideoSourceError         the ImagePolicy's guard refused where it comes from
    │       ├── VideoFetchError                reading it failed (network, HTTP status, timeout, no file)
    │       ├── VideoDecodeError               not a whole video we decode, or frames/arrays we refuse
    │       └── VideoTooLargeError             over a VideoLimits limit (bytes, frames, pixels, duration)
    ├── MissingDependencyError (ImportError)   an optional library is needed for this input
    ├── MultiModalDataError (ValueError)       a step's multi-modal data (its sidecar) breaks its rules
    ├── RenderError (ValueError)               messages a renderer cannot turn into tokens
    │   ├── ReservedTokenError                 text (a message's, or a sampled completion's) holding a
    │   │                                      token the family reserves for images and videos
    │   └── UnsupportedModelError              a checkpoint vf_mm has no renderer for
    ├── ResultsError (ValueError)              an evaluation results store (vf_mm.results) refused:
    │   │                                      a non-JSON value, an outdir in use, a corrupt line
    │   ├── ResumeMismatchError                resume=True with a different run configuration
    │   ├── AssetError                         an asset a row refers to is missing, unreadable, or does
    │   │                                      not match its content hash (to_dataset, vf-mm export)
    │   └── MergeError                         merge_runs refused: sources that are not shards of one
    │                                          run (configs, shard numbers, overlapping rows), a
    │                                          missing shard, a bad asset, an outdir in use
    ├── TrajectoryError (ValueError)           token lists of a step that disagree in length or values;
    │                                          a sample or batch a trainer cannot use (a missing or
    │                                          non-finite advantage, reward or logprob)
    ├── TransportError                         the trainer hop (vf_mm.training): a target or socket unusable
    │   ├── BackPressureTimeout (TimeoutError) a send blocked past timeout_s: the trainer is not reading
    │   ├── LedgerError                        a receiver's ledger of committed group ids: held by another
    │   │                                      receiver, not a ledger, or a corrupt line before the last
    │   ├── ReceiveTimeout (TimeoutError)      no message arrived within the receiver's timeout_s
    │   └── StreamEndedEarlyError              a stream file whose writer stopped early (its end marker
    │                                          says why): raised after its last group
    ├── WorkerError                            rollout workers (vf_mm.workers, --workers / --ray)
    │   ├── WorkerStartError                   a worker could not build its environment or client
    │   └── WorkerLostError                    a worker died (or its Ray actor) with groups in flight
    └── WireError                              the msgpack tensor codec and framed streams
        ├── EncodeError (TypeError)            a value the codec cannot put on the wire
        ├── DecodeError (ValueError)           bytes that are not a valid vf_mm message
        └── StreamError (ValueError)           a framed stream that cannot be read or appended to
            ├── StreamHeaderError              not a vf_mm stream, or a version we do not read
            ├── FrameTooLargeError             a frame over the configured maximum size
            ├── CorruptFrameError              a frame whose checksum does not match its bytes
            └── TornFrameError                 the stream ends inside a frame (writer cut off)

Each error says what was wrong and where (a byte offset, a frame index, a dtype),
so a failed item can be reported and skipped without losing the rest of a run.
"""

from __future__ import annotations

__all__ = [
    "AssetError",
    "BackPressureTimeout",
    "BackendError",
    "BackendHTTPError",
    "BackendOutOfMemoryError",
    "BackendProtocolError",
    "BackendUnavailableError",
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "EnvError",
    "EnvironmentArgsError",
    "EnvironmentCheckError",
    "EnvironmentLoadError",
    "EnvironmentNotFoundError",
    "FrameTooLargeError",
    "GroupFrameError",
    "ImageDecodeError",
    "ImageError",
    "ImageFetchError",
    "ImageRebuildError",
    "ImageRefError",
    "ImageTooLargeError",
    "LedgerError",
    "MediaError",
    "MergeError",
    "MessageError",
    "MissingColumnError",
    "MissingDependencyError",
    "MultiModalDataError",
    "ProcessingMismatchError",
    "PromptTooLongError",
    "ReceiveTimeout",
    "RenderError",
    "ReservedTokenError",
    "ResultsError",
    "ResumeMismatchError",
    "RewardFunctionError",
    "StreamEndedEarlyError",
    "StreamError",
    "StreamHeaderError",
    "TornFrameError",
    "TrajectoryError",
    "TransportError",
    "UnsafeImageSourceError",
    "UnsafeVideoSourceError",
    "UnsupportedEnvironmentError",
    "UnsupportedModelError",
    "VfMmError",
    "VideoDecodeError",
    "VideoError",
    "VideoFetchError",
    "VideoTooLargeError",
    "WireError",
    "WorkerError",
    "WorkerLostError",
    "WorkerStartError",
]


class VfMmError(Exception):
    """Base of every error vf_mm raises on purpose."""


class MissingDependencyError(VfMmError, ImportError):
    """An optional library (torch, ml_dtypes, ...) is needed for this particular input."""


class MultiModalDataError(VfMmError, ValueError):
    """Multi-modal data whose hashes, placeholders and items disagree or overlap."""


class TrajectoryError(VfMmError, ValueError):
    """Token-level trajectory data whose parallel lists disagree or hold bad values; a
    training sample or batch whose advantages, rewards or logprobs are missing or not
    finite (they would make the loss NaN without an error)."""


class MediaError(VfMmError, ValueError):
    """An image or a video that could not be loaded: refused, unreadable, undecodable or too large.

    ``ImageError`` and ``VideoError`` are its two kinds; catch this one for either.
    ``str(error)`` puts the three arguments together, led by the medium (``image`` /
    ``video``); each is kept as the attribute of the same name.

    Args:
        reason: What went wrong.
        source: A short description of the source: a shortened URL or path, never a whole
            base64 payload, with any query string and credentials left out;
            ``<array (8, 48, 64, 3) uint8>`` for raw frames.
        where: Its place in a conversation (``"message 2, part 1"``) when the caller
            gave one.
    """

    medium = "media"

    def __init__(self, reason: str, *, source: str | None = None, where: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.source = source
        self.where = where

    def __str__(self) -> str:
        if self.source is None and self.where is None:
            return self.reason
        label = self.medium if self.source is None else f"{self.medium} {self.source}"
        if self.where is not None:
            label += f" ({self.where})"
        return f"{label}: {self.reason}"


class _FetchFailure(MediaError):
    """Reading a medium's bytes failed; ``status`` is the HTTP status when there was one."""

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        where: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(reason, source=source, where=where)
        self.status = status


class ImageError(MediaError):
    """An image that could not be loaded (``MediaError``'s ``reason``, ``source``,
    ``where``)."""

    medium = "image"


class UnsafeImageSourceError(ImageError):
    """The ``ImagePolicy`` refused the source before anything was read: a scheme other
    than http(s)/file/data, network access off, a host outside ``allowed_domains``, a
    loopback/private/link-local/reserved address, credentials in the URL, or a path
    outside ``local_roots``."""


class ImageFetchError(_FetchFailure, ImageError):
    """Reading the image failed.

    DNS, connection, TLS, an HTTP error status, a timeout, too many redirects, a body over
    ``max_bytes``, or a missing local file.

    Args:
        reason: What went wrong (see ``MediaError``).
        source: A short description of the source (see ``MediaError``).
        where: Its place in a conversation (see ``MediaError``).
        status: The HTTP status, when there was one (kept as ``status``).
    """


class ImageDecodeError(ImageError):
    """The bytes are not a whole image in a format we decode: corrupt, truncated,
    zero-sized, not an image at all (HTML, SVG, text), or a format the policy leaves out."""


class ImageTooLargeError(ImageError):
    """Over the policy's ``max_bytes`` or ``max_pixels`` (decompression bombs included),
    found before the pixels are decoded."""


class VideoError(MediaError):
    """A video that could not be loaded (``MediaError``'s ``reason``, ``source``,
    ``where``)."""

    medium = "video"


class UnsafeVideoSourceError(VideoError):
    """The ``ImagePolicy``'s guard refused where the video comes from, before anything was
    read (network off, a refused host or address, a path outside ``local_roots``, ...):
    the same rules as ``UnsafeImageSourceError``, which is chained as ``__cause__``."""


class VideoFetchError(_FetchFailure, VideoError):
    """Reading the video's bytes failed.

    DNS, connection, TLS, an HTTP error status, a timeout, too many redirects, or a missing
    local file.

    Args:
        reason: What went wrong (see ``MediaError``).
        source: A short description of the source (see ``MediaError``).
        where: Its place in a conversation (see ``MediaError``).
        status: The HTTP status, when there was one (kept as ``status``).
    """


class VideoDecodeError(VideoError):
    """Not a whole video vf_mm decodes: not a video at all (an image, HTML, text, audio
    only), a container outside the ones read, corrupt or truncated data, zero frames, a
    resolution change mid-stream; or raw frames refused (wrong dtype or shape, frames of
    different sizes, an empty array)."""


class VideoTooLargeError(VideoError):
    """Over a ``VideoLimits`` limit (encoded bytes, frames, pixels per frame, decoded
    bytes, duration): found from the header where it says, else while decoding, as soon
    as the limit is passed, before more memory is spent."""


class EnvError(VfMmError):
    """An environment that cannot be loaded, or that fails ``check_environment``."""


class EnvironmentNotFoundError(EnvError, LookupError):
    """No installed environment package and no ``environments/<id>`` folder for an id."""


class EnvironmentLoadError(EnvError):
    """An environment was found but could not be made: importing its module failed, or its
    ``load_environment(**env_args)`` raised. The message names the environment, the
    arguments and where the original exception (chained as ``__cause__``) was raised."""


class EnvironmentArgsError(EnvironmentLoadError, TypeError):
    """``env_args`` that the environment's ``load_environment`` does not take.

    A mistake in the arguments, not in the environment: the CLI exits 2 with it. Each
    argument is kept as the attribute of the same name.

    Args:
        message: What went wrong.
        name: A keyword it does not know, or a required one not given.
        kind: ``"unknown"`` or ``"missing"``.
        accepted: The keywords it names.
        suggestion: The nearest accepted keyword, if one is near.
        passes_on: The callable its ``**kwargs`` went to, which did not take ``name``
            either.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        kind: str,
        accepted: list[str],
        suggestion: str | None = None,
        passes_on: str | None = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.kind = kind
        self.accepted = accepted
        self.suggestion = suggestion
        self.passes_on = passes_on


class UnsupportedEnvironmentError(EnvironmentLoadError):
    """An environment of another framework that vf_mm cannot run as it is: a verifiers
    environment asking for the completions API (vf_mm records chat calls, whose messages
    its renderers turn into exact tokens), or a verifiers v1 environment (its harness
    calls an endpoint itself: record it with ``vf-mm serve --record``). The message says
    which, and what to do instead."""


class MessageError(EnvError, ValueError):
    """A message that entered a rollout and is not one.

    A dataset prompt, an ``env_response`` return, a tool result.

    Args:
        message: What is wrong with it.
        where: The method, turn and field (kept as ``where``).
        hint: How to write it (kept as ``hint``).
    """

    def __init__(self, message: str, *, where: str, hint: str | None = None) -> None:
        super().__init__(f"{message} ({hint})" if hint else message)
        self.where = where
        self.hint = hint


class MissingColumnError(EnvError, KeyError):
    """A reward function asks for a dataset column the rollout's row lacks (or holds null).

    The column is ``answer`` or ``info``. Scoring it against a made-up ``None`` could match a
    parser that found nothing. Declare the column optional on the environment
    (``optional_columns=``) if the reward function copes without it.

    Args:
        message: What went wrong.
        column: The column (kept as ``column``).
    """

    def __init__(self, message: str, *, column: str) -> None:
        super().__init__(message)
        self.column = column

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RewardFunctionError(EnvError, TypeError):
    """A reward function the rubric cannot call: it asks for an argument the rubric does
    not supply (a typo such as ``answr``), takes one only by position, has no readable
    signature, or is not callable at all. Refused when the ``Rubric`` is built, so a
    mistake costs no rollout; the message names the function, the argument and the names
    it can ask for."""


class EnvironmentCheckError(EnvError, AssertionError):
    """``check_environment`` found problems.

    Args:
        message: The summary.
        problems: Every problem found (kept as ``problems``).
    """

    def __init__(self, message: str, *, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class RenderError(VfMmError, ValueError):
    """Messages a renderer cannot turn into tokens (an image for a text-only model, ...)."""


class ReservedTokenError(RenderError):
    """Text holding a token the model family reserves for images and videos.

    A placeholder, a pad, a vision marker; in a message (the message says where), or in a
    completion the model sampled (a backend that ignored the ban on those tokens). Rendered
    again, the text would be read as an image or video no input explains, so the rollout fails
    instead.

    Args:
        message: What went wrong, and where.
        token: The literal token (kept as ``token``).
    """

    def __init__(self, message: str, *, token: str) -> None:
        super().__init__(message)
        self.token = token


class UnsupportedModelError(RenderError):
    """A checkpoint (or processor) whose model type vf_mm has no renderer for."""


class ResultsError(VfMmError, ValueError):
    """The evaluation results store (``vf_mm.results``) refused.

    A value JSON cannot hold (bytes, a tensor, NaN), an outdir that already holds results
    (without ``resume``) or is held by another writer, or a results file with a corrupt
    line.

    Args:
        message: What went wrong.
        path: The file, when known (kept as ``path``).
        line: The bad line (1-based), when known (kept as ``line``).
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class ResumeMismatchError(ResultsError):
    """``resume=True`` on an outdir whose stored run configuration differs from the new one.

    Args:
        message: What went wrong.
        path: Where the stored run configuration lives.
        differences: Each differing key to ``(stored, new)`` (a missing side is
            ``ResumeMismatchError.MISSING``; kept as ``differences``).
    """

    MISSING = "<missing>"

    def __init__(self, message: str, *, path: str | None = None, differences: dict) -> None:
        super().__init__(message, path=path)
        self.differences = differences


class AssetError(ResultsError):
    """A results row's asset (``assets/<hash>.<ext>`` in its messages) cannot be used.

    The file is missing or unreadable, it does not decode, or its content does not hash to
    the name it is stored under (changed after it was written). Each argument is kept as
    the attribute of the same name.

    Args:
        message: What went wrong.
        asset: The URL as the row holds it.
        example_id: The row's example.
        rollout_index: The row's rollout.
        where: The place in the row (``"prompt, message 0, part 1"``).
        path: The run's ``results.jsonl``.
    """

    def __init__(
        self,
        message: str,
        *,
        asset: str,
        example_id: int | str,
        rollout_index: int,
        where: str = "",
        path: str | None = None,
    ) -> None:
        super().__init__(message, path=path)
        self.asset = asset
        self.example_id = example_id
        self.rollout_index = rollout_index
        self.where = where


class MergeError(ResultsError):
    """``vf_mm.results.merge_runs`` (``vf-mm merge``) refused to combine run directories.

    A source that is missing or not a run directory, configs that differ in more than
    ``"shard"``, two sources holding the same shard, different shard counts, one (example,
    rollout) in two sources, a shard missing (without ``allow_partial``), an asset that is
    missing or does not match its content hash, or an outdir that is not empty. Nothing has
    been written when it is raised.

    Args:
        message: What went wrong.
        path: The outdir, when it is the problem (kept as ``path``).
        sources: The source directories involved (kept as ``sources``).
    """

    def __init__(
        self, message: str, *, path: str | None = None, sources: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, path=path)
        self.sources = tuple(sources)


class GroupFrameError(VfMmError, ValueError):
    """A group of rollouts that ``vf_mm.training.pack_group`` will not pack or
    ``unpack_group`` will not rebuild: two different tensors under one image hash, a step
    that refers to an image the group does not carry, placeholders that break the sidecar
    rules (overlapping, unsorted, past the prompt), or a frame that is not a group. The
    message names the rollout and step."""


class ImageRebuildError(GroupFrameError):
    """A group's image the trainer could not rebuild into the sampler's exact model inputs.

    The group was sent ``encoded`` or ``ref`` (``vf_mm.training``). The group fails, never
    trains on other pixels.

    Args:
        message: What went wrong.
        image_hash: The image's ``mm_hash`` (kept as ``image_hash``).
    """

    def __init__(self, message: str, *, image_hash: str | None = None) -> None:
        super().__init__(message)
        self.image_hash = image_hash


class ImageRefError(ImageRebuildError):
    """An image's bytes the trainer cannot use: a reference whose file is gone, unreadable,
    outside the receiver's roots, or whose sha256 does not match; encoded bytes that do
    not decode, or decode to other pixels than the sampler's. The receiver's
    ``on_missing`` policy decides: fail the group, or skip the rollouts that show it."""


class ProcessingMismatchError(ImageRebuildError):
    """The trainer's image processing differs from the sampler's.

    The rebuilt model inputs do not hash to what the group recorded, or the recorded
    processor config or backend is not the trainer's.

    Args:
        message: What went wrong.
        differs: Which of ``"config"``, ``"backend"`` and ``"versions"`` differ (empty
            when none of them does and the inputs still differ; kept as ``differs``).
        image_hash: The image's ``mm_hash``.
    """

    def __init__(
        self, message: str, *, differs: tuple[str, ...] = (), image_hash: str | None = None
    ) -> None:
        super().__init__(message, image_hash=image_hash)
        self.differs = tuple(differs)


class BackendError(VfMmError):
    """An inference request that failed (after the backend's retries).

    Args:
        message: What went wrong.
        backend: The server or model (kept as ``backend``).
    """

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class BackendUnavailableError(BackendError):
    """No usable answer: connection refused or reset, a timeout, a body cut off mid-way."""


class BackendHTTPError(BackendError):
    """The server answered with an error status.

    Args:
        message: What went wrong.
        backend: The server or model.
        status: The HTTP status (kept as ``status``).
        detail: The server's own message (kept as ``detail``).
    """

    def __init__(self, message: str, *, backend: str = "", status: int, detail: str = "") -> None:
        super().__init__(message, backend=backend)
        self.status = status
        self.detail = detail


class BackendProtocolError(BackendError):
    """An answer that is not JSON, or that breaks the schema we expect."""


class PromptTooLongError(BackendError, ValueError):
    """A request refused before sending: prompt plus max_tokens exceed the model's length.

    Args:
        message: What went wrong.
        backend: The server or model.
        prompt_tokens: The prompt's length in tokens (kept as ``prompt_tokens``).
        limit: The model's length (kept as ``limit``).
    """

    def __init__(self, message: str, *, backend: str = "", prompt_tokens: int, limit: int) -> None:
        super().__init__(message, backend=backend)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class BackendOutOfMemoryError(BackendError, MemoryError):
    """The local backend cannot hold a request.

    Its prompt and ``max_tokens`` need more KV slots than the pool has, or a forward ran
    out of GPU memory. That request fails; the others and the backend go on.

    Args:
        message: What went wrong.
        backend: The model.
        needed: KV slots (tokens) the request needs (kept as ``needed``).
        available: KV slots (tokens) the pool has (kept as ``available``).
    """

    def __init__(
        self, message: str, *, backend: str = "", needed: int = 0, available: int = 0
    ) -> None:
        super().__init__(message, backend=backend)
        self.needed = needed
        self.available = available


class TransportError(VfMmError):
    """The trainer hop (``vf_mm.training.GroupSender`` / ``GroupReceiver``) cannot go on: a
    target that is neither a path nor a ZeroMQ endpoint, an address that cannot be bound or
    connected, a sender used after ``close``, pyzmq refusing an operation."""


class BackPressureTimeout(TransportError, TimeoutError):
    """A send waited longer than the sender's ``timeout_s`` for room in its bounded queue.

    The trainer is not reading (or not there).

    Args:
        message: What went wrong.
        sent: How many groups went out before it (kept as ``sent``).
    """

    def __init__(self, message: str, *, sent: int = 0) -> None:
        super().__init__(message)
        self.sent = sent


class LedgerError(TransportError):
    """A ``GroupReceiver``'s ledger cannot be used.

    The ledger is the file of group ids the trainer has committed. Another receiver holds it
    (one receiver per ledger: it is locked while open), the file is not a ledger, or a line
    before the last is corrupt (a torn *last* line is an interrupted commit and is dropped,
    never an error).

    Args:
        message: What went wrong.
        path: The ledger file (kept as ``path``).
        line: The bad line (1-based), when there is one (kept as ``line``).
    """

    def __init__(self, message: str, *, path: str, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class ReceiveTimeout(TransportError, TimeoutError):
    """No message reached the receiver within its ``timeout_s``."""


class StreamEndedEarlyError(TransportError):
    """A stream file of groups whose writer stopped before its run was done.

    Raised by the file's reader after the last group, every group before it whole (as a
    torn tail is), so a trainer cannot take a partial run for a whole one.

    Args:
        message: What went wrong.
        source: The file (kept as ``source``).
        sent: The groups the writer had written (kept as ``sent``).
        reason: Why it stopped, from its end marker: an exception, Ctrl-C,
            ``--max-errors`` (kept as ``reason``).
    """

    def __init__(self, message: str, *, source: str, sent: int, reason: str) -> None:
        super().__init__(message)
        self.source = source
        self.sent = sent
        self.reason = reason


class WorkerError(VfMmError):
    """Base of the rollout workers' errors (``vf_mm.workers``)."""


class WorkerStartError(WorkerError):
    """A worker could not start: its environment or client failed to build (the message
    is the worker's own error), or it did not come up in time. Every worker would fail
    the same way, so the run stops."""


class WorkerLostError(WorkerError):
    """A worker process (or Ray actor) died with groups in flight: those groups run again
    on another worker; a group that two workers died on is recorded as failed with this
    error (it may be what kills them)."""


class WireError(VfMmError):
    """Base of the codec's and the stream's errors."""


class EncodeError(WireError, TypeError):
    """A value the codec cannot encode (unsupported type, sparse or quantized tensor, ...)."""


class DecodeError(WireError, ValueError):
    """Bytes that do not decode: truncated, corrupted, hostile, or from an unknown format."""


class StreamError(WireError, ValueError):
    """A framed stream that cannot be read or appended to."""


class StreamHeaderError(StreamError):
    """The file does not start with a vf_mm stream header, or its version is unknown."""


class FrameTooLargeError(StreamError):
    """A frame declares (or would need) more bytes than the configured maximum.

    Args:
        message: What went wrong.
        offset: The frame's byte offset (kept as ``offset``).
        length: The frame's length in bytes (kept as ``length``).
        limit: The maximum (kept as ``limit``).
    """

    def __init__(self, message: str, *, offset: int, length: int, limit: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.length = length
        self.limit = limit


class CorruptFrameError(StreamError):
    """A frame whose bytes do not match the checksum written with it.

    Args:
        message: What went wrong.
        offset: The frame's byte offset (kept as ``offset``).
        index: The frame's number in the stream (kept as ``index``).
    """

    def __init__(self, message: str, *, offset: int, index: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.index = index


class TornFrameError(StreamError):
    """The stream ends part-way through a frame, as when a writer is killed mid-write.

    Args:
        message: What went wrong.
        offset: Where the torn frame starts: everything before it is whole, and a writer
            that resumes should truncate the file there (see ``repair_stream``; kept as
            ``offset``).
        index: The torn frame's number (kept as ``index``).
        expected: The bytes the frame needed (kept as ``expected``).
        available: The bytes there were (kept as ``available``).
    """

    def __init__(
        self, message: str, *, offset: int, index: int, expected: int, available: int
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.index = index
        self.expected = expected
        self.available = available
