"""The routed experts timed whole and alone, for every model of a profile, in one device call.

A rank's routed-expert call (``TorchBench.moe``) sorts its (token, expert) pairs, gathers and
quantizes the rows, runs the experts (grouped GEMM, SwiGLU, grouped GEMM) and combines the
weighted outputs. Under expert parallelism in decode, DeepEP's low-latency kernels do the
sorting, quantizing, gathering and weighted combining themselves (their measured times are the
all-to-all's), so a decode rank's experts cost only the middle part (``TorchBench.moe_experts``,
the profile's ``moe_experts``). This measures both on the calibration's MoE grid and off-grid
shapes, needing only the experts' kernels (no FlashMLA), and merges them into a profile.

    python -m deepinfer_sim.calibration.moe_split measure --out FILE.json [--device cuda]
        [--models deepseek-v4.1-flash,deepseek-v3,...] [--kernels deepseek] [--grid quick]
        [--parts moe,prefill,decode]
    python -m deepinfer_sim.calibration.moe_split merge FILE.json PROFILE.yaml OUT.yaml
        [--keep-whole]
    python -m deepinfer_sim.calibration.moe_split rescale TARGET.json BASE.json NEW.json
        --out OUT.json [--drop-missing]
    python -m deepinfer_sim.calibration.moe_split export PROFILE --models A,B --out FILE.json
        [--parts moe,prefill,decode]

``measure`` also lists the kernels of one decode-sized call of each (``torch.profiler``, on the
GPU), so the share the exchange takes over shows by name. ``merge`` re-fits each measured
model's ``moe`` and fits its ``moe_experts`` (``sweep.fit_routed``), replacing those fits, their
errors and raw points on the profile's one hardware, and notes the file in the provenance;
``--keep-whole`` keeps the profile's ``moe`` (what its engine-core replays were checked with) and
adds only ``moe_experts``. ``rescale`` carries a kernel change measured on another GPU to the
profiled one: each TARGET time (the profiled GPU, old kernels) times NEW / BASE, both timed on one
GPU in one call (new kernels, and the old ones again as the baseline), shape by shape.

``measure --parts prefill`` (or ``moe,prefill``) times each model's prefill attention block on the
grid's prefill shapes instead of (or beside) its experts — a kernel change in prefill needs no
decode, engine or MoE re-timing — and ``merge`` re-fits those prefill fits (forms smooth, prefix,
merge and waves, as the shipped profile's) and replaces their raw points; ``--parts moe_whole``
times only the whole routed call (a change to its routing or combine leaves the experts' own work
alone). ``--parts decode`` times each model's decode attention block on the grid's decode shapes
and off-grid shapes (batch × context × verify tokens, as ``calibrate`` times them; FlashMLA on a
GPU for V3) and ``merge`` re-fits its decode fits (``sweep.fit_attention``, the calibration's forms
and the model's verify tile) — a change to the decode attention block alone, such as V3's block
making FlashMLA's scheduler metadata once per step instead of in every layer
(``DEEPINFER_MLA_SCHED=layer`` restores the old behaviour, the baseline of a rescale), needs no
prefill, MoE or engine re-timing. ``rescale`` carries whichever parts all three files timed, shape
by shape on each row's key columns ((experts, tokens), (kind, tokens, prefix), (kind, batch,
context, verify)); ``export`` writes a profile's own raw points of some models as a ``measure``
file, the TARGET of a rescale.

A measured model the profile does not hold — an expert-parallel slice,
``NAME@tp1-moetpM``, each routed expert narrowed M ways (expert tensor parallelism) — becomes an
entry of its own with only those fits; a pool at that expert width takes them beside the block
fits of another entry (``Profile.coefs``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..models.profile import (
    FitError,
    HardwareCoefs,
    ModelFits,
    Profile,
    Widths,
    load_profile,
    write_profile,
)
from ..models.registry import load_model
from .fit import PrefillForm
from .layer_kernels import profile_call
from .sweep import (
    Grid,
    Measurements,
    fit_attention,
    fit_experts_alone,
    fit_routed,
    measurements_of,
    prefill_wave_tiles,
    raw_of,
    time_decode,
    time_each,
    time_prefill,
    verify_tiles,
)

MODELS = ("deepseek-v4.1-flash", "deepseek-v3", "deepseek-v4-flash", "deepseek-v4-pro")
PROFILED = (8, 256)  # (local experts, tokens) of the profiled call: a decode rank's load
RAW_KEYS = ("moe", "moe_offgrid", "moe_experts", "moe_experts_offgrid")
PREFILL_KEYS = ("prefill", "prefill_offgrid")
DECODE_KEYS = ("decode", "decode_offgrid")
PREFILL_FORMS_SHIPPED: tuple[PrefillForm, ...] = ("smooth", "prefix", "merge", "waves")
# each part's raw keys; the attention parts, timed per attention kind by their sweep function
PART_KEYS = {
    "moe": RAW_KEYS,
    "moe_whole": RAW_KEYS[:2],
    "prefill": PREFILL_KEYS,
    "decode": DECODE_KEYS,
}
ATTENTION = {"prefill": time_prefill, "decode": time_decode}
ALL_KEYS = tuple(dict.fromkeys(k for keys in PART_KEYS.values() for k in keys))


def _kernels(fn: Any, cuda: bool, top: int = 14) -> list[dict[str, Any]]:
    """Each kernel's device time (CPU time off the GPU) in one call of ``fn``, largest first,
    operators' rows among them."""
    return profile_call(fn, cuda, kernels_only=False)[:top]


