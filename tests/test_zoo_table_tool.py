"""tools/zoo_table.py's dynamic zoo rows: the specialisation classes, the rows, the page (with and without data)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


zoo_table = _tool("zoo_table")
gen_docs = _tool("gen_docs")

# Messages as the zoo's sample run wrote them (auto's fallback reasons and the models' errors).
CANINE = ("dims: seq (input_ids.size(1), attention_mask.size(1)) cannot be dynamic in [4, 64] (inference): the model "
          "fixes it to 16 at transformers/models/canine/modeling_canine.py:449 (`for chunk_start in range(from_start, "
          "from_seq_length, self.attend_from_chunk_stride):`); make seq static (write 16 in the shape), or change the "
          "model so it reads the size from the input")
XLNET = ("dims: seq (input_ids.size(1), attention_mask.size(1)) cannot be dynamic in [4, 64] (inference): the model "
         "only runs for (((-1) + 2*input_ids.size(1)) % input_ids.size(1)) != 0. at "
         "transformers/models/xlnet/modeling_xlnet.py:1109 (`non_tgt_mask = ((attn_mask + non_tgt_mask[:, :, None, "
         "None]) > 0).to(attn_mask)`); narrow the range, or make seq static")
MOONSHINE = ("dims: samples (input_values.size(1)) cannot be dynamic in [2000, 8000] (inference): the model only runs "
             "for ((-1) + (((-127) + input_values.size(1)) // 384))*((-1) + (((-127) + input_values.size(1)) // 384)) "
             "> 1. at transformers/masking_utils.py:554 (`attention_mask = attention_mask.expand(batch_size, -1, "
             "q_length, kv_length)`); narrow the range (_samples: {min: 6, max: 21} under dims:), or make samples static")
BRANCH = ("dims: batch (arg0.size(0)) cannot be dynamic in [1, 64] (inference): the model only runs for 2 <= "
          "arg0.size(0) and arg0.size(0) <= 8 at shapes_models.py:18 (`if x.shape[0] > 8:`); narrow the range "
          "(batch: {max: 8} under dims:), or make batch static")


@pytest.mark.parametrize("message, fell_back, cls", [
    (CANINE, True, zoo_table.FIXED),
    ("export failed: " + CANINE.replace("canine", "rwkv") + "; dynamo failed: a tangent names 'output[?]'", False,
     zoo_table.FIXED),
    (XLNET, True, zoo_table.UNPROVEN),
    (MOONSHINE, True, zoo_table.UNPROVEN),
    (BRANCH, True, zoo_table.NARROWED),
    ("dims: seq (x.size(1)) cannot be dynamic in [4, 64] (training): Could not guard on data-dependent expression "
     "u0 < 3; narrow the range of seq, or make it static", True, zoo_table.REFUSED),
    ("dims: seq is static in every graph (specialised to 16: no graph keeps it symbolic)", False, zoo_table.STATIC),
    ("at min (batch=1, seq=4): inference graph does not run: RuntimeError: shape '[2, 4]' is invalid", False,
     zoo_table.DOES_NOT_RUN),
    ("at max (batch=4, seq=64): joint graph differs from the eager model: output 0 off by 0.3", False,
     zoo_table.DIFFERS),
    ("torch.export (training) failed: RandomBranch: the model branches on a random number it draws", True,
     zoo_table.FELL_BACK),
    ("inference: outside the graphs ran aten.all.default x1", False, zoo_table.PARTIAL),
    ("capture: AOTAutograd joint capture failed: RuntimeError: one of the variables", False, zoo_table.OTHER),
], ids=["loop-over-the-sequence", "refused-then-dynamo-failed", "xlnet-mod", "moonshine-floordiv",
        "branch-on-the-batch", "refused-otherwise", "static-everywhere", "does-not-run-at-min", "differs-at-max",
        "export-failed-otherwise", "partial", "other"])
def test_each_message_falls_in_its_specialisation_class(message, fell_back, cls):
    assert zoo_table.specialisation_class(message, fell_back=fell_back) == cls


def test_a_guard_is_walked_over_the_whole_range():
    sources = ["input_ids.size(1)", "attention_mask.size(1)"]
    assert zoo_table.guard_holds_on_range("((2*input_ids.size(1)) - 1) % input_ids.size(1) != 0", sources, 4, 64)
    assert zoo_table.guard_holds_on_range("Ne(Mod(attention_mask.size(1), 4), 3)", sources, 4, 64) is False
    assert zoo_table.guard_holds_on_range("input_ids.size(1) <= 64", sources, 4, 64) is True
    assert zoo_table.guard_holds_on_range("input_ids.size(1) <= 63", sources, 4, 64) is False


def test_a_guard_the_table_cannot_decide_is_not_called_unproven():
    sources = ["input_ids.size(1)"]
    assert zoo_table.guard_holds_on_range("input_ids.size(1) < pixel_values.size(0)", sources, 4, 64) is None
    assert zoo_table.guard_holds_on_range("input_ids.size(1).bit_length() > 1", sources, 4, 64) is None
    assert zoo_table.guard_holds_on_range("input_ids.size(1) > 1", sources, 1, 10**9) is None
    message = XLNET.replace("!= 0.", "!= pixel_values.size(0).")
    assert zoo_table.specialisation_class(message, fell_back=True) == zoo_table.NARROWED


def _dims(**status):
    return {"dims": {k: {"min": 1, "max": 4, "example": 2, "status": v, "sources": []} for k, v in status.items()},
            "checked": [{"point": "min", "sizes": {}, "checks": {"passed": 10, "run": 10}},
                        {"point": "max", "sizes": {}, "checks": {"passed": 9, "run": 10}}]}


def _dynamic_run(root: Path) -> Path:
    """A dynamic zoo's output folder: one model dynamic, one fallen back to dynamo, one failed at min."""
    folder = root / "hf-zoo-dynamic"
    for name, manifest in {
        "bert": {"capture": {"mode": "export"}, "dims": _dims(batch="dynamic", seq="dynamic")},
        "xlnet": {"capture": {"mode": "dynamo", "fallback": XLNET},
                  "dims": {"dims": _dims(batch="specialised", seq="specialised")["dims"]}},
    }.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "manifest.json").write_text(json.dumps(manifest))
    ok = {"status": "ok", "stage": None, "error": None, "graphs": ["a"] * 4, "checks": {"passed": 7, "skipped": 0}}
    (folder / "run.json").write_text(json.dumps({"seconds": 30.2, "executor": {"kind": "process"}, "models": [
        {"name": "bert", **ok}, {"name": "xlnet", **ok},
        {"name": "tt", "status": "failed", "stage": "verify", "graphs": [], "checks": {},
         "error": "at min (batch=1, seq=4): inference graph does not run: RuntimeError: boom"}]}))
    return folder


