"""The allow-list's decision, rule by rule, for the op just inside and the op just outside
each rule, and the one-line refusal of each; the checked size arithmetic at the int64 bound;
the argument checks a node's call goes through. In-process and fast (no artefact)."""

import functools
import operator

import pytest
import torch

import tests.data.aptestops  # noqa: F401  # registers aptestops::scaled_tanh, a library's op
from aotpipe.artifact import ops
from aotpipe.artifact.ops import OWN_CAPTURE, op_name, refused_elsewhere, resolve_op
from aotpipe.errors import ArtifactError
from tests.helpers.ops_cache import NOT_LISTED, decided_afresh  # noqa: F401  # decided_afresh: autouse

aten = torch.ops.aten


def refused(name, trusted=frozenset()):
    with pytest.raises(ArtifactError) as e:
        resolve_op(name, trusted)
    return str(e.value)


# ---------------------------------------------------------------------------------------
# each rule: the op just inside it resolves, the op just outside is refused in one line


@pytest.mark.parametrize("name,op", [
    ("aten.add.Tensor", aten.add.Tensor),  # functional, listed
    ("aten.add_.Tensor", aten.add_.Tensor),  # the in-place form of a listed op
    ("aten.copy_.default", aten.copy_.default),
    ("prims.iota.default", torch.ops.prims.iota.default),  # one of PRIMS
    ("mkldnn._convolution_pointwise.default", torch.ops.mkldnn._convolution_pointwise.default),  # one of MKLDNN
    ("aten.div.Tensor_mode", aten.div.Tensor_mode),  # a string argument that names a choice
    ("aten._assert_async.msg", aten._assert_async.msg),
    ("_c10d_functional.reduce_scatter_tensor.default", torch.ops._c10d_functional.reduce_scatter_tensor.default),
    ("_c10d_functional.wait_tensor.default", torch.ops._c10d_functional.wait_tensor.default),  # one of COLLECTIVES
])
def test_an_op_inside_a_rule_resolves_to_itself(name, op):
    assert resolve_op(name) is op


@pytest.mark.parametrize("name,why", [
    ("aten.flatten.using_ints", NOT_LISTED),  # functional, not listed
    ("aten.pow_.Tensor", NOT_LISTED),  # in-place, with no functional form of that overload
    ("aten.arccos_.default", NOT_LISTED),  # in-place, its functional form (an alias of acos) not listed
    ("aten.add.out", NOT_LISTED),  # an out= overload of a listed op: mutable, not in-place
    ("aten.relu_.default_x", None),  # no such overload
    ("prims.add.default", NOT_LISTED),  # a prim, not one of PRIMS
    ("mkldnn._convolution_transpose_pointwise.default", None),  # an mkldnn op, not one of MKLDNN
    ("_c10d_functional.broadcast.default", None),  # a collective, not one of COLLECTIVES
    ("_c10d_functional.all_reduce_.default", None),  # in place: not one of COLLECTIVES
    ("aten.resize_.default", "which is not allowed: it resizes a tensor in place"),
    ("aten.to_sparse.default", "which is not allowed: it builds or reads sparse, nested or mkldnn tensors"),
    ("aten._scaled_dot_product_flash_attention.quantized", "which is not allowed: it is specific to quantized "
                                                           "tensors"),
])
def test_an_op_just_outside_a_rule_is_refused_in_one_line(name, why):
    msg = refused(name)
    assert msg.startswith(f"graph.json names {name!r}, ") and "\n" not in msg, msg
    if why is not None:
        assert msg == f"graph.json names {name!r}, {why}", msg


def test_an_mkldnn_op_outside_the_named_ones_is_refused_by_name_or_category():
    msg = refused("mkldnn._convolution_transpose_pointwise.default")
    assert msg in (f"graph.json names 'mkldnn._convolution_transpose_pointwise.default', {NOT_LISTED}",
                   "graph.json names 'mkldnn._convolution_transpose_pointwise.default', which is not allowed: it "
                   "builds or reads sparse, nested or mkldnn tensors"), msg