def measure_model(
    model: str,
    device: str,
    kernels: str,
    grid: Grid,
    hardware: str | None = None,
    log: Any = print,
    parts: tuple[str, ...] = ("moe",),
) -> dict[str, Any]:
    """``parts`` of one model: ``moe``, both timings on ``grid``'s MoE shapes and the profiled
    decode-sized call; ``prefill`` / ``decode``, its prefill / decode attention block of each
    kind on the grid's prefill / decode shapes and off-grid shapes, as ``calibrate`` times them
    (with ``decode``, the verify tiles its fit takes: ``sweep.verify_tiles``)."""
    from .torch_bench import TorchBench

    attention = [part for part in ATTENTION if part in parts]
    bench = TorchBench(
        device, model, hardware, backend=kernels, attention=bool(attention), **grid.bench_sizes()
    )
    bench.warmup()
    m = Measurements()
    for kind in bench.kinds:
        for part in attention:
            ATTENTION[part](bench, grid, kind, m, log)
    keys = tuple(k for part in attention for k in PART_KEYS[part])
    out: dict[str, Any] = {"verify_tiles": verify_tiles(bench.spec)} if "decode" in parts else {}
    if "prefill" in parts:
        out["wave_tiles"] = prefill_wave_tiles(bench.spec, bench.hardware)
    if "moe" in parts or "moe_whole" in parts:
        bench.release_kernels()
        m.moe = time_each(grid.moe_shapes(), log, "moe", bench.moe)
        m.moe_off = time_each(grid.off_moe, log, "moe off-grid", bench.moe)
        keys += RAW_KEYS[:2]
    if "moe" in parts:
        m.moe_experts = time_each(grid.moe_shapes(), log, "moe experts", bench.moe_experts)
        m.moe_experts_off = time_each(grid.off_moe, log, "moe experts off-grid", bench.moe_experts)
        keys += RAW_KEYS[2:]
        e, t = min(PROFILED[0], max(grid.moe_e)), PROFILED[1]
        moe = bench.moe_block(e)
        x = bench.torch.randn((t, bench.shape.hidden), device=bench.device).to(moe.dtype)
        ids, w = moe.uniform_routing(t, seed=t)
        rows, offs = moe.prepare_experts(x, ids)
        out["profiled"] = {
            "experts": e,
            "tokens": t,
            "moe": _kernels(lambda: moe.forward_routed(x, ids, w), bench.cuda),
            "moe_experts": _kernels(lambda: moe.forward_experts(rows, offs), bench.cuda),
        }
    return {
        "raw": {k: v for k, v in raw_of(m).items() if k in keys},
        **out,
        "model": bench.spec.name,
        "widths": Widths.of(bench.spec).model_dump(),
        "device": bench.device_name,
        "hardware": bench.hardware,
        "software": bench.software,
        "kernel_versions": dict(bench.kernel_versions),
    }


