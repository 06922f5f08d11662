"""EngineCore: a small real inference engine over a reduced-depth stack of V4.1-style layers.

It replays a request list in real time on the device, with random weights at full widths, so that
step times, TTFT and TPOT come from real kernels under a real scheduler (the simulator's
calibration target). Pieces:

* **Layers**: ``layers=[(kind, runs_in_prefill), ...]``; each is an ``AttentionBlock`` (attention +
  shared expert), a ``MoEBlock`` (routed experts local to this rank) and a ``KVPool``. Layers with
  ``runs_in_prefill=False`` are the decoder layers of the "causal encoder-decoder" (SPEC.md §2.6):
  every decoded token runs through them, but a prompt only through its *bounded replay* — when a
  prompt's last chunk runs, the decoder layers' caches are filled (randomly, at no cost: their
  block cache is projected from stored state, not computed here) up to the prompt length minus
  ``decoder_replay_tokens`` (default ``spec.swa.bounded_replay_tokens``, 128), and those last
  tokens are prefilled through them.
* **Batching**: each step is ONE mixed batch: prefill chunks (per-sequence attention) and all
  decode sequences (bucketed varlen attention, ``DecodePlan``) share the projections, the shared
  expert and one grouped-GEMM MoE call per layer.
* **Policies** (``mode``):

  - ``"mixed"``: every step runs all running decodes plus prefill chunks, first come first
    served, up to ``prefill_token_budget`` prefill tokens (decode tokens are not counted).
    Requests are admitted while admitted-and-unfinished < min(max_seqs, max_decode_batch).
  - ``"prefill_only"``: each step takes queued prompts FCFS, whole, placing them until the next one
    would exceed the budget (a prompt larger than the budget runs alone). A request is done when
    its prompt is: that step's end is its first token (TTFT) and its completion.
  - ``"decode_only"``: a request arrives with its prompt already in cache (``fill_random``, no
    compute) when admitted (FCFS while running < ``max_decode_batch``); admission is its first
    token; it then decodes ``output_len - 1`` tokens.

* **Speculative verify**: with ``verify_tokens=v > 1`` each decode sequence feeds v query tokens
  per step (the last token + v-1 drafts). Accepted drafts are drawn from a seeded generator
  (each draft accepted with ``accept_prob`` until the first rejection), the sequence advances by
  1 + accepted tokens and its caches are truncated back to that length.
* **CUDA graphs** (deepseek backend on a GPU): ``graphs=True`` replays each decode-only step as
  one graph; ``prefill_graphs=True`` replays each step of a prefill-only run of at most
  ``prefill_graph_tokens`` tokens as one graph per tuple of prompt lengths, on staging slots
  (``_prefill_graph``), so short prompts cost the GPU's work, not the host's launches — as
  engines capture small prefill batches; longer steps, GPU-bound, run eagerly. A shape seen
  for the first time (prefill or decode) is captured with the clock stopped (steps record
  ``graph`` and ``captured``), as an engine captures its graphs before it serves.
* **Time**: requests become visible when the wall clock since ``run`` started passes their
  arrival; an idle engine sleeps until the next arrival. Each step ends with a device
  synchronize; its host timestamps, the host's time to issue it (``issue_s``) and its GPU time
  (``gpu_s``, CUDA events; NaN on a CPU) are recorded.

Inputs are random hidden vectors (no tokenizer, no sampling): prompt rows and decode rows are
fresh ``randn`` embeddings each step. Per-step host work is per sequence at most (numpy
bookkeeping, one prefill attention call per chunk); the device index tensors of a step are
built once and shared by all layers.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from ..models.spec import ModelSpec
from ._util import as_device, capture_graph, default_dtype, generator, synchronize, to_device
from .attention import AttentionBlock, DecodePlan
from .backend import get_backend
from .cache import KVPool
from .moe import MoEBlock
from .shapes import Kind, LayerShape

Mode = Literal["mixed", "prefill_only", "decode_only"]
DEFAULT_LAYERS: tuple[tuple[Kind, bool], ...] = (
    ("csa", True),
    ("hca", True),
    ("csa", False),
    ("csa", False),
)


@dataclass
class EngineResult:
    steps: pd.DataFrame
    requests: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        r, s = self.requests, self.steps
        span = float(s["end_s"].max() - s["start_s"].min()) if len(s) else 0.0
        return {
            "requests": float(len(r)),
            "steps": float(len(s)),
            "span_s": span,
            "mean_ttft_s": float(r["ttft_s"].mean()),
            "mean_tpot_s": float(r["tpot_s"].mean()) if r["tpot_s"].notna().any() else float("nan"),
            "mean_step_s": float((s["end_s"] - s["start_s"]).mean()) if len(s) else float("nan"),
            "output_tokens": float(r["generated"].sum()),
        }


@dataclass
class _Layer:
    kind: Kind
    in_prefill: bool
    block: AttentionBlock
    moe: MoEBlock
    pool: KVPool


@dataclass
class _Graph:
    cuda_graph: Any
    plans: list[Any]
    x: torch.Tensor


@dataclass
class _Step:
    """What one step runs: prefill segments (request, start, n) and decode requests."""

    prefill: list[tuple[int, int, int]] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.prefill and not self.decode


class StepTimer:
    """The GPU time of one step (CUDA events around its launches; NaN off CUDA). With the
    host's time to issue the step, it tells a host-bound step from a slow GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        if self.cuda:
            self._begin.record()

    def end(self) -> None:
        if self.cuda:
            self._end.record()

    def seconds(self) -> float:
        """After a synchronize: the GPU time between ``begin`` and ``end``."""
        return self._begin.elapsed_time(self._end) / 1e3 if self.cuda else float("nan")