def test_an_op_this_torch_lacks_is_refused_naming_the_torch():
    assert refused("aten.no_such_op.default") == (f"graph.json names 'aten.no_such_op.default', which this torch "
                                                  f"({torch.__version__}) does not have")
    assert "does not have" in refused("aten.add.overloads")  # an attribute of the packet, not an overload


@pytest.mark.parametrize("name", ["aten.add", "aten.add.Tensor.x", "aten.add.Ten-sor", "aten.__and__.Tensor",
                                  "aten.add.__call__"])
def test_a_name_that_is_not_an_op_name_is_refused(name):
    msg = refused(name)
    assert msg in (f"graph.json names {name!r}, which is not a valid op name",
                   f"graph.json names {name!r}, which is not an op in an allowed namespace (aten, prims, rngprims, "
                   f"mkldnn, _c10d_functional) nor one of {', '.join(ops.PYTHON_CALLABLES)}; refusing to load it"), msg
    if name.count(".") == 2:
        assert msg.endswith("which is not a valid op name")


def test_a_python_callable_outside_the_list_is_refused_naming_what_is_allowed():
    msg = refused("torch.manual_seed")
    assert msg.startswith("graph.json names 'torch.manual_seed', which is not an op in an allowed namespace (aten, "
                          "prims, rngprims, mkldnn, _c10d_functional) nor one of operator.getitem, operator.add, ") and \
        msg.endswith("; refusing to load it"), msg


def test_a_librarys_op_is_refused_unless_trusted_and_says_how_to_trust_it():
    assert refused("aptestops.scaled_tanh.default") == (
        "graph.json names 'aptestops.scaled_tanh.default', an op of the library namespace 'aptestops', which aotpipe "
        "runs only if you trust that library: load with --trust-ops aptestops (Python: trust_ops=['aptestops']); "
        "the artefact's pipeline must have trusted it too (trusted_ops in the manifest)")
    assert resolve_op("aptestops.scaled_tanh.default", frozenset({"aptestops"})) is \
        torch.ops.aptestops.scaled_tanh.default
    assert "an op of the library namespace 'aptestops'" in refused("aptestops.scaled_tanh.default",
                                                                   frozenset({"other"}))


def test_a_trusted_librarys_op_must_be_registered_and_well_named():
    trust = frozenset({"aptestops"})
    assert refused("aptestops.nothing.default", trust) == (
        "graph.json names 'aptestops.nothing.default', a aptestops op that is not registered: the library that "
        "defines aptestops::nothing was not imported, or its version lacks it")
    assert refused("aptestops.scaled_tanh", trust) == "graph.json names 'aptestops.scaled_tanh', which is not a " \
                                                      "valid op name"
    assert refused("aptestops.__init__.default", trust).endswith("which is not a valid op name")


def test_trust_cannot_be_granted_to_a_namespace_the_list_checks():
    assert refused("aten.resize_.default", frozenset({"aten"})).endswith("it resizes a tensor in place")


def test_our_own_capture_resolves_any_registered_op_of_the_allowed_namespaces_and_nothing_else():
    assert resolve_op("aten.resize_.default", frozenset({OWN_CAPTURE})) is aten.resize_.default
    assert resolve_op("aten.add.Tensor", frozenset({OWN_CAPTURE})) is aten.add.Tensor
    assert refused("aten.no_such_op.default", frozenset({OWN_CAPTURE})) == (
        "graph.json names 'aten.no_such_op.default', a aten op that is not registered: the library that defines "
        "aten::no_such_op was not imported, or its version lacks it")
    assert "not an op in an allowed namespace" in refused("torch.manual_seed", frozenset({OWN_CAPTURE}))
    assert "an op of the library namespace 'aptestops'" in refused("aptestops.scaled_tanh.default",
                                                                   frozenset({OWN_CAPTURE}))


def test_a_target_that_is_not_a_string_is_refused():
    assert refused(3) == "graph.json: op target must be a string, got int"


