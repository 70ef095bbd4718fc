"""format/symbolic.py: sizes in a graph's symbols computed from text an artefact holds,
integer arithmetic only, never eval."""

import pytest

from aotpipe.errors import ArtifactError
from aotpipe.format.symbolic import evaluate, symbols_in


@pytest.mark.parametrize("expr, sizes, value", [
    ("s0", {"s0": 7}, 7),
    ("4*s0*s1", {"s0": 2, "s1": 3}, 24),
    ("s1 + 1", {"s1": 3}, 4),
    ("s0 - 1", {"s0": 1}, 0),
    ("-s0 + 10", {"s0": 3}, 7),
    ("Max(1, s0)", {"s0": 0}, 1),
    ("Min(s0, s1)", {"s0": 5, "s1": 2}, 2),
    ("FloorDiv(s0, 2)", {"s0": 7}, 3),
    ("CeilDiv(s0, 2)", {"s0": 7}, 4),
    ("Mod(s0, 4)", {"s0": 7}, 3),
    ("s0**2", {"s0": 5}, 25),
    ("s0//3 + s0 % 3", {"s0": 10}, 4),
    (12, {}, 12),
])
def test_torch_size_expressions_evaluate(expr, sizes, value):
    assert evaluate(expr, sizes) == value


@pytest.mark.parametrize("expr, why", [
    ("__import__('os').system('true')", "not size arithmetic"),
    ("s0.real", "not size arithmetic"),
    ("s0[0]", "not size arithmetic"),
    ("lambda: 1", "not size arithmetic"),
    ("open('x')", "not size arithmetic"),
    ("Max(s0, key=1)", "not size arithmetic"),
    ("1.5 * s0", "not size arithmetic"),
    ("2**65", "exponent 65 out of range"),
    ("s0**64 * s0**64", "larger than any size"),
    ("s0 / 2", "is not a multiple of 2"),
    ("FloorDiv(s0, 0)", "division by zero"),
    ("s0 +", "invalid syntax"),
    ("s0" + " + s0" * 200, "longer than 512 characters"),
])
def test_anything_else_is_refused_in_one_line(expr, why):
    with pytest.raises(ArtifactError) as e:
        evaluate(expr, {"s0": 3}, "graph x input y")
    assert str(e.value).startswith("graph x input y: ") and why in str(e.value)
    assert "\n" not in str(e.value)


def test_exponent_at_the_bound_is_computed():
    assert evaluate("2**62", {}) == 2 ** 62  # at _LIMIT: computed; one more bit is refused
    with pytest.raises(ArtifactError):
        evaluate("2**62 + 1", {})


def test_an_unknown_symbol_is_named():
    with pytest.raises(ArtifactError, match="names symbol s9, which the graph does not define"):
        evaluate("s0 + s9", {"s0": 1})


def test_symbols_in_leaves_out_size_functions_and_numbers():
    assert symbols_in("Max(1, s0)*s3 + FloorDiv(s1, 2)") == {"s0", "s1", "s3"}
    assert symbols_in(4) == set() and symbols_in("((") == set()


# ---------------------------------------------------------------------------------------
# sizes by name, and layouts and storages at them

from aotpipe.format.records import InputRecord, StorageRecord, SymbolRecord  # noqa: E402
from aotpipe.format.symbolic import layout_at, records_at, storages_at, symbol_sizes  # noqa: E402

SYMBOLS = {"s0": SymbolRecord(dim="batch", min=1, max=16, example=4, sources=["x.size(0)"]),
           "s1": SymbolRecord(dim=None, min=2, max=None, example=8, sources=["x.size(1)"])}


@pytest.mark.parametrize("given, want", [
    ({}, {"s0": 4, "s1": 8}),
    ({"batch": 1}, {"s0": 1, "s1": 8}),  # the min: just inside
    ({"batch": 16}, {"s0": 16, "s1": 8}),  # the max: just inside
    ({"s0": 7, "x.size(1)": 100000}, {"s0": 7, "s1": 100000}),  # by symbol and by source; no max
    ({"batch": 3, "x.size(0)": 3}, {"s0": 3, "s1": 8}),  # one dimension named twice, the same size
])
def test_sizes_by_name_symbol_or_source(given, want):
    assert symbol_sizes(SYMBOLS, given, "g") == want


