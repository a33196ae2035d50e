"""spio.kernels.trees: spio's own reading and evaluation of XGBoost models, against xgboost."""

import copy
import json
import random

import numpy as np
import pytest

from spio.kernels import perf_model as pm
from spio.kernels.conv2d_gw8_params import Conv2dGw8Params
from spio.kernels.trees import TreeEnsemble, read_ubjson

xgboost = pytest.importorskip("xgboost")  # a test dependency: spio itself does not need it

SHIPPED = sorted(pm.PACKAGED_MODELS_DIR.glob("sm_*/**/*.ubj"))


def _booster(path_or_bytes) -> "xgboost.Booster":
    source = path_or_bytes if isinstance(path_or_bytes, str) else bytearray(path_or_bytes)
    booster = xgboost.Booster(model_file=source)
    booster.set_param({"nthread": 1})
    return booster


def _ensemble(raw: bytes) -> TreeEnsemble:
    return TreeEnsemble.from_model(read_ubjson(raw))


def _layer_rows(family: str) -> np.ndarray:
    """The feature rows spio ranks: every config of a spread of layers and batch sizes."""
    fam = pm.FAMILIES[family]
    rows = []
    layers = [(1, 8, 7, 1, 0), (16, 64, 56, 3, 1), (128, 64, 64, 3, 1), (32, 256, 16, 5, 2),
              (7, 96, 19, 2, 3), (256, 1024, 7, 3, 1)]  # fmt: skip
    for n, c, hw, rs, pad in layers:
        params = Conv2dGw8Params(n, c, hw, hw + 1, padding=pad, r=rs, s=rs)
        rows.append(pm.features(fam, params, fam.configs(params)))
    return np.concatenate(rows)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shipped_models_predict_exactly_what_xgboost_does(path):
    """Bit for bit, on the rows spio ranks and on random rows with missing values (NaN)."""
    ours = _ensemble(path.read_bytes())
    theirs = _booster(str(path))
    rows = _layer_rows(pm.read_meta(path.with_suffix(".json"))["family"])
    rng = np.random.default_rng(0)
    noise = rng.choice(ours.threshold, size=(3000, ours.n_features)).astype(np.float32)
    noise[rng.random(noise.shape) < 0.05] = np.nan
    for x in (rows, noise):
        got = ours.predict(x)
        want = theirs.inplace_predict(x, validate_features=False)
        assert got.dtype == np.float32 and np.array_equal(got, want)
    # The pick of a layer: the same config first as xgboost's prediction ranks.
    assert np.argmin(ours.predict(rows[:50])) == np.argmin(theirs.inplace_predict(rows[:50]))


def test_a_model_trained_with_missing_values_and_an_old_intercept():
    """Missing values send rows to each node's default side, which xgboost learns from data with
    NaNs (both sides occur); a model whose base_score is a plain number (xgboost before 3) reads
    as one."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = np.nan
    y = np.nan_to_num(x[:, 0], nan=-1.0) * 2 + np.where(np.isnan(x[:, 1]), 3.0, x[:, 1])
    booster = xgboost.train(
        {"objective": "reg:squarederror", "max_depth": 5, "eta": 0.3, "nthread": 1},
        xgboost.DMatrix(x, label=y),
        num_boost_round=20,
    )
    raw = bytes(booster.save_raw("ubj"))
    ours = _ensemble(raw)
    assert ours.default_left.any() and not ours.default_left.all()
    probe = rng.normal(size=(2000, 5)).astype(np.float32)
    probe[rng.random(probe.shape) < 0.3] = np.nan
    assert np.array_equal(ours.predict(probe), booster.inplace_predict(probe))

    model = json.loads(bytes(booster.save_raw("json")))
    model["learner"]["learner_model_param"]["base_score"] = "5E-1"
    old = TreeEnsemble.from_model(model)  # (JSON reads too: the same structure)
    assert old.intercept == np.float32(0.5)
    shifted = old.predict(probe) - ours.predict(probe)
    assert np.allclose(shifted, 0.5 - ours.intercept, atol=1e-5)


def test_a_pruned_model_keeps_its_deleted_nodes_unread():
    """xgboost's exact method with a minimum split gain prunes nodes and keeps them in the file
    (`num_deleted`), parentless: they are never reached, and the predictions are xgboost's."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6)).astype(np.float32)
    y = x[:, 0] * 3 + np.sin(x[:, 1]) + rng.normal(size=600) * 0.1
    booster = xgboost.train(
        {"nthread": 1, "tree_method": "exact", "max_depth": 8, "gamma": 5.0},
        xgboost.DMatrix(x, label=y),
        30,
    )
    model = json.loads(bytes(booster.save_raw("json")))
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    assert any(int(t["tree_param"]["num_deleted"]) for t in trees)
    probe = rng.normal(size=(2000, 6)).astype(np.float32)
    ours = _ensemble(bytes(booster.save_raw("ubj"))).predict(probe)
    assert np.array_equal(ours, booster.inplace_predict(probe))


