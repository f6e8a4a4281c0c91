"""The TensorFlow runtime in one process (not launched), its TF_CONFIG writing and its start watchdog.

The cases that import tensorflow live in tests/tf_cases_single.py and run in a pytest of their own:
one framework per process (this session imports torch elsewhere). The rest is standard library only.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpmigrate.runtime import _tf_env
from dpmigrate.runtime.role import LaunchEnvironmentError, Role

CASES = Path(__file__).parent / "tf_cases_single.py"
LAUNCHER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "SLURM_", "OMPI_", "PADDLE_",
                     "TF_CONFIG", "GROUP_RANK", "DPMIGRATE_", "TF_USE_LEGACY_KERAS")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return {**env, **extra}


def test_the_tensorflow_cases_pass_in_a_tensorflow_only_process():
    proc = subprocess.run([sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(CASES.parent)], capture_output=True, text=True, timeout=600,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) == 13, proc.stdout[-2000:]  # every case of the file ran
    assert "failed" not in proc.stdout.splitlines()[-1] and "skipped" not in proc.stdout.splitlines()[-1]


ENV_PROBE = """import os, json; before = dict(os.environ)
import dpmigrate.runtime.tensorflow
mid = dict(os.environ)
import tensorflow
from tensorflow import keras
print(json.dumps({'by_import': sorted(k for k in set(mid) | set(before) if mid.get(k) != before.get(k)),
                  'after_tf': sorted(k for k in set(os.environ) | set(mid) if os.environ.get(k) != mid.get(k)),
                  'keras': keras.__name__}))"""


def test_importing_the_runtime_changes_no_environment_of_ours_and_keeps_the_users_keras():
    """Imported first, before TensorFlow: it sets no TF_USE_LEGACY_KERAS (nor anything of ours), so the script
    keeps the Keras it always had (Keras 3 here); what changes is TensorFlow's own doing (its import is inside)."""
    out = subprocess.run([sys.executable, "-c", ENV_PROBE], capture_output=True, text=True, timeout=300,
                         env=clean_env(), check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    ours = [k for k in result["by_import"] if k.startswith(("TF_USE_LEGACY_KERAS", "TF_CONFIG", "DPMIGRATE_", "KERAS"))]
    assert ours == [] and result["after_tf"] == []
    # what a plain `import tensorflow` sets itself (measured with tensorflow-cpu 2.21, h5py via Keras)
    assert set(result["by_import"]) <= {"ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH", "TF2_BEHAVIOR",
                                        "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION"}, result["by_import"]
    assert result["keras"].startswith("keras")  # Keras 3, as the original script gets without the variable


def test_importing_the_runtimes_helpers_and_the_launcher_loads_no_framework():
    code = ("import sys, dpmigrate.runtime._tf_env, dpmigrate.runtime._tf_watchdog, dpmigrate.launch.tensorflow, "
            "dpmigrate.launch.tensorflow_worker, dpmigrate.launch.cli\n"
            "print([m for m in ('torch', 'tensorflow', 'paddle', 'keras', 'tf_keras') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- TF_CONFIG from other launchers (pure) ---------------------------------------------------------------


def test_a_launch_that_set_tf_config_or_one_process_needs_nothing_written():
    assert _tf_env.cluster_for(Role()) is None
    assert _tf_env.cluster_for(Role(rank=1, world_size=2, launcher="tf_config")) is None


def test_torchrun_on_one_node_puts_every_worker_after_torchruns_own_port():
    role = Role(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1", master_port=29500,
                launcher="torchrun")
    assert _tf_env.cluster_for(role, {}) == {"cluster": {"worker": ["127.0.0.1:29501", "127.0.0.1:29502"]},
                                             "task": {"type": "worker", "index": 1}}


def test_paddles_endpoints_are_the_workers():
    role = Role(rank=0, world_size=2, master_addr="10.0.0.1", master_port=6170, launcher="paddle")
    env = {"PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.2:6170"}
    assert _tf_env.cluster_for(role, env)["cluster"]["worker"] == ["10.0.0.1:6170", "10.0.0.2:6170"]


def test_slurm_workers_follow_the_node_list_and_tasks_per_node():
    role = Role(rank=3, world_size=4, local_rank=1, local_world_size=2, node_rank=1, num_nodes=2,
                master_addr="node01", master_port=15123, launcher="slurm")
    env = {"SLURM_STEP_NODELIST": "node[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    assert _tf_env.cluster_for(role, env) == {
        "cluster": {"worker": ["node01:15124", "node01:15125", "node02:15124", "node02:15125"]},
        "task": {"type": "worker", "index": 3}}


def test_torchrun_on_several_nodes_is_refused_naming_the_ways_that_work():
    role = Role(rank=2, world_size=4, local_rank=0, local_world_size=2, node_rank=1, num_nodes=2,
                master_addr="node0", master_port=29500, launcher="torchrun")
    with pytest.raises(LaunchEnvironmentError, match="dpmigrate launch.*srun.*export TF_CONFIG"):
        _tf_env.cluster_for(role, {})


def test_start_timeout_comes_from_the_launcher_or_the_collective_timeout():
    assert _tf_env.start_timeout(600.0, {}) == 600.0
    assert _tf_env.start_timeout(600.0, {"DPMIGRATE_START_TIMEOUT": "20"}) == 20.0
    with pytest.raises(ValueError, match="DPMIGRATE_START_TIMEOUT='soon'"):
        _tf_env.start_timeout(600.0, {"DPMIGRATE_START_TIMEOUT": "soon"})


# --- the start watchdog (a real process, standard library only) ---------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_watchdog_kills_a_worker_whose_peer_never_came_and_names_that_peer():
    waiting = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"])
    with socket.socket() as listener:  # worker 0 "is up": its port answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        workers = [f"127.0.0.1:{listener.getsockname()[1]}", f"127.0.0.1:{_closed_port()}"]
        started = time.monotonic()
        watchdog = subprocess.Popen(  # its stdin stays open: the worker neither finished nor exited
            [sys.executable, "-m", "dpmigrate.runtime._tf_watchdog", str(waiting.pid), "1", "0", json.dumps(workers)],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiting.wait(timeout=20) == -signal.SIGKILL
        elapsed = time.monotonic() - started
        stderr = watchdog.stderr.read()
        watchdog.stdin.close()
    assert watchdog.wait(timeout=10) == 1
    assert elapsed < 6
    assert f"worker 1 ({workers[1]}) never came up: nothing listens there" in stderr
    assert "worker 0 (" not in stderr.split("gave up:")[1]


def test_the_watchdog_leaves_when_told_every_worker_met():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = subprocess.run([sys.executable, "-m", "dpmigrate.runtime._tf_watchdog", str(sleeper.pid), "30", "0",
                               "[]"], input="ok\n", capture_output=True, text=True, timeout=20)
        assert proc.returncode == 0 and proc.stderr == ""
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
