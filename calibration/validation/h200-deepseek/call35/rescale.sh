#!/usr/bin/env bash
# Device call 35 (2026-12-06, three H100 80GB HBM3 machines; no H200 came): the H200 profile's V3
# prefill and the whole routed call of V3 and of the expert-TP slices carried to the new kernels
# by rescaling the profile's own H200 raw points shape by shape with new / base timed on an H100
# (moe_split.py rescale), starting from the profile as it was before the call (commit 6ddfb63),
# so this script reproduces the shipped profile whenever it is run:
# - prefill: prefill_v3.json (split attention on cuDNN, first machine) over prefill_v3_flash.json
#   (FlashAttention-2, DEEPINFER_PREFILL_ATTENTION=flash, second machine);
# - the whole routed call: moe_whole_new.json (Triton combine) over moe_whole_base.json
#   (DEEPINFER_COMBINE=torch), both on the second machine, and V4.1-Flash's expert-TP slices
#   (moe_whole_v41_*.json) on the third. A TP slice's routed experts are the whole model's
#   (deepseek-v3@tpN holds V3's experts), so they take deepseek-v3's ratios.
# Then re-derive the derived profiles (calibration/README.md). Run from the repository root:
#   bash calibration/validation/h200-deepseek/call35/rescale.sh
set -euo pipefail
D=calibration/validation/h200-deepseek/call35
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
prof=calibration/profiles/h200-deepseek.yaml
git show 6ddfb63:$prof > "$T/before.yaml"
V3=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8
SLICES=deepseek-v3@tp1-moetp2,deepseek-v3@tp1-moetp4,deepseek-v3@tp1-moetp8
V41=deepseek-v4.1-flash@tp1-moetp2,deepseek-v4.1-flash@tp1-moetp4,deepseek-v4.1-flash@tp1-moetp8
$P export "$T/before.yaml" --models "$V3" --parts prefill --out "$T/prefill_target.json"
$P export "$T/before.yaml" --models "$V3,$SLICES,$V41" --parts moe_whole --out "$T/moe_target.json"
python - "$D" "$T" <<'PY'
import json, sys
d, t = sys.argv[1:]
for kind in ("new", "base"):
    data = json.load(open(f"{d}/moe_whole_{kind}.json"))
    for tp in (2, 4, 8):  # the TP slices' experts are deepseek-v3's
        data["models"][f"deepseek-v3@tp{tp}"] = data["models"]["deepseek-v3"]
    data["models"].update(json.load(open(f"{d}/moe_whole_v41_{kind}.json"))["models"])
    json.dump(data, open(f"{t}/moe_whole_{kind}.json", "w"))
PY
$P rescale "$T/prefill_target.json" "$D/prefill_v3_flash.json" "$D/prefill_v3.json" \
  --out "$D/prefill_v3_h200.json"
$P rescale "$T/moe_target.json" "$T/moe_whole_base.json" "$T/moe_whole_new.json" \
  --out "$D/moe_whole_h200.json" --drop-missing
$P merge "$D/prefill_v3_h200.json" "$T/before.yaml" "$T/prefill.yaml"
$P merge "$D/moe_whole_h200.json" "$T/prefill.yaml" "$prof"
rm -rf "$T"