STATIC = {"models": [{"name": n, "mode": "export", "status": "ok"} for n in ("bert", "xlnet", "tt")]}


def test_a_dynamic_run_rows_say_each_dimension_and_why_a_model_is_not_dynamic(tmp_path):
    data = zoo_table.rows_from_run(_dynamic_run(tmp_path))
    assert json.loads(zoo_table.dump(data)) == data
    rows = {m["name"]: m for m in data["models"]}
    assert rows["bert"]["dynamic"] and rows["bert"]["class"] == "" and rows["bert"]["sized"] == [19, 20]
    assert rows["xlnet"]["dims"] == {"batch": "specialised", "seq": "specialised"}
    assert not rows["xlnet"]["dynamic"] and rows["xlnet"]["class"] == zoo_table.UNPROVEN
    assert rows["xlnet"]["why"].startswith("dims: seq (input_ids.size(1)")
    assert rows["tt"]["class"] == zoo_table.DOES_NOT_RUN and rows["tt"]["dims"] == {}
    assert "docs/data/hf-zoo-dynamic.json" in data["note"]


def test_a_static_run_rows_stay_as_they_were(tmp_path):
    root = tmp_path / "hf-zoo"
    (root / "bert").mkdir(parents=True)
    (root / "bert" / "manifest.json").write_text(json.dumps({"capture": {"mode": "export"}}))
    (root / "run.json").write_text(json.dumps({"seconds": 1, "models": [
        {"name": "bert", "status": "ok", "stage": None, "error": None, "graphs": [], "checks": {}}]}))
    (row,) = zoo_table.rows_from_run(root)["models"]
    assert set(row) == {"name", "mode", "status", "graphs", "passed", "skipped", "reason"}


def test_the_dynamic_page_sets_the_rate_beside_the_static_zoo_and_counts_the_classes(tmp_path):
    text = zoo_table.render_dynamic(zoo_table.rows_from_run(_dynamic_run(tmp_path)), STATIC)
    assert text.startswith("**1/3 (33.3%) dynamic ok**")
    assert "**dynamic ok / static ok: 1/3 = 33.3%** (target: 90% or more; not met)." in text
    assert f"| {zoo_table.UNPROVEN} | 1 | xlnet | xlnet: dims: seq (input_ids.size(1)" in text
    assert f"| {zoo_table.DOES_NOT_RUN} | 1 | tt | tt: at min (batch=1, seq=4)" in text
    assert "| bert | ok (export) | dynamic ok | export | batch, seq dynamic | 19 / 20 |  |  |" in text
    assert "| xlnet | ok (export) | ok | dynamo | batch, seq static | - | " in text


