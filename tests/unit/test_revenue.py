"""Revenue as providers bill it: cached input tokens may be priced apart from misses, and a
traffic class apart from the others (``prices.revenue.by_class``)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from conftest import make_source, tiny_dict

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.cli import main
from deepinfer_sim.errors import ConfigError, ConfigWarning
from deepinfer_sim.scenario import Revenue, scenario_from_dict
from deepinfer_sim.sim.results.revenue import TokenRates, revenue

SMALL = ["workload.max_requests=150", "sim.progress=false"]


@pytest.fixture(scope="module")
def runs():
    same = simulate(load_scenario("default", SMALL)).summary
    cheap = simulate(
        load_scenario("default", [*SMALL, "prices.revenue.input_cache_hit_per_mtok_usd=0.014"])
    ).summary
    return same, cheap


def test_revenue_says_which_tokens_earned_it(runs) -> None:
    same, _ = runs
    cost = same["cost"]
    parts = cost["revenue_usd_per_hour_by_tokens"]
    assert sum(parts.values()) == pytest.approx(cost["revenue_usd_per_hour"])
    hit = same["cache"]["hit_rate_tokens"]
    assert 0 < hit < 1  # the default workload reuses prefixes
    # without a cache-hit price, hits earn what misses earn, per token
    assert parts["input_cache_hit"] / parts["input_cache_miss"] == pytest.approx(hit / (1 - hit))


def test_cheaper_cache_hits_lower_revenue_by_the_hit_tokens_only(runs) -> None:
    same, cheap = runs
    a, b = (
        same["cost"]["revenue_usd_per_hour_by_tokens"],
        cheap["cost"]["revenue_usd_per_hour_by_tokens"],
    )
    assert b["input_cache_hit"] == pytest.approx(a["input_cache_hit"] / 10)
    assert b["input_cache_miss"] == pytest.approx(a["input_cache_miss"])
    assert b["output"] == pytest.approx(a["output"])
    assert cheap["cost"]["revenue_usd_per_hour"] < same["cost"]["revenue_usd_per_hour"]


# ---- per traffic class --------------------------------------------------------------------

PER_H = 3600 / 1e6  # tokens/s x USD per million tokens -> USD per hour


def test_two_classes_each_earn_at_their_own_prices() -> None:
    """Agents pay 3 $/M for missed input and 4 $/M for output; what they leave out (the hit
    price) is the global one. The totals are what each class's tokens earned, added up."""
    prices = Revenue(
        input_per_mtok_usd=1.0,
        input_cache_hit_per_mtok_usd=0.5,
        output_per_mtok_usd=2.0,
        by_class={"agent": {"input_per_mtok_usd": 3.0, "output_per_mtok_usd": 4.0}},
    )
    chatbot, agent = TokenRates(100, 50, 10), TokenRates(200, 100, 20)
    total = TokenRates(*(a + b for a, b in zip(chatbot, agent, strict=True)))
    totals, by_class = revenue(prices, total, {"chatbot": chatbot, "agent": agent})
    assert by_class["chatbot"] == pytest.approx(
        {
            "input_cache_miss": 100 * 1.0 * PER_H,
            "input_cache_hit": 50 * 0.5 * PER_H,
            "output": 10 * 2.0 * PER_H,
            "total": (100 + 25 + 20) * PER_H,
        }
    )
    assert by_class["agent"] == pytest.approx(
        {
            "input_cache_miss": 200 * 3.0 * PER_H,
            "input_cache_hit": 100 * 0.5 * PER_H,
            "output": 20 * 4.0 * PER_H,
            "total": (600 + 50 + 80) * PER_H,
        }
    )
    for kind in totals:
        assert totals[kind] == pytest.approx(by_class["chatbot"][kind] + by_class["agent"][kind])


def test_a_class_without_a_hit_price_bills_hits_as_its_own_misses() -> None:
    """With no cache-hit price anywhere, a hit costs what a miss costs, the class's own miss."""
    prices = Revenue(by_class={"agent": {"input_per_mtok_usd": 3.0}})
    assert prices.prices("agent").input_cache_hit == 3.0
    assert prices.prices("chatbot") == prices.prices()
    assert prices.prices().input_cache_hit == prices.input_per_mtok_usd


def two_class_run(**over: object):
    """The tiny deployment on 300 requests, alternating chatbot and agent; agents' prompts are
    4x longer, so the two classes earn visibly different amounts at the same prices."""
    data = tiny_dict(**{"workload": {"sessions": {"days": 1}}, **over})
    rng = np.random.default_rng(3)
    n = 300
    classes = np.arange(n) % 2
    source = make_source(
        np.sort(rng.uniform(0, 30, n)),
        np.where(classes == 1, 4000, 1000),
        200,
        classes=classes.astype(np.int8),
        class_names=("chatbot", "agent"),
    )
    return simulate(scenario_from_dict(data), source=source).summary["cost"]


