"""``gpupool init``: the policy it writes validates, renders and replays, from flags and from
questions on a terminal; what it refuses, it refuses in one line and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import load_policy
from policy.receivers import WebhookReceiver
from runtime.cli import init_commands
from runtime.cli.app import app
from runtime.init.catalog import MODELS, find_gpu

pytestmark = pytest.mark.process

runner = CliRunner()

ISSUE_CLUSTER = [
    # 6 x 8 A100 for production Llama-3.1-70B at TP 4; 3 x 8 H100 lending to a 7B batch model
    "--gpu-model",
    "A100",
    "--gpus-per-node",
    "8",
    "--prod-nodes",
    "a100-1,a100-2,a100-3,a100-4,a100-5,a100-6",
    "--flex-gpu-model",
    "H100",
    "--flex-nodes",
    "h100-1,h100-2,h100-3",
    "--flex-model",
    "Qwen/Qwen2.5-7B-Instruct",
    "--production",
    "inference/llama-3-1-70b:4",
]
H200_CLUSTER = [
    # one GPU model, counted nodes (Karpenter), a 70B flex model that needs two GPUs
    "--gpu-model",
    "NVIDIA-H200",
    "--prod-nodes",
    "4",
    "--flex-nodes",
    "5",
    "--flex-model",
    "meta-llama/Llama-3.1-70B-Instruct",
    "--production",
    "chat/assistant:8",
    "--production",
    "search/rerank:1",
    "--cluster-name",
    "h200-east",
    "--runtime-image",
    "registry.acme.test/gpupool/gpupool:0.1.0",
]
SMALL_CLUSTER = [
    # smaller than the bundled production sample's peak: init's whatif scales it down
    "--gpu-model",
    "L40S",
    "--gpus-per-node",
    "4",
    "--prod-nodes",
    "l40s-a,l40s-b",
    "--flex-nodes",
    "l40s-c",
    "--flex-model",
    "deepseek-ai/DeepSeek-V2-Lite",
    "--repo-url",
    "git@git.acme.test:platform/gpu-policy.git",
    "--alert-webhook",
    "https://hooks.acme.test/gpupool",
]
T4_CLUSTER = ["--gpu-model", "T4", "--prod-nodes", "1", "--flex-nodes", "1"]
CLUSTERS = {"issue": ISSUE_CLUSTER, "h200": H200_CLUSTER, "small": SMALL_CLUSTER}


def _init(out: Path, *args: str) -> str:
    result = runner.invoke(app, ["init", "--non-interactive", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_init_writes_a_policy_that_validates_renders_and_replays(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "gpu-policy"
    out = _init(repo, *CLUSTERS[cluster])
    text = (repo / "policy/pool.yaml").read_text()
    assert len(text.splitlines()) <= 61  # short: about 40 lines and their comments
    assert "policy/pool.yaml: ok (2 node pools, 1 flex workloads)" in out
    next_commands = out[out.index("Next") :].splitlines()[1:]
    # counted prod nodes (h200) are Karpenter's: the labels target would refuse production
    render = "gpupool render --out build/" + (" --target karpenter" if cluster == "h200" else "")
    assert [line.split("#")[0].strip() for line in next_commands] == [
        init_commands.WHATIF_COMMAND,
        render,
        init_commands.COMMIT_COMMAND,
    ]
    monkeypatch.chdir(repo)
    valid = runner.invoke(app, ["validate"])
    assert valid.exit_code == 0, valid.output
    assert valid.stderr.startswith("policy: policy/pool.yaml (from the current directory)")
    rendered = runner.invoke(app, render.split()[1:])
    assert rendered.exit_code == 0, rendered.output
    assert (repo / "build/kustomization.yaml").is_file()
    replay = ["whatif", "--hours", "1"]
    if cluster == "small":  # 12 GPUs: the bundled sample peaks at 67, init says --fit-production
        assert runner.invoke(app, replay).exit_code != 0
        replay.append("--fit-production")
    replayed = runner.invoke(app, replay, env={"COLUMNS": "200"})
    assert replayed.exit_code == 0, replayed.output
    assert "cluster useful GPU-hours" in replayed.stdout


def test_the_issue_cluster_is_the_cluster_the_policy_declares(tmp_path: Path) -> None:
    _init(tmp_path, *ISSUE_CLUSTER)
    policy = load_policy(tmp_path / "policy/pool.yaml")
    prod, flex = policy.prod_pool, policy.flex_pools[0]
    a100, h100 = find_gpu("A100"), find_gpu("H100")
    assert a100 is not None and h100 is not None
    assert (prod.gpu_model, prod.max_nodes, prod.gpus_per_node) == (a100.label, 6, 8)
    assert (flex.gpu_model, flex.max_nodes, flex.gpus_per_node) == (h100.label, 3, 8)
    assert prod.nodes[0] == "a100-1" and len(flex.nodes) == 3
    assert prod.gpu_memory_gib == 80 and flex.gpu_memory_gib == 79.6
    assert prod.lend_idle  # an A100 80GB holds what the flex workload is sized for on H100
    (workload,) = policy.workloads
    assert (workload.model, workload.gpus_per_replica) == ("Qwen/Qwen2.5-7B-Instruct", 1)
    assert workload.hf_config == "models/qwen2.5-7b-instruct.json"
    (llama,) = policy.production
    assert (llama.namespace, llama.name, llama.gpus_per_replica) == (
        "inference",
        "llama-3-1-70b",
        4,
    )
    assert llama.max_replicas == 12  # 6 nodes x 2 replicas of 4 GPUs
    assert policy.tuner.policy_repo_url.startswith("https://git.example.invalid/")
    shipped = (tmp_path / "policy/models/qwen2.5-7b-instruct.json").read_bytes()
    assert shipped == next(m for m in MODELS if m.stem == "qwen2.5-7b-instruct").path.read_bytes()


def test_init_sizes_the_flex_replica_and_names_what_is_left_to_fill(tmp_path: Path) -> None:
    out = _init(tmp_path, *H200_CLUSTER)
    policy = load_policy(tmp_path / "policy/pool.yaml")
    assert policy.workloads[0].gpus_per_replica == 2  # 70B in bf16 needs two 140 GiB GPUs
    assert policy.cluster.name == "h200-east"
    assert policy.cluster.runtime_image == "registry.acme.test/gpupool/gpupool:0.1.0"
    assert policy.prod_pool.nodes == () and policy.prod_pool.max_nodes == 4
    assert [p.max_replicas for p in policy.production] == [2, 16]  # the prod pool, split
    todo = [line for line in out.splitlines() if ": warning: " in line]
    assert [line.split(": warning: ")[1].split(":")[0] for line in todo] == [
        "alerting.routing.receivers.0.url",
        "tuner.policy_repo_url",
    ]
    assert "gated" in out  # Llama: hf_token_secret, commented in the file
    assert "# hf_token_secret: hf-token" in (tmp_path / "policy/pool.yaml").read_text()


def test_an_mla_model_before_hopper_gets_a_backend_that_runs_it(tmp_path: Path) -> None:
    _init(tmp_path, *SMALL_CLUSTER)
    policy = load_policy(tmp_path / "policy/pool.yaml")
    assert policy.workloads[0].attention_backend == "triton"
    assert policy.tuner.policy_repo_url == "git@git.acme.test:platform/gpu-policy.git"
    assert (
        "Replace the placeholders"
        in runner.invoke(
            app, ["init", "--non-interactive", "--force", "--out", str(tmp_path), *SMALL_CLUSTER]
        ).stdout
    )  # the runtime image is still a placeholder


@pytest.mark.parametrize("model", [m.hf_id for m in MODELS])
def test_every_shipped_model_makes_a_valid_policy(model: str, tmp_path: Path) -> None:
    out = _init(
        tmp_path,
        *["--gpu-model", "H100", "--prod-nodes", "2", "--flex-nodes", "2", "--flex-model", model],
    )
    assert f"serves {model} on " in out


def test_the_owners_own_config_json(tmp_path: Path) -> None:
    """A model gpupool ships no config for: the owner's config.json (a folder holding one)."""
    own = tmp_path / "my-model"
    own.mkdir()
    config = json.loads(
        next(m for m in MODELS if m.stem == "mistral-7b-instruct-v0.3").path.read_text()
    )
    (own / "config.json").write_text(json.dumps(config))
    repo = tmp_path / "repo"
    args = ["--gpu-model", "A100", "--prod-nodes", "1", "--flex-nodes", "1"]
    refused = runner.invoke(
        app, ["init", "--non-interactive", "--out", str(repo), *args, "--flex-model", "acme/m-7b"]
    )
    assert refused.exit_code == 2 and "--flex-config" in refused.stderr
    assert not repo.exists()
    _init(repo, *args, "--flex-model", "acme/m-7b", "--flex-config", str(own))
    policy = load_policy(repo / "policy/pool.yaml")
    assert policy.workloads[0].model == "acme/m-7b"
    assert (repo / "policy" / policy.workloads[0].hf_config).is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-model", "A100"], "--prod-nodes, --flex-nodes, --flex-model are required"),
        (
            ["--gpu-model", "B300", "--prod-nodes", "1", "--flex-nodes", "1", "--flex-model", "x"],
            "--gpu-memory-gib",
        ),
        (
            [*ISSUE_CLUSTER, "--production", "inference/llama"],
            "expected NAMESPACE/DEPLOYMENT:GPUS",
        ),
        (
            [*T4_CLUSTER, "--flex-model", "Qwen/Qwen2.5-72B-Instruct"],
            "fits no Tesla-T4 replica",
        ),
    ],
)
def test_what_init_refuses_it_says_in_one_line_and_writes_nothing(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = runner.invoke(app, ["init", "--non-interactive", "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line
    assert not (tmp_path / "policy").exists()


def test_an_existing_policy_is_kept_unless_forced(tmp_path: Path) -> None:
    _init(tmp_path, *ISSUE_CLUSTER)
    before = (tmp_path / "policy/pool.yaml").read_text()
    again = runner.invoke(
        app, ["init", "--non-interactive", "--out", str(tmp_path), *ISSUE_CLUSTER]
    )
    assert again.exit_code == 2 and "--force" in again.stderr
    assert (tmp_path / "policy/pool.yaml").read_text() == before
    _init(tmp_path, *ISSUE_CLUSTER, "--force", "--flex-model", "phi-3-mini-4k-instruct")
    assert "microsoft/Phi-3-mini-4k-instruct" in (tmp_path / "policy/pool.yaml").read_text()


def test_on_a_terminal_init_asks_what_the_flags_leave_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(init_commands, "stdin_is_terminal", lambda: True)
    answers = [
        "acme-gpu",  # cluster name
        "Z999",  # production GPU: unknown, asked again
        "A100",
        "a1,a2,a3,a4,a5,a6",  # production nodes
        "H100",  # flex GPU
        "3",  # flex nodes: a count
        "mistralai/Mistral-7B-Instruct-v0.3",
        "inference/llama-70b:4",  # production workloads
        "",  # repository URL: placeholder
        "registry.acme.test/gpupool:0.1.0",
        "https://hooks.acme.test/gpupool",
    ]
    result = runner.invoke(app, ["init", "--out", str(tmp_path)], input="\n".join(answers) + "\n")
    assert result.exit_code == 0, result.output
    assert "gpupool knows the memory of" in result.output  # why Z999 was asked again
    policy = load_policy(tmp_path / "policy/pool.yaml")
    assert policy.cluster.name == "acme-gpu"
    assert policy.cluster.runtime_image == "registry.acme.test/gpupool:0.1.0"
    assert policy.alerting.routing.receivers[0] == WebhookReceiver(
        name="platform", type="webhook", url="https://hooks.acme.test/gpupool"
    )
    assert (policy.prod_pool.max_nodes, policy.flex_pools[0].max_nodes) == (6, 3)
    assert policy.workloads[0].model == "mistralai/Mistral-7B-Instruct-v0.3"
    assert policy.production[0].name == "llama-70b"
    assert "tuner.policy_repo_url" in result.stdout  # the one placeholder left


def test_without_a_terminal_init_does_not_wait_for_answers(tmp_path: Path) -> None:
    """CliRunner's stdin is no terminal: init refuses at once, as with --non-interactive."""
    result = runner.invoke(app, ["init", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--gpu-model, --prod-nodes, --flex-nodes, --flex-model are required" in result.stderr
