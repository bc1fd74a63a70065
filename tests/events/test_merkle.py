"""The RFC 6962 / RFC 9162 Merkle tree: published vectors, proofs for every shape, malformed input."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, overload

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    aligned_chunks,
    audit_ranges,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_leaf_hashes,
    root_of,
    subtree_root,
    verify_consistency,
    verify_inclusion,
)

# The reference tree of certificate-transparency (RFC 6962's test data), as published in
# transparency-dev/merkle (testonly/constants.go, proof/verify_test.go); proofs there number
# leaves from 1, here from 0.
CT_ENTRIES = [
    bytes.fromhex(h)
    for h in ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"]
]
CT_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# Every complete subtree of the 8-leaf tree, level by level (level 0: the leaf hashes).
CT_NODES = [
    [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7",
        "07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658",
        "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
        "46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1",
    ],
    [
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    ],
    [
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    ["5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"],
]
CT_INCLUSION = [  # (index, size, proof)
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
CT_CONSISTENCY = [  # (old_size, new_size, proof)
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        7,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]
CT_LEAVES = [leaf_hash(entry) for entry in CT_ENTRIES]
SOME_HASH = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")


# -- the RFC's definitions, written over slices as the RFC writes them: the oracle ---------------


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of RFC 9162 2.1.1 over leaf hashes."""
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return d[0]
    k = _k(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of RFC 9162 2.1.3.1."""
    if len(d) == 1:
        return []
    k = _k(len(d))
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def ref_subproof(m: int, d: Sequence[bytes], b: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b) of RFC 9162 2.1.4.1."""
    if m == len(d):
        return [] if b else [ref_mth(d)]
    k = _k(len(d))
    if m <= k:
        return [*ref_subproof(m, d[:k], b), ref_mth(d[k:])]
    return [*ref_subproof(m - k, d[k:], False), ref_mth(d[:k])]


def flip(h: bytes, bit: int = 3) -> bytes:
    return bytes([h[0] ^ (1 << bit)]) + h[1:]


def make_leaves(n: int, salt: bytes = b"") -> list[bytes]:
    return [leaf_hash(salt + i.to_bytes(4, "big")) for i in range(n)]


class LeavesWithoutSlices(Sequence[bytes]):
    """A store's leaf sequence: answers single indexes only, and counts how many it was asked for."""

    def __init__(self, leaves: list[bytes]) -> None:
        self._leaves = leaves
        self.reads = 0

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            raise TypeError("this store does not copy ranges")
        self.reads += 1
        return self._leaves[index]

    def __len__(self) -> int:
        return len(self._leaves)


# -- what must verify, and every forgery of it that must not --------------------------------------


def inclusion_forgeries(
    leaves: list[bytes], roots: list[bytes], index: int, size: int, proof: list[bytes]
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Changed versions of a valid inclusion proof's arguments, each of which must fail; `roots[n]`
    is the root of the first n leaves."""
    leaf, root = leaves[index], roots[size]
    yield "changed leaf", (flip(leaf), index, size, proof, root)
    yield "another leaf", (SOME_HASH, index, size, proof, root)
    yield "changed root", (leaf, index, size, proof, flip(root))
    yield "empty root", (leaf, index, size, proof, EMPTY_ROOT)
    for other in range(size + 1):
        if other != index:
            yield f"index {other}", (leaf, other, size, proof, root)
    # The size is bound with its root (a checkpoint signs both): every other tree fails.
    for other in range(index + 1, len(roots)):
        if other != size:
            yield f"size {other} with its root", (leaf, index, other, proof, roots[other])
    yield "size * 2", (leaf, index, size * 2, proof, root)
    if size // 2 > index:
        yield "size // 2", (leaf, index, size // 2, proof, root)
    for i in range(len(proof)):
        changed = list(proof)
        changed[i] = flip(changed[i])
        yield f"proof[{i}] changed", (leaf, index, size, changed, root)
    if proof:
        yield "last element dropped", (leaf, index, size, proof[:-1], root)
        yield "first element dropped", (leaf, index, size, proof[1:], root)
    if len(proof) > 1 and proof[0] != proof[1]:
        yield "first two swapped", (leaf, index, size, [proof[1], proof[0], *proof[2:]], root)
    yield "trailing root", (leaf, index, size, [*proof, root], root)
    yield "trailing hash", (leaf, index, size, [*proof, SOME_HASH], root)
    yield "preceding leaf", (leaf, index, size, [leaf, *proof], root)
    yield "preceding root", (leaf, index, size, [root, *proof], root)


def check_inclusion(leaves: list[bytes]) -> None:
    """Every index of every prefix of `leaves` has the RFC's proof, which verifies, and no forgery does."""
    roots = [ref_mth(leaves[:n]) for n in range(len(leaves) + 1)]
    for size in range(1, len(leaves) + 1):
        for index in range(size):
            proof = inclusion_proof(leaves, index, size)
            assert proof == ref_path(index, leaves[:size]), (index, size)
            assert verify_inclusion(leaves[index], index, size, proof, roots[size]), (index, size)
            for what, args in inclusion_forgeries(leaves, roots, index, size, proof):
                assert verify_inclusion(*args) is False, f"{what} verified (index {index}, size {size})"


def consistency_forgeries(
    roots: list[bytes], old: int, new: int, proof: list[bytes]
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Changed versions of a valid consistency proof's arguments, each of which must fail (0 < old < new)."""
    old_root, new_root = roots[old], roots[new]
    yield "changed old root", (old, new, flip(old_root), new_root, proof)
    yield "changed new root", (old, new, old_root, flip(new_root), proof)
    yield "swapped roots", (old, new, new_root, old_root, proof)
    yield "old root for both", (old, new, old_root, old_root, proof)
    yield "empty old root", (old, new, EMPTY_ROOT, new_root, proof)
    for other in range(1, len(roots)):
        if other != old and other <= new:
            yield f"old size {other} with its root", (other, new, roots[other], new_root, proof)
        if other != new and other >= old:
            yield f"new size {other} with its root", (old, other, old_root, roots[other], proof)
    yield "new size * 2", (old, new * 2, old_root, new_root, proof)
    yield "old size ^ 2", (old ^ 2, new, old_root, new_root, proof)
    yield "empty proof", (old, new, old_root, new_root, [])
    for i in range(len(proof)):
        changed = list(proof)
        changed[i] = flip(changed[i], 4)
        yield f"proof[{i}] changed", (old, new, old_root, new_root, changed)
    yield "last element dropped", (old, new, old_root, new_root, proof[:-1])
    if len(proof) > 1:
        yield "first element dropped", (old, new, old_root, new_root, proof[1:])
    for name, extra in (("old root", old_root), ("new root", new_root), ("proof[0]", proof[0])):
        yield f"trailing {name}", (old, new, old_root, new_root, [*proof, extra])
        yield f"preceding {name}", (old, new, old_root, new_root, [extra, *proof])


def check_consistency(leaves: list[bytes], old: int, new: int, roots: list[bytes]) -> None:
    """The RFC's proof between two prefixes of `leaves`, which verifies, and no forgery does."""
    proof = consistency_proof(leaves, old, new)
    expected = [] if old in (0, new) else ref_subproof(old, leaves[:new], True)
    assert proof == expected, (old, new)
    assert verify_consistency(old, new, roots[old], roots[new], proof), (old, new)
    if 0 < old < new:
        for what, args in consistency_forgeries(roots, old, new, proof):
            assert verify_consistency(*args) is False, f"{what} verified ({old} -> {new})"


# -- the tests ------------------------------------------------------------------------------------


class TestKnownVectors:
    def test_empty_root(self) -> None:
        """The empty tree's root is SHA-256 of no bytes, however it is asked for."""
        assert EMPTY_ROOT == hashlib.sha256(b"").digest() == bytes.fromhex(CT_ROOTS[0])
        assert root_of([]) == root_from_leaf_hashes([]) == MerkleTree().root() == EMPTY_ROOT
        assert subtree_root(CT_LEAVES, 3, 3) == EMPTY_ROOT

    def test_leaf_and_node_hashes(self) -> None:
        """Leaves hash 0x00 || entry and nodes 0x01 || left || right, so a node never passes for a leaf."""
        assert leaf_hash(b"").hex() == CT_ROOTS[1]
        assert node_hash(CT_LEAVES[0], CT_LEAVES[1]).hex() == CT_ROOTS[2]
        assert leaf_hash(CT_LEAVES[0] + CT_LEAVES[1]) != node_hash(CT_LEAVES[0], CT_LEAVES[1])

    def test_roots_of_sizes_0_to_8(self) -> None:
        """Every prefix of the reference entries has the published root, by each way of computing it."""
        tree = MerkleTree()
        for size in range(len(CT_ENTRIES) + 1):
            assert root_of(CT_ENTRIES[:size]).hex() == CT_ROOTS[size]
            assert root_from_leaf_hashes(CT_LEAVES[:size]).hex() == CT_ROOTS[size]
            assert subtree_root(CT_LEAVES, 0, size).hex() == CT_ROOTS[size]
            assert tree.root().hex() == CT_ROOTS[size]
            if size < len(CT_ENTRIES):
                tree.append(CT_ENTRIES[size])

    def test_every_complete_subtree(self) -> None:
        """subtree_root of each aligned power-of-two range is the published node hash."""
        for level, nodes in enumerate(CT_NODES):
            width = 1 << level
            for i, expected in enumerate(nodes):
                assert subtree_root(CT_LEAVES, i * width, (i + 1) * width).hex() == expected

    @pytest.mark.parametrize(("index", "size", "proof"), CT_INCLUSION)
    def test_published_inclusion_proofs(self, index: int, size: int, proof: list[str]) -> None:
        """The published audit paths are what we build, and they verify."""
        expected = [bytes.fromhex(h) for h in proof]
        assert inclusion_proof(CT_LEAVES, index, size) == expected
        assert verify_inclusion(CT_LEAVES[index], index, size, expected, bytes.fromhex(CT_ROOTS[size]))

    @pytest.mark.parametrize(("old", "new", "proof"), CT_CONSISTENCY)
    def test_published_consistency_proofs(self, old: int, new: int, proof: list[str]) -> None:
        """The published consistency proofs are what we build, and they verify."""
        expected = [bytes.fromhex(h) for h in proof]
        assert consistency_proof(CT_LEAVES, old, new) == expected
        old_root, new_root = bytes.fromhex(CT_ROOTS[old]), bytes.fromhex(CT_ROOTS[new])
        assert verify_consistency(old, new, old_root, new_root, expected)

    def test_every_proof_of_the_reference_tree(self) -> None:
        """Every inclusion and consistency proof within the 8 reference leaves verifies, and no forgery."""
        check_inclusion(CT_LEAVES)
        roots = [bytes.fromhex(h) for h in CT_ROOTS]
        for new in range(len(CT_LEAVES) + 1):
            for old in range(new + 1):
                check_consistency(CT_LEAVES, old, new, roots)


class TestMerkleTree:
    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.binary(max_size=40), max_size=100))
    def test_root_after_every_append(self, entries: list[bytes]) -> None:
        """After each append the root is the RFC's root of the entries so far, and asking does not change it."""
        tree = MerkleTree()
        by_leaf_hash = MerkleTree()
        assert tree.root() == EMPTY_ROOT
        for n, entry in enumerate(entries, 1):
            tree.append(entry)
            by_leaf_hash.append_leaf_hash(leaf_hash(entry))
            assert tree.size == by_leaf_hash.size == n
            assert tree.root() == tree.root() == root_of(entries[:n]) == by_leaf_hash.root()
        assert tree.size == len(entries)

    def test_every_size_to_300(self) -> None:
        """The frontier gives the RFC's root at every size up to 300 (past the 256 boundary)."""
        leaves = make_leaves(300)
        tree = MerkleTree()
        for n, leaf in enumerate(leaves, 1):
            tree.append_leaf_hash(leaf)
            assert tree.root() == ref_mth(leaves[:n]), n

    @pytest.mark.parametrize("bad", [b"", b"\x00" * 31, b"\x00" * 33, b"ab" * 32, "00" * 32, bytearray(32), None])
    def test_a_leaf_hash_that_is_not_32_bytes(self, bad: Any) -> None:
        """A leaf hash that is not 32 bytes is refused and leaves the tree as it was."""
        tree = MerkleTree()
        tree.append(b"x")
        root = tree.root()
        with pytest.raises(ValueError, match="32 bytes"):
            tree.append_leaf_hash(bad)
        assert (tree.size, tree.root()) == (1, root)


class TestInclusion:
    def test_every_index_of_every_size_to_70(self) -> None:
        """In trees of 1 to 70 leaves, every index's proof is the RFC's and verifies; no forgery does."""
        check_inclusion(make_leaves(70))

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.binary(max_size=16), min_size=1, max_size=70, unique=True))
    def test_any_entries(self, entries: list[bytes]) -> None:
        """Whatever the entries, every proof verifies and no forgery does."""
        check_inclusion([leaf_hash(entry) for entry in entries])

    def test_the_proof_does_not_bind_the_size(self) -> None:
        """Index 4's proof in a tree of 7 fits size 8 against root 7: sizes count only with their roots."""
        leaves = make_leaves(8)
        proof, root7 = inclusion_proof(leaves, 4, 7), root_from_leaf_hashes(leaves[:7])
        assert verify_inclusion(leaves[4], 4, 8, proof, root7)
        assert not verify_inclusion(leaves[4], 4, 8, proof, root_from_leaf_hashes(leaves))

    def test_a_store_sequence_is_read_by_index(self) -> None:
        """Proofs over a sequence that cannot slice read each leaf a bounded number of times."""
        leaves = make_leaves(1000)
        store = LeavesWithoutSlices(leaves)
        assert inclusion_proof(store, 345, 1000) == inclusion_proof(leaves, 345, 1000)
        assert store.reads <= 2 * 1000
        store.reads = 0
        assert consistency_proof(store, 345, 1000) == consistency_proof(leaves, 345, 1000)
        assert store.reads <= 2 * 1000
        store.reads = 0
        assert subtree_root(store, 512, 1000) == ref_mth(leaves[512:1000])
        assert store.reads <= 2 * 488