@pytest.mark.parametrize("given, why", [
    ({"batch": 0}, "batch=0 is outside the recorded range [1, 16]; pick a size in range"),
    ({"batch": 17}, "batch=17 is outside the recorded range [1, 16]"),
    ({"s1": 1}, "s1=1 is outside the recorded range [2, no max]"),
    ({"seq": 4}, "no dimension 'seq'; its dims are batch (s0), s1 (x.size(1))"),
    ({"batch": 3, "s0": 4}, "batch=3 and s0=4 are the same dimension (s0); give it once"),
])
def test_a_size_outside_its_range_or_an_unknown_name_is_refused(given, why):
    with pytest.raises(ArtifactError) as e:
        symbol_sizes(SYMBOLS, given, "g")
    assert str(e.value) == f"g: {why}" or str(e.value).startswith(f"g: {why}")


def test_a_static_graph_takes_no_sizes():
    with pytest.raises(ArtifactError) as e:
        symbol_sizes({}, {"batch": 2}, "g")
    assert str(e.value) == ("g: the artefact is static (captured without dims:, no symbolic sizes); sizes apply "
                            "only to a shape-polymorphic capture")


def _input(**k):
    base = {"index": 0, "name": "x", "role": "user", "type": "tensor", "dtype": "float32", "storage": 0}
    return InputRecord(**{**base, **k})


def test_a_layout_and_a_size_input_at_other_sizes():
    x = _input(shape=[4, 8], stride=[8, 1], sym_shape=["s0", "s1"], sym_stride=["s1", 1])
    at = layout_at(x, {"s0": 2, "s1": 3}, "g")
    assert (at.shape, at.stride) == ([2, 3], [3, 1])
    n = InputRecord(index=1, name="n", role="symint", type="int", source="forward", sym_value="s0*s1")
    assert layout_at(n, {"s0": 2, "s1": 3}, "g").value == 6
    static = _input(shape=[4], stride=[1])
    assert layout_at(static, {"s0": 2}, "g") is static


def test_a_storage_is_sized_by_the_furthest_view_at_the_new_sizes():
    a = _input(shape=[4, 8], stride=[8, 1], sym_shape=["s0", 8], sym_stride=[8, 1])
    b = _input(index=1, name="b", shape=[8], stride=[1], storage_offset=8, sym_shape=[8], sym_stride=[1])
    lone = StorageRecord(dtype="float32", device="cpu", numel=5)
    storages, inputs = records_at([StorageRecord(dtype="float32", device="cpu", numel=32), lone], [a, b],
                                  {"s0": 3}, "g")
    assert [s.numel for s in storages] == [24, 5]  # a reaches 3*8, b reaches 8+8; the other is kept
    assert storages_at(storages, inputs)[0].numel == 24
    assert records_at(storages, inputs, None, "g") == (storages, inputs)


@pytest.mark.parametrize("expr, value", [("6 / 2", 3), ("-s0", -3), ("+s0", 3), ("s0**0", 1), ("CleanDiv(s0, 3)", 1)])
def test_exact_division_unary_signs_and_a_zero_exponent(expr, value):
    got = evaluate(expr, {"s0": 3})
    assert got == value and type(got) is int


@pytest.mark.parametrize("expr, message", [
    ("7 / 2", "(7 is not a multiple of 2)"),
    ("s0 / 0", "(3 is not a multiple of 0)"),
    ("Mod(s0, 0)", "(modulo by zero)"),
    ("s0 % 0", "(modulo by zero)"),
    ("FloorDiv(s0, 0)", "(division by zero)"),
    ("2**62 * 2", "(the value is larger than any size)"),
    ("open(s0)", "(Call is not size arithmetic)"),
    ("s0**-1", "(exponent -1 out of range)"),
])
def test_refusals_say_why(expr, message):
    with pytest.raises(ArtifactError) as e:
        evaluate(expr, {"s0": 3}, "w")
    assert str(e.value) == f"w: {expr!r} is not a size this aotpipe computes {message}"


def test_the_length_bound_is_512_characters():
    at_bound = "s0" + " " * 510
    assert evaluate(at_bound, {"s0": 3}) == 3
    with pytest.raises(ArtifactError, match=r"\(longer than 512 characters\)"):
        evaluate(at_bound + " ", {"s0": 3})


def test_a_long_expression_is_quoted_to_80_characters():
    expr = "s0 + " * 20 + "s0."
    with pytest.raises(ArtifactError) as e:
        evaluate(expr, {"s0": 1}, "w")
    assert str(e.value).startswith(f"w: {expr[:80]!r} is not a size")


