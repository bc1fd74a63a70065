"""The Merkle tree of RFC 6962 / RFC 9162 over a producer's chain: roots, inclusion and consistency
proofs, and their verification.

A producer's checkpoint signs the root of the tree whose entries are its event hashes in order
(the 32 bytes of event `seq` i are entry i - 1); an auditor holding a signed (size, root) checks
that an event is in it with an inclusion proof, and that a later checkpoint extends an earlier one
with a consistency proof. Everything is SHA-256 with the RFC's domain separation: a leaf hashes
`0x00 || entry`, an interior node `0x01 || left || right`, so no leaf can pass for a node.

Functions taking `leaves` take leaf hashes (already `leaf_hash`ed), 32 bytes each, from any
sequence (a list, or a store's own sequence type): they read `leaves[i]` for the indexes they need
and never copy the sequence.

Cost: every element of a proof is `subtree_root` of an index range, and from raw leaves that
range is hashed afresh, so one proof hashes every leaf of the tree once: O(n), 0.6 to 0.8 s for a
million leaves on a 2-core machine. A store that answers proofs often keeps the levels of its tree
(the roots of its complete, aligned subtrees) and answers from them: `audit_ranges` names the
ranges a proof needs and `aligned_chunks` the complete subtrees each range is made of, so a proof
reads O(log n) stored nodes (`consumers.proofs`).

Not safe to share between threads without a lock: `MerkleTree` is plain mutable state; the functions
are pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import islice

HASH_SIZE = 32
"""Bytes in every hash here (SHA-256)."""

EMPTY_ROOT = hashlib.sha256(b"").digest()
"""The root of the empty tree: SHA-256 of no bytes (RFC 9162 2.1.1)."""

_MAX_SIZE = 1 << 64  # RFC 9162 sizes and indexes are uint64


def leaf_hash(entry: bytes) -> bytes:
    """The hash of one entry as a leaf: SHA-256(0x00 || entry) (RFC 9162 2.1.1)."""
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node from its children: SHA-256(0x01 || left || right) (RFC 9162 2.1.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    # The largest power of two smaller than n (n >= 2): where RFC 9162 2.1.1 splits D[0:n].
    return 1 << ((n - 1).bit_length() - 1)


def _mth(leaves: Sequence[bytes], start: int, end: int) -> bytes:
    # MTH(D[start:end]) for start < end, over already checked leaf hashes; depth log2(end - start).
    n = end - start
    if n == 1:
        return leaves[start]
    if n == 2:  # half of all calls end here: a tenth faster than recursing to single leaves
        return node_hash(leaves[start], leaves[start + 1])
    k = _split(n)
    return node_hash(_mth(leaves, start, start + k), _mth(leaves, start + k, end))


def _check_leaves(leaves: Sequence[bytes], start: int, end: int) -> None:
    # One pass in C over the lengths: a 64-byte hex digest passed by mistake would otherwise make a
    # valid-looking tree no one else can reproduce. islice is twice as fast on a list, but walks a
    # store's sequence from 0, so it only serves ranges that start there.
    items = islice(leaves, end) if start == 0 else map(leaves.__getitem__, range(start, end))
    lengths = set(map(len, items))
    if lengths - {HASH_SIZE}:
        raise ValueError(f"leaf hashes must be {HASH_SIZE} bytes; got lengths {sorted(lengths)}")


def _check_count(name: str, value: int, leaves: Sequence[bytes]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    if value > len(leaves):
        raise ValueError(f"{name} {value} is beyond the {len(leaves)} leaf hashes given")


def subtree_root(leaves: Sequence[bytes], start: int, end: int) -> bytes:
    """MTH(D[start:end]) (RFC 9162 2.1.1): the root of the tree over leaf hashes `start` to `end - 1`;
    `EMPTY_ROOT` when `start == end`. Hashes each of those leaves once (end - start - 1 node hashes).

    Raises `ValueError` unless 0 <= start <= end <= len(leaves) and every leaf hash in the range is
    32 bytes (`TypeError` if `start` or `end` is not an int).
    """
    _check_count("end", end, leaves)
    _check_count("start", start, leaves)
    if start > end:
        raise ValueError(f"start {start} is after end {end}")
    if start == end:
        return EMPTY_ROOT
    _check_leaves(leaves, start, end)
    return _mth(leaves, start, end)


def root_from_leaf_hashes(leaves: Sequence[bytes]) -> bytes:
    """MTH over leaf hashes (RFC 9162 2.1.1): `EMPTY_ROOT` for none. Raises `ValueError` if one is
    not 32 bytes."""
    return subtree_root(leaves, 0, len(leaves))


def root_of(entries: Sequence[bytes]) -> bytes:
    """MTH over entries (RFC 9162 2.1.1): each is hashed with `leaf_hash` first."""
    return root_from_leaf_hashes([leaf_hash(entry) for entry in entries])


class MerkleTree:
    """Append-only tree kept as its frontier (compact range): O(log n) memory, amortized O(1)
    hashing per append.

    The frontier is the roots of the complete subtrees the leaves so far make, largest (leftmost)
    first, one per bit set in `size`. It holds no leaves, so it gives roots, not proofs. Not safe
    from several threads without a lock.
    """

    __slots__ = ("_frontier", "_size")

    def __init__(self) -> None:
        self._frontier: list[bytes] = []
        self._size = 0

    def append(self, entry: bytes) -> None:
        """Add one entry: its `leaf_hash` becomes leaf number `size`."""
        self.append_leaf_hash(leaf_hash(entry))

    def append_leaf_hash(self, leaf: bytes) -> None:
        """Add an already hashed leaf. Raises `ValueError` if it is not 32 bytes (the tree is unchanged)."""
        if not isinstance(leaf, bytes) or len(leaf) != HASH_SIZE:
            raise ValueError(f"a leaf hash is {HASH_SIZE} bytes, got {leaf!r:.80}")
        # Like a binary counter: each trailing 1 bit of the old size is a complete subtree of the
        # same size as the one being carried, and the two merge into one twice as large.
        node, n = leaf, self._size
        while n & 1:
            node = node_hash(self._frontier.pop(), node)
            n >>= 1
        self._frontier.append(node)
        self._size += 1

    def extend(self, entries: Iterable[bytes]) -> None:
        """`append` each of `entries` (32-byte entries: event hashes), in one tight loop: about
        half the cost per entry of `append` for a batch of 1,000. Raises `ValueError` at an entry
        of another length (the entries before it stay appended)."""
        items: Sequence[bytes] = entries if isinstance(entries, list | tuple) else list(entries)
        bad = None
        if set(map(len, items)) - {HASH_SIZE}:  # checked in C; the index only when one is wrong
            bad = next(i for i, entry in enumerate(items) if len(entry) != HASH_SIZE)
        self._extend_checked(items if bad is None else items[:bad])
        if bad is not None:
            raise ValueError(f"extend takes {HASH_SIZE}-byte entries, got {items[bad]!r:.80}")

    def _extend_checked(self, entries: Sequence[bytes]) -> None:
        # The leaf hashes in one comprehension first, then the carries: a third faster than hashing
        # each leaf inside the carry loop (what a checkpoint's fold of 1,000 events spends).
        sha256 = hashlib.sha256
        frontier = self._frontier
        size = self._size
        for node in [sha256(b"\x00" + entry).digest() for entry in entries]:
            n = size
            while n & 1:
                node = sha256(b"\x01" + frontier.pop() + node).digest()
                n >>= 1
            frontier.append(node)
            size += 1
        self._size = size

    @property
    def size(self) -> int:
        """How many leaves the tree holds."""
        return self._size

    def root(self) -> bytes:
        """The tree's root, MTH of all its leaves (RFC 9162 2.1.1); `EMPTY_ROOT` when empty.
        O(log n); does not change the tree."""
        if not self._frontier:
            return EMPTY_ROOT
        # RFC 9162 splits off the largest complete subtree on the left at each level, so the
        # root folds the frontier from the right.
        root = self._frontier[-1]
        for left in reversed(self._frontier[:-1]):
            root = node_hash(left, root)
        return root

    def __repr__(self) -> str:
        return f"MerkleTree(size={self._size})"


def aligned_chunks(start: int, end: int) -> list[tuple[int, int]]:
    """The complete, aligned subtrees that make the leaf range start..end-1, as (level, index)
    pairs (the subtree of level L and index j holds leaves j * 2**L .. (j + 1) * 2**L - 1), largest
    first. For every range RFC 9162's recursion visits (each starts at a multiple of a power of two
    at least its length), MTH of the range is the chunks' roots folded from the right:
    `node_hash(c1, node_hash(c2, ...))`. Raises `ValueError` unless 0 <= start < end and `start`
    is aligned so (a multiple of the largest power of two not above end - start)."""
    if not 0 <= start < end:
        raise ValueError(f"not a leaf range: {start}..{end}")
    chunks: list[tuple[int, int]] = []
    at, n = start, end - start
    for level in range(n.bit_length() - 1, -1, -1):
        if n >> level & 1:
            if at % (1 << level):
                raise ValueError(f"leaf range {start}..{end} is not aligned as RFC 9162's ranges are")
            chunks.append((level, at >> level))
            at += 1 << level
    return chunks


def audit_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges (start, end) whose roots are PATH(index, D[0:size]), in the proof's order
    (from the leaf up): what `inclusion_proof` hashes, for a store that answers them from its
    levels. Raises `ValueError` unless 0 <= index < size."""
    if not 0 <= index < size:
        raise ValueError(f"index {index} is not in a tree of size {size}")
    ranges: list[tuple[int, int]] = []
    start, end, m = 0, size, index
    # Top-down, the RFC's recursion unrolled: the sibling found first is the last element.
    while end - start > 1:
        k = _split(end - start)
        if m < k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            m -= k
    ranges.reverse()
    return ranges


