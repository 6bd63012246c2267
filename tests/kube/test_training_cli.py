"""The recorded training CLIs refuse what the real programs refuse, with their messages and exit codes."""

from __future__ import annotations

import pytest

from sandbox.kube.training_cli import SOURCES, CliError, check, commands, identify, llamafactory_config


def test_hyperpodrun_accepts_the_incumbent_launch_line() -> None:
    env = {"NNODES": "2", "NPROC_PER_NODE": "8"}
    script = ("set -e\nexport X=1\nhyperpodrun --nnodes=$NNODES --nproc-per-node=${NPROC_PER_NODE} "
              "--server-host=0.0.0.0 --server-port=8080 --tee=3 --log_dir=/tmp/hyperpod "
              "--post-train-script=/s3/post.sh /s3/train.py --max_steps 40 --lr 1e-4")
    found = identify(["bash", "-c", script], env)
    assert found is not None and found.recipe == "pytorch" and found.launcher == "hyperpodrun"
    assert found.launch is not None
    assert found.launch.options["nnodes"] == "2" and found.launch.options["nproc-per-node"] == "8"
    assert found.launch.options["log-dir"] == "/tmp/hyperpod"
    assert found.launch.script[0] == "/s3/train.py"
    assert found.settings == {"max_steps": "40", "lr": "1e-4"}


def test_unknown_launcher_flag_is_argparse_error_exit_2() -> None:
    with pytest.raises(CliError) as err:
        identify(["torchrun", "--nnodes", "1", "--bogus-flag", "x", "train.py"], {})
    assert err.value.exit_code == 2
    assert err.value.lines[-1] == "torchrun: error: unrecognized arguments: --bogus-flag"
    # torchrun has no HyperPod agent options
    assert check(["torchrun", "--server-port=8080", "train.py"])[-1] == \
        "torchrun: error: unrecognized arguments: --server-port=8080"
    assert check(["torchrun", "--nnodes"])[-1] == "torchrun: error: argument --nnodes: expected one argument"
    assert check(["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"]) == []
    assert check(["torchrun", "--nproc", "2", "t.py"]) == []  # argparse abbreviations


def test_llamafactory_swift_and_verl_keys() -> None:
    found = identify(["llamafactory-cli", "train", "/s3/cfg/sft.yaml", "max_steps=30", "learning_rate=1e-5"], {})
    assert found is not None and found.recipe == "llama-factory" and found.config_file == "/s3/cfg/sft.yaml"
    assert found.settings["max_steps"] == "30"
    assert check(["llamafactory-cli", "train", "no_such_key=1"])[-1] == \
        "ValueError: Some specified arguments are not used by the HfArgumentParser: ['no_such_key']"
    # with a YAML: its keys and the overrides merged, then checked as parse_dict checks a dict
    assert llamafactory_config("a.yaml", "stage: sft\nbf16: true\n", {"max_steps": "3"}) == {
        "stage": "sft", "bf16": "true", "max_steps": "3"}
    with pytest.raises(CliError) as unused:
        llamafactory_config("a.yaml", "stage: sft\nlearning_rat: 1\n", {"no_such_key": "1"})
    assert unused.value.lines[-1] == \
        "ValueError: Some keys are not used by the HfArgumentParser: ['learning_rat', 'no_such_key']"
    with pytest.raises(CliError) as missing:
        llamafactory_config("/config/train.yaml", None, {})
    assert missing.value.lines[-1] == "FileNotFoundError: [Errno 2] No such file or directory: '/config/train.yaml'"
    swift = identify(["swift", "sft", "--model", "Qwen/Qwen3-0.6B", "--dataset", "a.jsonl", "b.jsonl",
                      "--max_steps", "12"], {})
    assert swift is not None and swift.settings["dataset"] == "a.jsonl b.jsonl" and swift.settings["max_steps"] == "12"
    assert check(["swift", "sft", "--modle", "x"]) == ["ValueError: remaining_argv: ['--modle', 'x']"]
    verl = identify(["ray", "job", "submit", "--address", "http://h:8265", "--", "python3", "-m",
                     "verl.trainer.main_ppo", "trainer.total_training_steps=5", "+extra.key=1"], {})
    assert verl is not None and verl.recipe == "verl" and verl.settings["trainer.total_training_steps"] == "5"
    assert check(["python3", "-m", "verl.trainer.main_ppo", "trainr.nnodes=2"])[:3] == [
        "Could not override 'trainr.nnodes'.", "To append to your config use +trainr.nnodes=2",
        "Key 'trainr' is not in struct"]


def test_commands_split_shell_scripts() -> None:
    assert commands(["sh", "-c", "cd /s3 && A=1 exec swift sft --model m; echo done"], {}) == [
        ["cd", "/s3"], ["swift", "sft", "--model", "m"], ["echo", "done"]]
    assert identify(["sleep", "infinity"], {}) is None


def test_every_recorded_cli_names_its_source() -> None:
    assert set(SOURCES) == {"torchrun", "hyperpodrun", "llamafactory-cli", "swift", "verl.trainer.main_ppo"}
    assert all(len(source) > 20 for source in SOURCES.values())
