"""Names printed are sanitised, and odd input is one line.

A name can be a weapon: a folder named "\\x1b[2K\\rmlp verified" rewrites the terminal line
`ls` prints for it, and a Cyrillic "mlр" beside an ASCII "mlp" passes for it. Every name
ls, verify, show and sign print has its control characters (and, in names, non-ASCII
characters) escaped. A 5000-digit integer, a NUL or a lone surrogate in a name, and folders
nested past Python's recursion limit are each one line, never a traceback.
"""

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from aotpipe.artifact.manifest import seal
from aotpipe.cli import main
from aotpipe.errors import printable

SPOOF = "\x1b[2K\rmlp verified"


def cli(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def _copy(quickstart_run, dst):
    root, _ = quickstart_run
    shutil.copytree(root / "mlp", dst)
    return dst


def _corrupt(folder):
    g = folder / "mlp_inference_0" / "graph.json"
    g.write_bytes(g.read_bytes().replace(b"relu", b"relv", 1))


def _edit_manifest(folder, edit):
    m = json.loads((folder / "manifest.json").read_text())
    edit(m)
    (folder / "manifest.json").write_bytes(seal(m))


def _no_raw_controls(text):
    return not any(c in text for c in "\x1b\r\x00\u202e")


def test_printable_escapes_controls_and_with_names_every_non_ascii_character():
    assert printable(SPOOF) == "\\x1b[2K\\rmlp verified"
    assert printable("a\x00b\u202ec\udcff") == "a\\x00b\\u202ec\\udcff"
    assert printable("ml\u0440") == "ml\u0440" and printable("ml\u0440", names=True) == "ml\\u0440"
    assert printable("mlp", names=True) == "mlp"


def test_ls_cannot_show_a_corrupt_artefact_as_verified_through_its_name(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / SPOOF)
    m = json.loads((folder / "manifest.json").read_text())
    m["fingerprint"] = "0" * 64  # changed without its checksum
    (folder / "manifest.json").write_text(json.dumps(m))
    r = cli("ls", tmp_path / "lib")
    assert r.exit_code == 0 and _no_raw_controls(r.output), repr(r.output)
    (line,) = r.output.splitlines()
    assert line.startswith("\\x1b[2K\\rmlp verified ") and "corrupt (checksum)" in line, line


def test_verify_and_sign_print_a_spoofing_folder_name_escaped(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / SPOOF)
    _corrupt(folder)
    r = cli("verify", tmp_path / "lib")
    assert r.exit_code == 1 and _no_raw_controls(r.output), repr(r.output)
    assert r.output.startswith("FAILED  ") and "\\x1b[2K\\rmlp verified" in r.output.splitlines()[0]
    key = tmp_path / "secret.key"
    key.write_bytes(bytes(range(64)))
    r = cli("sign", tmp_path / "lib", "--key", key)
    assert r.exit_code == 1 and _no_raw_controls(r.output) and "FAILED  " in r.output, repr(r.output)


def test_show_escapes_names_the_artefact_supplies(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / "mlp")
    _edit_manifest(folder, lambda m: m["model"].update(name=SPOOF, source="aotpipe.zoo:mlp\x1b]0;title\x07"))
    r = cli("show", folder)
    assert r.exit_code == 0 and _no_raw_controls(r.output) and "\x07" not in r.output, repr(r.output)
    assert r.output.startswith("\\x1b[2K\\rmlp verified: aotpipe.zoo:mlp\\x1b]0;title\\x07")


@pytest.mark.parametrize("corrupt", ["cyrillic", "ascii"])
def test_look_alike_folders_are_each_checked_by_their_own_content_and_print_apart(quickstart_run, tmp_path, corrupt):
    ascii_name, cyrillic_name = "mlp", "ml\u0440"  # the second ends in CYRILLIC SMALL LETTER ER
    for name in (ascii_name, cyrillic_name):
        _copy(quickstart_run, tmp_path / "lib" / name)
    _corrupt(tmp_path / "lib" / (cyrillic_name if corrupt == "cyrillic" else ascii_name))
    r = cli("verify", tmp_path / "lib")
    assert r.exit_code == 1, r.output
    status = {line.split()[1].rsplit("/", 1)[-1]: line.split()[0] for line in r.output.splitlines()
              if line.startswith(("ok ", "FAILED "))}
    assert status == ({"mlp": "ok", "ml\\u0440": "FAILED"} if corrupt == "cyrillic" else
                      {"mlp": "FAILED", "ml\\u0440": "ok"}), r.output
    assert "\u0440" not in r.output
    r = cli("ls", tmp_path / "lib")
    assert sorted(line.split()[0] for line in r.output.splitlines()) == ["ml\\u0440", "mlp"]


def test_an_undecodable_file_name_is_printed_escaped(quickstart_run, tmp_path):
    name = os.fsdecode(b"ml\xffp")  # a lone surrogate in Python's view of the name
    _copy(quickstart_run, tmp_path / "lib" / name)
    r = cli("ls", tmp_path / "lib")
    assert r.exit_code == 0 and r.output.startswith("ml\\udcffp "), repr(r.output)
    r = cli("verify", tmp_path / "lib")
    assert r.exit_code == 0 and "ml\\udcffp" in r.output, repr(r.output)


# ---------------------------------------------------------------------------------------
# one line, never a traceback


def _one_line(r, exit_code, needle):
    assert r.exit_code == exit_code and r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], r.output
    assert "Traceback" not in r.output


