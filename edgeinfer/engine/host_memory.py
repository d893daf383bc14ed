"""Host memory for saved KV states: large buffers mapped with their pages made up front.

A prefix-cache entry's state (``llama_state_seq_get_data``) is tens of MB: 40 MB for
1,800 SmolLM2-135M tokens in f16, and a request's first token can wait for that copy
(the prefix cache moves idle entries to host RAM before a prompt is computed). Most of
its time is the first touch of new memory, one page fault per 4 KiB page, which is slow
in VMs. Measured in the engine on a 2-core VM, 40 MB: a fresh ``bytearray`` (zeroed,
then written by llama.cpp) 24.5 ms; an anonymous mapping faulted in as llama.cpp writes
21 ms; one whose pages the kernel makes in one go (``MAP_POPULATE``) 16.5 ms. (Huge pages
by ``madvise`` took 107 ms there: the kernel compacts memory to find them.) Where
``mmap`` has no private anonymous ``MAP_POPULATE`` mapping, an ordinary ``bytearray``.
The mapping is unmapped when its last reference goes.
"""

from __future__ import annotations

import mmap

# buffers of at least this size are mapped (for smaller ones a system call is not worth it)
MAPPED_MIN = 1 << 20

# a sequence's saved KV state. Read it as a buffer (len, slices, ``bytes + state``, write):
# an mmap does not compare equal to bytes with ``==`` and does not pickle
State = bytes | bytearray | mmap.mmap


def host_buffer(size: int) -> bytearray | mmap.mmap:
    """Zeroed, writable memory of ``size`` bytes for a KV state (see the module)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if size < MAPPED_MIN or not populate or not flags:
        return bytearray(size)
    try:
        return mmap.mmap(-1, size, flags=flags | populate)
    except OSError:  # (a limit on mappings, no memory to populate): the ordinary way
        return bytearray(size)
