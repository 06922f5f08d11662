"""Multi-day synthetic session workloads: chatbot conversations and agent tool loops.

Design notes
------------
KV-cache TTLs of days (agent 3 d, chatbot 7 d; SPEC.md §2.5) can only be studied on a workload
whose prefixes come back after hours and days, and the public traces span an hour. This module
generates such a workload from a small, validated config (:class:`SessionWorkload`) and returns
an ordinary :class:`~deepinfer_sim.traces.source.RequestSource`.

The unit is a **session** (one conversation, one agent task). It has one or more **visits**
(the user comes back after a return gap), each of one or more **turns** (requests):

- A session starts at a time drawn from a diurnal rate curve, picks a system prompt from its
  class's small pool (Zipf popularity), and every turn's prompt is the whole conversation so
  far: ``prompt_k = prompt_{k-1} + output_{k-1} + message_k``. Chatbot messages are user
  messages; agent messages are tool results, so an agent visit is a long run of steps seconds
  apart over a growing context.
- Turns of a visit are ``output / decode_tokens_per_s + think_time`` apart (open loop: the
  trace fixes arrival times; a simulator does not delay a turn until the previous completes).
- After its last turn a visit is followed by another with probability ``return_prob``, after a
  lognormal return gap (hours to weeks for chatbots, mostly minutes to hours for agents).
- With probability ``rewrite_prob`` a later turn keeps only a leading share of the cached
  prefix (the app edited or dropped earlier content; the prompt length is unchanged): 15 % of
  Mooncake's follow-up requests reuse only part of their predecessor's blocks.
- A prompt above ``max_context`` either ends the session (``on_overflow="end"``, a new chat)
  or is compacted (``"compact"``: system prompt + a fresh summary, as coding agents do).

Block ids follow the Mooncake convention (chained: an id at position ``k`` names the whole
prefix up to block ``k``), with these rules:

- The full blocks of a system prompt get ids shared by every session that uses the prompt. A
  system prompt's trailing partial block holds the first user tokens too, so it is per session.
- A turn reuses the ids of its predecessor's **full** blocks (``input // block_tokens`` of
  them) and gets fresh ids from there on. A partial last block is a dead end: its id names
  that exact partial content, and when the next turn fills the block with more tokens, that
  block gets a new id. Reusing the partial id would tell a prefix cache (which counts hits in
  whole blocks) that 512 tokens of different content were cached. So a turn's prefix hit is
  always its predecessor's full blocks, never more, matching how content hashes behave.
- A rewrite keeps the first ``max(system blocks, keep · previous full blocks)`` ids; a
  compaction keeps only the system prompt's. Everything after is fresh.

Everything is vectorized over sessions, visits, turns and block references; only sessions that
hit a compaction are walked one at a time (few). The 7-day default workload (0.8 M requests,
37 M block references) generates in ~1.6 s, ~500 k requests/s (``benchmarks/sessions_stats.py``).

Measured against the shared traces (``docs/workloads.md``): the chatbot defaults are fitted to
the Mooncake conversation trace's length distributions and 1-hour prefix reuse; the agent
defaults follow the TraceLab sample (large tool-definition system prompts, growing context,
~90 % cached-prefix share); the chatbot return process, invisible in a 1-hour trace, is set
so that cutting the chatbot TTL from 7 to 3 days costs ~0.7 points of chatbot hit rate in
steady state (the article measured 0.5-1 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from deepinfer_sim import fpmath
from deepinfer_sim.rng import normal, stream
from deepinfer_sim.traces.source import RequestSource
from deepinfer_sim.validation import FrozenModel

__all__ = [
    "CLASS_NAMES",
    "DEFAULT_AGENT",
    "DEFAULT_CHATBOT",
    "LogNormalMix",
    "SessionClass",
    "SessionWorkload",
    "diurnal_rate",
    "generate_sessions",
]

DAY_S = 86400.0
CLASS_NAMES = ("chatbot", "agent")
"""Traffic classes of a generated source, in code order."""

_MINUTES_PER_DAY = 1440


# ---------------------------------------------------------------------------- config


class LogNormalMix(FrozenModel):
    """A lognormal (or a mixture of two), clipped to ``[low, high]``.

    With probability ``mix_prob`` a value comes from the second component. Token counts are
    rounded to integers; durations are in seconds.
    """

    median: float = Field(gt=0, le=1e12, description="median of the main component")
    sigma: float = Field(ge=0, le=10, description="log-space standard deviation, main component")
    mix_prob: float = Field(0.0, ge=0, le=1, description="probability of the second component")
    mix_median: float = Field(1.0, gt=0, le=1e12, description="median of the second component")
    mix_sigma: float = Field(0.0, ge=0, le=10, description="log-space sd, second component")
    low: float = Field(0.0, ge=0, le=1e12, description="values below are raised to this")
    high: float = Field(1e12, gt=0, le=1e12, description="values above are cut to this")

    @model_validator(mode="after")
    def _bounds(self) -> LogNormalMix:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
        """``n`` draws (floats). Draws ``n`` normals, plus ``n`` uniforms when mixed."""
        z = normal(rng, n)
        x = self.median * fpmath.exp(self.sigma * z)
        if self.mix_prob > 0:
            second = rng.random(n) < self.mix_prob
            x = np.where(second, self.mix_median * fpmath.exp(self.mix_sigma * z), x)
        return np.clip(x, self.low, self.high)

    def sample_int(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        """``n`` draws rounded to integers (token counts, turn counts)."""
        return np.rint(self.sample(rng, n)).astype(np.int64)


def _ln(
    median: float, sigma: float, low: float = 0.0, high: float = 1e12, **mix: float
) -> LogNormalMix:
    return LogNormalMix(median=median, sigma=sigma, low=low, high=high, **mix)


class SessionClass(FrozenModel):
    """How sessions of one traffic class look: prompts, turns, timing, returns, context cap."""

    system_prompts: int = Field(ge=1, le=100_000, description="size of the system-prompt pool")
    system_prompt_tokens: LogNormalMix = Field(description="length of each pooled system prompt")
    system_prompt_zipf: float = Field(
        ge=0, le=10, description="popularity of pool entry r is proportional to (r+1)^-zipf"
    )
    first_message: LogNormalMix = Field(description="tokens of a session's first user message")
    turn_message: LogNormalMix = Field(
        description="tokens appended by each later turn of a visit (user message or tool result)"
    )
    return_message: LogNormalMix = Field(description="tokens of the first message of a return")
    output: LogNormalMix = Field(description="output tokens of each turn")
    turns_per_visit: LogNormalMix = Field(description="turns in one visit (rounded, at least 1)")
    think_time_s: LogNormalMix = Field(
        description="seconds from the end of a response to the next turn of the same visit"
    )
    rewrite_prob: float = Field(
        ge=0,
        le=1,
        description="probability a later turn keeps only a leading part of the cached prefix",
    )
    rewrite_keep: LogNormalMix = Field(
        description="share of the previous prompt's blocks a rewriting turn keeps (0..1)"
    )
    return_prob: float = Field(ge=0, lt=1, description="probability a visit is followed by another")
    return_gap_s: LogNormalMix = Field(description="seconds from a visit's last turn to the next")
    max_visits: int = Field(ge=1, le=10_000, description="visits per session at most")
    max_context: int = Field(ge=2, le=100_000_000, description="prompt tokens per request at most")
    on_overflow: Literal["end", "compact"] = Field(
        description="a prompt over max_context ends the session, or compacts its history"
    )
    compact_tokens: LogNormalMix = Field(
        description="summary tokens that replace the history after a compaction"
    )

    @model_validator(mode="after")
    def _check(self) -> SessionClass:
        for name in (
            "system_prompt_tokens",
            "first_message",
            "turn_message",
            "return_message",
            "output",
            "compact_tokens",
            "turns_per_visit",
        ):
            if getattr(self, name).low < 1:
                raise ValueError(f"{name}.low: must be >= 1 (got {getattr(self, name).low})")
        if self.rewrite_keep.high > 1:
            raise ValueError(f"rewrite_keep.high: must be <= 1 (got {self.rewrite_keep.high})")
        if self.turns_per_visit.high > 100_000:
            raise ValueError("turns_per_visit.high: must be <= 100000")
        room = self.system_prompt_tokens.high + (
            self.compact_tokens.high if self.on_overflow == "compact" else 0
        )
        if room + 1 > self.max_context:
            raise ValueError(
                f"max_context ({self.max_context}) must exceed system_prompt_tokens.high"
                + (" + compact_tokens.high" if self.on_overflow == "compact" else "")
                + f" ({room:g}) by at least one token"
            )
        return self


# Chatbot defaults: lengths, turns, think time and rewrites fitted to the Mooncake conversation
# trace seen through 1-hour windows (docs/workloads.md); the return process (not visible in a
# 1 h trace) is set so that cutting the chatbot TTL from 7 to 3 days costs ~0.7 points of
# chatbot hit rate in steady state (the article: 0.5-1 %, SPEC.md §2.5).
DEFAULT_CHATBOT = SessionClass(
    system_prompts=4,
    system_prompt_tokens=_ln(800, 0.2, 512, 2048),
    system_prompt_zipf=1.0,
    first_message=_ln(75, 1.7, 1, 120_000, mix_prob=0.7, mix_median=6000, mix_sigma=1.1),
    turn_message=_ln(13, 2.1, 1, 120_000, mix_prob=0.08, mix_median=3300, mix_sigma=1.0),
    return_message=_ln(13, 2.1, 1, 120_000, mix_prob=0.08, mix_median=3300, mix_sigma=1.0),
    output=_ln(390, 0.37, 1, 2000, mix_prob=0.3, mix_median=50, mix_sigma=1.6),
    turns_per_visit=_ln(1.0, 0.95, 1, 1000, mix_prob=0.01, mix_median=10, mix_sigma=0.8),
    think_time_s=_ln(100, 1.0, 1, 3600),
    rewrite_prob=0.35,
    rewrite_keep=_ln(0.15, 0.9, 0, 1),
    return_prob=0.65,
    return_gap_s=_ln(6 * 3600, 1.5, 600, 60 * DAY_S),
    max_visits=100,
    max_context=131_072,
    on_overflow="end",
    compact_tokens=_ln(4000, 0.5, 1, 32_768),
)

# Agent defaults: TraceLab sample (Claude Code / Codex rounds): tool-definition system prompts
# of 7-27k tokens, a few thousand tokens of first instruction, tool results of hundreds of
# tokens appended each step, steps seconds apart; few and short returns.
DEFAULT_AGENT = SessionClass(
    system_prompts=4,
    system_prompt_tokens=_ln(14_000, 0.6, 2000, 64_000),
    system_prompt_zipf=1.0,
    first_message=_ln(3000, 0.8, 1, 100_000),
    turn_message=_ln(200, 1.3, 1, 100_000, mix_prob=0.03, mix_median=6000, mix_sigma=1.0),
    return_message=_ln(200, 1.2, 1, 100_000),
    output=_ln(250, 1.0, 1, 16_384),
    turns_per_visit=_ln(15, 0.9, 1, 2000),
    think_time_s=_ln(1.5, 1.3, 0.05, 600),
    rewrite_prob=0.2,
    rewrite_keep=_ln(0.8, 0.3, 0, 1),
    return_prob=0.2,
    return_gap_s=_ln(1800, 1.5, 60, 30 * DAY_S),
    max_visits=50,
    max_context=1_000_000,
    on_overflow="compact",
    compact_tokens=_ln(20_000, 0.5, 1000, 100_000),
)


class SessionWorkload(FrozenModel):
    """A multi-day synthetic workload of chatbot and agent sessions.

    Time 0 is midnight of day 0 (the clock of ``peak_hour`` and ``hourly_weights``). Every
    session starts inside ``[0, days)``, so a cache fed from time 0 starts cold. For steady-state
    numbers, generate a warm-up of at least the longest TTL more and count only the requests
    after it (``benchmarks/sessions_stats.py`` does this for the TTL cost). The diurnal curve
    shapes session starts; turns and returns follow them.
    """

    days: float = Field(7.0, gt=0, le=366, description="length of the workload in days")
    sessions_per_day: float = Field(
        20_000, gt=0, le=1e8, description="new sessions per day, both classes together"
    )
    agent_fraction: float = Field(
        0.05, ge=0, le=1, description="share of new sessions that are agent sessions"
    )
    peak_to_valley: float = Field(
        3.0, ge=1, le=1000, description="diurnal session-start rate at peak over that at valley"
    )
    peak_hour: float = Field(15.0, ge=0, lt=24, description="hour of day of the peak rate")
    hourly_weights: tuple[float, ...] | None = Field(
        None, description="24 relative start rates, one per hour (overrides the sinusoid)"
    )
    decode_tokens_per_s: float = Field(
        40.0, gt=0, le=1e6, description="response streaming speed assumed between turns"
    )
    block_tokens: int = Field(512, ge=1, le=1 << 20, description="tokens per prefix block")
    chatbot: SessionClass = Field(DEFAULT_CHATBOT, description="chatbot conversation parameters")
    agent: SessionClass = Field(DEFAULT_AGENT, description="agent tool-loop parameters")
    name: str = Field("sessions", min_length=1, description="name of the generated source")

    @model_validator(mode="after")
    def _weights(self) -> SessionWorkload:
        w = self.hourly_weights
        if w is not None:
            if len(w) != 24:
                raise ValueError(f"hourly_weights: expected 24 values, got {len(w)}")
            if any(not (math.isfinite(x) and x >= 0) for x in w) or sum(w) <= 0:
                raise ValueError("hourly_weights: values must be finite, >= 0, not all 0")
        return self

    def params(self, traffic_class: str) -> SessionClass:
        """The :class:`SessionClass` of ``"chatbot"`` or ``"agent"``."""
        if traffic_class not in CLASS_NAMES:
            raise KeyError(f"unknown traffic class {traffic_class!r}; known: {CLASS_NAMES}")
        cls: SessionClass = getattr(self, traffic_class)
        return cls


# ---------------------------------------------------------------------------- helpers


def diurnal_rate(cfg: SessionWorkload, hours: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Relative session-start rate at hour-of-day ``hours`` (any float; mean 1 over a day).

    A sinusoid ``1 + a·cos(2π(h - peak_hour)/24)`` with ``a = (r - 1)/(r + 1)`` for
    ``r = peak_to_valley``, or the step function of ``hourly_weights``.
    """
    h = np.mod(np.asarray(hours, dtype=np.float64), 24.0)
    if cfg.hourly_weights is not None:
        w = np.asarray(cfg.hourly_weights, dtype=np.float64)
        w = w / w.mean()
        return w[np.minimum(h.astype(np.int64), 23)]
    r = cfg.peak_to_valley
    a = (r - 1.0) / (r + 1.0)
    return 1.0 + a * fpmath.cos(2.0 * np.pi * (h - cfg.peak_hour) / 24.0)


