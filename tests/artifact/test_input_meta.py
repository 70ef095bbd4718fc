"""The .input pickle: graph_dumper_aot's format, read by torch's get_inputs, loaded safely."""

import os
import pickle
import re

import pytest
import torch

from aotpipe.artifact import input_meta
from aotpipe.format.ir import GraphInput, TensorMeta
from aotpipe.errors import ArtifactError


def _inputs():
    t = TensorMeta((2, 3), (1, 2), torch.float32, torch.device("cpu"))
    i = TensorMeta((4,), (1,), torch.int64, torch.device("cpu"))
    return [GraphInput("a", "param", "w", t), GraphInput("b", "user", "ids", i, None, (0, 10)),
            GraphInput("c", "symint", None, None, int)]


def test_entries_follow_graph_dumper_aot_format():
    meta = input_meta.input_meta(_inputs())
    assert meta[0] == (torch.Tensor, torch.Size([2, 3]), (1, 2), torch.float32, torch.device("cpu"))
    assert meta[2] == (int,)


def test_joint_is_nested_primals_then_tangents():
    meta = input_meta.input_meta(_inputs(), (2, 1))
    assert len(meta) == 2 and len(meta[0]) == 2 and len(meta[1]) == 1


def test_round_trip_through_restricted_unpickler():
    meta = input_meta.input_meta(_inputs(), (2, 1))
    assert input_meta.loads(input_meta.dumps(meta)) == meta


def test_torch_get_inputs_reads_written_file(tmp_path):
    from torch._functorch.compilers import get_inputs

    p = tmp_path / "g.input"
    p.write_bytes(input_meta.dumps(input_meta.input_meta(_inputs()[:2])))
    a, b = get_inputs(str(p))
    assert a.shape == (2, 3) and a.dtype == torch.float32
    assert b.shape == (4,) and b.dtype == torch.int64


def test_dumps_is_deterministic():
    assert input_meta.dumps(input_meta.input_meta(_inputs())) == input_meta.dumps(input_meta.input_meta(_inputs()))


# Hostile pickles. Each payload would create `marker` if it ran; every test asserts that it
# did not, and that the refusal is the restricted unpickler's (or the opcode check's) own,
# not some later error: an unpickler that called the payload and then failed on the
# structure would still raise an ArtifactError.


