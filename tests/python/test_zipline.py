"""cadence.zipline on NumPy input: every accepted layout (read in place when possible), every
rejected one with an exception that names the row and the problem, and the GIL released during
the search."""

import threading
import time

import numpy as np
import pytest

import cadence
from cadence import _core


def increasing(n, r, dtype=np.int64, seed=0):
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, 100, size=(n, r)) if dtype == np.int64 else rng.uniform(0.1, 2.0, size=(n, r))
    return np.ascontiguousarray(np.cumsum(steps, axis=1).astype(dtype))


def address(a):
    return a.__array_interface__["data"][0]


def answer(r):
    return (r.spread, r.barrier, r.choice)


def test_variants_listed_and_all_agree():
    names = cadence.zipline_variants()
    assert names[:4] == ["zipline", "opt", "opt-bs", "fast"]
    m = increasing(30, 9)
    answers = {v: answer(cadence.zipline(m, variant=v)) for v in names}
    assert len(set(map(repr, answers.values()))) == 1
    assert cadence.zipline(m).variant == "fast"


def test_small_example_by_the_contract():
    # Rows 1,5,9 / 2,6,10 / 3,4,8: the window {3,2,1} spreads 2, and {5,6,4} also spreads 2;
    # the smaller barrier (3) wins; each row's choice is its latest element <= 3.
    r = cadence.zipline([np.array([1, 5, 9]), np.array([2, 6, 10]), np.array([3, 4, 8])])
    assert answer(r) == (2, 3, [0, 0, 0])


def test_matrix_is_read_in_place():
    m = increasing(20, 7)
    assert _core._rows_layout(m) == ("matrix", address(m))
    # A slice of whole rows is still C-contiguous: read in place at its own offset.
    assert _core._rows_layout(m[5:9]) == ("matrix", address(m) + 5 * 7 * 8)


def test_rows_of_one_buffer_are_read_in_place():
    m = increasing(20, 7, np.float64)
    assert _core._rows_layout(list(m)) == ("ragged", address(m))
    flat = np.cumsum(np.arange(1, 31, dtype=np.int64))
    parts = np.split(flat, [4, 10, 11])  # unequal lengths, end to end
    assert _core._rows_layout(parts) == ("ragged", address(flat))
    assert answer(cadence.zipline(parts)) == answer(cadence.zipline([p.copy() for p in parts]))


def test_separate_rows_are_read_in_place_and_give_the_same_answer():
    m = increasing(25, 6)
    rows = [row.copy() for row in m]
    assert _core._rows_layout(rows) == ("separate", address(rows[0]))
    assert answer(cadence.zipline(rows)) == answer(cadence.zipline(m)) == answer(cadence.zipline(list(m)))
    assert answer(cadence.zipline(tuple(rows))) == answer(cadence.zipline(m))


def test_separate_rows_of_unequal_length_match_the_same_rows_in_one_buffer():
    rng = np.random.default_rng(9)
    for dtype in (np.int64, np.float64):
        lengths = rng.integers(1, 30, size=300)
        flat = np.concatenate([np.cumsum(rng.integers(1, 50, size=k)) + rng.integers(0, 200)
                               for k in lengths]).astype(dtype)
        in_one = np.split(flat, np.cumsum(lengths)[:-1])  # end to end: a ragged view
        separate = [row.copy() for row in in_one]
        assert _core._rows_layout(in_one)[0] == "ragged"
        assert _core._rows_layout(separate)[0] == "separate"
        for v in cadence.zipline_variants():
            assert answer(cadence.zipline(separate, variant=v)) == answer(cadence.zipline(in_one, variant=v))


