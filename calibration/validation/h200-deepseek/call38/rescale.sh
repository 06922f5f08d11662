#!/usr/bin/env bash
# Device call 38 (2026-12-06, one H100 80GB HBM3; stage decodev3): V3's decode attention block
# now makes FlashMLA's scheduler metadata once per step (MLADecodePlan.sched) instead of in every
# layer. The H200 profile's own decode raw points of V3 and its TP2/4/8 slices are carried to it
# shape by shape with new / base timed on the H100 in one call (moe_split.py rescale):
# decode_v3.json (metadata per step) over decode_v3_layer.json (DEEPINFER_MLA_SCHED=layer, the
# old behaviour). Starts from the profile as it was before the call (commit 2edde13), so it
# reproduces the shipped profile whenever it is run; then re-derives the derived profiles.
# Run from the repository root: bash calibration/validation/h200-deepseek/call38/rescale.sh
set -euo pipefail
D=calibration/validation/h200-deepseek/call38
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
prof=calibration/profiles/h200-deepseek.yaml
git show 2edde13:$prof > "$T/before.yaml"
V3=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8
$P export "$T/before.yaml" --models "$V3" --parts decode --out "$T/decode_target.json"
$P rescale "$T/decode_target.json" "$D/decode_v3_layer.json" "$D/decode_v3.json" \
  --out "$D/decode_v3_h200.json"
$P merge "$D/decode_v3_h200.json" "$T/before.yaml" "$prof"
note="; re-derived 2026-12-06 after device call 38: V3 and its TP slices' decode (FlashMLA's \
scheduler metadata once per step)"
bash calibration/validation/h200-deepseek/rederive.sh 2edde13 "$note"
rm -rf "$T"
