"""The .input pickle: graph_dumper_aot's format, read by torch's get_inputs, loaded safely."""

import os
import pickle

import pytest
import torch

from aotpipe.artifact import input_meta
from aotpipe.capture.types import GraphInput, TensorMeta
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


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


@pytest.mark.parametrize("payload", [_Evil(), [eval], [torch.load], [(torch.Tensor, torch.Size([1]), (1,), torch.float32, torch.device("cpu"), os.getcwd)]])
def test_hostile_pickles_are_refused(payload):
    data = pickle.dumps(payload)
    with pytest.raises(ArtifactError):
        input_meta.loads(data)


def test_pickle_that_would_write_a_file_is_refused_and_writes_nothing(tmp_path):
    marker = tmp_path / "written"

    class WritesFile:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with pytest.raises(ArtifactError, match="refusing to unpickle"):
        input_meta.loads(pickle.dumps([WritesFile()]))
    assert not marker.exists()


def test_not_a_list_is_refused():
    with pytest.raises(ArtifactError, match="expected a list"):
        input_meta.loads(pickle.dumps((1, 2)))