def _model_json(path) -> dict:
    return json.loads(bytes(_booster(str(path)).save_raw("json")))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("child past the end", "links or splits out of the tree"),
        ("own child", "links or splits out of the tree"),
        ("child before its parent", "links or splits out of the tree"),
        ("two parents", "a node with two parents"),
        ("feature out of range", "links or splits out of the tree"),
        ("categorical split", "links or splits out of the tree"),
        ("short array", "arrays of other lengths"),
        ("tree count", r"tree count 7 disagrees with its \d+ trees"),
        ("two outputs", r"more than one output \(2 targets, 0 classes\)"),
        ("tree of another output", r"tree 3 of output 1, not of the one"),
        ("outputs short", r"\d+ trees' outputs named for its \d+ trees"),
        ("objective", "not reg:squarederror"),
        ("booster", "not gbtree"),
        ("no trees", "without trees"),
        ("missing field", "do not read"),
        ("booster not an object", "do not read"),
        ("infinite node count", "do not read"),
        ("intercept", "intercept of 2 values"),
    ],
)
def test_unsafe_or_foreign_models_are_refused_by_name(damage, message):
    """Each a ValueError naming the problem, never a crash or a silently wrong prediction:
    XGBoost loaded trees whose children point outside them and crashed predicting (SIGSEGV)."""
    model = _model_json(SHIPPED[0])
    learner = model["learner"]
    trees = learner["gradient_booster"]["model"]["trees"]
    tree = trees[0]
    inner = tree["left_children"].index(next(c for c in tree["left_children"] if c > 1))
    if damage == "child past the end":
        tree["left_children"][0] = 10**6
    elif damage == "own child":
        tree["right_children"][0] = 0
    elif damage == "child before its parent":
        tree["left_children"][inner] = 1
    elif damage == "two parents":
        tree["right_children"][0] = tree["left_children"][0]
    elif damage == "feature out of range":
        tree["split_indices"][0] = 10**3
    elif damage == "categorical split":
        tree["split_type"][0] = 1
    elif damage == "short array":
        tree["split_conditions"].pop()
    elif damage == "tree count":
        learner["gradient_booster"]["model"]["gbtree_model_param"]["num_trees"] = "7"
    elif damage == "two outputs":
        learner["learner_model_param"]["num_target"] = "2"
    elif damage == "tree of another output":
        learner["gradient_booster"]["model"]["tree_info"][3] = 1
    elif damage == "outputs short":
        learner["gradient_booster"]["model"]["tree_info"].pop()
    elif damage == "objective":
        learner["objective"]["name"] = "binary:logistic"
    elif damage == "booster":
        learner["gradient_booster"]["name"] = "gblinear"
    elif damage == "no trees":
        trees.clear()
        learner["gradient_booster"]["model"]["gbtree_model_param"]["num_trees"] = "0"
        learner["gradient_booster"]["model"]["tree_info"] = []
    elif damage == "missing field":
        del tree["default_left"]
    elif damage == "booster not an object":
        learner["gradient_booster"] = "gbtree"
    elif damage == "infinite node count":
        tree["tree_param"]["num_nodes"] = float("inf")  # (a UBJSON float where an int belongs)
    else:
        learner["learner_model_param"]["base_score"] = "[1E0,2E0]"
    with pytest.raises(ValueError, match=message):
        TreeEnsemble.from_model(model)


def _damage(tree: dict, damage: str) -> int | None:
    """Damages `tree` (a model's JSON) as `damage` says; returns the node the refusal names (None
    for a short array or a missing field)."""
    if damage == "own child":
        tree["left_children"][0] = 0
        return 0
    if damage == "two parents":
        tree["right_children"][0] = tree["left_children"][0]
        return tree["left_children"][0]
    if damage == "short array":
        tree["split_type"].pop()
        return None
    if damage == "missing field":
        del tree["default_left"]
        return None
    if damage == "leaf child":
        leaf = tree["left_children"].index(-1)
        tree["right_children"][leaf] = leaf + 1
        return leaf
    if damage == "child far past the end":  # (counted as a parent: a 10^12-entry count)
        tree["left_children"][0] = 10**12
    else:  # a negative child
        tree["right_children"][0] = -5
    return 0


