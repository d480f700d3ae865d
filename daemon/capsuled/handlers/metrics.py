"""``metrics``: the daemon's figures as OpenMetrics text (docs/design.md §7)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.registry import Collector

from capsule_client.wire import MetricsResult, NoParams
from capsuled.metrics.collector import exposition

__all__ = ["metrics_handler"]


def metrics_handler(collector: Collector) -> Callable[[NoParams], MetricsResult]:
    """The ``metrics`` handler: ``{"text": ...}`` made from ``collector`` at each call."""

    def metrics(params: NoParams) -> MetricsResult:
        return MetricsResult(text=exposition(collector))

    return metrics