def _raw_manifest(folder, old, new):
    p = folder / "manifest.json"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))


def test_a_5000_digit_integer_is_one_line(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / "mlp")
    _raw_manifest(folder, '"format_version": 4', '"format_version": ' + "9" * 5000)
    needle = "manifest.json: not valid JSON (Exceeds the limit (4300 digits) for integer string conversion"
    for command in (["show", folder], ["replay", folder], ["ls", folder.parent]):
        _one_line(cli(*command), 2, needle)
    r = cli("verify", folder.parent)  # verify reports it as that artefact's problem
    assert r.exit_code == 1 and r.exception is None or isinstance(r.exception, SystemExit)
    assert needle in r.output and "Traceback" not in r.output


def test_a_nul_in_a_file_name_is_one_line(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / "mlp")
    _edit_manifest(folder, lambda m: m["files"].update({"a\x00b": "0" * 64}))
    r = cli("verify", folder.parent)
    assert r.exit_code == 1 and "manifest.json: bad file name 'a\\x00b'" in r.output, r.output
    _edit_manifest(folder, lambda m: m["graphs"]["inference"].update(folder="mlp_inf\x00erence_0"))
    for command in (["show", folder], ["replay", folder]):
        _one_line(cli(*command), 2, "embedded null byte")


def test_a_lone_surrogate_in_a_key_is_one_line(quickstart_run, tmp_path):
    folder = _copy(quickstart_run, tmp_path / "lib" / "mlp")
    _raw_manifest(folder, '"files": {', '"files": {"x\\ud800": "' + "0" * 64 + '", ')
    needle = "manifest.json: a string holds a lone surrogate ('\\ud800'), which is not text"
    for command in (["show", folder], ["replay", folder], ["ls", folder.parent]):
        _one_line(cli(*command), 2, needle)
    r = cli("verify", folder.parent)
    assert r.exit_code == 1 and needle in r.output and "Traceback" not in r.output, r.output


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """1,900 folders nested in one another (made and removed without full paths; about 10 s
    on a slow disk, so once for the module)."""
    root = tmp_path_factory.mktemp("deep") / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    fds = [fd]
    for _ in range(1900):
        os.mkdir("d", dir_fd=fds[-1])
        fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    yield root
    for parent in reversed(fds[:-1]):
        os.rmdir("d", dir_fd=parent)
    for f in fds:
        os.close(f)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["ls", "verify"])
def test_1900_nested_folders_are_one_line(deep, command):
    _one_line(cli(command, deep), 2, "folders nested more than 32 deep")