def test_refused_elsewhere_lists_the_refused_names_sorted_once():
    names = ["aten.resize_.default", "aten.add.Tensor", "aten.flatten.using_ints", "aten.resize_.default",
             "operator.getitem"]
    assert refused_elsewhere(names) == ["aten.flatten.using_ints", "aten.resize_.default"]
    assert refused_elsewhere([]) == []


def test_the_allowed_ops_are_those_that_resolve():
    allowed = ops.allowed_ops()
    assert allowed == sorted(set(allowed))
    assert {"operator.getitem", "operator.add", "aten.add.Tensor", "aten.add_.Tensor", "prims.iota.default",
            "mkldnn._convolution_pointwise.binary", "aten.relu.default"} <= set(allowed)
    assert not {"aten.resize_.default", "aten.flatten.using_ints", "aten.add.out", "aten.pow_.Tensor"} & set(allowed)
    assert "aten.native_dropout.default" in allowed and "aten.native_dropout" not in allowed  # full names only


def test_the_reviewed_list_is_read_without_its_comments():
    listed = ops.listed()
    assert "aten.add.Tensor" in listed and "aten.relu.default" in listed
    assert all(n and "#" not in n and n == n.strip() and n.count(".") == 2 for n in listed)


# ---------------------------------------------------------------------------------------
# why an argument makes an op unsafe


def test_an_out_argument_free_string_or_storage_makes_an_op_unsafe():
    assert ops._argument_problem(aten.atan2.out) == "it writes, and may resize, an out= tensor"
    assert ops._argument_problem(aten.linalg_norm.ord_str) == "its argument 'ord' is a free string"
    assert ops._argument_problem(aten.set_.source_Storage) == "its argument 'source' is a Storage"
    assert ops._argument_problem(aten.div.Tensor_mode) is None  # rounding_mode: one of a few values
    assert ops._argument_problem(torch.ops.mkldnn._convolution_pointwise.default) is None  # checked value by value
    assert ops._argument_problem(aten.add.Tensor) is None


def test_an_argument_of_any_type_makes_an_op_unsafe():
    assert ops._argument_problem(torch.ops.quantized.conv2d_unpack_sizes.default) == \
        "its argument 'packed_weights' is a Any"


class _Schema:
    def __init__(self, mutable):
        self.is_mutable = mutable


class _Op:
    """An op as _admitted sees one: its schema's mutability (a torch of another version may
    register ops named like those below)."""

    def __init__(self, mutable):
        self._schema = _Schema(mutable)


def test_only_a_name_ending_in_one_underscore_is_taken_for_an_in_place_form(monkeypatch):
    # "foo_" is a listed functional op here: "foo__" (a dunder's shape) and "foo_x" are not
    # its in-place forms, nor is a mutable "foo_" taken for one of "foo" unless "foo" is listed
    listed = functools.lru_cache(maxsize=None)(lambda: frozenset({"aten.foo_.default", "aten.fo.default"}))
    monkeypatch.setattr(ops, "listed", listed)  # cached as the real one (the fixture clears it)
    monkeypatch.setattr(ops, "_lookup", lambda ns, op, overload: _Op(mutable=False))
    assert ops._admitted("aten", "foo_", "default", _Op(mutable=False))
    assert not ops._admitted("aten", "foo__", "default", _Op(mutable=True))
    assert not ops._admitted("aten", "foo", "default", _Op(mutable=True))  # "fo" listed, but foo is no fo_
    assert ops._admitted("aten", "fo_", "default", _Op(mutable=True))  # the in-place form of a listed op


# ---------------------------------------------------------------------------------------
# size arithmetic, checked


