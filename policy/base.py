"""Shared building blocks of the policy models: strict config, typed units, invariants."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from policy.quantity import parse_quantity

_DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
    r"(?:([0-9]+)ms)?",
    re.ASCII,
)
"""Prometheus' duration grammar (``model.ParseDuration``): ASCII digits, each unit at most
once, largest first. Every pattern here is matched whole (``fullmatch``) and ASCII-only: a
``$`` anchor also matches before a trailing newline, and ``\\d`` or ``\\w`` match digits
and letters of every script, which Prometheus, Kubernetes and the registries refuse."""
_DURATION_UNITS_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
DURATION_MAX_S = 365 * 86400
"""Longest duration gpupool accepts (``1y``): every window, ``for:`` and interval is minutes
to days; more is a typo (and past about 292 years Prometheus' int64 milliseconds overflow)."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?", re.ASCII)
_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*", re.ASCII)

INT32_MAX = 2**31 - 1
"""Largest value of an ``int32`` field: most integers of the Kubernetes API (replicas,
``periodSeconds``, HPA policy values, ports) and of the programs gpupool configures."""

LABEL_KEY = re.compile(
    r"(?:(?P<prefix>[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
    r"(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)",
    re.ASCII,
)
"""A Kubernetes label (or taint) key: optional DNS-subdomain prefix and ``/``, then a name."""

LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", re.ASCII)
"""A Kubernetes label value (may be empty); at most ``DNS_LABEL_MAX`` characters.
``LABEL_KEY`` and it are matched whole (``fullmatch``)."""

DNS_LABEL_MAX = 63
"""Longest RFC 1123 / RFC 1035 label: Namespace and Service names, label values, the name
part of a label key (Kubernetes ``validation.DNS1123LabelMaxLength``)."""

DNS_SUBDOMAIN_MAX = 253
"""Longest RFC 1123 subdomain: names of most objects (Deployments, Secrets, PVCs, Nodes,
PriorityClasses, ...) and the prefix of a label key."""

RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "karpenter.sh")
"""Label domains (and their subdomains) gpupool's own node label may not use: Kubernetes
reserves ``kubernetes.io`` and ``k8s.io`` (the kubelet's NodeRestriction admission refuses
them except for a fixed list) and Karpenter refuses all three in a NodePool's labels."""

MAX_NODES = 5000
"""Most nodes one pool may have: the node count of the largest cluster Kubernetes supports."""

MAX_REPLICAS = 5000
"""Largest replica bound gpupool accepts (5,000 is the node count of the largest cluster
Kubernetes supports): a bigger value is a typo, never a plan."""