def test_separate_rows_are_read_at_their_own_address_whatever_array_they_view():
    # Slices of larger arrays, not end to end: each row is read where it starts (the direct
    # reading of numpy.ndarray objects must honour the data pointer of a view), and subclasses
    # and byte-swapped arrays take the buffer protocol or are refused as before.
    big = np.cumsum(np.arange(1, 401, dtype=np.int64))
    views = [big[10:60], big[100:130], big[200:290:1], big[5:6]]
    assert _core._rows_layout(views) == ("separate", address(views[0]))
    assert answer(cadence.zipline(views)) == answer(cadence.zipline([v.copy() for v in views]))
    fviews = [v.astype(np.float64)[3:] for v in views[:3]]
    assert answer(cadence.zipline(fviews)) == answer(cadence.zipline([v.copy() for v in fviews]))
    with pytest.raises(cadence.ArrayTypeError, match="row 0: dtype must be int64 or float64, got >i8"):
        cadence.zipline([np.arange(3, dtype=">i8")])
    with pytest.raises(cadence.InvalidParameterError, match="row 1: the array is not C-contiguous"):
        cadence.zipline([big[:5], big[::3]])


def test_rows_may_differ_in_length():
    rows = [np.array([1.0, 2.0, 3.0]), np.array([2.5]), np.array([0.5, 2.2, 4.0, 6.0])]
    r = cadence.zipline(rows)
    assert r.barrier == 2.5 and len(r.choice) == 3


@pytest.mark.parametrize("make, message", [
    (lambda m: m[:, ::2], "not C-contiguous"),
    (lambda m: m[::2], "not C-contiguous"),
    (lambda m: np.asfortranarray(m), "not C-contiguous"),
    (lambda m: [m[0], m[1][::2]], "row 1: the array is not C-contiguous"),
    (lambda m: [row for row in m.T], "row 0: the array is not C-contiguous"),
])
def test_non_contiguous_arrays_are_rejected(make, message):
    m = increasing(6, 8)
    with pytest.raises(ValueError, match=message) as info:
        cadence.zipline(make(m))
    assert isinstance(info.value, cadence.InvalidParameterError)


@pytest.mark.parametrize("rows, message", [
    ([np.arange(3, dtype=np.int32)], "row 0: dtype must be int64 or float64, got int32"),
    ([np.arange(3, dtype=np.float32)], "row 0: dtype must be int64 or float64, got float32"),
    ([np.array([True, False])], "got bool"),
    ([np.arange(3), np.arange(3.0)], "row 1 is float64 but row 0 is int64"),
    ([[1, 2, 3]], "row 0: expected a NumPy array of int64 or float64, got list"),
    ([np.arange(3), "abc"], "row 1: expected a NumPy array"),
    ("1,2,3", "rows must be a list of 1-D NumPy arrays"),
    (None, "rows must be a list of 1-D NumPy arrays"),
    (np.array(["a", "b"]), "dtype must be int64 or float64"),
])
def test_wrong_types_raise_type_errors_naming_them(rows, message):
    with pytest.raises(TypeError, match=message) as info:
        cadence.zipline(rows)
    assert isinstance(info.value, cadence.ArrayTypeError)


@pytest.mark.parametrize("rows, message", [
    ([np.zeros((2, 2), dtype=np.int64)], "row 0: expected a 1-D array, got 2-D"),
    ([np.int64(5)], "row 0"),
    (np.zeros((2, 2, 2)), "expected a 2-D array, got 3-D"),
    (np.arange(5), "expected a 2-D array, got 1-D"),
])
def test_wrong_shapes_raise_value_errors_naming_them(rows, message):
    with pytest.raises((ValueError, TypeError), match=message) as info:
        cadence.zipline(rows)
    assert isinstance(info.value, cadence.Error)


@pytest.mark.parametrize("rows, message", [
    ([], "no rows"),
    ([np.array([1, 2]), np.array([], dtype=np.int64)], "row 1 is empty"),
    ([np.array([1, 3, 3])], "row 0 is not strictly increasing at index 2"),
    ([np.array([1.0, np.nan])], "row 0 index 1 is not finite"),
    ([np.array([1.0, np.inf])], "not finite"),
    ([np.array([-2**62, 2**62], dtype=np.int64), np.array([0, 1])], "cannot represent"),
])
@pytest.mark.parametrize("variant", cadence.zipline_variants())
def test_contract_violations_name_the_row(rows, message, variant):
    with pytest.raises(cadence.ZiplineInputError, match=message):
        cadence.zipline(rows, variant=variant)