def fold_chunks(leaves: Sequence[bytes], start: int, end: int) -> bytes:
    roots = [ref_mth(list(leaves[j << level : (j + 1) << level])) for level, j in aligned_chunks(start, end)]
    acc = roots[-1]
    for left in reversed(roots[:-1]):
        acc = node_hash(left, acc)
    return acc


class TestRangesForStoredLevels:
    def test_audit_ranges_are_the_proofs_subtrees(self) -> None:
        """For every index of every size to 70, each audit range's root is the proof's element there."""
        leaves = make_leaves(70)
        for size in range(1, 71):
            for index in range(size):
                ranges = audit_ranges(index, size)
                assert [ref_mth(leaves[a:b]) for a, b in ranges] == inclusion_proof(leaves, index, size)

    def test_aligned_chunks_fold_to_each_range(self) -> None:
        """The complete aligned subtrees of every audit range (to size 300) fold to its root, and each
        chunk is complete and aligned."""
        leaves = make_leaves(300)
        for size in (1, 2, 3, 5, 8, 13, 64, 100, 255, 256, 257, 300):
            for index in range(0, size, 7):
                for start, end in audit_ranges(index, size):
                    chunks = aligned_chunks(start, end)
                    assert sum(1 << level for level, _ in chunks) == end - start
                    assert [level for level, _ in chunks] == sorted((level for level, _ in chunks), reverse=True)
                    assert fold_chunks(leaves, start, end) == ref_mth(leaves[start:end])

    def test_the_whole_tree_is_its_frontier(self) -> None:
        """[0, n) is one chunk per bit of n, largest first."""
        assert aligned_chunks(0, 13) == [(3, 0), (2, 2), (0, 12)]
        assert aligned_chunks(0, 1 << 20) == [(20, 0)]

    @pytest.mark.parametrize(("start", "end"), [(-1, 3), (3, 3), (5, 2), (1, 3), (2, 6)])
    def test_a_range_no_tree_visits(self, start: int, end: int) -> None:
        """Empty, negative and unaligned ranges are refused."""
        with pytest.raises(ValueError, match="range"):
            aligned_chunks(start, end)

    @pytest.mark.parametrize(("index", "size"), [(0, 0), (3, 3), (-1, 4)])
    def test_an_index_outside_the_tree(self, index: int, size: int) -> None:
        with pytest.raises(ValueError, match="not in a tree"):
            audit_ranges(index, size)