def test_a_run_of_fewer_architectures_than_the_static_zoo_is_called_a_sample(tmp_path):
    data = zoo_table.rows_from_run(_dynamic_run(tmp_path))
    assert "**A sample**" not in zoo_table.render_dynamic(data, STATIC)  # the same 3 architectures
    bigger = {"models": STATIC["models"] + [{"name": "gpt2", "mode": "export", "status": "ok"}]}
    text = zoo_table.render_dynamic(data, bigger)
    assert "**A sample**: this run holds 3 of the static zoo's 4 architectures" in text
    assert "on the 3 architectures both ran" in text


def test_without_a_static_run_the_page_says_there_is_nothing_to_compare(tmp_path):
    text = zoo_table.render_dynamic(zoo_table.rows_from_run(_dynamic_run(tmp_path)), None)
    assert "No static zoo run of these architectures is recorded" in text
    assert "dynamic ok / static ok" not in text


def test_the_generated_page_says_how_to_make_the_data_while_there_is_none(tmp_path, monkeypatch):
    (tmp_path / "docs" / "data").mkdir(parents=True)
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    text = gen_docs.hf_zoo_dynamic_page()
    assert "**No run of the dynamic zoo is recorded yet**: docs/data/hf-zoo-dynamic.json does not exist." in text
    assert "python tools/zoo_table.py artifacts/hf-zoo-dynamic --save docs/data/hf-zoo-dynamic.json" in text


def test_the_generated_page_renders_the_data_once_there_is_some(tmp_path, monkeypatch):
    data = tmp_path / "docs" / "data"
    data.mkdir(parents=True)
    (data / "hf-zoo-dynamic.json").write_text(zoo_table.dump(zoo_table.rows_from_run(_dynamic_run(tmp_path))))
    (data / "hf-zoo.json").write_text(json.dumps(STATIC))
    monkeypatch.setattr(gen_docs, "REPO", tmp_path)
    text = gen_docs.hf_zoo_dynamic_page()
    assert "No run of the dynamic zoo" not in text
    assert "**dynamic ok / static ok: 1/3 = 33.3%**" in text


def test_an_assertion_the_capture_kept_failing_at_a_size_is_its_own_class():
    message = ("dims: at max (batch=4, seq=64) a run-time assertion the capture kept fails: seq (input_ids.size(1)) "
               "cannot be dynamic in [4, 64] (inference): the model only runs for (input_ids.size(1) % 64) != 0. "
               "at m.py:3 (`x`); it holds for seq in [4, 63]; set seq: {max: 63}, or make the dimension static")
    assert zoo_table.specialisation_class(message) == zoo_table.ASSERTED


def test_a_run_that_kept_models_from_an_earlier_one_says_its_time_is_not_theirs(tmp_path):
    data = zoo_table.rows_from_run(_dynamic_run(tmp_path))
    assert "kept from an earlier run" not in zoo_table.render_dynamic(data, STATIC)
    text = zoo_table.render_dynamic({**data, "kept": 2}, STATIC)
    assert f"s (2 of its {len(data['models'])} models kept from an earlier run: their time is not in it)." in text


def _one_model_run(root: Path, name: str, seconds: int) -> Path:
    """A dynamic zoo's output folder after `aotpipe run --only NAME`: the model dynamic ok."""
    folder = root / "hf-zoo-dynamic"
    (folder / name).mkdir(parents=True)
    (folder / name / "manifest.json").write_text(json.dumps({"capture": {"mode": "export"},
                                                             "dims": _dims(batch="dynamic", seq="dynamic")}))
    (folder / "run.json").write_text(json.dumps({"seconds": seconds, "models": [
        {"name": name, "status": "ok", "stage": None, "error": None, "graphs": ["a"], "checks": {"passed": 1}}]}))
    return folder


