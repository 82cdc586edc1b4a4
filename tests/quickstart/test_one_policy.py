"""One policy: every command that reads a policy reads ./policy/pool.yaml (or the file it is
given); outside a policy repository each refuses with one line naming `gpupool init` and
`--example`, and only `--example` reads the packaged example. `vllm-args --model` describes the
model it was given."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policy import DEFAULT_POLICY, load_policy
from runtime.cli.app import app
from runtime.init.catalog import MODELS_DIR
from tests.vllm.test_waste import AZURE_CODE

runner = CliRunner()

EXAMPLE_MODEL = load_policy(DEFAULT_POLICY).workloads[0].model
"""The packaged example's flex model (meta-llama/Llama-3.1-8B-Instruct)."""


def _commands(tmp: Path) -> dict[str, list[str]]:
    """Every command that reads a policy, with the arguments it needs besides the policy."""
    return {
        "validate": ["validate"],
        "render": ["render", "--out", str(tmp / "build")],
        "diff": ["diff", str(DEFAULT_POLICY)],
        "demo": ["demo", "--out", str(tmp / "demo"), "--whatif-out", str(tmp / "demo-whatif")],
        "vllm-args": ["vllm-args", "--json"],
        "kv-report": ["kv-report", "--trace", str(AZURE_CODE)],
        "alerts render": ["alerts", "render", "--out", str(tmp / "alerts")],
        "whatif": ["whatif", "--hours", "0.1"],
        "kv-sidecar compact": ["kv-sidecar", "compact", "--token-file", str(tmp / "no-token")],
        "kv-sidecar shrink": ["kv-sidecar", "shrink", "64", "--token-file", str(tmp / "no-token")],
        "kv-sidecar run": [
            "kv-sidecar",
            "run",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
            "--token-file",
            str(tmp / "no-token"),
            "--polls",
            "1",
        ],
        "kv-snapshots gc": [
            "kv-snapshots",
            "gc",
            "--root",
            str(tmp / "snapshots"),
            "--capacity-bytes",
            "1000000",
            "--passes",
            "1",
            "--listen",
            "127.0.0.1:0",
        ],
        "advise": [
            "advise",
            "--out",
            str(tmp / "advise"),
            "--hours",
            "0.05",
            "--max-variants",
            "1",
            "--budget-s",
            "1",
            "--jobs",
            "1",
        ],
        "production-trace": [
            "production-trace",
            "--prometheus",
            "http://127.0.0.1:9",
            "--out",
            str(tmp / "trace.csv"),
        ],
    }


COMMANDS = list(_commands(Path("/nonexistent")))

WORKS_WITH_EXAMPLE = {
    "validate",
    "render",
    "diff",
    "demo",
    "vllm-args",
    "kv-report",
    "alerts render",
    "whatif",
    "kv-snapshots gc",
}
"""Commands that succeed on the packaged example alone; the others then stop where a test
lacks what a cluster has (``STOPS_AT``)."""

STOPS_AT = {
    "advise": "over --max-variants 1",  # the 19 default variants: refused before any replay
    "production-trace": "ConnectionError",  # no Prometheus listens there
}
"""What stops a command after it read the example; the kv-sidecar ones: the control token a
pod has and a test does not."""