def inclusion_proof(leaves: Sequence[bytes], index: int, size: int) -> list[bytes]:
    """The audit path PATH(index, D[0:size]) (RFC 9162 2.1.3.1) for leaf `index` (0-based) in the
    tree of the first `size` leaf hashes of `leaves`: the sibling subtree roots from the leaf up.
    Empty for a tree of one leaf. O(size) hashing (module docstring).

    Raises `ValueError` unless 0 <= index < size <= len(leaves) and those leaf hashes are 32 bytes
    (`TypeError` if `index` or `size` is not an int).
    """
    _check_count("size", size, leaves)
    _check_count("index", index, leaves)
    if index >= size:
        raise ValueError(f"index {index} is not in a tree of size {size}")
    _check_leaves(leaves, 0, size)
    return [_mth(leaves, start, end) for start, end in audit_ranges(index, size)]


def consistency_proof(leaves: Sequence[bytes], old_size: int, new_size: int) -> list[bytes]:
    """PROOF(old_size, D[0:new_size]) (RFC 9162 2.1.4.1): the subtree roots that show the tree of
    the first `old_size` leaf hashes is a prefix of the tree of the first `new_size`. Empty when
    `old_size` is 0 or equals `new_size` (nothing to prove). O(new_size) hashing.

    Raises `ValueError` unless 0 <= old_size <= new_size <= len(leaves) and those leaf hashes are
    32 bytes (`TypeError` if a size is not an int).
    """
    _check_count("new_size", new_size, leaves)
    _check_count("old_size", old_size, leaves)
    if old_size > new_size:
        raise ValueError(f"old_size {old_size} is larger than new_size {new_size}")
    if old_size == 0 or old_size == new_size:
        return []
    _check_leaves(leaves, 0, new_size)
    proof: list[bytes] = []
    start, end, m = 0, new_size, old_size
    whole = True  # SUBPROOF's b: the old tree is still a whole subtree of this one
    while m != end - start:
        k = _split(end - start)
        if m <= k:
            proof.append(_mth(leaves, start + k, end))
            end = start + k
        else:
            proof.append(_mth(leaves, start, start + k))
            start += k
            m -= k
            whole = False
    if not whole:
        proof.append(_mth(leaves, start, end))
    proof.reverse()
    return proof


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == HASH_SIZE


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_SIZE