class TestConsistency:
    def test_every_pair_to_40(self) -> None:
        """Between every pair of sizes 0 <= old <= new <= 40 the proof is the RFC's and verifies; no forgery does."""
        leaves = make_leaves(40)
        roots = [ref_mth(leaves[:n]) for n in range(41)]
        for new in range(41):
            for old in range(new + 1):
                check_consistency(leaves, old, new, roots)

    @settings(max_examples=100, deadline=None)
    @given(st.data())
    def test_any_entries(self, data: st.DataObject) -> None:
        """Whatever the entries and sizes, the proof verifies and no forgery does."""
        entries = data.draw(st.lists(st.binary(max_size=16), min_size=1, max_size=40, unique=True))
        leaves = [leaf_hash(entry) for entry in entries]
        new = data.draw(st.integers(0, len(leaves)))
        old = data.draw(st.integers(0, new))
        check_consistency(leaves, old, new, [ref_mth(leaves[:n]) for n in range(len(leaves) + 1)])

    def test_the_proof_does_not_bind_the_new_size(self) -> None:
        """The proof from 5 to 7 fits 5 to 8 against root 7: sizes count only with their roots."""
        leaves = make_leaves(8)
        proof, root5 = consistency_proof(leaves, 5, 7), root_from_leaf_hashes(leaves[:5])
        assert verify_consistency(5, 8, root5, root_from_leaf_hashes(leaves[:7]), proof)
        assert not verify_consistency(5, 8, root5, root_from_leaf_hashes(leaves), proof)

    def test_trivial_cases(self) -> None:
        """Equal sizes need equal roots and no proof; size 0 needs the empty root and no proof."""
        root3 = root_from_leaf_hashes(CT_LEAVES[:3])
        root5 = root_from_leaf_hashes(CT_LEAVES[:5])
        assert verify_consistency(3, 3, root3, root3, [])
        assert not verify_consistency(3, 3, root3, root5, [])
        assert not verify_consistency(3, 3, root3, root3, [root3])
        assert verify_consistency(0, 5, EMPTY_ROOT, root5, [])
        assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
        assert not verify_consistency(0, 5, root3, root5, [])
        assert not verify_consistency(0, 5, EMPTY_ROOT, root5, [EMPTY_ROOT])
        assert not verify_consistency(0, 0, EMPTY_ROOT, root3, [])
        assert not verify_consistency(5, 3, root5, root3, [])


