"""Source files named the same on every machine: by the module they were imported as.

An artefact holds no absolute path (no home directory, checkout or temporary folder), so the
same model captured from any folder, machine or checkout gives the same bytes. Two kinds of
text name source files: the source line of each graph node (artifact/provenance.py) and the
messages torch writes into a manifest's notes, fallback reason and graph breaks ("... at
/home/me/proj/model.py:199"). Both go through :func:`relative_file`.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["relative_file", "name_files_in"]


def relative_file(path: str) -> str:
    """`path` as the module it was imported as (``aotpipe/models/zoo.py`` for ``aotpipe.models.zoo``), else
    relative to the outermost package folder it lies in, else its file name alone.

    Only the import name is used, never the working directory or sys.path (an editable
    install is found by an import hook, not a path, and a pipeline's own folder is on the
    path only while its models import), so the same model gives the same line from any
    folder, machine or checkout: two captures stay byte-identical."""
    full = os.path.abspath(path)
    name = _module_names().get(full)
    if name is None or name.startswith("__"):  # __main__, __mp_main__: a script, not an import name
        return _package_relative(full)
    tail = "/__init__.py" if os.path.basename(full) == "__init__.py" else os.path.splitext(full)[1]
    return name.replace(".", "/") + tail


_MODULE_NAMES: dict[str, str] = {}
_MODULE_COUNT = [-1]


def _module_names() -> dict[str, str]:
    """Absolute source file -> dotted name of every imported module, rebuilt when modules
    were imported since the last call."""
    if len(sys.modules) != _MODULE_COUNT[0]:
        _MODULE_NAMES.clear()
        for name, mod in list(sys.modules.items()):
            file = getattr(mod, "__file__", None)
            if isinstance(file, str) and file.endswith(".py"):
                _MODULE_NAMES.setdefault(os.path.abspath(file), name)
        _MODULE_COUNT[0] = len(sys.modules)
    return _MODULE_NAMES


def _package_relative(full: str) -> str:
    """`full` relative to the folder above its outermost package (folders with an
    ``__init__.py``), or its file name when it lies in no package."""
    root = os.path.dirname(full)
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.dirname(root) != root:
        root = os.path.dirname(root)
    return os.path.relpath(full, root).replace(os.sep, "/")


# An absolute path of a Python source file inside a message, up to its ".py".
_ABS_PY = re.compile(r"(?<![\w.])/(?:[^\s\"'`():,;]+/)*[^\s\"'`():,;/]+\.py\b")


def name_files_in(text: str) -> str:
    """`text` with every absolute path of a .py file replaced by :func:`relative_file`'s name
    for it (torch's messages quote the model's file: "at /home/me/proj/net.py:199")."""
    return _ABS_PY.sub(lambda m: relative_file(m.group(0)), text)
