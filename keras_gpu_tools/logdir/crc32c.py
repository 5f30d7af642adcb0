"""CRC-32C (Castagnoli), the checksum of TensorBoard's record framing, at C speed where it can be.

``google-crc32c``'s C extension (hardware CRC instructions, about 4 GB/s) is used where it is
built; where only its pure-Python fallback installed, the numpy version below is used instead.

Each record of an event file carries two masked CRC-32C checksums (of its length
and of its data). ``tensorboard`` computes them in pure Python, a byte at a time:
about 50 us per kilobyte, on the training thread at every epoch end for the
verdict's text and JSON. Here the bytes are taken in blocks of ``BLOCK``: a
block's checksum is the XOR of one table entry per byte (the CRC is linear), all
blocks gathered in one numpy operation; only the four bytes of state carried
from block to block are chained in Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_POLY = 0x82F63B78  # CRC-32C, reflected
BLOCK = 256
_SMALL = 64  # shorter data is checksummed a byte at a time (numpy's call overhead would dominate)
MASK_DELTA = 0xA282EAD8


def _byte_table() -> list[int]:
    """The CRC (from state 0) of each byte value."""
    table = []
    for v in range(256):
        c = v
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        table.append(c)
    return table


_BYTE = _byte_table()  # one step of the bytewise loop


@functools.cache
def _tables() -> tuple[Any, Any, list[list[int]]]:
    """``t[k][v]``: the CRC (from state 0) of byte ``v`` followed by ``k`` zero bytes, k < BLOCK;
    ``t`` by position in a full block; the carried state's four head entries as Python ints."""
    import numpy as np

    t = np.zeros((BLOCK, 256), dtype=np.uint32)
    t[0] = _BYTE
    for k in range(1, BLOCK):
        prev = t[k - 1]
        t[k] = (prev >> 8) ^ t[0][prev & 0xFF]
    return t, t[::-1], [[int(v) for v in t[BLOCK - 1 - j]] for j in range(4)]


def _bytewise(crc: int, data: bytes | memoryview) -> int:
    for b in data:
        crc = _BYTE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _blocks(crc: int, data: bytes | memoryview, n: int) -> int:
    """The state after ``n`` bytes (a multiple of ``BLOCK``) of ``data``."""
    import numpy as np

    _, by_position, (h0, h1, h2, h3) = _tables()
    blocks = np.frombuffer(data, dtype=np.uint8, count=n).reshape(-1, BLOCK)
    sums = np.bitwise_xor.reduce(by_position[np.arange(BLOCK), blocks], axis=1).tolist()
    for s in sums:
        crc = s ^ h0[crc & 0xFF] ^ h1[(crc >> 8) & 0xFF] ^ h2[(crc >> 16) & 0xFF] ^ h3[crc >> 24]
    return crc


def _tail(crc: int, data: memoryview) -> int:
    """The state after the ``r`` (4 to ``BLOCK``) bytes of ``data``: one gather, as a block's."""
    import numpy as np

    t, by_position, _ = _tables()
    r = len(data)
    rows = t[r - 1 :: -1] if r < BLOCK else by_position
    s = int(np.bitwise_xor.reduce(rows[np.arange(r), np.frombuffer(data, dtype=np.uint8)]))
    return s ^ int(
        t[r - 1, crc & 0xFF] ^ t[r - 2, (crc >> 8) & 0xFF] ^ t[r - 3, (crc >> 16) & 0xFF] ^ t[r - 4, crc >> 24]
    )


@functools.cache
def _c_extension() -> Callable[[bytes], int] | None:
    """``google_crc32c.value`` where its C extension is built, else None (its fallback is a byte-at-a-time loop).

    Imported at the first checksum, not with the package: the import takes tens of milliseconds.
    """
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if google_crc32c.implementation == "c" else None


def crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C of ``data``."""
    fast = _c_extension()
    if fast is not None:
        return fast(data if isinstance(data, bytes) else bytes(data))
    return numpy_crc32c(data)


def numpy_crc32c(data: bytes | memoryview) -> int:
    """The CRC-32C of ``data`` without the C extension."""
    crc = 0xFFFFFFFF
    n = len(data)
    if n < _SMALL:
        return _bytewise(crc, data) ^ 0xFFFFFFFF
    full = n - n % BLOCK
    if full:
        crc = _blocks(crc, data, full)
    rest = memoryview(data)[full:]
    crc = _tail(crc, rest) if len(rest) >= _SMALL else _bytewise(crc, rest)
    return crc ^ 0xFFFFFFFF


def checksum() -> Callable[[bytes], int]:
    """The fastest CRC-32C function here, for a loop over many records (one lookup, not one per record)."""
    return _c_extension() or numpy_crc32c


def masked_crc32c(data: bytes | memoryview) -> int:
    """The masked CRC-32C that TensorBoard's record framing stores."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF
