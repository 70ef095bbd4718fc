"""benchmarks/job_parts.py: its timers charge a recursive call once, and its table names every part."""

from __future__ import annotations

import importlib.util
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("job_parts", REPO / "benchmarks" / "job_parts.py")
parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(parts)


def test_a_recursive_call_is_charged_once_with_its_cpu_seconds():
    owner = types.SimpleNamespace()

    def spin(n):
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        return spin(n - 1) if n else 0

    owner.spin = spin
    parts.CPU.clear()
    parts.CALLS.clear()
    parts._timed(owner, "spin", "spin")
    spin_timed = owner.spin
    globals_ = spin.__globals__
    globals_["spin"] = spin_timed  # its recursion goes through the timer, as torch's nested calls do
    try:
        spin_timed(2)
    finally:
        globals_["spin"] = spin
    assert parts.CALLS["spin"] == 1
    assert 0.055 <= parts.CPU["spin"] < 1.0


def test_the_table_lists_every_part_with_its_share_of_the_jobs_cpu():
    rows = [{"name": "a", "status": "ok", "cpu_s": 10.0, "stages": {"capture": 6.0},
             "parts": {"torch.export, eval and train": 2.5}},
            {"name": "b", "status": "ok", "cpu_s": 10.0, "stages": {"capture": 5.0},
             "parts": {"torch.export, eval and train": 1.5, "writer: module.py text": 0.4}}]
    text = parts.report(rows)
    assert "2 job(s), 20.0 s CPU in all" in text and "capture 11.0" in text
    line = {ln.split("  ")[1].strip(): ln for ln in text.splitlines() if ln.startswith("  ") and "%" in ln}
    assert set(line) == {label for _, _, label in parts.PARTS}
    assert line["torch.export, eval and train"].rstrip().endswith("4.0   20.0%")
    assert line["writer: module.py text"].rstrip().endswith("0.4    2.0%")
