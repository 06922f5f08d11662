#!/usr/bin/env bash
# Device call 50 (2026-12-07, one H100 80GB HBM3 — an H200 was asked for; stage mlafused): V3's
# decode attention block runs a decode-only step as engines do — the new latents normalized and
# written into the paged cache by one Triton kernel (fused.mla_latent_write), the step's cache
# rows, page table and lengths made once per step, W_UV's bmm writing the rows wo reads in place
# — 17 kernels a layer where it ran 38-39. The H200 profile's own decode raw points of V3 and
# its TP2/4/8 slices are carried to it shape by shape with new / base timed on the H100 in one
# call (moe_split.py rescale): decode_v3.json (fused) over decode_v3_unfused.json
# (DEEPINFER_MLA_FUSED=0, the block as it was). Starts from the profile as it was before the
# call (commit 9921f13), so it reproduces the shipped profile whenever it is run; then
# re-derives the derived profiles.
# Run from the repository root: bash calibration/validation/h200-deepseek/call50/rescale.sh
set -euo pipefail
D=calibration/validation/h200-deepseek/call50
P="python -m deepinfer_sim.calibration.moe_split"
T=$(mktemp -d)
prof=calibration/profiles/h200-deepseek.yaml
git show 9921f13:$prof > "$T/before.yaml"
V3=deepseek-v3,deepseek-v3@tp2,deepseek-v3@tp4,deepseek-v3@tp8
$P export "$T/before.yaml" --models "$V3" --parts decode --out "$T/decode_target.json"
$P rescale "$T/decode_target.json" "$D/decode_v3_unfused.json" "$D/decode_v3.json" \
  --out "$D/decode_v3_h200.json"
$P merge "$D/decode_v3_h200.json" "$T/before.yaml" "$prof"
note="; re-derived 2026-12-07 after device call 50: V3 and its TP slices' decode (the latent \
written by one fused kernel, the step's indices once per step)"
bash calibration/validation/h200-deepseek/rederive.sh 9921f13 "$note"
rm -rf "$T"
