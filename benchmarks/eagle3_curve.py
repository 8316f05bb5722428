"""Plot an EAGLE-3 head's held-out learning curve (`scripts/train_eagle3.py --eval-every N` records it
in the head's training.json): how much acceptance each further pass over the corpus still buys, set
against the 2.8 mean acceptance length that a 1.8x speed-up at one client needs.

    python benchmarks/eagle3_curve.py DIR/training.json --name eagle3_candidate_4000_training
      # copies the record to results/NAME.json and draws results/NAME.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, save_twin_axes_plot  # noqa: E402

GOAL = 2.8  # mean acceptance length at 3 draft tokens that 1.8x at one client needs


def log_fit(curve: list[dict], last: int = 4) -> tuple[float, float]:
    """Acceptance length = a + b * log2(steps) over the curve's last points: the gain per doubling."""
    pts = [(math.log2(p["step"]), p["heldout_mean_acceptance_length"]) for p in curve[-last:]]
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / max(1e-9, sum((x - mx) ** 2 for x, _ in pts))
    return my - b * mx, b


def plot(record: dict, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = record["curve"]
    steps = [p["step"] for p in curve]
    fig, ax = plt.subplots(figsize=(7, 4.4))
    ax.plot(steps, [p["heldout_mean_acceptance_length"] for p in curve], "o-", color="#27c",
            label="held-out mean acceptance length (3 draft tokens)")
    ax.axhline(GOAL, color="#c33", ls="--", lw=1, label=f"{GOAL}: needed for 1.8x at 1 client")
    top1 = ax.twinx()
    for k in range(len(curve[0]["heldout_top1_per_step"])):
        top1.plot(steps, [p["heldout_top1_per_step"][k] for p in curve], ":", lw=1,
                  label=f"held-out top-1, draft step {k + 1} (right)")
    ax.set_xlabel(f"optimizer steps ({record['batch']} answers each; {record['train_sequences']} answers in all)")
    ax.set_ylabel("mean acceptance length")
    ax.set_ylim(1, 3)
    top1.set_ylabel("top-1 agreement with the target")
    top1.set_ylim(0, 1)
    ax.set_title("EAGLE-3 head for the assistant: held-out acceptance as training goes on", fontsize=9)
    return save_twin_axes_plot(fig, ax, top1, name, "upper left")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("training_json", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    record = json.loads(args.training_json.read_text())
    if not record.get("curve"):
        ap.error(f"{args.training_json} has no learning curve: train with --eval-every N")
    a, b = log_fit(record["curve"])
    steps_per_sec = record["steps"] / record["train_s"]
    needed = 2 ** ((GOAL - a) / b) if b > 0 else math.inf
    record["extrapolation"] = {
        "fit": "acceptance length = a + b * log2(steps), last 4 points",
        "a": round(a, 4), "gain_per_doubling": round(b, 4),
        "steps_for_goal": None if math.isinf(needed) else round(needed),
        "hours_for_goal_here": None if math.isinf(needed) else round(needed / steps_per_sec / 3600, 1),
    }
    if args.note:
        record["note"] = args.note
    (RESULTS / f"{args.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["extrapolation"], indent=1))
    print(plot(record, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
