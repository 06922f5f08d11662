#!/usr/bin/env bash
# Device call 47 (2026-12-07, an H100 80GB HBM3; the H200 was not lent): the split prefill
# attention's merge moved from the reference's float32 passes to the Triton kernel
# (kernels/triton_merge.py), as engines fuse it. V3 and its TP2/4/8 slices' prefill timed with the
# kernel (prefill_v3_merge.json) and with the reference (DEEPINFER_MERGE=torch,
# prefill_v3_torchmerge.json) on the same GPU, and the H200 profile's own raw points of chunks with
# a prefix carried to the kernel shape by shape (H200 time × kernel / reference; a chunk without a
# prefix runs no merge, so it keeps its time), starting from the profile after refit.sh (commit
# 603fba3), so this script reproduces the shipped profiles whenever it is run; the fits re-fitted
# (forms smooth, prefix, merge, waves) and the derived profiles re-derived. From the repository
# root:  bash calibration/validation/h200-deepseek/prefill_waves/call47/rescale.sh
set -euo pipefail
D=calibration/validation/h200-deepseek/prefill_waves/call47
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
prof=calibration/profiles/h200-deepseek.yaml
git show 603fba3:$prof > "$T/before.yaml"
V3=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8
$P export "$T/before.yaml" --models "$V3" --parts prefill --out "$T/target.json"
python - "$D" "$T" <<'PY'
import json, sys
d, t = sys.argv[1:]
base = json.load(open(f"{d}/prefill_v3_torchmerge.json"))
new = json.load(open(f"{d}/prefill_v3_merge.json"))
for name, res in new["models"].items():  # no prefix, no merge: the same code both times
    for key in ("prefill", "prefill_offgrid"):
        was = {tuple(r[:-1]): r[-1] for r in base["models"][name]["raw"][key]}
        res["raw"][key] = [r if r[2] > 0 else [*r[:-1], was[tuple(r[:-1])]] for r in res["raw"][key]]
json.dump(new, open(f"{t}/new.json", "w"))
PY
$P rescale "$T/target.json" "$D/prefill_v3_torchmerge.json" "$T/new.json" \
  --out "$D/prefill_v3_h200.json"
$P merge "$D/prefill_v3_h200.json" "$T/before.yaml" "$prof"
note="; re-derived 2026-12-07 after device call 47: V3 and its TP slices' prefill with the split \
attention's Triton merge (prefill_waves/call47/rescale.sh)"
bash calibration/validation/h200-deepseek/rederive.sh 603fba3 "$note"
rm -rf "$T"