def merge(
    measured: dict[str, Any], profile: Profile, source: str, keep_whole: bool = False
) -> Profile:
    """``profile`` with what ``measured`` (``measure``'s output) timed of each model: its
    ``moe`` re-fitted and ``moe_experts`` fitted, its prefill fits re-fitted (forms smooth,
    prefix, merge and waves, as the shipped profile's), its decode fits re-fitted
    (``_fit_attention``); those parts' fits, fit errors and raw points replaced, other models
    and fits kept. ``keep_whole``: keep the profile's ``moe`` fits and raw points (those its
    engine replays were checked against) and add only the experts alone."""
    models = dict(profile.models)
    done: dict[str, list[str]] = {"moe": [], "moe_experts": [], "prefill": [], "decode": []}
    for name, res in measured.get("models", {}).items():
        new = name not in models
        if new:
            models[name] = _experts_entry(name, res.get("widths"), profile, source)
        fits = models[name]
        top_k = fits.widths.top_k if fits.widths else load_model(name).moe.top_k
        if len(fits.hardware) != 1:
            raise UserError(f"{profile.name}: {name} has fits for {len(fits.hardware)} hardware")
        try:
            m = measurements_of(res["raw"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{source}: {name}: not moe_split measurements ({exc})") from None
        errors = dict(fits.fit)
        ((hw, coefs),) = fits.hardware.items()
        parts = [part for part in ATTENTION if res["raw"].get(part)]
        update, attention_errors = _fit_attention(m, parts, name, hw, res, source)
        errors.update(attention_errors)
        taken = tuple(k for part in parts for k in PART_KEYS[part])
        for part in parts:
            done[part].append(name)
        whole = keep_whole and not new  # a new entry's whole call is its own measurement
        if res["raw"].get("moe") and not whole:
            update["moe"], errors["moe"] = fit_routed(m, top_k)
            taken += RAW_KEYS[:2]
            done["moe"].append(name)
        if res["raw"].get("moe_experts"):
            update["moe_experts"] = fit_experts_alone(m, top_k, errors)
            taken += RAW_KEYS[2:]
            done["moe_experts"].append(name)
        raw = {k: v for k, v in fits.raw.items() if k not in taken}
        raw.update({k: res["raw"][k] for k in taken if res["raw"].get(k)})
        models[name] = fits.model_copy(
            update={
                "hardware": {hw: coefs.model_copy(update=update)},
                "fit": errors,
                "raw": raw,
            }
        )
    if not any(done.values()):
        raise UserError(f"{source}: no measured model")
    notes = [f"{part} of {', '.join(names)}" for part, names in done.items() if names]
    note = f"; {' and '.join(notes)} from {Path(source).name} (moe_split.py"
    note += f", prefill forms {', '.join(PREFILL_FORMS_SHIPPED)})" if done["prefill"] else ")"
    prov = profile.provenance
    return profile.model_copy(
        update={"models": models, "provenance": prov.model_copy(update={"note": prov.note + note})}
    )


def _fit_attention(
    m: Measurements, parts: list[str], name: str, hw: str, res: dict[str, Any], source: str
) -> tuple[dict[str, Any], dict[str, FitError]]:
    """The fits of ``parts`` (``prefill``, ``decode``) of ``m``, one model's measurements, and
    their errors, as ``calibrate`` fits them (``sweep.fit_attention``: prefill forms smooth,
    prefix, merge and waves, as the shipped profile's; decode with the verify tiles ``measure``
    recorded, else the model's own); refused where a kind timed has too few shapes to fit."""
    if not parts:
        return {}, {}
    tiles = res.get("verify_tiles")
    if tiles is None and "decode" in parts:
        tiles = verify_tiles(load_model(name))
    waves = res.get("wave_tiles")  # what measure recorded; for a profile's raw, the model's own
    if waves is None and "prefill" in parts:
        waves = prefill_wave_tiles(load_model(name), hw)
    prefill, decode, errors = fit_attention(m, PREFILL_FORMS_SHIPPED, tiles, waves or 0.0)
    fitted: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "prefill": (prefill, m.prefill),
        "decode": (decode, m.decode),
    }
    update: dict[str, Any] = {}
    for part in parts:
        fits, timed = fitted[part]
        short = sorted(set(timed) - set(fits))
        if short:
            raise UserError(f"{source}: {name}: too few {part} shapes of {', '.join(short)} to fit")
        update[part] = fits
    kept = {k: e for k, e in errors.items() if k.partition(".")[0] in parts}
    return update, kept


def rescale(
    target: dict[str, Any],
    base: dict[str, Any],
    new: dict[str, Any],
    drop_missing: bool = False,
    log: Any = print,
) -> dict[str, Any]:
    """``target``'s measurements with every time multiplied by ``new`` / ``base`` at the same
    shape (a row's key columns: (experts, tokens), (kind, tokens, prefix) for prefill, (kind,
    batch, context, verify) for decode), which both others must have timed (they may have timed
    more); all three ``measure`` outputs of the same models.
    Only the parts the target and both others timed are kept; ``drop_missing``: a target shape
    the others did not time is left out (and said), not refused."""
    out = json.loads(json.dumps(target))
    for name, res in out["models"].items():
        try:
            b_raw, n_raw = base["models"][name]["raw"], new["models"][name]["raw"]
        except KeyError:
            raise UserError(f"{name}: measured in the target but not in both others") from None
        keys = [k for k in ALL_KEYS if res["raw"].get(k)]
        missing = [k for k in keys if not (b_raw.get(k) and n_raw.get(k))]
        if missing:
            raise UserError(f"{name}: {', '.join(missing)} timed in the target only")
        res["raw"] = {k: res["raw"][k] for k in keys}
        for key in keys:
            b_at, n_at = ({tuple(r[:-1]): r[-1] for r in f[key]} for f in (b_raw, n_raw))
            both = b_at.keys() & n_at.keys()
            lost = [r[:-1] for r in res["raw"][key] if tuple(r[:-1]) not in both]
            if lost and not drop_missing:
                raise UserError(f"{name}: {key}: {lost[0]} is not timed in both other files")
            if lost:
                log(f"{name}: {key}: {len(lost)} shapes not timed in both others left out: {lost}")
            res["raw"][key] = [
                [*r[:-1], r[-1] * n_at[tuple(r[:-1])] / b_at[tuple(r[:-1])]]
                for r in res["raw"][key]
                if tuple(r[:-1]) in both
            ]
        res["rescaled"] = {
            "by": "new / base, shape by shape",
            "device": new["models"][name].get("device"),
            "kernel_versions": new["models"][name].get("kernel_versions"),
        }
    return out


def export(
    profile: Profile, models: list[str], parts: tuple[str, ...] = ("moe", "prefill")
) -> dict[str, Any]:
    """``models``' raw points of ``parts`` in ``profile``, as ``measure`` writes them (the
    target of :func:`rescale`)."""
    out: dict[str, Any] = {"profile": profile.name, "models": {}}
    for name in models:
        if name not in profile.models:
            raise UserError(f"model {name!r} is not in profile {profile.name!r}")
        raw = profile.models[name].raw
        keys = [k for part in parts for k in PART_KEYS[part]]
        out["models"][name] = {"raw": {k: raw[k] for k in keys if raw.get(k)}}
    return out


def _experts_entry(
    name: str, widths: dict[str, Any] | None, profile: Profile, source: str
) -> ModelFits:
    """A new entry for an expert-parallel slice (``NAME@tp1-moetpM``: the model's routed experts
    narrowed ``M`` ways) whose fits ``merge`` is about to set: its widths as measured, no
    attention-block fits, the whole model's dtypes and all-to-all. A pool at that expert width
    takes its block fits from another entry (``Profile.coefs``)."""
    base = name.partition("@")[0]
    if base not in profile.models or widths is None:
        raise UserError(
            f"{source}: model {name!r} is not in profile {profile.name!r}"
            + ("" if widths is None else f" and neither is {base!r}")
        )
    whole = profile.models[base]
    (hw, coefs), *_ = whole.hardware.items()
    bare = HardwareCoefs(prefill={}, decode={}, moe=coefs.moe, a2a=coefs.a2a, graphed=coefs.graphed)
    return ModelFits(dtypes=whole.dtypes, widths=Widths.model_validate(widths), hardware={hw: bare})


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p for p in text.split(",") if p)
    if not parts or set(parts) - set(PART_KEYS):
        raise UserError(f"--parts {text!r}: choose from {', '.join(PART_KEYS)}")
    return parts


