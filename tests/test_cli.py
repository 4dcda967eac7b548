"""The command line: bad input ends with one clear line on stderr, exit 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, subprocess_env

PODSRL = [sys.executable, "-m", "podsrl"]


def run(*args, cwd=None, timeout=1800):
    """The CLI in a subprocess. ``timeout`` only guards against a hang: a run on a machine busy
    with other work can take many times its quiet time, and that must not fail a test."""
    return subprocess.run([*PODSRL, *args], capture_output=True, text=True, cwd=cwd, env=subprocess_env(), timeout=timeout)


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "bogus_key=1"], "unknown config key 'bogus_key'"),
        (["train", "model.bogus=1"], "unknown config key 'model.bogus'"),
        (["train", "n=4", "m=8"], "m must be in 1..n"),
        (["train", "missing.yaml"], "config file not found: missing.yaml"),
        (["train", "task.name=gsm8k", "task.path=/nonexistent/gsm8k"], "data file not found"),
        (["train", "model.name_or_path=/nonexistent/model"], "cannot load"),
        (["train", "rule=best"], "unknown rule 'best'"),
        (["train", "rewards=[no_such_module:fn]"], "cannot import reward function"),
    ],
)
@pytest.mark.slow
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, args, message):
    result = run(*args, f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("podsrl: error:") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_nan_reward_mid_run_leaves_no_output(tmp_path, tiny_model_dir):
    result = run("train", f"model.name_or_path={tiny_model_dir}", "rewards=[rewards_for_tests:nan_reward]",
                 "steps=2", "prompts_per_step=2", "n=2", "m=2", "task.test_size=2",
                 "rollout.max_new_tokens=4", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [l for l in result.stderr.splitlines() if "error" in l]
    assert errors == ["podsrl: error: reward 'rewards_for_tests:nan_reward' returned NaN or inf"]
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_existing_output_dir_is_not_overwritten(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    result = run("train", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert result.returncode == 2 and "not empty" in result.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "x"


def test_config_prints_merged_yaml(tmp_path):
    result = run("config", str(REPO / "configs" / "smoke.yaml"), "n=6", cwd=tmp_path)
    assert result.returncode == 0
    assert "'n': 6" in result.stdout and "mode: pods" in result.stdout


@pytest.mark.slow
def test_smoke_config_on_the_embedded_model(tmp_path):
    """configs/smoke.yaml end to end through the CLI on SmolLM2-135M-Instruct."""
    result = run("train", str(REPO / "configs" / "smoke.yaml"), f"output_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    # no library noise on a CPU: deepspeed's "no GPU found" warning (on stdout), transformers' renamed cache argument
    noise = result.stdout + result.stderr
    assert "unable to detect" not in noise and "past_key_values" not in noise, noise[-2000:]
    import json

    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and 0.0 <= rows[0]["eval_accuracy"] <= 1.0
    assert rows[-1]["step"] == 2 and "eval_accuracy" in rows[-1]
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model" / "model.safetensors").exists()
    evaluated = run("eval", str(REPO / "configs" / "smoke.yaml"), "log_completions=3",
                    f"model.name_or_path={tmp_path / 'run' / 'checkpoints' / 'step-000002' / 'model'}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    report = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert 0.0 <= report["accuracy"] <= 1.0 and len(report["completions"]) == 3
    assert all(isinstance(s["completion"], str) and isinstance(s["correct"], bool) for s in report["completions"])


@pytest.mark.slow
def test_version_help_without_arguments_and_where_the_keys_are():
    from podsrl import __version__

    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"podsrl {__version__}"
    alone = run()
    assert alone.returncode == 0 and alone.stdout.startswith("usage: podsrl") and "train" in alone.stdout
    train_help = run("train", "--help")
    assert train_help.returncode == 0 and "podsrl config" in train_help.stdout


@pytest.mark.parametrize("key,suggestion", [("lrr=3", "'lr'"), ("lora_r=4", "'model.lora_r'"),
                                            ("rollout.temprature=1", "'rollout.temperature'")])
def test_a_mistyped_key_names_the_closest_one(key, suggestion):
    from podsrl.config import load_config
    from podsrl.errors import PodsError

    with pytest.raises(PodsError, match=f"did you mean {suggestion}"):
        load_config(None, [key])


def test_threads_sets_the_training_processs_threads(tiny_config):
    import torch

    from podsrl.trainer import train

    before = torch.get_num_threads()
    try:
        train(tiny_config("threads=1", "steps=1"))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# The default run's final held-out accuracy moves with a seed and a CPU's rounding (one seed,
# curves that decline after their peak): 0.61-0.965 over seeds 0-4 on the development machine with
# the grader that pays a cut completion only for a complete marked answer (0.905-0.990 and 0.735
# under earlier graders). The README states the range; this bound, from about 0.35 at step 0, says
# the run learns.
DEFAULT_RUN_FLOOR = 0.50


@pytest.mark.slow
def test_the_default_run_learns(tmp_path):
    """``podsrl train`` with no settings (what ``make train`` runs), offline, end to end."""
    import json

    # quiet, about 2 minutes; beside other jobs on 2 cores it has taken 18 (make train, 1,103 s)
    result = run("train", f"output_dir={tmp_path / 'run'}", "progress=false", cwd=tmp_path, timeout=3600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["step"]: r["eval_accuracy"] for r in rows if "eval_accuracy" in r}
    assert set(accuracy) == {0, 16} and accuracy[0] < 0.5 and accuracy[16] >= DEFAULT_RUN_FLOOR


def test_bitsandbytes_import_note_about_a_hub_kernel_is_filtered():
    """bitsandbytes, on a CPU with AVX-512 BF16, logs at import that it could not fetch a kernel
    from the hub, and offline the ``kernels`` package (where installed) that it skips the kernel's
    publisher trust check; both notes are dropped, and only they."""
    pytest.importorskip("bitsandbytes")
    code = ("import logging; from podsrl.quiet import quiet_known_warnings; quiet_known_warnings(); import bitsandbytes; "
            "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('another warning')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and "kernels-community" not in result.stderr and "another warning" in result.stderr


@pytest.mark.slow
def test_the_podsrl_script_imports_a_reward_module_beside_the_user(tmp_path):
    """`podsrl train rewards=[my_rewards:short]` next to my_rewards.py, as docs/rewards.md shows
    it, with nothing on PYTHONPATH: the console script imports it as `python -m podsrl` does."""
    script = Path(sys.executable).parent / "podsrl"
    if not script.is_file():
        pytest.skip("podsrl's console script is not installed beside this Python")
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}
    args = [str(script), "config", "rewards=[accuracy,my_rewards:short]", "reward_weights=[1.0,0.1]"]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stderr.strip() == (
        "podsrl: error: cannot import reward function 'my_rewards:short': No module named 'my_rewards'")
    (tmp_path / "my_rewards.py").write_text("def short(completions, **columns):\n"
                                            "    return [1.0 if len(c) < 200 else 0.0 for c in completions]\n")
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "my_rewards:short" in run.stdout
