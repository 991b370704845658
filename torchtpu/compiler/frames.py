"""Messages between a process and its compiler process: a JSON header and raw byte blobs.

A frame is the header's length (4 bytes, little-endian), the header (JSON; its "sizes" lists
each blob's length) and the blobs. Nothing is pickled: each side only ever decodes JSON and bytes.
"""
from __future__ import annotations

import json
import struct

_LENGTH = struct.Struct("<I")


class Truncated(EOFError):
    """The stream ended inside a frame: the other side exited while writing."""


def write(stream, header: dict, blobs: list[bytes] = ()) -> None:
    head = json.dumps({**header, "sizes": [len(b) for b in blobs]}).encode()
    stream.write(_LENGTH.pack(len(head)) + head)
    for blob in blobs:
        stream.write(blob)
    stream.flush()


def read(stream) -> tuple[dict, list[bytes]] | None:
    """The next frame, or None where the stream ended between frames."""
    raw = stream.read(_LENGTH.size)
    if not raw:
        return None
    (length,) = _LENGTH.unpack(raw + _exactly(stream, _LENGTH.size - len(raw)))
    header = json.loads(_exactly(stream, length))
    return header, [_exactly(stream, size) for size in header.pop("sizes")]


def _exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    while len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            raise Truncated(f"stream ended {size - len(data)} bytes short of a frame")
        data += more
    return data