class _Call:
    """Pickles as a call of `fn(*args)`."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _payloads(marker):
    import subprocess

    m = str(marker)
    return {
        "os.system": (_Call(os.system, f"touch {m}"), "posix.system"),
        "exec": (_Call(exec, f"open({m!r}, 'w').close()"), "builtins.exec"),
        "eval": (_Call(eval, f"open({m!r}, 'w').close()"), "builtins.eval"),
        "subprocess": (_Call(subprocess.call, ["touch", m]), "subprocess.call"),
        "open": (_Call(open, m, "w"), "io.open"),
        "torch.save": (_Call(torch.save, 0, m), "torch.serialization.save"),
        "getattr": (_Call(getattr, _Call(__import__, "os"), "system"), "builtins.getattr"),
    }


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("where", ["alone", "in a list", "inside an entry"])
@pytest.mark.parametrize("name", ["os.system", "exec", "eval", "subprocess", "open", "torch.save", "getattr"])
def test_hostile_pickles_are_refused_and_their_payload_never_runs(tmp_path, name, where, protocol):
    marker = tmp_path / "payload-ran"
    payload, global_name = _payloads(marker)[name]
    obj = {"alone": payload, "in a list": [payload],
           "inside an entry": [(torch.Tensor, torch.Size([1]), (1,), torch.float32, torch.device("cpu"), payload)]}[where]
    path = tmp_path / "g.input"
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    module, _, attr = global_name.rpartition(".")
    py2 = {"builtins": "__builtin__", "subprocess": "commands"}.get(module, module)  # protocols 0-2 write these
    with pytest.raises(ArtifactError) as e:
        input_meta.read(path)
    assert not marker.exists(), "the payload ran"
    # The refusal names the callable it would not load, and the file; one line.
    msg = str(e.value)
    assert re.match(rf"{re.escape(str(path))}: refusing to unpickle ({module}|{py2})\.{attr}: "
                    r"a \.input file holds only tensor metadata", msg), msg
    assert "\n" not in msg


def test_the_marker_check_would_see_a_payload_that_ran(tmp_path):
    # The oracle itself: an ordinary unpickler runs the same payload and makes the marker.
    marker = tmp_path / "payload-ran"
    pickle.loads(pickle.dumps([_payloads(marker)["open"][0]]))[0].close()
    assert marker.exists()


def test_not_a_list_is_refused():
    with pytest.raises(ArtifactError, match="expected a list"):
        input_meta.loads(pickle.dumps((1, 2)))


# --- opcodes: checked before unpickling -----------------------------------------------------


def _tensor_global(protocol_header=b"\x80\x02"):
    return protocol_header + b"ctorch\nTensor\n"


def test_build_on_torch_tensor_is_refused_before_unpickling(monkeypatch):
    # torch.Tensor() then BUILD: Tensor.__setstate__ would get a state the file chooses.
    data = _tensor_global() + b")R" + b"(K\x01K\x02tb" + b"."
    called = []
    monkeypatch.setattr(torch.Tensor, "__setstate__", lambda self, state: called.append(state), raising=False)
    with pytest.raises(ArtifactError, match="refusing pickle opcode BUILD") as e:
        input_meta.loads(data, "g.input")
    assert not called and "\n" not in str(e.value) and str(e.value).startswith("g.input: ")


def test_reduce_can_call_only_size_and_device():
    # REDUCE on torch.Tensor with 10**9 would allocate 4 GB: the type is only a mark, never callable
    data = _tensor_global() + b"J\x00\xca\x9a;\x85R" + b"."
    with pytest.raises(ArtifactError, match="not a valid .input pickle"):
        input_meta.loads(data)


@pytest.mark.parametrize("payload", [
    {"a": 1}, {1, 2}, b"bytes", bytearray(b"x"), None, 1.5, "str", [(torch.Tensor, torch.Size([1]), (1,))],
    [(torch.Tensor, torch.Size([-1]), (1,), torch.float32, torch.device("cpu"))],
    [(torch.Tensor, "shape", (1,), torch.float32, torch.device("cpu"))], [(str,)],
])
def test_anything_but_the_format_is_refused(payload):
    with pytest.raises(ArtifactError):
        input_meta.loads(pickle.dumps(payload))


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_graph_dumper_aot_style_files_still_read(tmp_path, protocol):
    # What torch's graph_dumper_aot writes: pickle.dump of (type(arg), shape, stride, dtype, device)
    # per tensor (type(arg) may be Parameter) and (type(arg),) per int or float.
    args = [torch.nn.Parameter(torch.randn(3, 4)), torch.randn(4, 5).t(), 7, 0.5,
            torch.zeros(2, dtype=torch.int64)]
    meta = [(type(a),) if type(a) in (int, float) else (type(a), a.shape, a.stride(), a.dtype, a.device)
            for a in args]
    p = tmp_path / "g.input"
    p.write_bytes(pickle.dumps(meta, protocol=protocol))
    back = input_meta.read(p)
    assert back == meta
    from aotpipe.replay import get_inputs

    values = get_inputs(p)
    assert [v.shape for v in values if isinstance(v, torch.Tensor)] == [(3, 4), (5, 4), (2,)]
    assert values[1].stride() == (1, 5)


def test_files_the_writer_makes_pass_the_opcode_check(quickstart_run):
    root, _ = quickstart_run
    files = sorted(root.rglob("*.input"))
    assert len(files) == 4 * 5
    for f in files:
        input_meta.check_opcodes(f.read_bytes(), str(f))
        assert input_meta.read(f)
