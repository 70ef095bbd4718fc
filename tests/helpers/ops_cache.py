"""The op allow-list's decision made afresh in each test (its lookups are cached per process).

Import `decided_afresh` into a test module to apply it to every test there; `NOT_LISTED` is
the end of the refusal for an op not on the list.
"""

import pytest

from aotpipe.artifact import ops

NOT_LISTED = "which is not allowed: it is not on the reviewed list of what aotpipe's capture and passes emit " \
             "(aotpipe/artifact/allowed_ops.txt)"


@pytest.fixture(autouse=True)
def decided_afresh():
    """Each test sees the allow-list decide, not a cache an earlier caller filled."""
    for cached in (ops._resolve, ops._resolve_trusted, ops.listed):
        cached.cache_clear()
    yield
    for cached in (ops._resolve, ops._resolve_trusted, ops.listed):
        cached.cache_clear()
