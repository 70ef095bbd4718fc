"""The precheck's meta pass over every op's recorded calls (torch's OpInfo samples, forward,
backward and in place, and each of them made hostile): it accepts nothing the fake-tensor
pass refuses, and takes every honest call fake tensors accept of the ops it runs. Slow (a
minute), and apart from tests/artifact/test_precheck_meta.py, whose hand calls the mutation
runs use."""

import pytest

from tests.artifact.test_precheck_meta import _differential_in_child


@pytest.mark.slow
def test_over_every_op_s_recorded_calls_the_meta_pass_accepts_only_what_the_fake_pass_does(tmp_path):
    total, on_meta, wrong = _differential_in_child(tmp_path, hand_only=False)
    assert not wrong, f"{len(wrong)} of {on_meta} accepted on meta:\n" + "\n".join(wrong)
    assert on_meta > total // 3
