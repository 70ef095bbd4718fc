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


@pytest.mark.parametrize("mode", list(CAPTURE_MODES))
def test_every_row_of_the_mode_table_imports_each_function_it_names(mode):
    # The table names its functions as strings, which the import contracts cannot see: a
    # function that moves or is renamed fails here, not in a user's first capture.
    entry = CAPTURE_MODES[mode]
    for which in ("capture", "build", "example_inputs"):
        named = getattr(entry, which)
        module, _, attribute = named.partition(":")
        assert module.startswith("aotpipe.") and attribute, named
        fn = entry.function(which)
        assert callable(fn) and fn.__name__ == attribute.rsplit(".", 1)[-1], named
    if entry.tries_first is not None:
        assert entry.tries_first in CAPTURE_MODES and entry.tries_first != mode


def test_a_row_naming_a_function_that_is_gone_fails_to_resolve():
    with pytest.raises((ImportError, AttributeError)):
        resolve("aotpipe.capture:no_such_capture")
    with pytest.raises((ImportError, AttributeError)):
        resolve("aotpipe.capture.gone:capture_export")