@pytest.mark.parametrize("name,args,want", [
    ("operator.add", (2, 3), 5), ("operator.sub", (2, 3), -1), ("operator.mul", (4, 3), 12),
    ("operator.floordiv", (7, 2), 3), ("operator.mod", (7, 4), 3), ("operator.neg", (4,), -4),
    ("torch.sym_max", (2, 9), 9), ("torch.sym_min", (2, 9), 2), ("operator.eq", (2, 2), True),
    ("operator.ne", (2, 2), False), ("operator.lt", (2, 3), True), ("operator.le", (3, 3), True),
    ("operator.gt", (3, 3), False), ("operator.ge", (3, 3), True), ("operator.and_", (True, False), False),
    ("operator.or_", (True, False), True), ("torch.sym_not", (True,), False), ("torch.sym_ite", (True, 4, 5), 4),
    # a shape-polymorphic graph's scale factors and run-time assertions: sizes as numbers
    ("operator.truediv", (1.0, 4), 0.25), ("operator.truediv", (6, 4), 1.5), ("operator.pow", (2, 10), 1024),
    ("operator.pow", (2.0, 0.5), 2.0 ** 0.5), ("torch.sym_float", (3,), 3.0), ("torch.sym_int", (3.7,), 3),
    ("math.floor", (2.5,), 2), ("math.ceil", (2.5,), 3),
])
def test_size_arithmetic_computes_what_python_computes(name, args, want):
    assert resolve_op(name) is ops.PYTHON_CALLABLES[name]
    fn = ops.checked_size_arithmetic(name)  # made afresh: PYTHON_CALLABLES' were made at import
    got = fn(*args)
    assert got == want and type(got) is type(want)
    assert fn.__name__ == f"checked_{name.replace('.', '_')}" and op_name(fn) == name


@pytest.mark.parametrize("name,args,got", [
    ("operator.add", (True, 1), "bool, int"),  # a condition where a size goes
    ("operator.and_", (1, True), "int, bool"),  # a size where a condition goes
    ("operator.mul", ([0], 10), "list, int"),
    ("operator.add", (torch.tensor(1), 1), "Tensor, int"),
    ("operator.add", (1.5, 1), "float, int"),
    ("operator.neg", (1, 2), "int, int"),  # one argument too many
    ("operator.add", (1,), "int"),  # one too few
])
def test_size_arithmetic_on_anything_but_sizes_and_conditions_is_refused_uncomputed(name, args, got):
    kinds = ", ".join(ops.SIZE_ARITHMETIC[name][1])
    with pytest.raises(ArtifactError) as e:
        ops.checked_size_arithmetic(name)(*args)
    assert str(e.value) == f"{name} takes ({kinds}) (sizes and conditions), got ({got}); not computed"


def test_a_division_by_zero_or_an_exponent_past_64_is_refused_uncomputed():
    div, power = ops.checked_size_arithmetic("operator.truediv"), ops.checked_size_arithmetic("operator.pow")
    with pytest.raises(ArtifactError, match=r"^operator.truediv: division of sizes by zero; not computed$"):
        div(4, 0)
    assert power(2, 62) == 2 ** 62 and power(1, -64) == 1.0  # |exponent| 64: just inside
    for exponent in (65, -65, 10 ** 9):
        with pytest.raises(ArtifactError, match=rf"^operator.pow: an exponent of {exponent} on a size; not computed$"):
            power(2, exponent)
    with pytest.raises(ArtifactError, match="beyond an int64"):
        power(2, 64)
    with pytest.raises(ArtifactError, match=r"math.floor takes \(number\) \(sizes and conditions\), got \(bool\)"):
        ops.checked_size_arithmetic("math.floor")(True)


def test_size_arithmetic_up_to_the_int64_bound_is_allowed_and_past_it_refused():
    add, sub = ops.checked_size_arithmetic("operator.add"), ops.checked_size_arithmetic("operator.sub")
    assert add(2 ** 63 - 2, 1) == 2 ** 63 - 1
    assert sub(-(2 ** 63 - 2), 1) == -(2 ** 63 - 1)
    with pytest.raises(ArtifactError) as e:
        add(2 ** 63 - 1, 1)
    assert str(e.value) == "operator.add of sizes gave 9223372036854775808..., beyond an int64"
    with pytest.raises(ArtifactError, match=r"^operator.mul of sizes gave 212676479325586539664609129644\.\.\., "):
        ops.checked_size_arithmetic("operator.mul")(2 ** 62, 2 ** 62)
    with pytest.raises(ArtifactError, match="beyond an int64"):
        sub(-(2 ** 63 - 1), 2)