class StrictModel(BaseModel):
    """Frozen, closed models: a typo in pool.yaml is an error, never silently ignored."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        populate_by_name=True,
        validate_default=True,
        # .inf and .nan are YAML floats; no threshold, share or size of gpupool means either,
        # and PromQL, vLLM and Kubernetes would each read them differently.
        allow_inf_nan=False,
    )


def duration_seconds(value: str) -> float:
    """Seconds in a Prometheus duration such as ``5m`` or ``1h30m``."""
    match = _DURATION.fullmatch(value)
    if match is None or not value:
        raise ValueError(
            "expected a Prometheus duration such as 30s, 5m or 1h30m (ASCII digits, units y w "
            f"d h m s ms, each once, largest first), found {value!r}"
        )
    return sum(
        int(n) * unit for n, unit in zip(match.groups(), _DURATION_UNITS_S, strict=True) if n
    )


def format_duration(seconds: float) -> str:
    """A Prometheus duration of ``seconds``: whole seconds (``90s``), else milliseconds
    (``1500ms``), never below ``1ms`` (a ``[0s]`` range does not parse)."""
    ms = max(round(seconds * 1000), 1)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _check_duration(value: str) -> str:
    seconds = duration_seconds(value)
    if seconds <= 0:
        raise ValueError(f"expected a positive duration such as 5m, found {value!r}")
    if seconds > DURATION_MAX_S:
        raise ValueError(f"expected a duration of at most 1y such as 5m, found {value!r}")
    return value


def check_dns_label(value: str) -> str:
    """``value`` if it is an RFC 1123 label (a Namespace or most object names), else ValueError."""
    if len(value) > DNS_LABEL_MAX or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"expected a Kubernetes name (lower-case letters, digits and '-', at most "
            f"{DNS_LABEL_MAX} characters, starting and ending alphanumeric, e.g. gpu-flex), "
            f"found {value!r}"
        )
    return value


def check_service_name(value: str) -> str:
    """``value`` if it is an RFC 1035 label (what the API server requires of a Service name)."""
    if len(value) > DNS_LABEL_MAX or not _DNS_1035_LABEL.fullmatch(value):
        raise ValueError(
            f"expected a Service name (DNS-1035 label: lower-case letters, digits and '-', at "
            f"most {DNS_LABEL_MAX} characters, starting with a letter and ending "
            f"alphanumeric, e.g. llama-8b-flex), found {value!r}"
        )
    return value


def check_dns_subdomain(value: str) -> str:
    """``value`` if it is an RFC 1123 subdomain (Node, Secret, PVC, PriorityClass names)."""
    if len(value) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            f"expected a DNS-1123 subdomain (lower-case alphanumeric labels of letters, digits "
            f"and '-', joined by '.', at most {DNS_SUBDOMAIN_MAX} characters, e.g. "
            f"ip-10-0-1-23.ec2.internal), found {value!r}"
        )
    return value


def is_label_key(value: str) -> bool:
    """Whether ``value`` is a Kubernetes label key (prefix <= 253, name <= 63 characters)."""
    match = LABEL_KEY.fullmatch(value)
    return (
        match is not None
        and len(match["name"]) <= DNS_LABEL_MAX
        and len(match["prefix"] or "") <= DNS_SUBDOMAIN_MAX
    )


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a Kubernetes label value (<= 63 characters)."""
    return len(value) <= DNS_LABEL_MAX and LABEL_VALUE.fullmatch(value) is not None


def _check_label_key(value: str) -> str:
    if not is_label_key(value):
        raise ValueError(
            "expected a label key [PREFIX/]NAME (PREFIX a DNS subdomain of at most "
            f"{DNS_SUBDOMAIN_MAX} characters, NAME at most {DNS_LABEL_MAX} letters, digits, "
            f"'-', '_' or '.', alphanumeric at both ends, e.g. gpupool.io/pool), found {value!r}"
        )
    return value


def _check_label_value(value: str) -> str:
    if not is_label_value(value):
        raise ValueError(
            f"expected a label value (at most {DNS_LABEL_MAX} letters, digits, '-', '_' or '.', "
            f"alphanumeric at both ends, or empty, e.g. gpu-prod), found {value!r}"
        )
    return value


def _check_namespace(value: str) -> str:
    check_dns_label(value)
    if value == "default" or value.startswith("kube-"):
        raise ValueError(
            "expected a namespace of gpupool's own, not default and not kube-* (Kubernetes' "
            "namespaces: gpupool's Pod Security labels and pods do not belong there), "
            f"found {value!r}"
        )
    return value


def _check_priority_class_name(value: str) -> str:
    check_dns_subdomain(value)
    if value.startswith("system-"):
        raise ValueError(
            "expected a PriorityClass name without the system- prefix (the API server "
            f"reserves it for Kubernetes' own classes), found {value!r}"
        )
    return value


def _check_node_label_key(value: str) -> str:
    _check_label_key(value)
    domain = value.partition("/")[0] if "/" in value else ""
    if any(domain == d or domain.endswith(f".{d}") for d in RESERVED_LABEL_DOMAINS):
        raise ValueError(
            f"expected a label key outside {', '.join(RESERVED_LABEL_DOMAINS)} (reserved: the "
            "kubelet's NodeRestriction admission and Karpenter refuse them), e.g. "
            f"gpupool.io/pool, found {value!r}"
        )
    return value


