"""Hostile or malformed input that used to end in a traceback is one `error:` line, exit 2."""

import json

import pytest
from click.testing import CliRunner

from aotpipe.cli import main



def one_line_exit_2(r, *needles):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    for n in needles:
        assert n in r.output, (n, r.output)


def _edit_graph(folder, fn, graph="mlp_inference_0"):
    path = folder / graph / "graph.json"
    data = json.loads(path.read_text())
    fn(data, folder)
    path.write_text(json.dumps(data))


def _get_attr_import(d, folder):
    blob = sorted((folder / "blobs").iterdir())[0]  # a real constant: only the name is wrong
    d["nodes"].insert(0, {"name": "c", "op": "get_attr", "target": "import", "blob": blob.stem})


def _placeholder_none(d, folder):
    ph = next(n for n in d["nodes"] if n["op"] == "placeholder")
    old = ph["name"]
    ph["name"] = ph["target"] = "None"
    for n in d["nodes"]:
        n["args"] = json.loads(json.dumps(n.get("args", [])).replace(f'{{"node": "{old}"}}', '{"node": "None"}'))


@pytest.mark.parametrize("edit", [_get_attr_import, _placeholder_none], ids=["get_attr import", "placeholder None"])
@pytest.mark.parametrize("command", ["show", "replay"])
def test_keyword_names_in_graph_json_are_one_line(mlp_copy, edit, command):
    _edit_graph(mlp_copy, edit)
    one_line_exit_2(CliRunner().invoke(main, [command, str(mlp_copy)]), "graph.json")


def test_tangent_dtype_naming_a_function_is_one_line(mlp_copy):
    path = mlp_copy / "mlp_backward_0" / "inputs.json"
    rec = json.loads(path.read_text())
    tangent = next(r for r in rec["inputs"] if r["role"] == "tangent")
    tangent["dtype"] = "load"  # getattr(torch, "load") is torch.load
    path.write_text(json.dumps(rec))
    one_line_exit_2(CliRunner().invoke(main, ["replay", str(mlp_copy), "--graph", "inference", "--chain"]),
                    "inputs.json: field inputs.")


@pytest.mark.parametrize("device", ["bogus", "cuda:x", "gpu"])
def test_unknown_device_is_one_line(mlp_copy, device):
    one_line_exit_2(CliRunner().invoke(main, ["replay", str(mlp_copy), "--device", device]),
                    f"--device {device!r} is not a device")
