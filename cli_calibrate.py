"""``calibrate``, ``derive-profile`` and ``merge-profiles``: make and combine cost profiles.

Thin: parse, call ``calibration/`` (run, derive, profile), print. A bad input (unknown model,
backend or hardware, a derived profile to derive from, overlapping profiles to merge) is one
``error:`` line and exit status 2, through the main group.
"""

from __future__ import annotations

from pathlib import Path

import click

from .kernels.backend import BACKEND_NAMES


@click.command()
@click.option(
    "--model",
    "models",
    multiple=True,
    default=("deepseek-v4.1-flash",),
    show_default=True,
    help="Model to calibrate (bundled name or YAML path); repeat for several.",
)
@click.option(
    "--kernels",
    default="reference",
    show_default=True,
    type=click.Choice(BACKEND_NAMES),
    help="Kernel backend to time (kernels/backend.py).",
)
@click.option(
    "--grid",
    type=click.Choice(["full", "quick", "tiny"]),
    default=None,
    help="Shapes to time: full, quick (a few minutes per model on an H200), tiny (CPU tests).",
)
@click.option("--quick", is_flag=True, help="Same as --grid quick.")
@click.option("--device", default="cuda", show_default=True, help="torch device to measure on.")
@click.option("--hardware", default=None, help="HardwareSpec name of the device (auto-detected).")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False))
@click.option("--name", default=None, help="Profile name (default: <hardware>-<kernels>).")
@click.option("--no-vision", is_flag=True, help="Skip timing the vision encoder.")
@click.option("--no-engine", is_flag=True, help="Skip timing engine-core steps.")
@click.option(
    "--decode-spread",
    type=click.FloatRange(0.0, 0.95),
    default=0.0,
    show_default=True,
    help="Time decode batches with context lengths spread over context·(1 ± S), same total "
    "(serving batches mix lengths; 0 = every sequence at one length).",
)
@click.option(
    "--engine-depth",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Layers per layer group of the timed engine-core stack (deeper: the engine's host "
    "time is a smaller share of each step).",
)
def calibrate(
    models: tuple[str, ...],
    kernels: str,
    grid: str | None,
    quick: bool,
    device: str,
    hardware: str | None,
    out_file: str,
    name: str | None,
    no_vision: bool,
    no_engine: bool,
    decode_spread: float,
    engine_depth: int,
) -> None:
    """Time one layer of each kind of MODEL with a kernel backend, fit, write a profile YAML.

    Needs the `calibrate` extra (torch). Prints each fit's training error and its error on the
    off-grid shapes. Then point a scenario at the profile with
    --set cost_model.prefill=PROFILE.yaml --set cost_model.decode=PROFILE.yaml.
    """
    from .calibration.run import run_calibration
    from .errors import UserError

    if quick and grid not in (None, "quick"):
        raise UserError(f"--quick and --grid {grid} disagree; give one")
    run_calibration(
        device=device,
        out=Path(out_file),
        grid="quick" if quick else grid or "full",
        hardware=hardware,
        name=name,
        models=models,
        kernels=kernels,
        vision=not no_vision,
        engine=not no_engine,
        decode_spread=decode_spread,
        engine_depth=engine_depth,
    )


@click.command("derive-profile")
@click.argument("measured")
@click.option("--targets", required=True, help="Comma-separated hardware names, e.g. b200,gb200.")
@click.option("--name", required=True, help="Name of the derived profile.")
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False))
def derive_profile(measured: str, targets: str, name: str, out_file: str) -> None:
    """Derive a profile for other hardware from a MEASURED one by roofline ratios."""
    from .calibration.derive import derive
    from .models.profile import load_profile, write_profile

    prof = derive(
        load_profile(measured), name, [t.strip() for t in targets.split(",") if t.strip()]
    )
    write_profile(prof, Path(out_file))
    click.echo(f"wrote {out_file} ({', '.join(prof.models)} on {', '.join(prof.hardware_names())})")


@click.command("merge-profiles")
@click.argument("out_file", metavar="OUT", type=click.Path(dir_okay=False))
@click.argument("inputs", metavar="IN...", nargs=-1, required=True)
@click.option("--name", default=None, help="Name of the merged profile (default: the first's).")
def merge_profiles(out_file: str, inputs: tuple[str, ...], name: str | None) -> None:
    """Merge profiles with fits for different models (same device and kernels) into OUT."""
    from .models.profile import load_profile, merge_profiles, write_profile

    profiles = [load_profile(p, Path.cwd()) for p in inputs]
    merged = merge_profiles(profiles, name or profiles[0].name)
    write_profile(merged, Path(out_file))
    click.echo(f"wrote {out_file} ({', '.join(merged.models)})")