def test_unknown_variant():
    with pytest.raises(cadence.ParseError, match="unknown ZipLine variant 'fastest'.*fast"):
        cadence.zipline([np.arange(3)], variant="fastest")


def test_thrust_without_the_backend_says_so():
    if "thrust" in cadence.zipline_variants():
        assert cadence.zipline([np.arange(3), np.arange(1, 4)], variant="thrust").spread == 0
    else:
        with pytest.raises(cadence.InvalidParameterError, match="no Thrust backend"):
            cadence.zipline([np.arange(3)], variant="thrust")


def most_ticks_in_one_call(call, seconds=0.3):
    """Runs call() repeatedly (about `seconds` in all) while a Python thread ticks every half
    millisecond; returns the most ticks seen during one call. The ticker needs the GIL for
    each tick, so a call that holds the GIL sees at most the one or two ticks of the switches
    around it, and a call that releases it sees about one tick per 0.5-1 ms it runs."""
    ticks, stop = [0], threading.Event()

    def ticker():
        while not stop.is_set():
            time.sleep(0.0005)
            ticks[0] += 1

    t = threading.Thread(target=ticker)
    t.start()
    most, spent = 0, 0.0
    try:
        deadline = time.monotonic() + 20
        while spent < seconds and time.monotonic() < deadline:
            before = ticks[0]
            t0 = time.perf_counter()
            call()
            spent += time.perf_counter() - t0
            most = max(most, ticks[0] - before)
    finally:
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()
    return most


def test_the_gil_is_released_during_the_search():
    m = increasing(1400, 40, seed=4)
    # The paper's O(R n^2) search, slow on purpose: about 25 ms a call here (700 rows took about
    # 7 ms, few enough ticks that a loaded machine failed the test about one run in eight).
    released = most_ticks_in_one_call(lambda: cadence.zipline(m, variant="zipline"))
    # Control: ElasticPlanner.plan keeps the GIL (it updates the planner) and runs the same
    # search on as many points; the ticker must tick far less there, or the measurement
    # proves nothing. (Not zero: on a loaded machine the ticker can tick a few times while
    # the main thread waits to be scheduled before the call.)
    ranks, r = 700, 40
    planner = cadence.ElasticPlanner(f"elastic:{r}:last:zipline", ranks)
    rng = np.random.default_rng(4)
    records = np.stack([cadence.make_record(planner.history, 3, rng.integers(500, 5000, size=3))
                        for _ in range(ranks)])
    assert not planner.plan(records, 0).warmup
    held = most_ticks_in_one_call(lambda: planner.plan(records, 0))
    assert released >= 8 and held * 3 < released, (
        f"the ticker ticked at most {released} times during one search, {held} times during "
        "one call that holds the GIL")


def test_concurrent_searches_agree():
    m = increasing(200, 20, np.float64, seed=2)
    want = answer(cadence.zipline(m))
    out = [None] * 4

    def run(i):
        out[i] = [answer(cadence.zipline(m)) for _ in range(5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(o == [want] * 5 for o in out)


def test_torch_cpu_tensors_are_read_in_place_too():
    torch = pytest.importorskip("torch")
    t = torch.cumsum(torch.randint(1, 50, (8, 5), dtype=torch.int64), dim=1)
    assert _core._rows_layout(t) == ("matrix", t.data_ptr())
    assert answer(cadence.zipline(t)) == answer(cadence.zipline(t.numpy().copy()))
    assert answer(cadence.zipline(list(t))) == answer(cadence.zipline(t))
    with pytest.raises(cadence.ArrayTypeError, match="got torch.int32"):
        cadence.zipline(t.to(torch.int32))
    with pytest.raises(cadence.InvalidParameterError, match="not C-contiguous"):
        cadence.zipline(t.t())
