"""The catalogue of one policy: every concern's queries in one stable order, looked up by
recorded-series name, and the exporters they read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from policy.pool import PoolPolicy
from runtime.metrics.catalogue.budget import TERMS
from runtime.metrics.catalogue.budget import queries as budget_queries
from runtime.metrics.catalogue.capacity import queries as capacity_queries
from runtime.metrics.catalogue.evictions import queries as eviction_queries
from runtime.metrics.catalogue.gpus import queries as gpu_queries
from runtime.metrics.catalogue.kv_cache import queries as kv_cache_queries
from runtime.metrics.catalogue.query import Query, Source
from runtime.metrics.catalogue.serving import queries as serving_queries
from runtime.metrics.catalogue.snapshots import queries as snapshot_queries
from runtime.metrics.catalogue.sources import sources


@dataclass(frozen=True)
class Catalogue:
    """The queries of one policy, in a stable order, looked up by recorded-series name."""

    queries: tuple[Query, ...]
    sources: tuple[Source, ...]

    def __getitem__(self, record: str) -> Query:
        for query in self.queries:
            if query.record == record:
                return query
        raise KeyError(f"no query records {record!r}; known: {[q.record for q in self.queries]}")

    def __iter__(self) -> Iterator[Query]:
        return iter(self.queries)

    def query(self, record: str) -> str:
        """The standalone PromQL of ``record`` (works on raw data without the recording rules)."""
        query = self[record]
        return query.expr if query.standalone is None else query.standalone

    @property
    def budget(self) -> tuple[Query, ...]:
        """The flex budget's chain of terms, in evaluation order."""
        return tuple(q for q in self.queries if q.record in TERMS)


CONCERNS: tuple[Callable[[PoolPolicy], list[Query]], ...] = (
    budget_queries,
    gpu_queries,
    capacity_queries,
    eviction_queries,
    kv_cache_queries,
    serving_queries,
    snapshot_queries,
)
"""Every concern's queries, in catalogue order: the budget's chain first."""


def build_catalogue(policy: PoolPolicy) -> Catalogue:
    """All of gpupool's named queries for ``policy``, every concern's in ``CONCERNS`` order."""
    queries = [query for concern in CONCERNS for query in concern(policy)]
    return Catalogue(tuple(queries), tuple(sources(policy)))