@pytest.fixture()
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory that is no policy repository (no ./policy/pool.yaml)."""
    cwd = tmp_path / "not-a-policy-repository"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


@pytest.mark.parametrize("name", COMMANDS)
def test_outside_a_policy_repository_every_command_refuses_in_one_line(
    name: str, elsewhere: Path
) -> None:
    args = _commands(elsewhere)[name]
    result = runner.invoke(app, args)
    assert result.exit_code != 0, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: no policy/pool.yaml in ")
    assert "`gpupool init`" in line and "--example" in line
    assert result.stdout == ""
    written = ("build", "alerts", "demo", "advise", "trace.csv")
    assert not any(p.name in written for p in elsewhere.iterdir())


@pytest.mark.heavy
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_with_example_each_command_reads_the_packaged_example(name: str, elsewhere: Path) -> None:
    args = _commands(elsewhere)[name]
    (elsewhere / "snapshots").mkdir()
    result = runner.invoke(app, [*args, "--example"], env={"COLUMNS": "200"})
    assert "no policy/pool.yaml" not in result.output
    assert f"policy: {DEFAULT_POLICY} (the packaged example, --example)" in result.stderr
    if name in WORKS_WITH_EXAMPLE:
        assert result.exit_code == 0, result.output
    else:
        assert STOPS_AT.get(name, "control token") in " ".join(result.stderr.split())


def test_a_policy_file_and_example_are_not_both_taken(elsewhere: Path) -> None:
    result = runner.invoke(app, ["validate", str(DEFAULT_POLICY), "--example"])
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"error: give a policy file ({DEFAULT_POLICY}) or --example, not both"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["vllm-args", "--json"],
        ["alerts", "render", "--out", "alerts"],
        ["kv-report", "--trace", str(AZURE_CODE)],
    ],
)
def test_commands_read_the_repository_policy_not_the_example(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a policy repository, ``vllm-args``, ``alerts render`` and ``kv-report`` read
    ./policy/pool.yaml: its model, sizes and receivers, not the packaged example's."""
    policy = tmp_path / "policy"
    (policy / "models").mkdir(parents=True)
    shutil.copy(MODELS_DIR / "qwen2.5-7b-instruct.json", policy / "models")
    text = (
        DEFAULT_POLICY.read_text()
        .replace("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
        .replace("models/llama-3.1-8b-instruct.json", "models/qwen2.5-7b-instruct.json")
        .replace("max_model_len: 8192", "max_model_len: 4096")
        .replace("http://gpupool-tuner.gpupool-system.svc:9095/alerts", "http://pager.acme.test/p")
    )
    (policy / "pool.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    if args[0] == "vllm-args":
        served = json.loads(result.stdout)
        assert served[served.index("--model") + 1] == "Qwen/Qwen2.5-7B-Instruct"
        assert served[served.index("--max-model-len") + 1] == "4096"
    elif args[0] == "alerts":
        routes = (tmp_path / "alerts" / "alertmanager.yml").read_text()
        assert "http://pager.acme.test/p" in routes
        assert "gpupool-tuner.gpupool-system.svc" not in routes
    else:
        assert "max_model_len 4096" in result.stdout
    assert result.stderr.startswith("policy: policy/pool.yaml (from the current directory)")


def _model_dir(tmp_path: Path) -> Path:
    """A model directory (as on a volume: config.json beside the weights) of another model."""
    folder = tmp_path / "models--qwen2.5-7b-instruct"
    folder.mkdir()
    document = json.loads((MODELS_DIR / "qwen2.5-7b-instruct.json").read_text())
    del document["_name_or_path"]
    (folder / "config.json").write_text(json.dumps(document))
    return folder


EXAMPLE = ["--policy", str(DEFAULT_POLICY)]
"""The example's policy by name: its workload serves Llama 3.1 8B."""


def test_vllm_args_model_dir_describes_the_model_it_was_given(tmp_path: Path) -> None:
    """``--model DIR`` of a Qwen model names DIR, in the arguments and in the table, not the
    workload's Llama."""
    folder = _model_dir(tmp_path)
    result = runner.invoke(
        app, ["vllm-args", *EXAMPLE, "--model", str(folder)], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 0, result.output
    args = shlex.split(result.stdout.strip().splitlines()[-1])
    assert args[args.index("--model") + 1] == str(folder)
    assert f"vLLM KV cache for {folder}" in result.stdout
    assert EXAMPLE_MODEL not in result.stdout
    as_json = runner.invoke(
        app, ["vllm-args", *EXAMPLE, "--json", "--model", str(folder / "config.json")]
    )
    served = json.loads(as_json.stdout)
    assert served[served.index("--model") + 1] == str(folder)


def test_vllm_args_model_file_names_its_hugging_face_id() -> None:
    """A config kept apart from its weights (a shipped one) is named by ``_name_or_path``."""
    config = MODELS_DIR / "mistral-7b-instruct-v0.3.json"
    result = runner.invoke(app, ["vllm-args", *EXAMPLE, "--json", "--model", str(config)])
    assert result.exit_code == 0, result.output
    served = json.loads(result.stdout)
    assert served[served.index("--model") + 1] == "mistralai/Mistral-7B-Instruct-v0.3"