def _start_times(cfg: SessionWorkload, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` session starts in ``[0, days)`` with density proportional to the diurnal rate.

    Inverse CDF of a per-minute piecewise-constant density (uniform within each minute).
    """
    horizon = cfg.days * DAY_S
    minutes = max(1, math.ceil(cfg.days * _MINUTES_PER_DAY))
    edges = np.minimum(np.arange(minutes + 1, dtype=np.float64) * 60.0, horizon)
    mid_h = (edges[:-1] + edges[1:]) / 2.0 / 3600.0
    mass = diurnal_rate(cfg, mid_h) * np.diff(edges)
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    t = np.interp(rng.random(n) * cdf[-1], cdf, edges)
    return np.minimum(t, np.nextafter(horizon, 0.0))


def _segment_starts(counts: np.ndarray) -> np.ndarray:
    """Index of the first element of each segment of a CSR with these ``counts``."""
    out = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def _exclusive_cumsum(values: np.ndarray, seg: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per element, the sum of the earlier elements of its segment.

    ``seg`` maps elements to segments (non-decreasing), ``first`` holds each segment's first
    element index.
    """
    incl = np.cumsum(values)
    excl = incl - values
    return excl - excl[first][seg]


@dataclass(slots=True)
class _Turns:
    """The turns of one class: struct of arrays, grouped by session, in time order within one."""

    arrival: np.ndarray
    chain_start: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    prompt: np.ndarray
    session: np.ndarray
    keep: np.ndarray
    """Rewriting turns: the kept share of the previous prompt's blocks; others: -1."""

    def take(self, keep: np.ndarray) -> _Turns:
        return _Turns(*(getattr(self, f.name)[keep] for f in fields(self)))

    @staticmethod
    def concat(parts: list[_Turns]) -> _Turns:
        names = [f.name for f in fields(_Turns)]
        return _Turns(*(np.concatenate([getattr(t, k) for t in parts]) for k in names))


def _class_turns(
    cfg: SessionWorkload, p: SessionClass, rng: np.random.Generator, n_sessions: int
) -> tuple[_Turns, np.ndarray]:
    """Draw the sessions of one class; return its turns and its system-prompt lengths."""
    horizon = cfg.days * DAY_S
    pool_len = p.system_prompt_tokens.sample_int(rng, p.system_prompts)
    popularity = fpmath.power(np.arange(p.system_prompts) + 1.0, -p.system_prompt_zipf)
    start = _start_times(cfg, rng, n_sessions)
    prompt = rng.choice(p.system_prompts, size=n_sessions, p=popularity / popularity.sum())
    sys_len = pool_len[prompt]

    # Visits: 1 + geometric number of returns, capped.
    n_vis = np.minimum(rng.geometric(1.0 - p.return_prob, size=n_sessions), p.max_visits)
    n_v = int(n_vis.sum())
    vis_first = _segment_starts(n_vis)
    vis_session = np.repeat(np.arange(n_sessions), n_vis)
    vis_index = np.arange(n_v) - vis_first[vis_session]
    n_turns = np.maximum(p.turns_per_visit.sample_int(rng, n_v), 1)
    return_gap = np.where(vis_index > 0, p.return_gap_s.sample(rng, n_v), 0.0)

    # Turns: message, output, and the gap to the next turn of the same visit.
    n_t = int(n_turns.sum())
    turn_first = _segment_starts(n_turns)
    turn_visit = np.repeat(np.arange(n_v), n_turns)
    session = vis_session[turn_visit]
    first_in_visit = np.zeros(n_t, dtype=bool)
    first_in_visit[turn_first] = True
    first_in_session = first_in_visit & (vis_index[turn_visit] == 0)
    returning = first_in_visit & ~first_in_session
    msg = np.empty(n_t, dtype=np.int64)
    msg[first_in_session] = p.first_message.sample_int(rng, int(first_in_session.sum()))
    msg[returning] = p.return_message.sample_int(rng, int(returning.sum()))
    later = ~first_in_visit
    msg[later] = p.turn_message.sample_int(rng, int(later.sum()))
    out = p.output.sample_int(rng, n_t)
    gap_after = out / cfg.decode_tokens_per_s + p.think_time_s.sample(rng, n_t)

    # Times: offset within the visit; a visit starts return_gap after the previous one ended.
    offset = _exclusive_cumsum(gap_after, turn_visit, turn_first)
    duration = offset[turn_first + n_turns - 1]
    prev_duration = np.where(vis_index > 0, np.roll(duration, 1), 0.0)
    step = return_gap + prev_duration
    visit_start = start[vis_session] + _exclusive_cumsum(step, vis_session, vis_first) + step
    arrival = visit_start[turn_visit] + offset

    # Context: the system prompt, everything said so far, then this turn's message.
    sess_first = turn_first[vis_first]  # first turn of each session
    sys_t = sys_len[session]
    msg[first_in_session] = np.minimum(
        msg[first_in_session], p.max_context - sys_t[first_in_session]
    )
    grow = msg + out
    input_len = sys_t + _exclusive_cumsum(grow, session, sess_first) + msg
    chain_start = first_in_session.copy()
    keep_share = np.full(n_t, -1.0)
    rewrite = ~first_in_session & (rng.random(n_t) < p.rewrite_prob)
    keep_share[rewrite] = p.rewrite_keep.sample(rng, int(rewrite.sum()))
    keep = arrival < horizon
    over = input_len > p.max_context
    if over.any():
        if p.on_overflow == "end":
            bad_sessions, idx = np.unique(session[over], return_index=True)
            cut = np.full(n_sessions, n_t, dtype=np.int64)
            cut[bad_sessions] = np.flatnonzero(over)[idx]
            keep &= np.arange(n_t) < cut[session]
        else:
            ends = np.append(sess_first[1:], n_t)
            for s in np.unique(session[over]).tolist():
                _compact(p, rng, int(sess_first[s]), int(ends[s]), msg, out, input_len, chain_start)
    turns = _Turns(
        arrival=arrival,
        chain_start=chain_start,
        input_len=input_len,
        output_len=out,
        prompt=prompt[session],
        session=session,
        keep=keep_share,
    )
    return turns.take(keep), pool_len


def _compact(
    p: SessionClass,
    rng: np.random.Generator,
    lo: int,
    hi: int,
    msg: np.ndarray,
    out: np.ndarray,
    input_len: np.ndarray,
    chain_start: np.ndarray,
) -> None:
    """Recompute the prompts of one session's turns ``[lo, hi)`` with compactions, in place.

    Walks the session one compaction at a time: the first turn over ``max_context`` restarts
    its context at system prompt + a fresh summary + its message, and a new block chain.
    """
    sys_len = int(input_len[lo] - msg[lo])
    i, base = lo, sys_len
    while i < hi:
        grow = msg[i:hi] + out[i:hi]
        prompt = base + (np.cumsum(grow) - grow) + msg[i:hi]
        bad = np.flatnonzero(prompt > p.max_context)
        if not bad.size:
            input_len[i:hi] = prompt
            return
        j = i + int(bad[0])
        if j == i:  # cannot happen: a chain's first prompt is clipped to fit; be safe anyway
            raise AssertionError("compaction left no room for a message")
        input_len[i:j] = prompt[: j - i]
        chain_start[j] = True
        base = sys_len + int(p.compact_tokens.sample_int(rng, 1)[0])
        msg[j] = min(int(msg[j]), p.max_context - base)
        i = j


def _block_ids(
    turns: _Turns,
    sys_full: np.ndarray,
    sys_base: np.ndarray,
    block_tokens: int,
    order: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets, ids) of the turns' chained block ids, rows in the given ``order``.

    ``turns`` are grouped by session in time order. A *chain* is a run of turns that starts at
    a session start, a compaction or a rewrite and continues with plain turns, each extending
    its predecessor. Within a chain the content at a full-block position never changes, so a
    full block at position ``k`` gets the id ``chain_base[c] + k - R_c`` (``R_c``: the first
    position the chain's start turn did not inherit), shared by every turn of the chain that
    holds it. A partial last block gets an id of its own (from a separate range), so it is
    never reused, even when a later turn fills that block position with more tokens.

    Positions below ``R_c`` are the system prompt's shared blocks, or (after a rewrite)
    blocks kept from earlier chains: position ``k`` then belongs to the latest earlier chain of
    the session whose ``R`` is <= k (a binary descent over a sparse table of minima).

    So a turn's id list is a few runs of consecutive ids -- system prompt, kept runs of a
    rewrite, its chain's run, its partial block -- and is written as ``k + run offset`` with
    one ``repeat`` over all references.
    """
    if not len(turns.input_len):
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # the runs' temporaries are freed before the full-size id array is built
    offsets, per_row, length, offset = _row_runs(turns, sys_full, sys_base, block_tokens, order)
    return offsets, _expand_runs(offsets, per_row, length, offset)


def _row_runs(
    turns: _Turns,
    sys_full: np.ndarray,
    sys_base: np.ndarray,
    block_tokens: int,
    order: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, runs per row, run lengths, run id offsets) of the rows (see ``_block_ids``)."""
    n = len(turns.input_len)
    n_blocks = -(-turns.input_len // block_tokens)
    n_full = turns.input_len // block_tokens
    full_sys = sys_full[turns.prompt]
    rewrite = (turns.keep >= 0) & ~turns.chain_start
    starts = turns.chain_start | rewrite
    chain = np.cumsum(starts) - 1
    chain_first = np.flatnonzero(starts)
    chain_last = np.append(chain_first[1:], n) - 1
    prev_full = n_full[np.maximum(chain_first - 1, 0)]
    low = full_sys[chain_first]
    kept = np.maximum(low, (turns.keep[chain_first] * prev_full).astype(np.int64))
    chain_r = np.where(turns.chain_start[chain_first], low, kept)
    # A chain's full blocks are those of its last turn (prompts only grow along a chain).
    span = n_full[chain_last] - chain_r
    chain_base = int(sys_full.sum()) + _segment_starts(span)
    partial_base = int(chain_base[-1] + span[-1])

    # Kept runs of rewrite chains: positions [low, R_c) -> owning earlier chain, run-length
    # encoded per chain into (chain, first position, length, id offset).
    n_kept = chain_r - low
    kc = np.repeat(np.arange(len(chain_r)), n_kept)
    kk = np.arange(len(kc), dtype=np.int64) - _segment_starts(n_kept)[kc] + low[kc]
    if len(kc):
        reach = int(np.bincount(turns.session[chain_first]).max())
        owner = _latest_at_most(chain_r, kc - 1, kk, reach)
        new_run = np.ones(len(kc), dtype=bool)
        new_run[1:] = (kc[1:] != kc[:-1]) | (owner[1:] != owner[:-1])
        run_first = np.flatnonzero(new_run)
        run_len = np.diff(np.append(run_first, len(kc)))
        run_chain = kc[run_first]
        run_offset = chain_base[owner[run_first]] - chain_r[owner[run_first]]
    else:
        run_len = run_chain = run_offset = np.zeros(0, dtype=np.int64)
    runs_per_chain = np.bincount(run_chain, minlength=len(chain_r))
    chain_run_first = _segment_starts(runs_per_chain)

    # Runs per row, in output order: system prompt, kept runs, the chain's own run, partial.
    c = chain[order]
    n_kept_runs = runs_per_chain[c]
    per_row = 3 + n_kept_runs
    row_run = _segment_starts(per_row)
    total_runs = int(per_row.sum())
    length = np.empty(total_runs, dtype=np.int64)
    offset = np.empty(total_runs, dtype=np.int64)
    length[row_run] = full_sys[order]
    offset[row_run] = sys_base[turns.prompt[order]]
    own = row_run + 1 + n_kept_runs
    length[own] = n_full[order] - chain_r[c]
    offset[own] = chain_base[c] - chain_r[c]
    length[own + 1] = n_blocks[order] - n_full[order]
    offset[own + 1] = partial_base + order - n_full[order]
    if len(run_len):
        rows = np.flatnonzero(n_kept_runs)
        counts = n_kept_runs[rows]
        slot = np.repeat(row_run[rows] + 1, counts) + (
            np.arange(int(counts.sum())) - np.repeat(_segment_starts(counts), counts)
        )
        src = np.repeat(chain_run_first[c[rows]], counts) + (
            np.arange(int(counts.sum())) - np.repeat(_segment_starts(counts), counts)
        )
        length[slot] = run_len[src]
        offset[slot] = run_offset[src]

    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_blocks[order], out=offsets[1:])
    return offsets, per_row, length, offset


def _expand_runs(
    offsets: np.ndarray, per_row: np.ndarray, length: np.ndarray, offset: np.ndarray
) -> np.ndarray:
    """Every reference's id: ``offset`` of its run + its position in the row."""
    run_row_start = np.repeat(offsets[:-1], per_row)
    ids = np.repeat(offset - run_row_start, length)
    step = 1 << 20  # add the reference indices a slice at a time: no second full-size array
    for start in range(0, len(ids), step):
        ids[start : start + step] += np.arange(start, min(start + step, len(ids)), dtype=np.int64)
    return ids


def _latest_at_most(values: np.ndarray, p: np.ndarray, k: np.ndarray, reach: int) -> np.ndarray:
    """Per query, the largest ``q <= p`` with ``values[q] <= k``; it lies within ``reach``.

    Sparse table: ``level[L][i] = min(values[i - 2**L + 1 .. i])`` (clamped at 0). Descending
    over L, skip a block of ``2**L`` entries whenever its minimum is above ``k``.
    """
    levels = [values]
    while (1 << len(levels)) <= reach:
        prev, step = levels[-1], 1 << (len(levels) - 1)
        shifted = np.concatenate([np.full(step, prev[0]), prev[:-step]])
        levels.append(np.minimum(prev, shifted))
    p = p.copy()
    for depth in range(len(levels) - 1, -1, -1):
        skip = levels[depth][np.maximum(p, 0)] > k
        p[skip] -= 1 << depth
    return p


# ---------------------------------------------------------------------------- public API


def generate_sessions(cfg: SessionWorkload, seed: int) -> RequestSource:
    """Generate the workload ``cfg`` describes, deterministically for ``seed``.

    Returns a source sorted by arrival with ``class_names == ("chatbot", "agent")``,
    ``session_id`` set (chatbot sessions first, then agent sessions) and chained block ids as
    described in the module notes. Each class draws from its own stream
    (``stream(seed, "sessions.chatbot")``, ``... "sessions.agent"``), so changing one class's
    parameters leaves the other class's requests unchanged.
    """
    bt = cfg.block_tokens
    parts: list[_Turns] = []
    pools: list[np.ndarray] = []
    n_sessions: list[int] = []
    for name in CLASS_NAMES:
        p = cfg.params(name)
        rng = stream(seed, f"sessions.{name}")
        share = cfg.agent_fraction if name == "agent" else 1.0 - cfg.agent_fraction
        n = int(rng.poisson(cfg.sessions_per_day * cfg.days * share))
        turns, pool_len = _class_turns(cfg, p, rng, n)
        turns.session = turns.session + sum(n_sessions)
        turns.prompt = turns.prompt + sum(len(x) for x in pools)
        parts.append(turns)
        pools.append(pool_len)
        n_sessions.append(n)
    turns = _Turns.concat(parts)
    codes = np.repeat(np.arange(len(CLASS_NAMES), dtype=np.int8), [len(t.arrival) for t in parts])
    pool_len = np.concatenate(pools)
    sys_full = pool_len // bt
    sys_base = _segment_starts(sys_full)
    order = np.argsort(turns.arrival, kind="stable")
    offsets, ids = _block_ids(turns, sys_full, sys_base, bt, order)
    return RequestSource.from_columns(
        arrival_s=turns.arrival[order],
        input_len=turns.input_len[order],
        output_len=turns.output_len[order],
        block_offsets=offsets,
        block_hashes=ids,
        block_tokens=bt,
        traffic_class=codes[order],
        class_names=CLASS_NAMES,
        session_id=turns.session[order],
        name=cfg.name,
        copy=False,
    )
