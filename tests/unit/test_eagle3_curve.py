"""benchmarks/eagle3_curve.py: the gain per doubling of training steps that the benchmarks page's
extrapolation to a mean acceptance length of 2.8 rests on."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("eagle3_curve", ROOT / "benchmarks" / "eagle3_curve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_log_fit_recovers_gain_per_doubling():
    curve = [{"step": s, "heldout_mean_acceptance_length": 0.5 + 0.125 * math.log2(s)} for s in (100, 200, 400, 800, 1600)]
    a, b = load().log_fit(curve)
    assert math.isclose(a, 0.5, abs_tol=1e-9) and math.isclose(b, 0.125, abs_tol=1e-9)


def test_log_fit_uses_only_the_last_points():
    early = [{"step": 10, "heldout_mean_acceptance_length": 9.0}]
    late = [{"step": s, "heldout_mean_acceptance_length": 1.0 + 0.1 * math.log2(s)} for s in (100, 200, 400, 800)]
    _, b = load().log_fit(early + late, last=4)
    assert math.isclose(b, 0.1, abs_tol=1e-9)


def test_committed_extrapolation_matches_its_curve():
    mod = load()
    record = json.loads((ROOT / "benchmarks" / "results" / "eagle3_candidate_4000_training.json").read_text())
    a, b = mod.log_fit(record["curve"])
    ext = record["extrapolation"]
    assert math.isclose(ext["gain_per_doubling"], b, abs_tol=1e-4)
    assert math.isclose(ext["steps_for_goal"], 2 ** ((mod.GOAL - a) / b), rel_tol=1e-3)
    assert record["curve"][-1]["step"] == record["steps"]
