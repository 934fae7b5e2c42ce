"""The KV block pool of the simulated engine: vLLM 0.19's ``BlockPool`` (v1/core/block_pool.py), block by block.

Blocks are ids 0 .. n - 1 (the null block is not among them). A block no sequence references (``ref`` 0) waits in
one free queue (``FreeKVCacheBlockQueue``, v1/core/kv_cache_utils.py): never-used blocks first, then freed ones in
the order they were freed; an allocation takes blocks from its head (least recently freed first) and evicts the
prefix-cache hash a taken block still carries. A full block gets a hash (``cache``); a prompt hits the blocks whose
hashes it shares, wherever they are (held by a sequence or waiting in the free queue), and ``touch`` takes a hit
block out of the queue. Freed blocks are appended in the order given (``KVCacheManager.free``: the request's tail
first, so its tail is evicted first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice

__all__ = ["BlockPool"]


class BlockPool:
    """Reference counts, the free queue (LRU, head = next to take) and the hash map."""

    __slots__ = ("by_hash", "free", "hash_of", "more", "ref")

    def __init__(self, num_blocks: int) -> None:
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        # OrderedDict, not dict: taking from a dict's front leaves holes that make the next look-up slower
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # hash -> the first block cached under it; later ones with the same hash, in order, in ``more`` (vLLM does
        # not de-duplicate: BlockHashToBlockMap; a look-up gets the first of those left)
        self.by_hash: dict[int, int] = {}
        self.more: dict[int, list[int]] = {}

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take (vLLM's ``get_num_free_blocks``: free and cached-but-unreferenced)."""
        return len(self.free)

    def take(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the free queue's head (``get_new_blocks``), evicting their hashes; ref 1 each."""
        free, ref, hash_of, by_hash, more = self.free, self.ref, self.hash_of, self.by_hash, self.more
        taken = list(islice(free, n))  # the head's n, at C speed; then out of the queue one by one
        if len(taken) < n:
            raise ValueError(f"{n} blocks asked of a free queue of {len(taken)}")
        for b in taken:
            del free[b]
            ref[b] = 1
            h = hash_of[b]
            if h is not None:  # _evict, inlined: most taken blocks carry a hash
                hash_of[b] = None
                if h not in more:  # the one block cached under h
                    del by_hash[h]
                else:
                    self._evict_duplicate(b, h)
        return taken

    def _evict(self, block: int) -> None:
        h = self.hash_of[block]
        assert h is not None
        self.hash_of[block] = None
        if h not in self.more:
            del self.by_hash[h]
        else:
            self._evict_duplicate(block, h)

    def _evict_duplicate(self, block: int, h: int) -> None:
        """Take ``block`` out of the blocks cached under ``h``, which are several: the next in line takes its
        place in the map when it led them."""
        later = self.more[h]
        if self.by_hash[h] == block:
            self.by_hash[h] = later.pop(0)
        else:
            later.remove(block)
        if not later:
            del self.more[h]

    def lookup(self, h: int) -> int | None:
        """A block cached under hash ``h`` (the first cached of those left, ``get_one_block``), or None."""
        return self.by_hash.get(h)

    def touch(self, blocks: Iterable[int]) -> None:
        """Reference prefix-cache hits: a hit waiting in the free queue leaves it (``touch``)."""
        free, ref = self.free, self.ref
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference of each block; those no longer referenced join the queue's tail in this order."""
        free, ref = self.free, self.ref
        for b in blocks:
            r = ref[b] - 1
            ref[b] = r
            if not r:
                free[b] = None

    def cache(self, blocks: list[int], hashes: list[int]) -> None:
        """Give full blocks that carry no hash their hashes, ``blocks[i]`` ``hashes[i]`` (``cache_full_blocks``)."""
        hash_of, first = self.hash_of, self.by_hash.setdefault
        for b, h in zip(blocks, hashes, strict=True):
            hash_of[b] = h
            if first(h, b) != b:  # h was cached before: b waits behind the blocks cached under it
                self.more.setdefault(h, []).append(b)

    def drop_unreferenced_hashes(self) -> int:
        """Forget the hashes of the blocks in the free queue (nothing hits them any more); returns how many."""
        dropped = 0
        for b in self.free:
            if self.hash_of[b] is not None:
                self._evict(b)
                dropped += 1
        return dropped
