"""The Paddle runtime in one process (not launched), and its environment handling (standard library only).

The cases that import paddle live in tests/paddle_cases_single.py and run in a pytest of their own:
one framework per process (this session imports torch elsewhere).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpmigrate.runtime import _paddle_env
from dpmigrate.runtime.role import LaunchEnvironmentError, Role

CASES = Path(__file__).parent / "paddle_cases_single.py"


def test_the_paddle_cases_pass_in_a_paddle_only_process():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RANK", "WORLD_SIZE"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(CASES.parent)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) == 24, proc.stdout[-2000:]  # every case of the file ran
    assert "failed" not in proc.stdout.splitlines()[-1] and "skipped" not in proc.stdout.splitlines()[-1]


def test_a_cpu_build_is_given_gloo_and_an_existing_value_wins():
    env: dict[str, str] = {}
    assert _paddle_env.complete_environment(Role(), gpu=False, environ=env) == ["PADDLE_DISTRI_BACKEND"]
    assert env == {"PADDLE_DISTRI_BACKEND": "gloo"}
    env = {"PADDLE_DISTRI_BACKEND": "xccl"}
    assert _paddle_env.complete_environment(Role(), gpu=False, environ=env) == []
    assert env == {"PADDLE_DISTRI_BACKEND": "xccl"}


def test_a_torchrun_started_rank_gets_paddles_variables_with_the_store_after_torchruns_port():
    role = Role(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="10.0.0.5", master_port=29500,
                launcher="torchrun")
    env: dict[str, str] = {}
    _paddle_env.complete_environment(role, gpu=False, environ=env)
    assert env["PADDLE_TRAINER_ID"] == "1" and env["PADDLE_TRAINERS_NUM"] == "2"
    assert env["PADDLE_TRAINER_ENDPOINTS"] == "10.0.0.5:29501,10.0.0.5:29502"
    assert env["PADDLE_CURRENT_ENDPOINT"] == "10.0.0.5:29502"
    assert env["PADDLE_MASTER"] == "10.0.0.5:29501"  # torchrun's agent store holds 29500
    assert env["PADDLE_DISTRI_BACKEND"] == "gloo" and "FLAGS_selected_gpus" not in env


def test_a_slurm_rank_on_gpus_uses_the_master_port_and_pins_its_local_gpu():
    role = Role(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, num_nodes=2,
                master_addr="node0", master_port=15123, launcher="slurm")
    env: dict[str, str] = {}
    _paddle_env.complete_environment(role, gpu=True, environ=env)
    assert env["PADDLE_MASTER"] == "node0:15123" and env["FLAGS_selected_gpus"] == "1"
    assert "PADDLE_DISTRI_BACKEND" not in env and env["PADDLE_NNODES"] == "2"


def test_a_launch_without_master_is_refused_naming_the_variables():
    role = Role(rank=0, world_size=2, launcher="openmpi")
    with pytest.raises(LaunchEnvironmentError, match="export MASTER_ADDR=.* MASTER_PORT="):
        _paddle_env.complete_environment(role, gpu=False, environ={})


@pytest.mark.parametrize("value, cuda, explained", [("", True, True), ("  ", True, True), ("", False, False),
                                                     ("0,1", True, False), (None, True, False)])
def test_an_empty_cuda_visible_devices_is_explained_where_it_breaks_the_job(value, cuda, explained):
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    message = _paddle_env.explain_empty_cuda_visible_devices(cuda, env)
    assert (message is not None) == explained
    if explained:
        assert "IndexError" in message and "unset CUDA_VISIBLE_DEVICES" in message and "dpmigrate launch" in message