def _check_prometheus_label(value: str) -> str:
    if not _PROMETHEUS_LABEL.fullmatch(value) or value.startswith("__"):
        raise ValueError(
            "expected a Prometheus label name (ASCII letters, digits and '_', not starting with "
            f"a digit; '__' is reserved for Prometheus' internal labels; e.g. namespace), found "
            f"{value!r}"
        )
    return value


QUANTITY_MAX = 2**63 - 1
"""Largest quantity Kubernetes stores (``resource.Quantity`` caps larger ones silently)."""


def _check_quantity(value: str) -> str:
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"expected a Kubernetes quantity such as 500m, 16Gi or 2, found {value!r}")
    if parse_quantity(value) > QUANTITY_MAX:
        raise ValueError(
            f"expected a Kubernetes quantity of at most 2^63-1 (about 8 EiB) such as 16Gi, found "
            f"{value!r}"
        )
    return value


Duration = Annotated[str, AfterValidator(_check_duration)]
"""A Prometheus duration (``30s``, ``5m``, ``1h30m``): alert ``for:`` and query windows."""

DnsLabel = Annotated[str, AfterValidator(check_dns_label)]
"""A Kubernetes object name (RFC 1123 label)."""

ServiceName = Annotated[str, AfterValidator(check_service_name)]
"""The name of an object that is also a Service's (RFC 1035 label: starts with a letter)."""

DnsSubdomain = Annotated[str, AfterValidator(check_dns_subdomain)]
"""A Kubernetes object name that may contain dots (RFC 1123 subdomain): Nodes, Secrets, ..."""

NamespaceName = Annotated[str, AfterValidator(_check_namespace)]
"""A namespace gpupool creates and owns: never ``default`` or ``kube-*``."""

PriorityClassName = Annotated[str, AfterValidator(_check_priority_class_name)]
"""A PriorityClass name: a DNS subdomain without the reserved ``system-`` prefix."""

LabelKey = Annotated[str, AfterValidator(_check_label_key)]
"""A Kubernetes label key (``[PREFIX/]NAME``)."""

LabelValue = Annotated[str, AfterValidator(_check_label_value)]
"""A Kubernetes label value."""

NodeLabelKey = Annotated[str, AfterValidator(_check_node_label_key)]
"""A node label (and taint) key gpupool may set: outside ``RESERVED_LABEL_DOMAINS``."""

PrometheusLabel = Annotated[str, AfterValidator(_check_prometheus_label)]
"""A Prometheus label name (``[a-zA-Z_][a-zA-Z0-9_]*``, not ``__``-prefixed)."""

ReplicaBound = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
"""An HPA ``maxReplicas``-like bound: at least 1, at most ``MAX_REPLICAS``."""


def _check_replica_bound_or_auto(value: object) -> object:
    """``auto`` or a ``ReplicaBound``, checked before the union: one problem at the field
    (pydantic would report each member of the union at a path of its own)."""
    if value == "auto":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_REPLICAS:
        return value
    raise ValueError(
        f"expected auto or a whole number of replicas from 1 to {MAX_REPLICAS}, found {value!r}"
    )


ReplicaBoundOrAuto = Annotated[
    ReplicaBound | Literal["auto"], BeforeValidator(_check_replica_bound_or_auto)
]
"""A ``ReplicaBound`` or ``auto`` (the bound follows from capacity)."""


