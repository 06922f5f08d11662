"""Revenue as providers bill it: input tokens served from the prefix cache, input tokens that
missed it, and output tokens, each at its price per million tokens, per traffic class where a
class is priced apart (``prices.revenue.by_class``).

A class is billed for its completed requests' tokens per second of the run's makespan, its input
split by its own prefix-cache hit rate (the summary's ``cache.by_class``). The totals are the
run's tokens split by the run's hit rate at the global prices, plus, for each class priced apart,
its own tokens at the difference from the global price. So a run with no per-class prices bills
exactly what the global prices give, and the classes add up to the totals whenever every request
the cache saw completed (a run that drains); a run cut by a horizon bills the completed tokens at
hit rates that also count the requests still in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ...scenario import Revenue, TokenPrices

KINDS = ("input_cache_miss", "input_cache_hit", "output")
"""The token kinds billed, in the order of :class:`TokenRates` and :class:`TokenPrices`."""

_PER_HOUR = 3600 / 1e6  # tokens/s × USD per million tokens -> USD per hour


class TokenRates(NamedTuple):
    """Tokens per second billed as each kind."""

    input_cache_miss: float
    input_cache_hit: float
    output: float

    @classmethod
    def split(cls, input_tok_s: float, output_tok_s: float, hit_share: float) -> TokenRates:
        """Input tokens split into hits and misses by the share of them the cache served."""
        return cls(input_tok_s * (1 - hit_share), input_tok_s * hit_share, output_tok_s)


def _usd_per_hour(rates: TokenRates, prices: TokenPrices) -> dict[str, float]:
    return {k: r * p * _PER_HOUR for k, r, p in zip(KINDS, rates, prices, strict=True)}


def revenue(
    prices: Revenue, total: TokenRates, by_class: Mapping[str, TokenRates]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """USD per hour by token kind for the whole run, and by class (each kind and its
    ``total``). A class in ``by_class`` that has no prices of its own is billed at the global
    ones; prices for a class not in ``by_class`` earn nothing."""
    base = prices.prices()
    totals = _usd_per_hour(total, base)
    classes: dict[str, dict[str, float]] = {}
    for name, rates in by_class.items():
        own = prices.prices(name)
        earned = _usd_per_hour(rates, own)
        classes[name] = {**earned, "total": sum(earned.values())}
        for kind, rate, price, global_price in zip(KINDS, rates, own, base, strict=True):
            if price != global_price:
                totals[kind] += rate * (price - global_price) * _PER_HOUR
    return totals, classes


def unpriced_classes(prices: Revenue, class_names: tuple[str, ...]) -> list[str]:
    """Classes priced in ``prices.by_class`` that are not among a workload's classes."""
    return [name for name in prices.by_class if name not in class_names]