# -- malformed input ------------------------------------------------------------------------------

GOOD_ROOT = bytes.fromhex(CT_ROOTS[8])
GOOD_PROOF = [bytes.fromhex(h) for h in CT_INCLUSION[2][2]]  # index 5 of 8
NOT_HASHES = [b"", b"\x00" * 31, b"\x00" * 33, GOOD_ROOT.hex(), GOOD_ROOT.hex().encode(), bytearray(GOOD_ROOT), None, 5]
NOT_COUNTS = [-1, 2**64, 2**64 + 5, True, 5.0, "5", None]


class TestMalformedVerification:
    def test_the_good_case(self) -> None:
        """The arguments the malformed cases change verify as given (so each case tests one change)."""
        assert verify_inclusion(CT_LEAVES[5], 5, 8, GOOD_PROOF, GOOD_ROOT)

    @pytest.mark.parametrize(
        ("index", "size"), [(-1, 8), (8, 8), (9, 8), (0, 0), (5, -8), (5, 2**64), (True, 8), (5.0, 8), (5, "8")]
    )
    def test_index_and_size(self, index: Any, size: Any) -> None:
        """An index outside 0 <= index < size < 2**64, or not an int, is False."""
        assert verify_inclusion(CT_LEAVES[5], index, size, GOOD_PROOF, GOOD_ROOT) is False

    @pytest.mark.parametrize("bad", NOT_HASHES)
    def test_hashes(self, bad: Any) -> None:
        """A leaf, root or proof element that is not 32 bytes is False, for inclusion and consistency."""
        assert verify_inclusion(bad, 5, 8, GOOD_PROOF, GOOD_ROOT) is False
        assert verify_inclusion(CT_LEAVES[5], 5, 8, GOOD_PROOF, bad) is False
        assert verify_inclusion(CT_LEAVES[5], 5, 8, [GOOD_PROOF[0], bad, GOOD_PROOF[2]], GOOD_ROOT) is False
        proof = [bytes.fromhex(h) for h in CT_CONSISTENCY[2][2]]
        old_root, new_root = bytes.fromhex(CT_ROOTS[6]), GOOD_ROOT
        assert verify_consistency(6, 8, old_root, new_root, proof)
        assert verify_consistency(6, 8, bad, new_root, proof) is False
        assert verify_consistency(6, 8, old_root, bad, proof) is False
        assert verify_consistency(6, 8, old_root, new_root, [proof[0], bad, proof[2]]) is False
        assert verify_consistency(0, 8, bad, new_root, []) is False
        assert verify_consistency(8, 8, bad, bad, []) is False

    @pytest.mark.parametrize("proof", [None, GOOD_PROOF[0], b"".join(GOOD_PROOF), "ab" * 48, 3, iter(GOOD_PROOF)])
    def test_proof_that_is_no_list_of_hashes(self, proof: Any) -> None:
        """A proof that is not a sequence of hashes (one hash, their concatenation, an iterator) is False."""
        assert verify_inclusion(CT_LEAVES[5], 5, 8, proof, GOOD_ROOT) is False
        assert verify_consistency(6, 8, bytes.fromhex(CT_ROOTS[6]), GOOD_ROOT, proof) is False

    def test_an_empty_proof_that_is_bytes_or_text(self) -> None:
        """An empty bytes or str is no empty list of hashes, even for a tree of one leaf."""
        assert verify_inclusion(CT_LEAVES[0], 0, 1, [], CT_LEAVES[0])
        assert verify_inclusion(CT_LEAVES[0], 0, 1, b"", CT_LEAVES[0]) is False  # type: ignore[arg-type]
        assert verify_inclusion(CT_LEAVES[0], 0, 1, "", CT_LEAVES[0]) is False  # type: ignore[arg-type]

    def test_sizes_are_uint64(self) -> None:
        """A tree of 2**63 leaves verifies; at 2**64 (beyond RFC 9162's uint64) the same shape is False."""
        for bits in (63, 64):
            proof = make_leaves(bits, b"path")
            root = CT_LEAVES[0]
            for p in proof:  # the first leaf's path in a perfect tree: every sibling on the right
                root = node_hash(root, p)
            assert verify_inclusion(CT_LEAVES[0], 0, 2**bits, proof, root) is (bits == 63)

    @pytest.mark.parametrize("count", [0, 1, 2, 4, 5, 40])
    def test_proof_too_short_or_long(self, count: int) -> None:
        """A proof of any length but the right one is False."""
        proof = (GOOD_PROOF * 14)[:count]
        assert verify_inclusion(CT_LEAVES[5], 5, 8, proof, GOOD_ROOT) is False
        assert verify_consistency(6, 8, bytes.fromhex(CT_ROOTS[6]), GOOD_ROOT, proof) is False

    @pytest.mark.parametrize(("old", "new"), [(-1, 8), (6, -1), (9, 8), (6, 2**64), (True, 8), (6, 8.0), ("6", 8)])
    def test_consistency_sizes(self, old: Any, new: Any) -> None:
        """Sizes outside 0 <= old <= new < 2**64, or not ints, are False."""
        proof = [bytes.fromhex(h) for h in CT_CONSISTENCY[2][2]]
        assert verify_consistency(old, new, bytes.fromhex(CT_ROOTS[6]), GOOD_ROOT, proof) is False

    @settings(max_examples=300, deadline=None)
    @given(
        st.one_of(st.binary(max_size=40), st.none(), st.text(max_size=4)),
        st.one_of(st.integers(-3, 2**65), st.booleans(), st.floats(), st.none()),
        st.one_of(st.integers(-3, 2**65), st.booleans(), st.none()),
        st.one_of(st.lists(st.binary(min_size=31, max_size=33), max_size=70), st.binary(), st.none(), st.text()),
        st.one_of(st.binary(min_size=31, max_size=33), st.none()),
    )
    def test_never_raises(self, a: Any, b: Any, c: Any, proof: Any, d: Any) -> None:
        """Whatever the arguments, verification answers True or False."""
        assert verify_inclusion(a, b, c, proof, d) in (True, False)
        assert verify_consistency(b, c, a, d, proof) in (True, False)