@pytest.mark.parametrize("damage", ["own child", "two parents", "short array", "leaf child"])
def test_a_damaged_later_tree_is_named(damage):
    """All trees' nodes are checked together: the error names the damaged tree, here the 8th,
    not the first nor one beside it, and the node at fault by its number in that tree; the
    trees before the damage read as they are."""
    model = _model_json(SHIPPED[0])
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    node = _damage(trees[7], damage)
    with pytest.raises(ValueError, match=r"^tree 7 has ") as raised:
        TreeEnsemble.from_model(model)
    assert node is None or str(raised.value).endswith(f"(node {node})")
    del trees[7:]
    model["learner"]["gradient_booster"]["model"]["gbtree_model_param"]["num_trees"] = "7"
    del model["learner"]["gradient_booster"]["model"]["tree_info"][7:]
    assert len(TreeEnsemble.from_model(model).roots) == 7


@pytest.mark.parametrize(
    "first, later",
    [("own child", "short array"), ("own child", "missing field"), ("two parents", "own child"),
     ("own child", "two parents"), ("child far past the end", "two parents"),
     ("negative child", "own child")],
)  # fmt: skip
def test_of_two_damaged_trees_the_first_is_named(first, later):
    """Whatever is wrong with each, the first tree at fault is the one named, as a tree by tree
    check names it: tree 2 here, not tree 5 (whose fault another check finds first)."""
    model = _model_json(SHIPPED[0])
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    _damage(trees[2], first)
    _damage(trees[5], later)
    with pytest.raises(ValueError, match=r"^tree 2 has "):
        TreeEnsemble.from_model(model)


def test_a_tree_of_odd_values_changes_no_other_tree():
    """Each tree's columns are converted on their own: default sides written as strings in one
    tree (a hand-made file) leave every other tree's as they were."""
    model = _model_json(SHIPPED[0])
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    want = TreeEnsemble.from_model(copy.deepcopy(model)).default_left
    trees[3]["default_left"] = [str(v) for v in trees[3]["default_left"]]
    got = TreeEnsemble.from_model(model)
    in_tree_3 = slice(got.roots[3], got.roots[4])
    assert np.array_equal(np.delete(got.default_left, in_tree_3), np.delete(want, in_tree_3))


def test_a_deep_tree_loads_quickly_and_predicts_by_its_deepest_leaf():
    """A chain of 20,000 splits (each a leaf and a deeper split; no limit on depth in the format)
    has depth 20,000 and predicts by its deepest leaf. Its levels are found by pointer jumping
    (15 rounds); a round a level, as first written, took 6.3 s on a reviewer's run: the bound
    below is 100 times what this takes."""
    import time

    depth = 20_000
    size = 2 * depth + 1
    left, right = np.full(size, -1), np.full(size, -1)
    left[0 : 2 * depth : 2] = np.arange(1, 2 * depth, 2)  # leaves at odd nodes
    right[0 : 2 * depth : 2] = np.arange(2, 2 * depth + 1, 2)
    value = np.arange(size, dtype=np.float32)  # a split's value; a leaf's: its node number
    tree = {"tree_param": {"num_nodes": str(size)}, "left_children": left,
            "right_children": right, "split_indices": np.zeros(size, dtype=int),
            "split_conditions": value, "default_left": np.zeros(size, dtype=bool),
            "split_type": np.zeros(size, dtype=int)}  # fmt: skip
    model = _model_json(SHIPPED[0])
    booster = model["learner"]["gradient_booster"]
    booster["model"]["trees"] = [tree]
    booster["model"]["gbtree_model_param"]["num_trees"] = "1"
    booster["model"]["tree_info"] = [0]
    start = time.perf_counter()
    ensemble = TreeEnsemble.from_model(model)
    assert time.perf_counter() - start < 2.0
    assert ensemble.depth == depth
    rows = np.full((1, ensemble.n_features), 1e9, dtype=np.float32)  # right at every split
    assert ensemble.predict(rows)[0] == np.float32(size - 1) + ensemble.intercept