class EngineCore:
    def __init__(
        self,
        spec: ModelSpec | LayerShape,
        layers: Sequence[tuple[Kind, bool]] = DEFAULT_LAYERS,
        *,
        local_experts: int = 48,
        device: torch.device | str | None = None,
        fp8: bool = False,
        max_seqs: int = 64,
        max_tokens: int = 16384,
        prefill_token_budget: int = 8192,
        max_decode_batch: int = 64,
        verify_tokens: int = 1,
        accept_prob: float = 0.7,
        mode: Mode = "mixed",
        decoder_replay_tokens: int | None = None,
        decode_buckets: Literal["pow2", "single"] = "pow2",
        backend: str = "reference",
        graphs: bool = False,
        prefill_graphs: bool = False,
        prefill_graph_tokens: int = 16384,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        max_tmp_bytes: int = 1 << 30,
    ) -> None:
        if mode not in ("mixed", "prefill_only", "decode_only"):
            raise ValueError(f"unknown mode {mode!r}")
        if not layers:
            raise ValueError("need at least one layer")
        if not any(p for _, p in layers) and mode != "decode_only":
            raise ValueError("at least one layer must run in prefill")
        if verify_tokens < 1 or prefill_token_budget < 1 or max_decode_batch < 1:
            raise ValueError("verify_tokens, prefill_token_budget, max_decode_batch must be >= 1")
        self.device = as_device(device)
        self.dtype = dtype or default_dtype(self.device)
        if isinstance(spec, ModelSpec):
            shape = LayerShape.from_model(spec, local_experts)
            replay = spec.swa.bounded_replay_tokens
        else:
            shape = spec
            replay = shape.window
        self.shape = shape
        self.mode: Mode = mode
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.prefill_token_budget = prefill_token_budget
        self.max_decode_batch = max_decode_batch
        self.verify_tokens = verify_tokens
        self.accept_prob = accept_prob
        self.replay = replay if decoder_replay_tokens is None else decoder_replay_tokens
        self.seed = seed
        # "single": one padded varlen bucket per decode step. Eager launches cost per bucket, so
        # the power-of-two buckets make a step's host time depend on the spread of lengths.
        self.min_bucket = DecodePlan.SINGLE if decode_buckets == "single" else None
        self.layers: list[_Layer] = []
        kernels = get_backend(backend)
        for i, (kind, in_prefill) in enumerate(layers):
            blk = kernels.attention_block(
                shape,
                kind,
                self.device,
                fp8,
                seed=seed * 100 + i,
                dtype=self.dtype,
                max_tmp_bytes=max_tmp_bytes,
            )
            moe = kernels.moe_block(shape, self.device, fp8, seed=seed * 100 + i, dtype=self.dtype)
            pool = blk.new_pool(max_seqs, max_tokens, seed=seed * 100 + i)
            self.layers.append(_Layer(kind, in_prefill, blk, moe, pool))
        self._gen = generator(self.device, seed + 7)
        if graphs and (backend == "reference" or self.device.type != "cuda"):
            raise ValueError("CUDA-graph decode needs the deepseek backend on a CUDA device")
        if prefill_graphs and (backend == "reference" or self.device.type != "cuda"):
            raise ValueError("CUDA-graph prefill needs the deepseek backend on a CUDA device")
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs
        self.prefill_graph_tokens = prefill_graph_tokens
        self._graphs: dict[Any, _Graph] = {}
        self._prefill_graphs: dict[tuple[int, ...], _Graph] = {}
        self._staging: list[int] = []
        self._prefill_graph_failed: set[tuple[int, ...]] = set()
        self._capture_fn: Callable[..., Any] = capture_graph
        self._graph_pool = torch.cuda.graph_pool_handle() if graphs or prefill_graphs else None
        self.config = {
            "layers": [list(lay) for lay in layers],
            "local_experts": shape.local_experts,
            "fp8": fp8,
            "mode": mode,
            "max_seqs": max_seqs,
            "max_tokens": max_tokens,
            "prefill_token_budget": prefill_token_budget,
            "max_decode_batch": max_decode_batch,
            "verify_tokens": verify_tokens,
            "accept_prob": accept_prob,
            "decoder_replay_tokens": self.replay,
            "decode_buckets": decode_buckets,
            "backend": backend,
            "graphs": graphs,
            "prefill_graphs": prefill_graphs,
            "prefill_graph_tokens": prefill_graph_tokens,
            "device": str(self.device),
            "dtype": str(self.dtype),
            "seed": seed,
        }

    # ---- slots --------------------------------------------------------------------------------
    def alloc_slot(self) -> int:
        """Claim one slot in every layer's pool (for timing ``execute`` directly)."""
        slot = self.layers[0].pool.alloc()
        for lay in self.layers[1:]:
            lay.pool.alloc(slot)
        return slot

    def free_slot(self, slot: int) -> None:
        for lay in self.layers:
            lay.pool.free(slot)

    # ---- one step on the device ----------------------------------------------------------------
    def execute(
        self,
        prefill: Sequence[tuple[int, int, bool]],
        decode_slots: Sequence[int] | np.ndarray,
        v: int = 1,
    ) -> None:
        """Run one mixed step: prefill segments ``(slot, n, last_chunk)`` and decode slots.

        Public so the calibration can time a step of a chosen shape directly (after
        ``fill_random`` on the pools via ``fill(slot, tokens)``).
        """
        plans = self._plans(decode_slots, v) if len(decode_slots) else None
        if plans is not None and not prefill and self.graphs:
            self._graphed_decode(np.asarray(decode_slots, dtype=np.int64), v, plans)
            return
        n_dec = len(decode_slots) * v
        segs, replay, rows = self._prefill_rows(prefill, n_dec)
        dec_rows = to_device(rows, self.device) if rows.size else None
        x = self._inputs(sum(n for _, n in segs) + n_dec)
        self._forward(x, segs, replay, dec_rows, plans)

    def _inputs(self, rows: int) -> torch.Tensor:
        return torch.randn(
            (rows, self.shape.hidden), generator=self._gen, device=self.device, dtype=torch.float32
        ).to(self.dtype)

    def _prefill_rows(
        self, prefill: Sequence[tuple[int, int, bool]], n_dec: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], np.ndarray]:
        """Host side of a step: the prefill segments, the decoder layers' bounded-replay segments
        of finishing prompts (their caches before the replay set, not computed) and the rows of
        the step's input that run through the decoder layers (replay rows, then decode rows)."""
        enc_pool = next((lay.pool for lay in self.layers if lay.in_prefill), self.layers[0].pool)
        segs = [(s, n) for s, n, _ in prefill]
        n_pre = sum(n for _, n in segs)
        replay: list[tuple[int, int]] = []
        rows: list[np.ndarray] = []
        start = 0
        for s, n, last in prefill:
            if last:
                r = min(self.replay, n)
                total = enc_pool.length(s) + n  # the prompt's length once this chunk is in
                for lay in self.layers:
                    if not lay.in_prefill:  # cache before the replay: projected, not computed
                        lay.pool.fill_random(s, total - r)
                if r > 0:
                    replay.append((s, r))
                    rows.append(np.arange(start + n - r, start + n))
            start += n
        rows.append(np.arange(n_pre, n_pre + n_dec))
        return segs, replay, np.concatenate(rows)

    def _forward(
        self,
        x: torch.Tensor,
        segs: list[tuple[int, int]],
        replay: list[tuple[int, int]],
        dec_rows: torch.Tensor | None,
        plans: list[Any] | None,
    ) -> None:
        for i, lay in enumerate(self.layers):
            plan = plans[i] if plans is not None else None
            if lay.in_prefill:
                y, z = lay.block.forward(
                    x, lay.pool, prefill=segs, decode=plan, return_ffn_input=True
                )
                x = y + lay.moe(z)
            elif dec_rows is not None:
                xs = x.index_select(0, dec_rows)
                y, z = lay.block.forward(
                    xs, lay.pool, prefill=replay, decode=plan, return_ffn_input=True
                )
                x.index_copy_(0, dec_rows, y + lay.moe(z))

    # ---- prefill-only steps as CUDA graphs -------------------------------------------------------
    def _prefill_graph(self, prompts: Sequence[int]) -> _Graph | None:
        """The CUDA graph of a prefill-only step of whole prompts (these lengths), captured once
        per tuple of lengths on *staging* slots: the step's KV lands there, as it would in a
        prefill engine that hands it off — a request of a prefill-only replay leaves when its
        prompt is done, so no later step reads its own slot. None (run it eagerly) when the
        pools have no room for the staging slots or this shape's capture failed."""
        key = tuple(int(n) for n in prompts)
        graph = self._prefill_graphs.get(key)
        if graph is not None or key in self._prefill_graph_failed:
            return graph
        stage = self._staging_slots(len(key))
        if stage is None:
            return None
        try:
            graph = self._capture_prefill(stage[: len(key)], key)
        except RuntimeError as exc:  # capture is best effort: this shape runs eagerly
            self._prefill_graph_failed.add(key)
            print(f"prefill graph capture failed for {key}: {exc}", file=sys.stderr)
            return None
        self._prefill_graphs[key] = graph
        return graph

    def _replay_prefill(self, graph: _Graph, prompts: Sequence[int]) -> None:
        key = tuple(int(n) for n in prompts)
        self._stage_prefill(self._staging[: len(key)], key)
        graph.cuda_graph.replay()

    def _staging_slots(self, count: int) -> list[int] | None:
        missing = count - len(self._staging)
        if missing > int((~self.layers[0].pool.in_use).sum()):
            return None
        self._staging += [self.alloc_slot() for _ in range(max(0, missing))]
        return self._staging

    def _stage_prefill(
        self, stage: Sequence[int], prompts: tuple[int, ...]
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], np.ndarray]:
        """Empty the staging slots, then the host side of the step on them (as ``execute``)."""
        for lay in self.layers:
            lay.pool.lengths[list(stage)] = 0
        return self._prefill_rows([(s, n, True) for s, n in zip(stage, prompts, strict=True)], 0)

    def _capture_prefill(self, stage: Sequence[int], prompts: tuple[int, ...]) -> _Graph:
        segs, replay, rows = self._stage_prefill(stage, prompts)
        dec_rows = to_device(rows, self.device) if rows.size else None
        x = self._inputs(sum(prompts))

        def body() -> None:
            self._forward(x, segs, replay, dec_rows, None)

        g = self._record(body, lambda: self._stage_prefill(stage, prompts))
        return _Graph(g, [dec_rows], x)  # the graph reads x and the row index: keep them alive

    def _record(
        self,
        body: Callable[[], object],
        reset: Callable[[], object],
        before_capture: Callable[[], object] | None = None,
    ) -> Any:
        """``body`` as a CUDA graph in the engine's shared pool (``capture_graph``; tests and the
        CPU check swap in ``capture_eagerly``)."""
        return self._capture_fn(self.device, body, reset, self._graph_pool, before_capture)

    def _plans(self, slots: Sequence[int] | np.ndarray, v: int) -> list[Any]:
        """Each layer's decode plan; layers share the device tensors of the first one."""
        seqs = np.asarray(slots, dtype=np.int64)
        plans: list[Any] = []
        prev = None
        for lay in self.layers:
            prev = lay.block.plan_decode(lay.pool, seqs, v, min_bucket=self.min_bucket, share=prev)
            plans.append(prev)
        return plans

    def _decode_layers(self, x: torch.Tensor, plans: list[Any]) -> torch.Tensor:
        for lay, plan in zip(self.layers, plans, strict=True):
            y, z = lay.block.forward(x, lay.pool, decode=plan, return_ffn_input=True)
            x = y + lay.moe(z)
        return x

    def _decode_graph(self, slots: np.ndarray, v: int, plans: list[Any]) -> tuple[_Graph, bool]:
        """The CUDA graph of a decode-only step, captured once per (batch, verify, visible-entry
        caps); and whether this call captured it."""
        key = (slots.size, v, tuple(p.graph_key for p in plans))
        graph = self._graphs.get(key)
        if graph is not None:
            return graph, False
        graph = self._capture(plans, slots.size * v)
        self._graphs[key] = graph
        return graph, True

    def capture_decode(self, slots: Sequence[int] | np.ndarray, v: int) -> None:
        """Capture the graph a decode-only step of ``slots`` would replay, if it is new (the
        replay loop calls this with its clock stopped, as an engine captures before serving)."""
        seqs = np.asarray(slots, dtype=np.int64)
        self._decode_graph(seqs, v, self._plans(seqs, v))

    def _graphed_decode(self, slots: np.ndarray, v: int, plans: list[Any]) -> None:
        """A decode-only step as one CUDA-graph replay: the GPU's work without the host's
        launches."""
        graph, captured = self._decode_graph(slots, v, plans)
        if not captured:
            graph.plans[0].update(self.layers[0].pool, slots)
        before = [lay.pool.lengths[slots].copy() for lay in self.layers]
        graph.cuda_graph.replay()
        for lay, lengths in zip(self.layers, before, strict=True):
            lay.pool.lengths[slots] = lengths + v  # the bookkeeping forward() does when eager

    def _capture(self, plans: list[Any], rows: int) -> _Graph:
        lengths = [lay.pool.lengths.copy() for lay in self.layers]

        def restore() -> None:
            for lay, saved in zip(self.layers, lengths, strict=True):
                lay.pool.lengths[:] = saved

        def fresh_plans() -> None:  # per-step state (FlashMLA's scheduler metadata): in-graph
            for plan in plans:
                getattr(plan, "sched", {}).clear()

        x = self._inputs(rows)
        g = self._record(lambda: self._decode_layers(x, plans), restore, fresh_plans)
        return _Graph(g, plans, x)

    def fill(self, slot: int, tokens: int) -> None:
        """Give ``slot`` ``tokens`` tokens of random cache state in every layer (no compute)."""
        for lay in self.layers:
            lay.pool.fill_random(slot, tokens)

    def warmup(self) -> None:
        """One small prefill + decode on a scratch slot (CUDA init, cuBLAS handles, autotune)."""
        slot = self.alloc_slot()
        n = min(2 * self.shape.window, self.max_tokens - self.verify_tokens)
        self.execute([(slot, n, True)], [])
        self.execute([], [slot], self.verify_tokens)
        synchronize(self.device)
        self.free_slot(slot)

    # ---- the replay loop --------------------------------------------------------------------
    def run(self, requests: Any, *, warmup: bool = True, mode: Mode | None = None) -> EngineResult:
        """Replay ``requests`` (rows of ``(arrival_s, prompt_len, output_len)``) in real time
        (in ``mode`` if given, else the engine's)."""
        saved = self.mode
        self.mode = mode or saved
        try:
            return self._run(requests, warmup)
        finally:
            self.mode = saved

    def _run(self, requests: Any, warmup: bool) -> EngineResult:
        req = np.asarray(requests, dtype=float).reshape(-1, 3)
        n_req = req.shape[0]
        order = np.argsort(req[:, 0], kind="stable")
        arrival = req[order, 0]
        prompt = req[order, 1].astype(np.int64)
        output = req[order, 2].astype(np.int64)
        if np.any(prompt < 1) or np.any(output < 1):
            raise ValueError("prompt_len and output_len must be >= 1")
        need = prompt + (0 if self.mode == "prefill_only" else output + self.verify_tokens)
        if np.any(need > self.max_tokens):
            raise ValueError("a request needs more than max_tokens of cache")
        if warmup:
            self.warmup()
        rng = np.random.default_rng(self.seed)
        v = self.verify_tokens

        slot = np.full(n_req, -1, np.int64)
        prefilled = np.zeros(n_req, np.int64)
        generated = np.zeros(n_req, np.int64)
        admit_s = np.full(n_req, np.nan)
        first_s = np.full(n_req, np.nan)
        done_s = np.full(n_req, np.nan)
        waiting: deque[int] = deque()
        prefilling: list[int] = []  # admitted, prompt not finished (mixed)
        running: list[int] = []  # decoding
        steps: list[dict[str, float]] = []
        ptr = 0
        n_done = 0
        cap = min(self.max_seqs, self.max_decode_batch)
        gpu_timer = StepTimer(self.device)
        graphed_prefill = self.prefill_graphs and self.mode == "prefill_only"  # whole prompts
        t0 = time.perf_counter()
        paused = 0.0  # graph captures: the clock stops while they run

        def clock() -> float:
            return time.perf_counter() - t0 - paused

        def finish(r: int, t: float) -> None:
            nonlocal n_done
            done_s[r] = t
            self.free_slot(int(slot[r]))
            n_done += 1

        while n_done < n_req:
            now = clock()
            while ptr < n_req and arrival[ptr] <= now:
                waiting.append(ptr)
                ptr += 1
            step = _Step()
            if self.mode == "decode_only":
                while waiting and len(running) < cap:
                    r = waiting.popleft()
                    slot[r] = self.alloc_slot()
                    self.fill(int(slot[r]), int(prompt[r]))
                    admit_s[r] = first_s[r] = now
                    generated[r] = 1
                    if output[r] <= 1:
                        finish(r, now)
                    else:
                        running.append(r)
                step.decode = list(running)
            elif self.mode == "prefill_only":
                budget = self.prefill_token_budget
                used = 0
                while waiting and len(step.prefill) < self.max_seqs:
                    r = waiting[0]
                    if step.prefill and used + prompt[r] > budget:
                        break
                    waiting.popleft()
                    slot[r] = self.alloc_slot()
                    admit_s[r] = now
                    step.prefill.append((r, 0, int(prompt[r])))
                    used += int(prompt[r])
                    if used >= budget:
                        break
            else:  # mixed
                while waiting and len(prefilling) + len(running) < cap:
                    r = waiting.popleft()
                    slot[r] = self.alloc_slot()
                    admit_s[r] = now
                    prefilling.append(r)
                budget = self.prefill_token_budget
                for r in prefilling:
                    if budget <= 0:
                        break
                    n = int(min(prompt[r] - prefilled[r], budget))
                    step.prefill.append((r, int(prefilled[r]), n))
                    budget -= n
                step.decode = list(running)

            if step.empty():
                if ptr < n_req:
                    time.sleep(max(0.0, arrival[ptr] - clock()))
                    continue
                raise RuntimeError("engine stalled with unfinished requests")  # pragma: no cover

            # ---- run it ----
            segs = [(int(slot[r]), n, s0 + n == prompt[r]) for r, s0, n in step.prefill]
            dec_slots = slot[step.decode] if step.decode else np.zeros(0, np.int64)
            dec_kv = int(self.layers[0].pool.lengths[dec_slots].sum()) if step.decode else 0
            lengths = [n for _, n, _ in segs]
            graph = None
            captures = len(self._prefill_graphs) + len(self._graphs)
            # graphs are captured off the clock, as an engine captures its graphs before serving
            c0 = time.perf_counter()
            if graphed_prefill and sum(lengths) <= self.prefill_graph_tokens:
                graph = self._prefill_graph(lengths)
            graphed_decode = self.graphs and not segs and dec_slots.size > 0
            if graphed_decode:
                self.capture_decode(dec_slots, v)
            paused += time.perf_counter() - c0
            start = clock()
            gpu_timer.begin()
            if graph is not None:
                self._replay_prefill(graph, lengths)
            else:
                self.execute(segs, dec_slots, v)
            issued = clock()
            gpu_timer.end()
            synchronize(self.device)
            end = clock()

            # ---- bookkeeping ----
            kv = dec_kv + len(step.decode) * v
            n_pre = 0
            for r, s0, n in step.prefill:
                n_pre += n
                kv += s0 + n
                prefilled[r] = s0 + n
                if prefilled[r] == prompt[r]:
                    first_s[r] = end
                    generated[r] = 1
                    if self.mode == "mixed":
                        prefilling.remove(r)
                    if self.mode == "prefill_only" or output[r] <= 1:
                        finish(r, end)
                    else:
                        running.append(r)
            if step.decode:
                idx = np.asarray(step.decode)
                acc = np.ones(idx.size, np.int64)
                if v > 1:
                    ok = rng.random((idx.size, v - 1)) < self.accept_prob
                    acc += np.cumprod(ok, axis=1).sum(axis=1)
                adv = np.minimum(acc, output[idx] - generated[idx])
                for r, a in zip(step.decode, adv, strict=True):
                    s = int(slot[r])
                    generated[r] += a
                    if a < v:
                        new_len = self.layers[0].pool.length(s) - (v - a)
                        for lay in self.layers:
                            lay.pool.truncate(s, new_len)
                    if generated[r] >= output[r]:
                        running.remove(r)
                        finish(r, end)
            steps.append(
                {
                    "step": float(len(steps)),
                    "start_s": start,
                    "end_s": end,
                    "issue_s": issued - start,
                    "gpu_s": gpu_timer.seconds(),
                    "graph": float(graph is not None or graphed_decode),
                    "captured": float(len(self._prefill_graphs) + len(self._graphs) > captures),
                    "prefill_tokens": float(n_pre),
                    "prefill_seqs": float(len(step.prefill)),
                    "decode_seqs": float(len(step.decode)),
                    "decode_tokens": float(len(step.decode) * v),
                    "decode_kv_tokens": float(dec_kv),
                    "kv_tokens": float(kv),
                    "waiting": float(len(waiting)),
                }
            )

        ttft = first_s - arrival
        tpot = np.where(generated > 1, (done_s - first_s) / np.maximum(generated - 1, 1), np.nan)
        requests_df = pd.DataFrame(
            {
                "request": order,
                "arrival_s": arrival,
                "prompt_len": prompt,
                "output_len": output,
                "admit_s": admit_s,
                "first_token_s": first_s,
                "done_s": done_s,
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": done_s - arrival,
                "generated": generated,
            }
        ).sort_values("request", kind="stable", ignore_index=True)
        return EngineResult(pd.DataFrame(steps), requests_df, dict(self.config))