def _is_proof(proof: object) -> bool:
    return isinstance(proof, Sequence) and not isinstance(proof, bytes | str) and all(map(_is_hash, proof))


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether `proof` shows leaf hash `leaf` at `index` (0-based) in the tree of `size` leaves
    whose root is `root` (RFC 9162 2.1.3.2).

    False, never an exception, for anything malformed: hashes that are not 32 `bytes`, an index or
    size that is not an int with 0 <= index < size < 2**64, a proof too long or too short. The
    proof does not bind the size (index 4's proof in a tree of 7 also fits a tree of 8): trust
    `size` only together with `root`, as a signed checkpoint states them.
    """
    if not (_is_size(index) and _is_size(size) and index < size):
        return False
    if not (_is_hash(leaf) and _is_hash(root) and _is_proof(proof)):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """Whether `proof` shows the tree of `old_size` leaves with root `old_root` is a prefix of the
    tree of `new_size` leaves with root `new_root` (RFC 9162 2.1.4.2).

    Equal sizes need an empty proof and equal roots. Old size 0 needs an empty proof and
    `old_root == EMPTY_ROOT`, the only root of the empty tree (any tree extends it). False, never an
    exception, for anything malformed: hashes that are not 32 `bytes`, sizes that are not ints with
    0 <= old_size <= new_size < 2**64, a proof too long or too short. As with inclusion, the proof
    does not bind `new_size` (the proof from 5 to 7 also fits 5 to 8 against root 7): trust each
    size only together with its root.
    """
    if not (_is_size(old_size) and _is_size(new_size) and old_size <= new_size):
        return False
    if not (_is_hash(old_root) and _is_hash(new_root) and _is_proof(proof)):
        return False
    if old_size == new_size:
        return len(proof) == 0 and old_root == new_root and (old_size > 0 or old_root == EMPTY_ROOT)
    if old_size == 0:
        return len(proof) == 0 and old_root == EMPTY_ROOT
    if len(proof) == 0:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old tree is a whole subtree, its root unsent
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