def test_op_name_names_ops_callables_and_checked_forms():
    assert op_name(aten.add.Tensor) == "aten.add.Tensor"
    assert op_name(torch.ops.prims.iota.default) == "prims.iota.default"
    assert op_name(operator.getitem) == "operator.getitem"
    assert op_name(operator.floordiv) == "operator.floordiv" and op_name(torch.sym_ite) == "torch.sym_ite"
    assert op_name(operator.truediv) == "operator.truediv"  # a shape-polymorphic backward's scale factors
    assert op_name(operator.lshift) is None and op_name("aten.add.Tensor") is None

    class Checked:
        checked_op = aten.mm.default
    assert op_name(Checked()) == "aten.mm.default"


# ---------------------------------------------------------------------------------------
# a node's arguments


CONV = torch.ops.mkldnn._convolution_pointwise.default  # (X, W, B, padding, stride, dilation, groups, attr, ...)


def conv_args(attr, algorithm=None):
    return [None, None, None, [0], [1], [1], 1, attr, [], algorithm]


def test_a_string_argument_held_to_listed_values_passes_with_a_listed_value_or_none():
    ops.check_string_args(CONV, conv_args("relu", "tanh"), {}, "node 'c'")
    ops.check_string_args(CONV, conv_args("none"), {}, "node 'c'")
    ops.check_string_args(CONV, conv_args("gelu")[:7], {"attr": "gelu", "algorithm": ""}, "node 'c'")


@pytest.mark.parametrize("args,kwargs,shown", [
    (conv_args("sum"), {}, "attr='sum'"),
    (conv_args("relu", "erf"), {}, "algorithm='erf'"),
    (conv_args("relu")[:7], {"attr": "relu", "algorithm": "x" * 60}, "algorithm='" + "x" * 40 + "'"),
])
def test_a_string_argument_outside_its_listed_values_is_refused(args, kwargs, shown):
    with pytest.raises(ArtifactError) as e:
        ops.check_string_args(CONV, args, kwargs, "node 'c'")
    name = shown.split("=")[0]
    allowed = ", ".join(sorted(ops.STRING_ARG_VALUES["mkldnn._convolution_pointwise.default"][name]))
    assert str(e.value) == f"node 'c': {shown} is not allowed for mkldnn._convolution_pointwise.default; " \
                           f"allowed: {allowed}"


def test_string_arguments_of_other_ops_are_not_held_here():
    ops.check_string_args(aten.div.Tensor_mode, [None, None, "anything"], {}, "node 'd'")
    ops.check_string_args(operator.getitem, ["sum"], {}, "node 'g'")


@pytest.mark.parametrize("args,kwargs", [([None, "sum", None, None, None, 0, True], {}),
                                         ([None, "sum"], {"unsafe": True}),
                                         ([None, "sum", None, None, None, 0], {"unsafe": True})])
def test_an_argument_that_switches_a_kernels_checks_off_is_refused(args, kwargs):
    with pytest.raises(ArtifactError) as e:
        ops.check_unsafe_flags(aten.segment_reduce.default, args, kwargs, "node 's'")
    assert str(e.value) == "node 's': aten.segment_reduce.default with unsafe=True skips the kernel's own checks; " \
                           "refusing to load it"


def test_the_kernels_checks_left_on_pass():
    ops.check_unsafe_flags(aten.segment_reduce.default, [None, "sum", None, None, None, 0, False], {}, "node 's'")
    ops.check_unsafe_flags(aten.segment_reduce.default, [None, "sum"], {}, "node 's'")
    ops.check_unsafe_flags(operator.getitem, [None, True], {"unsafe": True}, "node 'g'")


def test_keyword_arguments_must_be_the_ops_own():
    assert ops.check_kwargs(aten.add.Tensor, {"alpha": 2}, "node 'a'") == {"alpha": 2}
    with pytest.raises(ArtifactError) as e:
        ops.check_kwargs(aten.add.Tensor, {"alpha": 2, "beta": 1}, "node 'a'")
    assert str(e.value) == "node 'a': 'beta' is not an argument of add.Tensor"
    with pytest.raises(ArtifactError) as e:
        ops.check_kwargs(operator.getitem, {"x": 1}, "node 'g'")
    assert str(e.value) == "node 'g': 'x' is not an argument of getitem"
    with pytest.raises(ArtifactError) as e:
        ops.check_kwargs(aten.add.Tensor, [("alpha", 2)], "node 'a'")
    assert str(e.value) == "node 'a': kwargs must be an object"