def _number_as_quantity(value: object) -> object:
    """``cpu: 8`` as Kubernetes reads it: a bare YAML number is the quantity ``"8"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value}"
    return value


Quantity = Annotated[str, BeforeValidator(_number_as_quantity), AfterValidator(_check_quantity)]
"""A Kubernetes resource quantity (``16Gi``, ``500m``)."""


_PERCENT = re.compile(r"([0-9]+(?:\.[0-9]+)?)%", re.ASCII)


def _check_quantity_or_percent(value: str) -> str:
    if not value.endswith("%"):
        return _check_quantity(value)
    # not float() alone: it also reads "1_0", " 50" and the digits of every script
    match = _PERCENT.fullmatch(value)
    share = float(match[1]) if match else -1.0
    if not 0 < share <= 100:
        raise ValueError(
            f"expected a percentage in (0, 100] such as 90%, or a Kubernetes quantity such as "
            f"80Gi, found {value!r}"
        )
    return value


QuantityOrPercent = Annotated[
    str, BeforeValidator(_number_as_quantity), AfterValidator(_check_quantity_or_percent)
]
"""A Kubernetes quantity (``80Gi``) or a percentage of another quantity (``90%``)."""

_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
"""One segment of a path gpupool renders into a container (a mount path, a token directory):
portable file-name characters only, so no value is ever read as two words, an option or YAML."""


def _path_segments_problem(segments: list[str]) -> str | None:
    for segment in segments:
        if not _PATH_SEGMENT.fullmatch(segment):
            return "segments of ASCII letters, digits, '.', '_' or '-'"
        if segment in (".", ".."):
            return "no '.' or '..' segment"
    return None


def check_absolute_path(value: str) -> str:
    """``value`` if it is an absolute, normalised path of portable segments (``/kv``)."""
    segments = value[1:].split("/")
    problem = "a path starting with '/'" if not value.startswith("/") else None
    problem = problem or _path_segments_problem(segments)
    if problem is not None:
        raise ValueError(
            f"expected an absolute path ({problem}; no trailing '/'), e.g. "
            f"/var/lib/gpupool/kv-snapshots, found {value!r}"
        )
    return value


AbsolutePath = Annotated[str, AfterValidator(check_absolute_path)]
"""An absolute container path of portable segments, without ``.``/``..`` or a trailing ``/``."""

HOST_PATTERN = (
    r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
"""A host name or IPv4 address (no user part, no IPv6 literal)."""

URL_PATH_CHARS = r"[A-Za-z0-9._~%+/-]"
"""Characters gpupool accepts in a URL path: RFC 3986's unreserved ones, ``%``, ``+`` and
``/`` (no quotes, spaces, ``$``, ``;`` or ``#``: the URLs reach argv, YAML and PromQL labels)."""

_HTTP_URL = re.compile(
    rf"https?://(?P<host>{HOST_PATTERN})(?::(?P<port>[0-9]{{1,5}}))?(?:/{URL_PATH_CHARS}*)?",
    re.ASCII,
)


def port_problem(port: str | None) -> bool:
    """Whether a URL's port (None: none given) is outside 1-65535."""
    return port is not None and not 1 <= int(port) <= 65535


def check_http_url(value: str) -> str:
    """``value`` if it is an ``http(s)://host[:port][/path]`` URL of ASCII characters."""
    match = _HTTP_URL.fullmatch(value)
    if match is None or port_problem(match["port"]):
        raise ValueError(
            "expected an http(s) URL http(s)://HOST[:PORT][/PATH] (ASCII host, port 1-65535, "
            "path of letters, digits and . _ ~ % + / -), e.g. "
            f"http://prometheus-operated.monitoring.svc:9090, found {value!r}"
        )
    return value


HttpUrlText = Annotated[str, AfterValidator(check_http_url)]
"""An ``http(s)://`` URL kept as written (pydantic's ``HttpUrl`` would normalise it)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
"""A share in [0, 1]; gpupool writes utilization and ratios as fractions, never percent."""


class InvariantViolation(ValueError):
    """One or more broken cross-field rules; each names the field paths it involves.

    Raised from ``model_validator(mode="after")``; pydantic keeps the exception in the
    error's ``ctx`` so the loader can point every violation at its line in pool.yaml.
    """

    def __init__(self, violations: list[tuple[str, str]]) -> None:
        self.violations = violations
        super().__init__("; ".join(f"{path}: {message}" for path, message in violations))


class Invariants:
    """Collects violations so one validation reports every broken rule, not just the first."""

    def __init__(self) -> None:
        self._found: list[tuple[str, str]] = []

    def require(self, ok: bool, path: str, message: str) -> None:
        if not ok:
            self._found.append((path, message))

    def raise_if_any(self) -> None:
        if self._found:
            raise InvariantViolation(self._found)
