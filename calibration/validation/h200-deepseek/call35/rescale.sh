#!/usr/bin/env bash
# Device calls 35 (2026-12-06, two H100 80GB HBM3 machines; no H200 came): the H200 profile's V3
# prefill and whole routed-call fits carried to the new kernels by rescaling its own H200 raw
# points shape by shape with new / base timed on an H100 (moe_split.py rescale):
# - prefill: prefill_v3.json (split attention on cuDNN, first call) over prefill_v3_flash.json
#   (FlashAttention-2, DEEPINFER_PREFILL_ATTENTION=flash, second call);
# - the whole routed call: moe_whole_new.json (Triton combine) over moe_whole_base.json
#   (DEEPINFER_COMBINE=torch), both in the second call. A TP slice's routed experts are the
#   whole model's (deepseek-v3@tpN holds the same experts), so they take deepseek-v3's ratios.
# Run from the repository root: bash calibration/validation/h200-deepseek/call35/rescale.sh
set -euo pipefail
D=calibration/validation/h200-deepseek/call35
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
V3=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8
SLICES=deepseek-v3@tp1-moetp2,deepseek-v3@tp1-moetp4,deepseek-v3@tp1-moetp8
$P export h200-deepseek --models "$V3" --parts prefill --out "$T/prefill_target.json"
$P export h200-deepseek --models "$V3,$SLICES" --parts moe_whole --out "$T/moe_target.json"
python - "$D" "$T" <<'PY'
import json, sys
d, t = sys.argv[1:]
for name in ("moe_whole_new", "moe_whole_base"):
    data = json.load(open(f"{d}/{name}.json"))
    for tp in (2, 4, 8):  # the TP slices' experts are deepseek-v3's
        data["models"][f"deepseek-v3@tp{tp}"] = data["models"]["deepseek-v3"]
    json.dump(data, open(f"{t}/{name}.json", "w"))
PY
$P rescale "$T/prefill_target.json" "$D/prefill_v3_flash.json" "$D/prefill_v3.json" \
  --out "$D/prefill_v3_h200.json"
$P rescale "$T/moe_target.json" "$T/moe_whole_base.json" "$T/moe_whole_new.json" \
  --out "$D/moe_whole_h200.json" --drop-missing
prof=calibration/profiles/h200-deepseek.yaml
$P merge "$D/prefill_v3_h200.json" "$prof" "$prof"
$P merge "$D/moe_whole_h200.json" "$prof" "$prof"
rm -rf "$T"
