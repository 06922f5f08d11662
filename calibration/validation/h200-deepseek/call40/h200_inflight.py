"""The H200's own engine replays (calls 17-28, Mooncake prefill) step by step: each one-prompt
step's measured GPU time over the shipped profile's prediction, binned by the busy share the
power-limit model (models/power_limit.py, window 0.2 s) gives the GPU as the step starts.
Output: h200_inflight.txt. Run from the repository root: python <this file>."""

import json
from pathlib import Path

import pandas as pd

from deepinfer_sim.calibration.validate import ReplayShape, validation_cost
from deepinfer_sim.models.power_limit import BusyShare, SustainedClock
from deepinfer_sim.models.profile import load_profile

# the share as the model keeps it (window 0.2 s; the slowdown values are not used here)
CLOCK = SustainedClock(slowdown=1.0, window_s=0.2, onset_share=0.5, source="analysis")
ROOT = Path("calibration/validation/h200-deepseek")
rows = []
for call in ["call17", "call18", "call22", "call25", "call27", "call28"]:
    folder = ROOT / call / "replay"
    shape = ReplayShape(**json.loads((folder / "replay_report.json").read_text())["shape"])
    cost = validation_cost(load_profile("h200-deepseek"), shape)
    for path in sorted(folder.glob("replay_mooncake_conversation_prefill_steps*.csv")):
        steps = pd.read_csv(path)
        cols = ("start_s", "end_s", "gpu_s", "prefill_tokens", "prefill_seqs", "decode_seqs")
        busy = BusyShare(CLOCK)
        for start, end, gpu, tokens, seqs, decoding in zip(
            *(steps[c].to_numpy(dtype=float).tolist() for c in cols), strict=True
        ):
            share = busy.share(start)
            if seqs == 1 and decoding == 0:
                predicted = cost.prefill_step([[(int(tokens), 0)]])
                rows.append((call, share, gpu / predicted))
            dt = end - start
            busy.ended(end, dt, min(1.0, gpu / dt) if dt > 0 else 1.0)
d = pd.DataFrame(rows, columns=["call", "share", "measured_over_predicted"])
d["busy_share"] = pd.cut(d.share, [-0.01, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0])
table = d.groupby("busy_share", observed=True).measured_over_predicted.describe()
out = table[["count", "mean", "50%"]].round(3).to_string()
out += "\n\n" + d.groupby("call").measured_over_predicted.median().round(3).to_string() + "\n"
Path(__file__).with_name("h200_inflight.txt").write_text(out)
print(out)
