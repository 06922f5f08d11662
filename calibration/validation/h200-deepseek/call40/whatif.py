"""The what-if of docs/validation.md ("Prefill under sustained load"): the shipped profiles'
prefill fits × 1.110 and routed-expert fits × 1.070 (call 40's back-to-back ratios for the
attention block and the experts), the expert-parallel and H200 prefill cases predicted with
them and with the shipped profiles (``validate --no-loso``). Not shipped: the ratios depend on
how busy the GPU is (calls 41 and 43). Run from the repository root:

    python calibration/validation/h200-deepseek/call40/whatif.py [--out DIR]

The routed-expert scaling also moves decode; only the prefill rows are the what-if.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from deepinfer_sim.models.profile import load_profile, write_profile

ATTENTION, EXPERTS = 1.110, 1.070
CASES = {
    "hopper-derived": [
        "sglang-v3-h100-96gpu",
        "deepseek-v3-profile-h800",
        "deepseek-v3-production-h800",
        "rtp-llm-v3-h800",
    ],
    "h200-deepseek": ["gpustack-r1-h200"],
}


def scaled(src: str, dst: Path) -> None:
    p = load_profile(src)
    models = {}
    for name, m in p.models.items():
        hws = {}
        for hwn, hw in m.hardware.items():
            pre = {
                k: c.model_copy(update={f: getattr(c, f) * ATTENTION for f in "abcdef"})
                for k, c in hw.prefill.items()
            }
            upd = {"prefill": pre}
            for part in ("moe", "moe_experts"):
                fit = getattr(hw, part)
                if fit is not None:
                    upd[part] = fit.model_copy(update={f: getattr(fit, f) * EXPERTS for f in "aef"})
            hws[hwn] = hw.model_copy(update=upd)
        models[name] = m.model_copy(update={"hardware": hws})
    write_profile(p.model_copy(update={"models": models}), dst)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for profile, files in CASES.items():
        edited = out / f"{profile}-sustained.yaml"
        scaled(profile, edited)
        cmd = [sys.executable, "-m", "deepinfer_sim.cli", "validate", "--no-loso"]
        for f in files:
            cmd += ["--case-file", f"configs/published/{f}.yaml"]
        cmd += ["--cost-model", str(edited), "--cost-model", profile]
        cmd += ["--json", str(out / f"{profile}.json")]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        by: dict[tuple[str, str], dict[str, float]] = {}
        for c in json.loads((out / f"{profile}.json").read_text()):
            key = (Path(c["file"]).stem, c["name"])
            by.setdefault(key, {})["what-if" if "sustained" in c["cost_model"] else "shipped"] = c[
                "ratio"
            ]
        rows += [(k, v["shipped"], v["what-if"]) for k, v in by.items() if "prefill" in k[1]]
    for (case, name), shipped, whatif in rows:
        print(f"{case:30s} {name[:58]:58s} shipped {shipped:.3f}  what-if {whatif:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
