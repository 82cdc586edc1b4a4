"""The one catalogue of PromQL that alerts, the HPA, the tuner and the dashboard share."""

from runtime.metrics.catalogue import Catalogue, Query, build_catalogue

__all__ = ["Catalogue", "Query", "build_catalogue"]
