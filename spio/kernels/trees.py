"""Predictions of a trained XGBoost regression-tree ensemble, computed with numpy alone.

spio's performance models are trained by XGBoost (scripts/train_perf_model.py) and shipped as
XGBoost's UBJSON model files. Using one needs only its trees: `read_ubjson` decodes the file,
`TreeEnsemble.from_model` checks the trees and lays them out as flat arrays, and `predict`
walks every tree for every row at once. So a user installs no xgboost (with its GPU build,
several hundred MB), and a damaged file is an error here where XGBoost loaded some only to crash
the process in its prediction.

`predict` computes what XGBoost's CPU predictor does, in its arithmetic: features and split
values as float32, a row goes to the left child where its feature is below the split value (a
NaN feature where the node says, `default_left`), and the leaf values are added to the
intercept one tree after another, in float32. tests/kernels/test_trees.py compares it with
xgboost's own predictions.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: UBJSON's numeric type markers and their big-endian layouts (struct's format codes): numpy
#: reads the packed arrays, struct a single number (several times faster).
_LAYOUTS = {"i": ">b", "U": ">B", "I": ">h", "l": ">i", "L": ">q", "d": ">f", "D": ">d"}
_NUMBERS: dict[int, np.dtype] = {ord(m): np.dtype(f) for m, f in _LAYOUTS.items()}
_SCALARS: dict[int, struct.Struct] = {ord(m): struct.Struct(f) for m, f in _LAYOUTS.items()}
_MAX_NESTING = 64
#: Markers of values that take no bytes (null, true, false; no-op): a typed container of them
#: could claim a count as large as the bytes left for each of many nested containers, a crafted
#: file of n bytes asking ~n^2/16 elements (32 KB: 15 s and 527 MB). xgboost writes none.
_EMPTY_MARKERS = frozenset(map(ord, "ZTFN"))
#: Errors of a model's fields missing or of another type (a list where a dict belongs, an
#: infinite count): its trees do not read.
_UNREADABLE = (KeyError, TypeError, IndexError, AttributeError, OverflowError)


class _Reader:
    """A cursor over UBJSON bytes (https://ubjson.org, as XGBoost writes its models)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.pos = 0

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if count < 0 or end > len(self.data):
            raise ValueError(f"UBJSON ends early: {count} bytes wanted at offset {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def marker(self) -> int:
        while True:
            byte = self.take(1)[0]
            if byte != ord("N"):  # no-op
                return byte

    def number(self, marker: int) -> int | float:
        layout = _SCALARS[marker]
        return layout.unpack(self.take(layout.size))[0]

    def length(self) -> int:
        marker = self.marker()
        if marker not in _NUMBERS or _NUMBERS[marker].kind not in "iu":
            raise ValueError(f"UBJSON length of type {chr(marker)!r} at offset {self.pos - 1}")
        count = int(self.number(marker))
        if count < 0 or count > len(self.data) - self.pos:  # each element takes a byte at least
            raise ValueError(f"UBJSON length {count} past the data's end at offset {self.pos}")
        return count

    def value(self, marker: int, depth: int = 0) -> Any:
        if marker in _NUMBERS:
            return self.number(marker)
        if marker == ord("S") or marker == ord("H"):  # string; high-precision number as text
            text = self.take(self.length()).decode("utf-8")
            return text if marker == ord("S") else float(text)
        if marker == ord("C"):
            return self.take(1).decode("ascii")
        if marker in (ord("T"), ord("F")):
            return marker == ord("T")
        if marker == ord("Z"):
            return None
        if marker in (ord("["), ord("{")):
            if depth >= _MAX_NESTING:
                raise ValueError(f"UBJSON nested deeper than {_MAX_NESTING} at offset {self.pos}")
            return self.container(marker == ord("{"), depth + 1)
        raise ValueError(f"UBJSON marker {marker:#04x} unknown at offset {self.pos - 1}")

    def container(self, is_object: bool, depth: int) -> Any:
        typed = count = None
        if self.data[self.pos : self.pos + 1] == b"$":
            self.pos += 1
            typed = self.marker()
            if typed in _EMPTY_MARKERS:  # elements of no bytes: the count bounds nothing
                raise ValueError(
                    f"UBJSON typed container of {chr(typed)!r} (elements of no bytes) at offset "
                    f"{self.pos - 1}"
                )
            if self.take(1) != b"#":
                raise ValueError(f"UBJSON typed container without a count at offset {self.pos}")
            count = self.length()
        elif self.data[self.pos : self.pos + 1] == b"#":
            self.pos += 1
            count = self.length()
        if not is_object and typed in _NUMBERS:  # a packed array: one read
            dtype = _NUMBERS[typed]
            assert count is not None
            raw = self.take(count * dtype.itemsize)
            return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
        items: Any = {} if is_object else []
        index = 0
        while count is None or index < count:
            if count is None:
                end = self.marker()
                if end == ord("}" if is_object else "]"):
                    return items
                self.pos -= 1  # not the end: the marker belongs to the next item
            if is_object:
                key = self.take(self.length()).decode("utf-8")
            element = self.value(self.marker() if typed is None else typed, depth)
            if is_object:
                items[key] = element
            else:
                items.append(element)
            index += 1
        return items


def read_ubjson(data: bytes) -> Any:
    """The value UBJSON `data` holds (dicts, lists, numpy arrays for packed numeric arrays,
    numbers, strings); ValueError where the bytes are not one well-formed value."""
    reader = _Reader(data)
    try:
        value = reader.value(reader.marker())
    except ValueError as error:  # (UnicodeDecodeError among them)
        raise ValueError(f"not a UBJSON model: {error}") from None
    if reader.pos != len(reader.data):
        raise ValueError(f"not a UBJSON model: {len(reader.data) - reader.pos} bytes after it")
    return value


@dataclass(frozen=True, eq=False)
class TreeEnsemble:
    """An XGBoost gbtree regression model's trees as flat arrays over all their nodes.

    A leaf's children are itself, so that walking `depth` steps from the roots ends at each
    tree's leaf however deep it lies."""

    n_features: int
    intercept: np.float32
    roots: np.ndarray  # (trees,) node index of each tree's root
    children: np.ndarray  # (2 * nodes,) the next node: [2i] where a row goes left, [2i + 1] right
    feature: np.ndarray  # (nodes,) the feature a node splits on (0 at leaves)
    threshold: np.ndarray  # (nodes,) float32 split value
    default_left: np.ndarray  # (nodes,) where a NaN feature goes
    leaf_value: np.ndarray  # (nodes,) float32 value of a leaf (0 elsewhere)
    depth: int  # the most splits from a root to a leaf

    @classmethod
    def from_model(cls, model: Mapping) -> TreeEnsemble:
        """The ensemble of an XGBoost model as read from its UBJSON or JSON file; ValueError
        naming what is missing or unsafe: another booster or objective than a single-output
        squared-error gbtree, categorical splits, or a node whose children are not later
        nodes of its tree or that splits on a feature the model does not take."""
        try:
            learner = model["learner"]
            params = learner["learner_model_param"]
            n_features = int(params["num_feature"])
            intercept = _intercept(params["base_score"])
            targets, classes = int(params.get("num_target", 1)), int(params.get("num_class", 0))
            if targets != 1 or classes != 0:
                raise ValueError(f"a model of more than one output ({targets} targets, "
                                 f"{classes} classes)")  # fmt: skip
            objective = learner["objective"]["name"]
            if objective != "reg:squarederror":
                raise ValueError(f"objective {objective!r}, not reg:squarederror")
            booster = learner["gradient_booster"]
            if booster.get("name") != "gbtree":
                raise ValueError(f"booster {booster.get('name')!r}, not gbtree")
            trees = booster["model"]["trees"]
            count = int(booster["model"]["gbtree_model_param"]["num_trees"])
            if count != len(trees):
                raise ValueError(f"its tree count {count} disagrees with its {len(trees)} trees")
            outputs = booster["model"]["tree_info"]
            if not isinstance(outputs, (list, np.ndarray)):
                raise TypeError(f"tree_info is a {type(outputs).__name__}, not a list")
            if len(outputs) != len(trees):
                raise ValueError(f"{len(outputs)} trees' outputs named for its {len(trees)} trees")
            number = next((i for i, o in enumerate(outputs) if np.any(np.asarray(o) != 0)), None)
            if number is not None:
                raise ValueError(f"tree {number} of output {outputs[number]!r}, not of the one (0)")
            return cls._of_trees(trees, n_features, intercept)
        except _UNREADABLE as error:
            raise ValueError(f"its trees do not read ({type(error).__name__}: {error})") from None

    @classmethod
    def _of_trees(cls, trees: list, n_features: int, intercept: np.float32) -> TreeEnsemble:
        if not trees:
            raise ValueError("a model without trees")
        # The trees' columns, read tree by tree (so that one tree's odd values change no other
        # tree's), up to the first that does not read; its error comes after those of the trees
        # before it, so that the first tree at fault is the one named.
        read: list[tuple[np.ndarray, ...]] = []
        unread: Exception | None = None
        for number, tree in enumerate(trees):
            try:
                read.append(_tree_columns(number, tree))
            except (ValueError, *_UNREADABLE) as error:
                unread = error
                break
        if unread is not None and not read:
            raise unread
        ensemble = cls._checked(read, n_features, intercept)
        if unread is not None:
            raise unread
        return ensemble

    @classmethod
    def _checked(
        cls, trees: list[tuple[np.ndarray, ...]], n_features: int, intercept: np.float32
    ) -> TreeEnsemble:
        """The ensemble of trees' columns (_tree_columns), checked all at once; ValueError naming
        the first tree with a node that links or splits out of its tree or has two parents."""
        # Every tree's nodes in one array (a tree's node i at its root's index + i), and for
        # each node: its tree, its tree's root and its tree's size.
        left, right, split, condition, default_left, categorical = (
            np.concatenate(column) for column in zip(*trees, strict=True)
        )
        sizes = [len(columns[0]) for columns in trees]
        roots = np.cumsum(sizes, dtype=np.intp) - sizes
        tree_of = np.repeat(np.arange(len(sizes)), sizes)
        root_of = roots[tree_of]
        size_of = np.asarray(sizes)[tree_of]
        nodes = np.arange(len(tree_of))
        leaf = left == -1
        inner = ~leaf
        # A leaf value that is not finite makes every prediction through it NaN or inf, which
        # ranks configs in their given order, silently (xgboost writes none).
        bad_leaf = leaf & ~np.isfinite(condition)
        if bad_leaf.any():
            node = int(np.argmax(bad_leaf))
            raise ValueError(
                f"tree {int(tree_of[node])} has a leaf of value {condition[node]} (node "
                f"{int(node - roots[tree_of[node]])}), not a finite number"
            )

        # A node that links or splits out of its tree: a leaf with a right child, a child that
        # is not a later node of the tree, a feature the model does not take, a categorical split.
        local = nodes - root_of
        out = leaf & (right != -1)
        out |= inner & ~((left > local) & (left < size_of) & (right > local) & (right < size_of))
        out |= inner & ((split < 0) | (split >= n_features) | categorical)
        first_out = int(tree_of[np.argmax(out)]) if out.any() else len(sizes)
        # Each node is the child of one node before it (so not the root), or of none: the root,
        # and nodes a pruning left behind (xgboost's `num_deleted`), which no walk from the root
        # meets. (Counted in the trees before the first that links out: their links are sound.)
        parent = np.flatnonzero(inner & (tree_of < first_out))
        child = np.concatenate([left[parent], right[parent]]) + np.tile(root_of[parent], 2)
        parent = np.tile(parent, 2)
        shared = np.bincount(child, minlength=len(nodes)) > 1
        first_shared = int(tree_of[np.argmax(shared)]) if shared.any() else len(sizes)
        if first_shared < first_out:
            node = int(local[np.argmax(shared)])
            raise ValueError(f"tree {first_shared} has a node with two parents (node {node})")
        if first_out < len(sizes):
            node = int(local[np.argmax(out)])
            raise ValueError(f"tree {first_out} has a node that links or splits out of the tree "
                             f"(node {node})")  # fmt: skip

        # Each node's level (its count of ancestors) by pointer jumping: `up` is an ancestor of
        # the node (-1: none left) `hops` levels up; each round doubles the hops, so that
        # log2(depth) rounds find every level, however deep a tree.
        up = np.full(len(nodes), -1)
        up[child] = parent
        hops = (up >= 0).astype(np.int64)
        while (going := np.flatnonzero(up >= 0)).size:
            ancestor = up[going]
            hops[going] += hops[ancestor]
            up[going] = up[ancestor]
        return cls(
            n_features=n_features,
            intercept=intercept,
            roots=roots,
            children=np.stack(
                [np.where(leaf, nodes, left + root_of), np.where(leaf, nodes, right + root_of)],
                axis=1,
            ).ravel(),
            feature=np.where(leaf, 0, split),
            threshold=condition,
            default_left=default_left,
            leaf_value=np.where(leaf, condition, np.float32(0)).astype(np.float32),
            depth=int(hops.max()),
        )

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """float32 predictions of each row of `rows` (rows × n_features)."""
        x = np.asarray(rows, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"rows of {self.n_features} features wanted, got shape {x.shape}")
        flat = x.ravel()
        base = (np.arange(len(x)) * self.n_features)[:, None]
        node = np.broadcast_to(self.roots, (len(x), len(self.roots)))
        nan = bool(np.isnan(flat).any())
        for _ in range(self.depth):
            value = flat.take(base + self.feature.take(node))
            go_right = ~(value < self.threshold.take(node))
            if nan:
                go_right &= ~(np.isnan(value) & self.default_left.take(node))
            node = self.children.take(2 * node + go_right)
        terms = np.empty((len(x), len(self.roots) + 1), dtype=np.float32)
        terms[:, 0] = self.intercept
        terms[:, 1:] = self.leaf_value.take(node)
        # One tree after another, in float32, as XGBoost adds them (cumsum adds in order).
        # (A sum past float32's range is inf, which callers refuse, without numpy's warning.)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]


_COLUMNS = ("left_children", "right_children", "split_indices", "split_conditions",
            "default_left", "split_type")  # fmt: skip


def _tree_columns(number: int, tree: Mapping) -> tuple[np.ndarray, ...]:
    """Tree `number`'s left and right children and split features (int64), split values
    (float32), default sides and categorical flags (bool), one value a node; ValueError where
    its arrays are not its node count long."""
    size = int(tree["tree_param"]["num_nodes"])
    arrays = [np.asarray(tree[c]) for c in _COLUMNS]
    if size < 1 or any(a.shape != (size,) for a in arrays):
        raise ValueError(f"tree {number} has arrays of other lengths than its {size} nodes")
    left, right, split = (a.astype(np.int64) for a in arrays[:3])
    return left, right, split, arrays[3].astype(np.float32), *(a.astype(bool) for a in arrays[4:])


def _intercept(base_score: Any) -> np.float32:
    """The model's intercept from its `base_score`: '5E-1' as older XGBoost writes it, or
    '[-2.7516245E1]', a one-element list, as XGBoost 3 does."""
    text = str(base_score).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    values = [float(v) for v in text.split(",")]
    if len(values) != 1:
        raise ValueError(f"an intercept of {len(values)} values")
    with np.errstate(over="ignore"):  # (1e39 is inf as float32: refused below, not warned of)
        intercept = np.float32(values[0])
    if not np.isfinite(intercept):
        raise ValueError(f"an intercept of {values[0]}, not a finite number")
    return intercept