@pytest.fixture(scope="module")
def class_runs():
    same = two_class_run()
    dear = two_class_run(**{"prices.revenue.by_class": {"agent": {"output_per_mtok_usd": 2.1}}})
    noop = two_class_run(**{"prices.revenue.by_class": {"agent": {}}})
    return same, dear, noop


def test_summary_says_what_each_class_earned(class_runs) -> None:
    same, _, _ = class_runs
    by_class = same["revenue_usd_per_hour_by_class"]
    assert set(by_class) == {"chatbot", "agent"}
    assert by_class["agent"]["input_cache_miss"] > by_class["chatbot"]["input_cache_miss"]
    for kind, earned in same["revenue_usd_per_hour_by_tokens"].items():
        assert earned == pytest.approx(sum(c[kind] for c in by_class.values()))
    assert same["revenue_usd_per_hour"] == pytest.approx(sum(c["total"] for c in by_class.values()))


def test_a_dearer_class_raises_its_own_earnings_only(class_runs) -> None:
    """Agents' output at 10x the global price: their output earns 10x, nothing else moves."""
    same, dear, _ = class_runs
    a, b = same["revenue_usd_per_hour_by_class"], dear["revenue_usd_per_hour_by_class"]
    assert b["chatbot"] == a["chatbot"]
    assert b["agent"]["output"] == pytest.approx(10 * a["agent"]["output"])
    assert b["agent"]["input_cache_miss"] == a["agent"]["input_cache_miss"]
    extra = b["agent"]["output"] - a["agent"]["output"]
    assert dear["revenue_usd_per_hour"] == pytest.approx(same["revenue_usd_per_hour"] + extra)
    assert dear["revenue_usd_per_hour_by_tokens"]["output"] == pytest.approx(
        b["agent"]["output"] + b["chatbot"]["output"]
    )


def test_a_class_with_no_prices_of_its_own_changes_nothing(class_runs) -> None:
    """Totals come out identical, to the bit, when no class is priced apart."""
    same, _, noop = class_runs
    assert noop == same


# ---- bad prices -----------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (  # sessions produce chatbot and agent only
            ["workload.sessions.days=1", "prices.revenue.by_class.robot.output_per_mtok_usd=1"],
            "prices.revenue.by_class.robot",
        ),
        (  # the builtin Mooncake trace is all chatbot
            ["prices.revenue.by_class.agent.output_per_mtok_usd=1"],
            "prices.revenue.by_class.agent",
        ),
        (
            ["prices.revenue.by_class.chatbot.output_per_mtok=1"],
            "prices.revenue.by_class.chatbot.output_per_mtok",
        ),
        (
            ["prices.revenue.by_class.chatbot.input_per_mtok_usd=-1"],
            "prices.revenue.by_class.chatbot.input_per_mtok_usd",
        ),
        (["prices.revenue.by_class.chatbot=3"], "prices.revenue.by_class.chatbot"),
    ],
    ids=["unknown-class-sessions", "unknown-class-trace", "unknown-key", "negative", "not-a-map"],
)
def test_bad_class_prices_are_one_error_naming_the_key(overrides, key) -> None:
    with pytest.raises(ConfigError, match=f"{key.replace('.', '[.]')}: "):
        load_scenario("default", overrides)
    args = [x for o in overrides for x in ("--set", o)]
    code, out = cli("show", "default", *args)
    assert code == 2, out
    assert out.startswith("error:") and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert f"{key}: " in out


def test_prices_for_a_class_a_trace_file_lacks_warn_at_run_start(tmp_path: Path) -> None:
    """A trace file's classes are known only once it is read: prices for a class it lacks are
    one ``warning:`` line at run start, and the run goes on."""
    shipped = Path(__file__).parents[2] / "traces" / "data" / "mooncake_conversation.jsonl.gz"
    trace = tmp_path / "conversation.jsonl"
    trace.write_bytes(gzip.decompress(shipped.read_bytes()))
    data = tiny_dict(**{"workload.trace": str(trace), "workload.max_requests": 50})
    data["prices"] = {"revenue": {"by_class": {"agent": {"output_per_mtok_usd": 1}}}}
    config = tmp_path / "scenario.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    sc = load_scenario(config)  # validates: the file's classes are not known yet
    with pytest.warns(ConfigWarning, match=r"by_class: agent never appear.*classes: chatbot"):
        simulate(sc)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("warnings.filters", [("always", None, ConfigWarning, None, 0)])
        code, out = cli("run", str(config), "--out", str(tmp_path / "run"))
    assert code == 0, out
    warned = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warned == [
        "warning: prices.revenue.by_class: agent never appear in the workload (its traffic "
        "classes: chatbot); those prices are unused"
    ]
