"""Edge: a policy file -> everything the pure builders need (the policy and the vLLM args).

A workload's ``hf_config`` is relative to the policy file's directory; ``runtime.vllm`` turns
the model config and the policy into the vLLM server arguments. A model config that is
missing or does not fit is reported like any other policy problem: at the line of the
workload field to change. So are the names of the objects the builders derive from the
policy (``name_problems``): what the API server would refuse, or two objects would share,
is refused here, before anything is rendered or declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.builders.meta import Manifest
from infra.builders.serving_options import DEFAULT_SERVING, ServingOptions
from infra.builders.serving_pools import serving_problems
from infra.builders.stack_options import TARGETS, StackOptions, Target
from infra.bundle import (
    INFERENCE_WORKLOAD,
    DuplicateObject,
    ObjectGroup,
    build_groups,
    check_unique,
)
from policy import PolicyError, PoolPolicy, Problem, parse_policy, policy_warnings
from policy.base import (
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    check_dns_label,
    check_dns_subdomain,
    check_service_name,
)
from policy.effects import unlabelled_production
from policy.loader import locate, read_document
from runtime.vllm import (
    BackendError,
    KvPlanError,
    ModelConfigError,
    load_model_spec,
    serve_args,
)

NAME_RULES = {
    "Service": (check_service_name, DNS_LABEL_MAX),
    "Namespace": (check_dns_label, DNS_LABEL_MAX),
}
"""Kind -> the API server's rule for its ``metadata.name`` and that rule's length limit;
every other kind gpupool renders is named by a DNS-1123 subdomain."""


@dataclass(frozen=True)
class BundleInputs:
    """A validated policy and the vLLM container args of each of its workloads."""

    policy: PoolPolicy
    vllm_args: dict[str, list[str]]
    """Workload name -> vLLM server arguments."""
    warnings: tuple[Problem, ...] = ()
    """``policy.policy_warnings``: valid but probably not meant; the CLI prints them."""


def load_inputs(
    policy_path: Path,
    serving: ServingOptions = DEFAULT_SERVING,
    target: Target | None = None,
) -> BundleInputs:
    """Read and validate the policy, then derive the vLLM args of every workload.

    Raises PolicyError listing every problem (policy, model config, derived object names,
    what the stack's ``serving`` mode needs: ``serving_problems``, and with ``target``
    ``labels`` production declared before its nodes are: ``unlabelled_production``) before
    anything is built.
    """
    source = str(policy_path)
    document = read_document(policy_path)
    policy = parse_policy(document, source)
    args: dict[str, list[str]] = {}
    problems: list[Problem] = []
    for i, workload in enumerate(policy.workloads):
        try:
            model = load_model_spec(policy_path.parent / workload.hf_config)
            args[workload.name] = serve_args(policy, workload, model)
        except ModelConfigError as exc:
            problems.append(locate(document, source, f"workloads.{i}.hf_config", str(exc)))
        except KvPlanError as exc:
            problems.append(locate(document, source, f"workloads.{i}.{exc.field}", str(exc)))
        except BackendError as exc:
            path = f"workloads.{i}.attention_backend"
            problems.append(locate(document, source, path, str(exc)))
    problems += [locate(document, source, path, msg) for path, msg in name_problems(policy)]
    problems += [
        locate(document, source, path, msg)
        for path, msg in serving_problems(policy, serving) or serving_name_problems(policy, serving)
    ]
    unlabelled = unlabelled_production(policy) if target == "labels" else None
    if unlabelled is not None:
        problems.append(locate(document, source, *unlabelled))
    if problems:
        raise PolicyError(sorted(problems, key=lambda p: (p.line, p.path)))
    return BundleInputs(policy, args, tuple(policy_warnings(policy, document, source)))


def name_problems(policy: PoolPolicy) -> list[tuple[str, str]]:
    """``(field path, message)`` for every object of a workload that the API server would
    refuse by name, or that would be the same object (or Pulumi resource) as another.

    The objects are the builders' own, so every derived name is covered
    (``<workload>-kv-compaction`` is a Service: 63 characters at most), and collisions are
    found by ``infra.bundle.check_unique``, the rule the bundle itself enforces. Each
    workload is built alone (with every cluster-wide object, for both targets) and then
    checked against the workloads before it, so each problem names the workload to rename.
    The other objects' names are fields the policy models validate. Names never depend on
    the vLLM arguments, so none are passed (a workload whose model failed is still checked).
    """
    found: dict[tuple[str, str], None] = {}
    earlier: list[ObjectGroup] = []
    for i, workload in enumerate(policy.workloads):
        path, alone = f"workloads.{i}.name", policy.model_copy(update={"workloads": [workload]})
        try:
            groups = [
                group
                for target in TARGETS
                for group in build_groups(
                    alone, stack=StackOptions(target), vllm_args={workload.name: []}
                )
                if group.component == INFERENCE_WORKLOAD
            ]
        except DuplicateObject as exc:
            found[(path, f"{exc}; expected distinct names: rename the workload")] = None
            continue
        own = groups[0]
        for obj in own.objects:
            problem = _name_problem(obj, workload.name)
            if problem is not None:
                found[(path, problem)] = None
            for container, mount in _repeated_mounts(obj):
                snapshot = mount == workload.snapshot_volume.mount_path
                at = f"workloads.{i}.snapshot_volume.mount_path" if snapshot else f"workloads.{i}"
                message = (
                    f"container {container} mounts twice at {mount}; expected a path no other "
                    "mount of the container uses"
                )
                found[(at, message)] = None
        for other in earlier:
            try:
                check_unique([other, own])
            except DuplicateObject as exc:
                found[(path, f"{exc}; expected distinct names: rename one workload")] = None
        earlier.append(own)
    return list(found)


def serving_name_problems(policy: PoolPolicy, serving: ServingOptions) -> list[tuple[str, str]]:
    """An object of the serving layer that would be the same object (or Pulumi resource) as
    another, e.g. a workload named like a pool's endpoint picker (``<model>-flex-epp``)."""
    if serving.mode == "off":
        return []
    try:
        build_groups(
            policy,
            stack=StackOptions(TARGETS[0], serving=serving),
            vllm_args={w.name: [] for w in policy.workloads},
        )
    except DuplicateObject as exc:
        return [
            ("serving.models", f"{exc}; expected distinct names: rename the model or the other")
        ]
    return []


def _repeated_mounts(obj: Manifest) -> list[tuple[str, str]]:
    """``(container, mount path)`` for each path a container of ``obj``'s pod template
    mounts twice (the API server refuses the pod)."""
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    out = []
    for container in [*pod.get("initContainers", ()), *pod.get("containers", ())]:
        paths = [m["mountPath"] for m in container.get("volumeMounts", ())]
        out += [(container["name"], p) for p in sorted({p for p in paths if paths.count(p) > 1})]
    return out


def _name_problem(obj: Manifest, workload: str) -> str | None:
    """Why the API server would refuse ``obj``'s name (None: it would not), with the
    longest workload name whose derived name would fit."""
    check, limit = NAME_RULES.get(obj["kind"], (check_dns_subdomain, DNS_SUBDOMAIN_MAX))
    name = obj["metadata"]["name"]
    try:
        check(name)
    except ValueError as exc:
        longest = limit - (len(name) - len(workload))
        return (
            f"the {obj['kind']} of workload {workload!r} would be refused by the API server: "
            f"{exc}; expected a workload name of at most {longest} characters"
        )
    return None