# ---------------------------------------------------------------------------------------
# the collectives: their reduction held to listed values, their group to a group's name form

C10D = torch.ops._c10d_functional


def test_every_collective_the_list_names_resolves_and_takes_a_group_name():
    for name in ops.COLLECTIVES:
        op = resolve_op(name)
        assert op_name(op) == name and ops._argument_problem(op) is None
    # a group_name argument is Any-typed: outside the collectives it makes an op unsafe
    assert "group_name" in [a.name for a in C10D.all_reduce.default._schema.arguments]


@pytest.mark.parametrize("value, ok", [("0", True), ("12", True), ("a_b.c:d-e", True), ("x" * 64, True),
                                       ("x" * 65, False), ("", False), ("../g", False), ("a b", False), (3, False),
                                       (None, False)])
def test_a_collectives_group_is_a_group_name_and_nothing_else(value, ok):
    op = C10D.all_reduce.default
    if ok:
        ops.check_string_args(op, [None, "sum", value], {}, "g: node 'n'")
    else:
        with pytest.raises(ArtifactError, match=r"^g: node 'n': group_name=.* is not a process group's name for "
                                                r"_c10d_functional.all_reduce.default"):
            ops.check_string_args(op, [None, "sum", value], {}, "g: node 'n'")
    # by keyword too
    if not ok:
        with pytest.raises(ArtifactError):
            ops.check_string_args(C10D.all_gather_into_tensor.default, [None, 2], {"group_name": value}, "w")


@pytest.mark.parametrize("reduce_op, ok", [("sum", True), ("avg", True), ("max", True), ("xor", False),
                                           ("SUM", False)])
def test_a_collectives_reduction_is_one_of_the_listed(reduce_op, ok):
    for op, args in ((C10D.all_reduce.default, [None, reduce_op, "0"]),
                     (C10D.reduce_scatter_tensor.default, [None, reduce_op, 2, "0"])):
        if ok:
            ops.check_string_args(op, args, {}, "w")
        else:
            with pytest.raises(ArtifactError, match=f"reduce_op='{reduce_op}' is not allowed"):
                ops.check_string_args(op, args, {}, "w")


def test_a_group_name_of_an_op_that_is_no_collective_is_not_checked_as_one():
    ops.check_string_args(aten.div.Tensor_mode, [None, None, "floor"], {}, "w")  # no group_name: nothing raised


def test_a_valid_group_name_by_keyword_passes_and_a_refusal_quotes_the_name_cut_at_40():
    ops.check_string_args(C10D.all_gather_into_tensor.default, [None, 2], {"group_name": "7"}, "w")
    long = "a" * 39 + "/" + "b" * 30  # 70 characters, not a name: quoted up to its 40th
    with pytest.raises(ArtifactError) as e:
        ops.check_string_args(C10D.all_reduce.default, [None, "sum", long], {}, "w")
    assert str(e.value) == (f"w: group_name={long[:40]!r} is not a process group's name for "
                            "_c10d_functional.all_reduce.default (letters, digits and _.:- only, at most 64)")


def test_the_collectives_exemption_covers_their_group_name_and_nothing_else(monkeypatch):
    # an op the list would call a collective still may not take an out= tensor
    monkeypatch.setattr(ops, "COLLECTIVES", ops.COLLECTIVES | {"aten.add.out"})
    assert ops._argument_problem(aten.add.out) == "it writes, and may resize, an out= tensor"
    # an argument held to listed values exempts that argument only: the out= after it is still found
    monkeypatch.setattr(ops, "STRING_ARG_VALUES", {**ops.STRING_ARG_VALUES, "aten.add.out": {"self": frozenset()}})
    assert ops._argument_problem(aten.add.out) == "it writes, and may resize, an out= tensor"