class TestMalformedProofRequests:
    @pytest.mark.parametrize(
        ("index", "size", "message"),
        [
            (-1, 8, "index must not be negative"),
            (8, 8, "index 8 is not in a tree of size 8"),
            (0, 0, "index 0 is not in a tree of size 0"),
            (0, 9, "size 9 is beyond the 8 leaf hashes given"),
            (0, -1, "size must not be negative"),
        ],
    )
    def test_inclusion_proof(self, index: int, size: int, message: str) -> None:
        """An index or size outside 0 <= index < size <= len(leaves) is a ValueError saying which."""
        with pytest.raises(ValueError, match=message):
            inclusion_proof(CT_LEAVES, index, size)

    @pytest.mark.parametrize(
        ("old", "new", "message"),
        [
            (5, 3, "old_size 5 is larger than new_size 3"),
            (0, 9, "new_size 9 is beyond the 8 leaf hashes given"),
            (-1, 3, "old_size must not be negative"),
        ],
    )
    def test_consistency_proof(self, old: int, new: int, message: str) -> None:
        """Sizes outside 0 <= old <= new <= len(leaves) are a ValueError saying which."""
        with pytest.raises(ValueError, match=message):
            consistency_proof(CT_LEAVES, old, new)

    def test_subtree_root(self) -> None:
        """A range outside 0 <= start <= end <= len(leaves) is a ValueError saying which."""
        with pytest.raises(ValueError, match="start 5 is after end 3"):
            subtree_root(CT_LEAVES, 5, 3)
        with pytest.raises(ValueError, match="end 9 is beyond"):
            subtree_root(CT_LEAVES, 0, 9)

    def test_a_count_that_is_not_an_int(self) -> None:
        """An index or size that is not an int is a TypeError."""
        with pytest.raises(TypeError, match="index must be an int"):
            inclusion_proof(CT_LEAVES, 1.0, 8)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="new_size must be an int"):
            consistency_proof(CT_LEAVES, 1, True)

    def test_leaf_hashes_of_the_wrong_length(self) -> None:
        """Hex digests (64 bytes) instead of the 32 bytes are a ValueError, from every builder."""
        hex_leaves = [leaf.hex().encode() for leaf in CT_LEAVES]
        with pytest.raises(ValueError, match=r"leaf hashes must be 32 bytes; got lengths \[64\]"):
            inclusion_proof(hex_leaves, 0, 8)
        with pytest.raises(ValueError, match="must be 32 bytes"):
            consistency_proof(hex_leaves, 3, 8)
        with pytest.raises(ValueError, match="must be 32 bytes"):
            root_from_leaf_hashes(hex_leaves)
        with pytest.raises(ValueError, match="must be 32 bytes"):
            subtree_root([*CT_LEAVES, b"short"], 4, 9)


class TestExtend:
    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.binary(min_size=32, max_size=32), max_size=70), st.integers(0, 70))
    def test_extend_is_append_in_a_loop(self, entries: list[bytes], split: int) -> None:
        """Extending in two goes gives the roots appending one by one gives."""
        one, two = MerkleTree(), MerkleTree()
        for entry in entries:
            one.append(entry)
        two.extend(entries[:split])
        two.extend(entries[split:])
        assert (two.size, two.root()) == (one.size, one.root()) == (len(entries), root_of(entries))

    def test_an_entry_of_another_length_stops_it(self) -> None:
        tree = MerkleTree()
        with pytest.raises(ValueError, match="32-byte entries"):
            tree.extend([b"a" * 32, b"short", b"b" * 32])
        assert tree.size == 1
        assert tree.root() == root_of([b"a" * 32])