def test_the_dims_an_error_lists_are_named_dims_first_then_symbols_by_name():
    symbols = {"s9": SymbolRecord(min=1, example=2, sources=["b.size(0)", "c.size(0)"]),
               "s2": SymbolRecord(min=1, example=2),
               "s5": SymbolRecord(dim="seq", min=1, example=2),
               "s1": SymbolRecord(dim="batch", min=1, example=2)}
    with pytest.raises(ArtifactError) as e:
        symbol_sizes(symbols, {"nope": 1}, "g")
    assert str(e.value) == "g: no dimension 'nope'; its dims are batch (s1), seq (s5), s2 (unnamed), s9 (b.size(0))"


def test_a_bad_layout_names_its_input():
    for field in ("sym_shape", "sym_stride"):
        bad = _input(shape=[4], stride=[1], **{field: ["s7"]})
        with pytest.raises(ArtifactError, match=r"^g input x: 's7' names symbol s7"):
            records_at([StorageRecord(dtype="float32", device="cpu", numel=4)], [bad], {"s0": 1}, "g")
    n = InputRecord(index=1, name="n", role="symint", type="int", source="forward", sym_value="s7")
    with pytest.raises(ArtifactError, match=r"^g: 's7' names symbol s7"):
        layout_at(n, {"s0": 1}, "g")


def test_only_tensor_views_size_a_storage_and_an_empty_view_reaches_nothing():
    empty = _input(shape=[0, 8], stride=[8, 1], sym_shape=["s0", 8], sym_stride=[8, 1])
    scalar = InputRecord(index=1, name="n", role="user", type="int", storage=1, shape=[9], stride=[1])
    unstored = _input(index=2, name="u", storage=None, shape=[9], stride=[1])
    no_shape = _input(index=3, name="v", storage=2)
    s = [StorageRecord(dtype="float32", device="cpu", numel=n) for n in (32, 5, 6)]
    assert [r.numel for r in storages_at(s, [empty, scalar, unstored, no_shape])] == [0, 5, 6]


def test_without_a_place_an_error_says_size():
    with pytest.raises(ArtifactError) as e:
        evaluate("s9", {})
    assert str(e.value) == "size: 's9' names symbol s9, which the graph does not define"


from aotpipe.format.symbolic import dense_strides  # noqa: E402


@pytest.mark.parametrize("sym_shape, stride, want", [
    (["s0", 3, 4], [12, 4, 1], [12, 4, 1]),  # contiguous: the batch's stride is static
    ([3, "s0", 4], [4, 12, 1], [4, 12, 1]),  # batch in the middle, contiguous
    (["s0", "s1", 4], [16, 4, 1], ["4*s1", 4, 1]),
    (["s0", 3, 4, 5], [60, 1, 15, 3], [60, 1, 15, 3]),  # channels-last with a static image
    (["s0", 3, "s1", 5], [3 * 4 * 5, 1, 15, 3], ["15*s1", 1, 15, 3]),  # channels-last, symbolic height
    (["s0 + 1", 4], [4, 1], [4, 1]),
    ([4, "s0 + 1"], [6, 1], ["s0 + 1", 1]),
    ([2, "s0", "s1 + 1"], [25, 5, 1], ["(s1 + 1)*s0", "s1 + 1", 1]),
    (["s0", 1, 4], [4, 99, 1], [4, 99, 1]),  # a static size-1 dimension keeps its stride
    (["s0", 1, "s1"], [4, 4, 1], ["s1", 4, 1]),  # ... and the dimensions after it go on
    (["s0", "2*s1", 3], [24, 3, 1], ["3*2*s1", 3, 1]),  # a product needs no parentheses
    (["s0", "Max(1, s1)", 3], [12, 3, 1], ["3*(Max(1, s1))", 3, 1]),  # a call does
])
def test_the_strides_of_a_dense_layout_in_symbols(sym_shape, stride, want):
    example = {"s0": 5, "s1": 4}
    got = dense_strides(sym_shape, stride, example)
    assert got == want
    assert [evaluate(g, example) for g in got] == stride


@pytest.mark.parametrize("sym_shape, stride", [
    (["s0", 4], [8, 1]),  # a gap between rows
    (["s0", 4], [0, 1]),  # a broadcast
    (["s0", 4], [2, 1]),  # rows overlap
])
def test_a_layout_with_gaps_overlap_or_broadcast_has_none(sym_shape, stride):
    assert dense_strides(sym_shape, stride, {"s0": 5}) is None


def test_a_shape_that_does_not_compute_at_the_example_has_none():
    assert dense_strides(["s9", 4], [4, 1], {"s0": 5}) is None


def test_a_transpose_is_dense_with_the_symbol_in_its_stride():
    assert dense_strides(["s0", 4], [1, 5], {"s0": 5}) == [1, "s0"]
