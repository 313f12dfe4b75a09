"""Pure aggregation functions on tiny hand-made arrays."""

import numpy as np
import pytest

from rayfl.algorithms.aggregate import AggregationError, add_up, difference, invalid_reason, merge, weighted_mean


def test_weighted_mean_by_sample_count():
    a = {"w": np.array([1.0, 2.0], np.float32), "b": np.array([0.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32), "b": np.array([4.0], np.float32)}
    out = weighted_mean([a, b], [1, 3])  # weights 1/4 and 3/4
    assert out["w"].tolist() == [2.5, 5.0]  # 0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 6
    assert out["b"].tolist() == [3.0]
    assert out["w"].dtype == np.float32


def test_integer_buffers_are_rounded_back():
    out = weighted_mean([{"n": np.array(3)}, {"n": np.array(4)}], [1, 1])
    assert out["n"].dtype == np.array(3).dtype and int(out["n"]) == 4  # 3.5 rounds to even


def test_mismatches_raise_named_errors():
    with pytest.raises(AggregationError, match="w: shape"):
        weighted_mean([{"w": np.zeros(2)}, {"w": np.zeros(3)}], [1, 1])
    with pytest.raises(AggregationError, match="w: missing"):
        weighted_mean([{"w": np.zeros(2)}, {"v": np.zeros(2)}], [1, 1])
    with pytest.raises(AggregationError, match="positive sum"):
        weighted_mean([{"w": np.zeros(2)}], [0])


def test_invalid_reason_catches_nan_shape_and_keys():
    ref = {"w": np.zeros((2, 2), np.float32)}
    assert invalid_reason({"w": np.ones((2, 2), np.float32)}, ref) is None
    assert "non-finite" in invalid_reason({"w": np.array([[1, np.nan], [0, 0]], np.float32)}, ref)
    assert "shape (2, 3)" in invalid_reason({"w": np.zeros((2, 3))}, ref)
    assert "keys differ" in invalid_reason({"v": np.zeros((2, 2))}, ref)


def test_difference_and_merge():
    new, old = {"a": np.array([3.0]), "b": np.array([1.0])}, {"a": np.array([1.0]), "b": np.array([1.0])}
    assert difference(new, old, ["a"]) == {"a": np.array([2.0])}
    merged = merge({"a": np.array([0.0], np.float32), "b": np.array([5.0], np.float32)}, {"a": np.array([7.0])})
    assert merged["a"].dtype == np.float32 and merged["a"].tolist() == [7.0] and merged["b"].tolist() == [5.0]


def test_add_up_is_a_union_of_keys_and_names_a_shape_clash():
    # InclusiveFL keys its summands by group: a part without a key adds nothing to it
    total = add_up([{"0/w": np.array([1.0, 2.0])}, {"1/w": np.array([5.0])}, {"0/w": np.array([0.5, 0.25])}])
    assert set(total) == {"0/w", "1/w"}
    np.testing.assert_array_equal(total["0/w"], [1.5, 2.25])
    np.testing.assert_array_equal(total["1/w"], [5.0])
    assert add_up([]) == {}
    with pytest.raises(AggregationError, match=r"0/w: shape \(3,\) != \(2,\)"):
        add_up([{"0/w": np.zeros(2)}, {"0/w": np.zeros(3)}])