def test_a_rerun_of_some_models_replaces_their_rows_and_the_pages_list_it(tmp_path):
    earlier = zoo_table.rows_from_run(_dynamic_run(tmp_path / "a"))
    root = _one_model_run(tmp_path / "b", "tt", seconds=5)
    data = zoo_table.merged(earlier, zoo_table.rows_from_run(root))
    assert [m["name"] for m in data["models"]] == ["bert", "xlnet", "tt"]  # the earlier order
    rows = {m["name"]: m for m in data["models"]}
    assert rows["tt"]["dynamic"] and rows["bert"] == earlier["models"][0]  # rerun, kept
    assert data["seconds"] == earlier["seconds"] and data["kept"] == earlier["kept"]  # the whole run's
    assert data["reruns"] == [{"models": ["tt"], "seconds": 5, "note": data["reruns"][0]["note"]}]
    assert json.loads(zoo_table.dump(data)) == data
    said = "Then 1 of its models were run again and their rows replaced (5 s): tt."
    assert said in zoo_table.render_dynamic(data, STATIC) and said in zoo_table.render(data)
    assert "run again" not in zoo_table.render(earlier)
    # a second rerun is listed after the first
    assert len(zoo_table.merged(data, zoo_table.rows_from_run(root))["reruns"]) == 2
    # a rerun adds no model
    other = {**zoo_table.rows_from_run(root), "models": [{**rows["tt"], "name": "gpt9"}]}
    with pytest.raises(SystemExit, match="gpt9: not in the earlier data"):
        zoo_table.merged(earlier, other)


def test_a_partial_model_s_reason_is_what_ran_outside_its_graphs(tmp_path):
    root = tmp_path / "hf-zoo"
    (root / "m2m").mkdir(parents=True)
    (root / "m2m" / "manifest.json").write_text(json.dumps({"capture": {"mode": "dynamo"}}))
    (root / "run.json").write_text(json.dumps({"seconds": 1, "models": [
        {"name": "m2m", "status": "partial", "stage": None, "error": None, "graphs": [], "checks": {},
         "outside_graphs": ["training: outside the graphs ran aten.rand.default x4"]}]}))
    (row,) = zoo_table.rows_from_run(root)["models"]
    assert row["reason"] == ("partial: part of the model ran outside its graphs: training: outside the graphs ran "
                             "aten.rand.default x4")


def test_an_earlier_run_under_another_definition_is_given_beside_this_one(tmp_path, monkeypatch):
    earlier = zoo_table.rows_from_run(_dynamic_run(tmp_path / "a"))
    now = zoo_table.rows_from_run(_dynamic_run(tmp_path / "b"))
    data = zoo_table.with_before(now, earlier, "the zoo before the bounds (abc1234)")
    ok = sum(1 for m in earlier["models"] if m["status"] == "ok")
    assert data["before"] == {"label": "the zoo before the bounds (abc1234)", "seconds": earlier["seconds"],
                              "models": len(earlier["models"]), "ok": ok}
    said = f"Beside it, the zoo before the bounds (abc1234): {ok}/{len(earlier['models'])} ok in"
    assert said in zoo_table.render(data) and "Beside it" not in zoo_table.render(now)
    assert json.loads(zoo_table.dump(data)) == data
    # from the command line: --before needs a label
    saved = tmp_path / "earlier.json"
    saved.write_text(zoo_table.dump(earlier))
    monkeypatch.setattr(sys, "argv", ["zoo_table.py", str(tmp_path / "b" / "hf-zoo-dynamic"), "--before", str(saved)])
    with pytest.raises(SystemExit):
        zoo_table.main()


def test_a_rerun_after_the_pipeline_changed_follows_its_members(tmp_path):
    earlier = zoo_table.rows_from_run(_dynamic_run(tmp_path / "a"))  # bert, xlnet, tt
    rerun = zoo_table.rows_from_run(_one_model_run(tmp_path / "b", "gpt9", seconds=3))
    data = zoo_table.merged(earlier, rerun, members=["gpt9", "bert", "tt"])
    assert [m["name"] for m in data["models"]] == ["gpt9", "bert", "tt"]  # the pipeline's order
    assert data["reruns"][-1]["added"] == ["gpt9"] and data["reruns"][-1]["dropped"] == ["xlnet"]
    text = zoo_table.render(data)
    assert "That run added gpt9, new in the pipeline." in text
    assert "The pipeline no longer holds xlnet: their rows were dropped." in text
    with pytest.raises(SystemExit, match="gpt9: not in the earlier data"):
        zoo_table.merged(earlier, rerun)  # without the members, a rerun adds none
    with pytest.raises(SystemExit, match=r"newbie: in the pipeline .* but in neither run"):
        zoo_table.merged(earlier, rerun, members=["gpt9", "newbie"])
    with pytest.raises(SystemExit, match="gpt9: not in the pipeline"):
        zoo_table.merged(earlier, rerun, members=["bert"])