def _read(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    me = sub.add_parser("measure")
    me.add_argument("--out", type=Path, required=True)
    me.add_argument("--device", default="cuda")
    me.add_argument("--models", default=",".join(MODELS))
    me.add_argument("--kernels", default="deepseek", choices=["deepseek", "reference"])
    me.add_argument("--grid", default="quick", choices=["full", "quick", "tiny"])
    me.add_argument("--hardware", help="the device's hardware name (default: detected)")
    me.add_argument(
        "--parts",
        default="moe",
        help="what to time, comma-separated: moe (the routed experts whole and alone), "
        "moe_whole (the whole call only), prefill (the prefill attention block), decode (the "
        "decode attention block: a change to it alone, e.g. FlashMLA's scheduler metadata once "
        "per step, DEEPINFER_MLA_SCHED=layer the old per-layer baseline)",
    )
    mg = sub.add_parser("merge")
    mg.add_argument("measured", type=Path)
    mg.add_argument("profile")
    mg.add_argument("out", type=Path)
    mg.add_argument(
        "--keep-whole",
        action="store_true",
        help="keep the profile's moe fits (the whole call); add only the experts alone",
    )
    rs = sub.add_parser("rescale")
    rs.add_argument("target", type=Path)
    rs.add_argument("base", type=Path)
    rs.add_argument("new", type=Path)
    rs.add_argument("--out", type=Path, required=True)
    rs.add_argument(
        "--drop-missing",
        action="store_true",
        help="leave out target shapes the others did not time (listed) instead of refusing",
    )
    ex = sub.add_parser("export")
    ex.add_argument("profile")
    ex.add_argument("--models", required=True)
    ex.add_argument(
        "--parts",
        default="moe,prefill",
        help=f"whose raw points, comma-separated: {', '.join(PART_KEYS)}",
    )
    ex.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "export":
            names = [s for s in a.models.split(",") if s]
            parts = _parts(a.parts)
            data = export(load_profile(a.profile), names, parts)
            a.out.write_text(json.dumps(data, indent=1) + "\n")
            return 0
        if a.cmd == "rescale":
            target, base, new = (_read(p) for p in (a.target, a.base, a.new))
            done = rescale(target, base, new, a.drop_missing)
            a.out.write_text(json.dumps(done, indent=1) + "\n")
            return 0
        if a.cmd == "measure":
            grid = Grid.named(a.grid)
            parts = _parts(a.parts)
            out: dict[str, Any] = {"grid": grid.name, "models": {}}
            for name in (s for s in a.models.split(",") if s):
                print(f"== {name}", flush=True)
                res = measure_model(name, a.device, a.kernels, grid, a.hardware, parts=parts)
                out["models"][res.pop("model")] = res
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps(out, indent=1) + "\n")  # what is done so far
            for name, res in out["models"].items():
                if "profiled" not in res:
                    continue
                p = res["profiled"]
                for which in ("moe", "moe_experts"):
                    total = sum(k["us"] for k in p[which])
                    print(f"{name} {which} E={p['experts']} T={p['tokens']}: {total:.1f} us")
            return 0
        measured = _read(a.measured)
        merged = merge(measured, load_profile(a.profile), str(a.measured), a.keep_whole)
        write_profile(merged, a.out)
        for name in measured.get("models", {}):
            fit = merged.models[name].fit
            print(f"{name}:", end="")
            if "moe" in fit:
                print(f" moe off-grid {fit['moe'].offgrid_mape:.1%}", end="")
            if "moe_experts" in fit:
                print(f", experts alone off-grid {fit['moe_experts'].offgrid_mape:.1%}", end="")
            for key in (k for k in fit if k.startswith(("prefill.", "decode."))):
                print(f", {key} off-grid {fit[key].offgrid_mape:.1%}", end="")
            print()
        return 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
