"""The pass registry and the capture-mode table share their keying and lazy imports."""

from collections import namedtuple

import pytest

from aotpipe.passes import PASSES
from aotpipe.spec.modes import CAPTURE_MODES
from aotpipe.spec.registry import by_name, resolve

Entry = namedtuple("Entry", "name value")


def test_a_name_registered_twice_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^pass 'freeze' is registered twice$"):
        by_name([Entry("freeze", 1), Entry("fold", 2), Entry("freeze", 3)], "pass")
    assert list(by_name([Entry("b", 1), Entry("a", 2)], "pass")) == ["b", "a"]  # order kept


def test_both_tables_name_functions_that_resolve():
    assert resolve("os.path:join") is __import__("os").path.join
    assert all(callable(info.function) for info in PASSES.values())
    assert all(callable(m.function()) for m in CAPTURE_MODES.values())
