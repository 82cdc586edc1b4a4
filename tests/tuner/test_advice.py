"""The advise lever's pure core (``runtime.tuner.advice``), its settings in the policy
(``tuner.advise``), and the forge's raw-file URL the pull request shows the plot by."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.builders.runtime_components import TUNER_RESOURCES, tuner_deployment
from policy import DEFAULT_POLICY, PolicyError, PoolPolicy, load_policy
from policy.tuner import AdviseLever
from runtime.advise.front import rate
from runtime.advise.levers import CURRENT, LeverError, Variant
from runtime.advise.sweep import Point
from runtime.sim.report import Summary
from runtime.tuner import advice
from runtime.tuner.forge import raw_file_url
from runtime.tuner.proposals import TunerState
from runtime.tuner.yamledit import ValueEdit
from tests.advise.test_front import base  # noqa: F401  (the fixture: an hour of 16 GPUs)

ON = AdviseLever(enabled=True, every="1d")
DAY = 86_400.0


@pytest.fixture(scope="module")
def policy() -> PoolPolicy:
    return load_policy()


def _policy_with(tmp_path: Path, advise: str) -> Path:
    text = DEFAULT_POLICY.read_text()
    line = next(x for x in text.splitlines() if x.startswith("  advise: {"))
    path = tmp_path / "pool.yaml"
    path.write_text(text.replace(line, f"  advise: {advise}"))
    (tmp_path / "models").symlink_to(DEFAULT_POLICY.parent / "models")
    return path


def test_the_lever_is_off_by_default_and_the_shipped_policy_restates_it(
    policy: PoolPolicy,
) -> None:
    assert policy.tuner.advise == AdviseLever()
    assert not AdviseLever().enabled


@pytest.mark.parametrize(
    ("advise", "message"),
    [
        ("{enabled: true, window: 1m, step: 1m}", "window 1m must hold two steps of 1m"),
        ("{window: 100d, step: 1m}", "144,000 samples, over 100,000; take a longer step"),
        ("{vary: [reserve_ratio]}", "expected FIELD=V1,V2,... as for gpupool advise --vary"),
        ("{jobs: 0}", "tuner.advise.jobs"),
        ("{evry: 1d}", "evry"),
        ("{every: soon}", "tuner.advise.every"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, advise: str, message: str) -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy(_policy_with(tmp_path, advise))
    text = str(raised.value)
    assert message in text and "tuner.advise" in text and "pool.yaml:" in text, text


def test_a_sweep_is_due_every_every_and_never_in_the_cooldown() -> None:
    assert advice.due(ON, TunerState(), at=DAY, cooldown_s=3600) is None
    recent = advice.due(ON, TunerState(last_advise_at=DAY - 3600), at=DAY, cooldown_s=3600)
    assert recent is not None and "tuner.advise.every is 1d" in recent.reason
    assert advice.due(ON, TunerState(last_advise_at=0.0), at=DAY, cooldown_s=3600) is None
    cooling = advice.due(ON, TunerState(last_proposal_at=DAY - 60), at=DAY, cooldown_s=3600)
    assert cooling is not None and cooling.reason.startswith("cooldown: last proposal 60 s ago")


def test_the_sweep_is_the_vary_grid_or_the_default_levers(policy: PoolPolicy) -> None:
    grid = advice.variants(policy, AdviseLever(vary=["gpu-prod.reserve_ratio=0.2,0.1"]))
    assert [v.name for v in grid] == ["current", "gpu-prod.reserve_ratio=0.1"]
    assert len(advice.variants(policy, AdviseLever())) > len(grid)  # the default sweep
    with pytest.raises(LeverError, match=r"^tuner\.advise\.vary: --vary gpu-prod\.reserv: "):
        advice.variants(policy, AdviseLever(vary=["gpu-prod.reserv=0.1"]))
    values = ",".join(str(n) for n in range(9))
    huge = AdviseLever(vary=[f"gpu-prod.reserve_ratio=0.{values}", f"move_nodes={values}"])
    with pytest.raises(LeverError, match=r"^tuner\.advise\.vary: a grid of 81 variants, over 64"):
        advice.variants(policy, huge)


def test_only_a_pick_that_changes_the_policy_is_proposed(base: Summary) -> None:  # noqa: F811
    moved = Variant((ValueEdit(("x",), 1),), "x=1")
    current, other = rate([Point(CURRENT, base), Point(moved, base)], base)
    assert advice.choose(other) is other
    kept = advice.choose(current)
    assert not isinstance(kept, type(current)) and "current policy is the sweep's pick" in (
        kept.reason
    )
    none = advice.choose(None)
    assert not isinstance(none, type(current)) and "no variant of the sweep is acceptable" in (
        none.reason
    )


def test_one_branch_per_base_policy() -> None:
    assert advice.branch_name("a: 1\n") == advice.branch_name("a: 1\n")
    assert advice.branch_name("a: 1\n") != advice.branch_name("a: 2\n")
    assert advice.branch_name("a: 1\n").startswith("gpupool-tuner/advise-")
    assert advice.artifact_paths("policy/pool.yaml") == (
        "policy/advise/production.csv",
        "policy/advise/pareto.png",
    )
    assert advice.artifact_paths("pool.yaml") == ("advise/production.csv", "advise/pareto.png")


@pytest.mark.parametrize(
    ("api_url", "expected"),
    [
        ("https://api.github.com", "https://github.com/acme/p/raw/gpupool-tuner/advise-1/a/b.png"),
        (
            "https://ghe.example.com/api/v3/",
            "https://ghe.example.com/acme/p/raw/gpupool-tuner/advise-1/a/b.png",
        ),
    ],
)
def test_the_plot_is_linked_by_the_forges_raw_file_url(api_url: str, expected: str) -> None:
    url = raw_file_url(
        api_url=api_url, repository="acme/p", ref="gpupool-tuner/advise-1", path="a/b.png"
    )
    assert url == expected


def test_the_raw_file_url_refuses_what_the_api_calls_refuse() -> None:
    with pytest.raises(ValueError, match="OWNER/NAME"):
        raw_file_url(api_url="https://api.github.com", repository="../x", ref="b", path="p")
    with pytest.raises(ValueError, match="GitHub API URL"):
        raw_file_url(api_url="ftp://x", repository="acme/p", ref="b", path="p")


def test_the_tuner_pod_grows_by_the_sweeps_processes_only_while_the_lever_is_on(
    tmp_path: Path,
) -> None:
    off = load_policy()
    on = load_policy(_policy_with(tmp_path, "{enabled: true, jobs: 3}"))
    [off_container] = tuner_deployment(off)["spec"]["template"]["spec"]["containers"]
    [on_container] = tuner_deployment(on)["spec"]["template"]["spec"]["containers"]
    assert off_container["resources"]["limits"] == TUNER_RESOURCES
    assert on_container["resources"]["requests"] == {"cpu": "3250m", "memory": "1664Mi"}
    assert on_container["resources"]["limits"] == on_container["resources"]["requests"]
