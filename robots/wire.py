"""msgpack wire format shared by the policy server and the robot client. No pickle anywhere.

Arrays travel as {"__nd__": True, "dtype": "<f4", "shape": [...], "data": bytes} and only numeric
dtypes are accepted on decode; anything else in a message must be msgpack-native (str, int, float,
bool, None, lists, dicts). `unpack` raises `WireError` (an `OversizedError` for a message over the
limit) for anything else, never another exception, so a peer's bytes cannot crash the reader.
`send_frame` / `FrameReader` carry the sim arm's commands as length-prefixed frames on a plain TCP socket.
"""
from __future__ import annotations

import math
import socket
import struct

import msgpack
import numpy as np

ALLOWED_DTYPES = {"<f2", "<f4", "<f8", "|u1", "|i1", "<i2", "<i4", "<i8", "|b1", "<u2", "<u4"}
MAX_DIMS = 8


class WireError(ValueError):
    """A message that does not decode to the expected structure."""


class OversizedError(WireError):
    """A message over the reader's size limit (kept apart so the reply can say by how much)."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size - limit} bytes over the {limit}-byte limit (message of {size} bytes)")
        self.size, self.limit = size, limit


def _default(obj):
    if isinstance(obj, np.ndarray):
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")  # ascontiguousarray makes 0-d arrays 1-d
        if arr.dtype.str not in ALLOWED_DTYPES:
            arr = arr.astype(np.float32)
        return {"__nd__": True, "dtype": arr.dtype.str, "shape": list(arr.shape), "data": arr.tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__} over the wire")


def _hook(obj: dict):
    if obj.get("__nd__") is True:
        dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
        if dtype not in ALLOWED_DTYPES or not isinstance(shape, list) or not isinstance(data, bytes):
            raise WireError(f"bad array header (dtype {dtype!r:.40}; numeric dtypes only)")
        if len(shape) > MAX_DIMS or not all(type(s) is int and s >= 0 for s in shape):
            raise WireError(f"bad array shape {shape!r:.80}")
        expected = math.prod(shape) * np.dtype(dtype).itemsize  # exact: an int64 product could wrap to len(data)
        if expected != len(data):
            raise WireError(f"array data has {len(data)} bytes, shape {shape} needs {expected}")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    return obj


def pack(message: dict) -> bytes:
    return msgpack.packb(message, default=_default, use_bin_type=True)


def unpack(raw: bytes, max_bytes: int) -> dict:
    if len(raw) > max_bytes:
        raise OversizedError(len(raw), max_bytes)
    try:
        message = msgpack.unpackb(raw, object_hook=_hook, raw=False, strict_map_key=True,
                                  max_bin_len=max_bytes, max_str_len=max_bytes, max_array_len=max_bytes,
                                  max_map_len=max_bytes, max_ext_len=max_bytes)
    except WireError:
        raise
    except Exception as err:  # noqa: BLE001  msgpack raises many types on garbage
        raise WireError(f"not a msgpack message ({type(err).__name__})") from None
    if not isinstance(message, dict):
        raise WireError("a message must be a map")
    return message


# --- length-prefixed frames over a plain TCP socket --------------------------------------------------
# The sim arm's command link. Its loop reads the socket itself: the kernel keeps receiving while the
# process is stopped, so after a stall every command sent meanwhile is there at the first read.
# (A ZeroMQ socket hands messages over from an I/O thread that stops with the process and wakes after
# the loop has already caught up, so those commands were met 10-50 ms late; issue 14.)
FRAME_HEADER = struct.Struct("!I")


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(FRAME_HEADER.pack(len(payload)) + payload)


class FrameReader:
    """Frames from a non-blocking stream socket; `read()` never blocks. A frame over `max_bytes`
    closes the link (as ZeroMQ's MAXMSGSIZE does): its stream can no longer be trusted."""

    def __init__(self, sock: socket.socket, max_bytes: int):
        sock.setblocking(False)
        self.sock, self.max_bytes, self.buf = sock, max_bytes, bytearray()
        self.closed = False

    def read(self) -> list[bytes]:
        while not self.closed:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buf += chunk
        frames = []
        while len(self.buf) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(self.buf)
            if size > self.max_bytes:
                self.closed, self.buf = True, bytearray()
                break
            if len(self.buf) < FRAME_HEADER.size + size:
                break
            frames.append(bytes(self.buf[FRAME_HEADER.size:FRAME_HEADER.size + size]))
            del self.buf[:FRAME_HEADER.size + size]
        return frames
