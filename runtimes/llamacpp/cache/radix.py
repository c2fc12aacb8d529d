"""A radix tree over token ids: which owners (slots, saved sequences) hold which prefixes.

Pure Python, no llama.cpp: the prefix cache (:mod:`.prefix`) asks it for the
longest held prefix of a prompt and everyone holding it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

log = logging.getLogger(__name__)


class _Node:
    __slots__ = ("edge", "children", "owners", "parent")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None) -> None:
        self.edge = edge  # token ids on the edge from the parent
        self.children: dict[int, _Node] = {}  # keyed by the first token of the child's edge
        self.owners: set[int] = set()  # owners whose sequence covers this node's whole edge
        self.parent = parent


def _match(edge: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    """How many leading tokens of ``edge`` equal ``tokens[start:]``."""
    n = min(len(edge), len(tokens) - start)
    if tuple(tokens[start : start + n]) == edge[:n]:
        return n
    i = 0
    while i < n and edge[i] == tokens[start + i]:
        i += 1
    return i


class RadixIndex:
    """Token-id radix tree: each owner (an int) holds one sequence; query the longest prefix.

    Every node lists the owners whose sequence runs through it, so the deepest node a
    prompt reaches names every owner sharing that prefix. Nodes nobody owns are pruned.
    """

    def __init__(self) -> None:
        self._root = _Node((), None)
        self._end: dict[int, _Node] = {}

    def __contains__(self, owner: int) -> bool:
        return owner in self._end

    def set(self, owner: int, tokens: Sequence[int]) -> None:
        """Make ``owner`` hold ``tokens`` (replacing what it held)."""
        self.discard(owner)
        if not tokens:
            return
        node, i, n = self._root, 0, len(tokens)
        while i < n:
            child = node.children.get(tokens[i])
            if child is None:
                child = _Node(tuple(tokens[i:]), node)
                node.children[tokens[i]] = child
                node = child
                break
            k = _match(child.edge, tokens, i)
            if k < len(child.edge):
                child = self._split(child, k)
            node, i = child, i + k
        self._end[owner] = node
        while node is not self._root:
            node.owners.add(owner)
            node = cast(_Node, node.parent)  # only the root has none

    def discard(self, owner: int) -> None:
        node = self._end.pop(owner, None)
        while node is not None and node is not self._root:
            node.owners.discard(owner)
            parent = cast(_Node, node.parent)  # only the root has none
            if not node.owners:  # nobody passes here: the whole subtree is unowned
                del parent.children[node.edge[0]]
            elif len(node.children) == 1:
                self._merge(node)
            node = parent

    def longest(self, tokens: Sequence[int]) -> tuple[int, frozenset[int]]:
        """(length of the longest held prefix of ``tokens``, the owners holding it)."""
        owners: frozenset[int]
        node, i, owners = self._root, 0, frozenset()
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _match(child.edge, tokens, i)
            i, owners = i + k, frozenset(child.owners)
            if k < len(child.edge):
                break
            node = child
        return i, owners

    def whole(self, tokens: Sequence[int], limit: int) -> tuple[int, frozenset[int]]:
        """(length, owners) of the longest held sequences that are themselves a prefix of
        ``tokens``, at most ``limit`` long: for saved states that restore only whole."""
        best: tuple[int, frozenset[int]]
        node, i, best = self._root, 0, (0, frozenset())
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _match(child.edge, tokens, i)
            if k < len(child.edge) or i + k > limit:
                break
            node, i = child, i + k
            ending = frozenset(o for o in node.owners if self._end.get(o) is node)
            if ending:
                best = (i, ending)
        return best

    def node_count(self) -> int:
        stack, count = [self._root], 0
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    @staticmethod
    def _split(child: _Node, k: int) -> _Node:
        parent = cast(_Node, child.parent)  # a child: never the root
        upper = _Node(child.edge[:k], parent)
        upper.owners = set(child.owners)
        parent.children[child.edge[0]] = upper
        child.edge, child.parent = child.edge[k:], upper
        upper.children[child.edge[0]] = child
        return upper

    def _merge(self, node: _Node) -> None:
        """Fold a single child into ``node`` when no owner ends at ``node`` (keeps the tree small)."""
        (child,) = node.children.values()
        if child.owners != node.owners:
            return
        node.edge += child.edge
        node.children = child.children
        for grandchild in node.children.values():
            grandchild.parent = node
        for owner, end in self._end.items():
            if end is child:
                self._end[owner] = node