def test_ubjson_values_and_malformed_bytes():
    """The value types and container forms of UBJSON (typed and counted, counted, open); bytes
    that are not one well-formed value are a ValueError."""
    doc = (
        b"{#U\x04"  # an object of 4 entries
        b"U\x01a" b"[$d#U\x02" b"\x3f\x80\x00\x00\xc0\x00\x00\x00"  # a: packed float32s
        b"U\x01b" b"[iUNU\x80I\x01\x00TFZSU\x02hi]"  # b: an open array of mixed values
        b"U\x01c" b"{U\x01xL\x00\x00\x00\x00\x00\x00\x00\x07}"  # c: an open object
        b"U\x01d" b"HU\x04-2.5"  # d: a high-precision number
    )  # fmt: skip
    value = read_ubjson(doc)
    assert value["a"].dtype == np.float32 and value["a"].tolist() == [1.0, -2.0]
    assert value["b"] == [85, 128, 256, True, False, None, "hi"]
    assert value["c"] == {"x": 7} and value["d"] == -2.5
    for bad, says in [
        (doc[:-3], "length 4 past the data's end"),
        (b"L\x00\x00", "ends early"),
        (doc + b"Z", "bytes after it"),
        (b"Q", "unknown"),
        (b"[#L\x7f\xff\xff\xff\xff\xff\xff\xff", "past the data's end"),
        (b"[$d#U\x02\x00\x00", "ends early"),
        (b"[" * 100 + b"]" * 100, "nested deeper"),
        (b"SU\x02\xff\xfe", "utf-8"),
        (b"Sd\x00\x00\x00\x00", "length of type"),
        (b"[$Z#U\x03", "elements of no bytes"),
        (b"[$T#U\x03", "elements of no bytes"),
    ]:
        with pytest.raises(ValueError, match=says):
            read_ubjson(bad)


def test_a_crafted_nest_of_empty_typed_containers_is_refused_at_once():
    """An array of n typed containers of nulls, each claiming as many as the bytes left, had
    cost ~n^2/16 elements (a 32 KB file: 15 s and 527 MB; a shipped model's size, hours): a
    typed container of values of no bytes is refused (xgboost writes none)."""
    crafted = b"[#I\x0f\xa0" + b"[$Z#I\x03\xe8" * 4000  # 4,000 arrays of 1,000 nulls each
    with pytest.raises(ValueError, match="elements of no bytes"):
        read_ubjson(crafted)


def test_a_damaged_model_file_is_a_value_error_or_a_model_never_a_crash():
    """Random byte changes to a shipped model: each either still reads (a changed number) and
    then predicts, or is a ValueError; no other exception (an IndexError, a MemoryError, ...)."""
    raw = SHIPPED[0].read_bytes()
    rows = _layer_rows("conv2d_gw8_fprop")[:20]
    rng = random.Random(0)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        damaged = bytearray(raw)
        for _ in range(rng.choice((1, 3))):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            ensemble = _ensemble(bytes(damaged))
        except ValueError:
            outcomes["refused"] += 1
            continue
        assert ensemble.predict(rows).shape == (20,)
        outcomes["read"] += 1
    assert outcomes["read"] and outcomes["refused"], outcomes


def test_predict_checks_the_rows_shape():
    ours = _ensemble(SHIPPED[0].read_bytes())
    with pytest.raises(ValueError, match=f"rows of {ours.n_features} features"):
        ours.predict(np.zeros((3, ours.n_features + 1)))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_leaf_or_intercept_that_is_not_finite_is_refused(value):
    """Every prediction through it was NaN or inf, which ranked configs in their given order:
    the smallest tile picked, silently."""
    model = _model_json(SHIPPED[0])
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    leaf = trees[3]["left_children"].index(-1)
    trees[3]["split_conditions"][leaf] = value
    with pytest.raises(ValueError, match=rf"^tree 3 has a leaf of value {value} \(node {leaf}\)"):
        TreeEnsemble.from_model(model)
    model = _model_json(SHIPPED[0])
    model["learner"]["learner_model_param"]["base_score"] = f"[{value}]"
    with pytest.raises(ValueError, match="an intercept of .*, not a finite number"):
        TreeEnsemble.from_model(model)


def test_sums_past_float32_are_inf_without_numpys_warning():
    """Finite leaves summing past float32's range give inf (which rank_configs refuses), not a
    RuntimeWarning that -W error turns into a traceback; an intercept past it is a ValueError."""
    import warnings

    model = _model_json(SHIPPED[0])
    trees = model["learner"]["gradient_booster"]["model"]["trees"]
    for tree in trees:
        tree["split_conditions"] = [
            3e38 if left == -1 else c
            for left, c in zip(tree["left_children"], tree["split_conditions"], strict=True)
        ]
    ensemble = TreeEnsemble.from_model(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isinf(ensemble.predict(np.zeros((2, ensemble.n_features)))).all()
        model["learner"]["learner_model_param"]["base_score"] = "[1e39]"
        with pytest.raises(ValueError, match="an intercept of 1e\\+39, not a finite number"):
            TreeEnsemble.from_model(model)
