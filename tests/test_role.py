"""read_role: each launcher's real variables in, one validated Role out; malformed values named.

The environments below are written the way each launcher builds them for its workers (torchrun's
LocalElasticAgent, Paddle's CollectiveController, srun's step environment, Open MPI's odls), for two
processes on one node and for two nodes of two. The slow tests take the environment from a real
torchrun instead.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from dpmigrate.runtime import LaunchEnvironmentError, Role, read_role
from dpmigrate.runtime.hostlist import expand_hostlist, expand_tasks_per_node
from dpmigrate.runtime.launchers import LAUNCHERS

LAYOUTS = [(1, 2), (2, 2)]  # (nodes, processes per node)
PROCESSES = [(nodes, per_node, node, local) for nodes, per_node in LAYOUTS
             for node in range(nodes) for local in range(per_node)]
HOSTS = ["10.1.0.11", "10.1.0.12"]
SLURM_HOSTS = ["gpu-a07", "gpu-a08"]


def torchrun_env(nodes, per_node, node, local):
    rank, world = node * per_node + local, nodes * per_node
    return {
        "LOCAL_RANK": str(local), "RANK": str(rank), "GROUP_RANK": str(node), "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": str(per_node), "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(nodes), "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": HOSTS[0],
        "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
    }


def paddle_env(nodes, per_node, node, local, hosts=HOSTS):
    endpoints = [f"{host}:{6170 + 100 * n + i}" for n, host in enumerate(hosts[:nodes]) for i in range(per_node)]
    rank = node * per_node + local
    return {
        "PADDLE_MASTER": f"{hosts[0]}:49731", "PADDLE_GLOBAL_SIZE": str(len(endpoints)),
        "PADDLE_LOCAL_SIZE": str(per_node), "PADDLE_GLOBAL_RANK": str(rank), "PADDLE_LOCAL_RANK": str(local),
        "PADDLE_NNODES": str(nodes), "PADDLE_CURRENT_ENDPOINT": endpoints[rank], "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(len(endpoints)), "PADDLE_RANK_IN_NODE": str(local),
        "PADDLE_AUTO_CLUSTER": "False", "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "FLAGS_selected_gpus": str(local),
    }


def tf_config_env(nodes, per_node, node, local):
    """Two workers on one host; or a chief and three workers on two hosts (the chief is rank 0)."""
    addresses = [f"{host}:{2222 + i}" for host in HOSTS[:nodes] for i in range(per_node)]
    rank = node * per_node + local
    if nodes == 1:
        cluster, task = {"worker": addresses}, {"type": "worker", "index": rank}
    else:
        cluster = {"chief": addresses[:1], "worker": addresses[1:]}
        task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank - 1}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def slurm_env(nodes, per_node, node, local):
    nodelist = "gpu-a[07-08]" if nodes == 2 else "gpu-a07"
    tasks = f"{per_node}(x{nodes})" if nodes > 1 else str(per_node)
    world, rank = nodes * per_node, node * per_node + local
    step = {"SLURM_NODELIST": nodelist, "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(world),
            "SLURM_NPROCS": str(world), "SLURM_TASKS_PER_NODE": tasks}
    return {
        "SLURM_JOB_ID": "734242", "SLURM_JOBID": "734242", "SLURM_JOB_NAME": "train",
        "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_SUBMIT_DIR": "/home/ada",
        **step, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node), "SLURMD_NODENAME": SLURM_HOSTS[node], "SLURM_CPUS_ON_NODE": "16",
        "SLURM_GTIDS": ",".join(str(node * per_node + i) for i in range(per_node)), "SLURM_TASK_PID": "40712",
    }


def openmpi_env(nodes, per_node, node, local):
    world, rank = nodes * per_node, node * per_node + local
    return {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_node),
        "OMPI_COMM_WORLD_NODE_RANK": str(local), "OMPI_UNIVERSE_SIZE": str(world),
        "OMPI_MCA_ess_base_jobid": "2916810753", "OMPI_MCA_ess_base_vpid": str(rank),
        "OMPI_MCA_orte_ess_num_procs": str(world), "PMIX_RANK": str(rank),
        "MASTER_ADDR": HOSTS[0], "MASTER_PORT": "29500",  # exported, forwarded with mpirun -x
    }


BUILDERS = {"torchrun": torchrun_env, "paddle": paddle_env, "tf_config": tf_config_env,
            "slurm": slurm_env, "openmpi": openmpi_env}
MASTERS = {"torchrun": f"{HOSTS[0]}:29500", "paddle": f"{HOSTS[0]}:6170", "tf_config": f"{HOSTS[0]}:2222",
           "slurm": "gpu-a07:19242", "openmpi": f"{HOSTS[0]}:29500"}


@pytest.mark.parametrize("launcher", list(BUILDERS))
@pytest.mark.parametrize("nodes, per_node, node, local", PROCESSES,
                         ids=[f"{n}x{p}-node{i}-local{j}" for n, p, i, j in PROCESSES])
def test_each_launcher_real_environment_gives_the_process_its_place(launcher, nodes, per_node, node, local):
    role = read_role(BUILDERS[launcher](nodes, per_node, node, local))
    assert (role.rank, role.world_size) == (node * per_node + local, nodes * per_node)
    assert (role.local_rank, role.local_world_size) == (local, per_node)
    assert (role.node_rank, role.num_nodes) == (node, nodes)
    assert (role.launcher, role.master_endpoint) == (launcher, MASTERS[launcher])


@pytest.mark.parametrize("launcher", list(BUILDERS))
def test_every_process_of_a_job_gets_a_distinct_rank_and_the_same_master(launcher):
    roles = [read_role(BUILDERS[launcher](2, 2, node, local)) for node in range(2) for local in range(2)]
    assert sorted(role.rank for role in roles) == [0, 1, 2, 3]
    assert len({(role.node_rank, role.local_rank) for role in roles}) == 4
    assert len({role.master_endpoint for role in roles}) == 1
    assert [role.is_main_process for role in roles].count(True) == 1


def test_dpmigrate_launch_on_one_node_needs_no_master_the_ranks_meet_in_a_file():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "1", "DPMIGRATE_RENDEZVOUS": "/logs/rendezvous-0123abcd"}
    assert read_role(env) == Role(rank=1, world_size=2, local_rank=1, local_world_size=2, node_rank=0,
                                  num_nodes=1, master_addr=None, master_port=None, launcher="torchrun")
    with pytest.raises(LaunchEnvironmentError, match="MASTER_ADDR is not set but the job has 2 processes"):
        read_role({k: v for k, v in env.items() if k != "DPMIGRATE_RENDEZVOUS"})


def test_plain_env_init_without_local_rank_is_one_process_per_machine():
    role = read_role({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.0.11", "MASTER_PORT": "29500"})
    assert role == Role(rank=1, world_size=2, local_rank=0, local_world_size=1, node_rank=1, num_nodes=2,
                        master_addr="10.1.0.11", master_port=29500, launcher="torchrun")


def test_paddle_legacy_launcher_without_local_variables_derives_them_from_endpoints():
    for node, local in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        env = paddle_env(2, 2, node, local)
        legacy = {k: v for k, v in env.items() if k.startswith(("PADDLE_TRAINER", "PADDLE_CURRENT", "FLAGS_"))}
        assert read_role(legacy) == read_role(env)


def test_paddle_two_nodes_on_one_machine_follow_the_launchers_layout():
    role = read_role(paddle_env(2, 2, 1, 0, hosts=["127.0.0.1", "127.0.0.1"]))
    assert (role.rank, role.local_rank, role.node_rank, role.num_nodes) == (2, 0, 1, 2)


def test_paddle_selected_gpu_id_is_not_taken_for_the_local_rank():
    env = {**paddle_env(1, 2, 0, 1), "FLAGS_selected_gpus": "3"}  # --gpus 2,3: local rank 1 runs on GPU 3
    assert read_role(env).local_rank == 1


def test_slurm_master_port_comes_from_the_job_id_unless_exported():
    env = slurm_env(1, 2, 0, 0)
    assert read_role({**env, "SLURM_JOB_ID": "123456"}).master_port == 15000 + 3456
    assert read_role({**env, "MASTER_ADDR": "login1", "MASTER_PORT": "29400"}).master_endpoint == "login1:29400"


def test_slurm_uneven_tasks_per_node_give_each_node_its_count():
    env = {**slurm_env(2, 2, 1, 0), "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "3,2",
           "SLURM_PROCID": "3"}
    role = read_role(env)
    assert (role.rank, role.world_size, role.local_world_size, role.node_rank) == (3, 5, 2, 1)


def test_tf_config_single_worker_cluster_is_rank_0_of_1():
    role = read_role({"TF_CONFIG": '{"cluster": {"worker": ["localhost:2222"]}, "task": {"type": "worker", '
                                   '"index": 0}}'})
    assert (role.rank, role.world_size, role.is_distributed, role.launcher) == (0, 1, False, "tf_config")


SLURM_ALLOCATION = {"SLURM_JOB_ID": "734242", "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_NNODES": "2",
                    "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NAME": "interactive"}


@pytest.mark.parametrize("env", [
    pytest.param({}, id="empty"),
    pytest.param({"PATH": "/usr/bin", "HOME": "/home/ada", "CUDA_VISIBLE_DEVICES": "0"}, id="plain-shell"),
    pytest.param({"SLURM_JOB_ID": "734242"}, id="slurm-job-id-only"),
    pytest.param(SLURM_ALLOCATION, id="salloc-shell"),
    pytest.param({**SLURM_ALLOCATION, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
                 id="sbatch-script-runs-once"),
    pytest.param({**slurm_env(1, 2, 0, 0), "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}, id="srun-n1"),
    pytest.param({"TF_CONFIG": " "}, id="blank-tf-config"),
    pytest.param({"MASTER_ADDR": "10.1.0.11", "MASTER_PORT": "29500"}, id="master-without-rank"),
])
def test_no_launcher_means_rank_0_of_1_and_nothing_to_start(env):
    role = read_role(env)
    assert role == Role()
    assert (role.launcher, role.is_distributed, role.master_endpoint) == ("none", False, None)


def test_default_environment_is_os_environ(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "TORCHELASTIC", "PADDLE_", "TF_CONFIG",
                            "OMPI_", "SLURM_", "MASTER_")):
            monkeypatch.delenv(name)
    assert read_role() == Role()
    for name, value in torchrun_env(1, 2, 0, 1).items():
        monkeypatch.setenv(name, value)
    assert (read_role().rank, read_role().launcher) == (1, "torchrun")


ORDER = ["torchrun", "paddle", "tf_config", "openmpi", "slurm"]  # the documented precedence


def test_launchers_are_tried_in_the_documented_order():
    assert [launcher.name for launcher in LAUNCHERS] == ORDER


@pytest.mark.parametrize("first, second", [(a, b) for i, a in enumerate(ORDER) for b in ORDER[i + 1:]])
def test_the_launcher_earlier_in_the_order_wins(first, second):
    inner = BUILDERS[first](2, 2, 1, 1)  # rank 3
    outer = BUILDERS[second](2, 2, 0, 0)  # rank 0
    assert read_role({**outer, **inner}).launcher == first
    assert read_role({**outer, **inner}).rank == 3


def test_srun_torchrun_reads_the_worker_not_the_slurm_task():
    slurm_task = slurm_env(2, 1, 1, 0)  # one torchrun agent per node: Slurm task 1 of 2
    role = read_role({**slurm_task, **torchrun_env(2, 4, 1, 3)})
    assert (role.launcher, role.rank, role.world_size, role.local_rank) == ("torchrun", 7, 8, 3)


def test_mpirun_inside_a_slurm_allocation_reads_open_mpi_not_the_daemons_step():
    orted_step = slurm_env(2, 1, 1, 0)  # Open MPI starts one orted per node with srun; its ranks inherit that
    role = read_role({**orted_step, **openmpi_env(2, 2, 1, 1)})
    assert (role.launcher, role.rank, role.world_size) == ("openmpi", 3, 4)


def test_reading_changes_nothing():
    env = slurm_env(2, 2, 1, 1)
    before = dict(env)
    read_role(env)
    assert env == before


TR, PD, SL, MPI = torchrun_env(1, 2, 0, 1), paddle_env(1, 2, 0, 1), slurm_env(2, 2, 1, 1), openmpi_env(1, 2, 0, 1)
TF_OK = {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": 1}}


def tf(**changes):
    config = {**TF_OK, **changes}
    return {"TF_CONFIG": json.dumps(config)}


def without(env, *names):
    return {k: v for k, v in env.items() if k not in names}


MALFORMED = [
    # (id, environment, variable named, further text the message must show)
    ("torchrun-rank-not-int", {**TR, "RANK": "one"}, "RANK", ["'one'", "torchrun"]),
    ("torchrun-rank-negative", {**TR, "RANK": "-1"}, "RANK", ["-1"]),
    ("torchrun-world-zero", {**TR, "WORLD_SIZE": "0"}, "WORLD_SIZE", ["WORLD_SIZE=0"]),
    ("torchrun-rank-too-big", {**TR, "RANK": "2"}, "RANK",
     ["WORLD_SIZE=2 but RANK=2: ranks run from 0 to WORLD_SIZE-1", "set by torchrun"]),
    ("torchrun-local-rank-too-big", {**TR, "LOCAL_RANK": "2"}, "LOCAL_RANK", ["LOCAL_WORLD_SIZE=2 but LOCAL_RANK=2"]),
    ("torchrun-local-rank-without-size", without(TR, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE", ["LOCAL_RANK='1'"]),
    ("torchrun-local-size-above-world", {**TR, "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE",
     ["LOCAL_WORLD_SIZE=4 but WORLD_SIZE=2"]),
    ("torchrun-uneven-nodes", {**without(TR, "GROUP_WORLD_SIZE"), "WORLD_SIZE": "3"}, "GROUP_WORLD_SIZE",
     ["WORLD_SIZE=3", "LOCAL_WORLD_SIZE=2"]),
    ("torchrun-group-rank-too-big", {**TR, "GROUP_RANK": "1"}, "GROUP_RANK", ["GROUP_WORLD_SIZE=1 but GROUP_RANK=1"]),
    ("torchrun-no-master-addr", without(TR, "MASTER_ADDR"), "MASTER_ADDR", ["export MASTER_ADDR="]),
    ("torchrun-no-master-port", without(TR, "MASTER_PORT"), "MASTER_PORT", ["MASTER_PORT"]),
    ("torchrun-port-too-big", {**TR, "MASTER_PORT": "70000"}, "MASTER_PORT", ["'70000'", "1 to 65535"]),
    ("torchrun-port-zero", {**TR, "MASTER_PORT": "0"}, "MASTER_PORT", ["'0'"]),
    ("torchrun-port-not-int", {**TR, "MASTER_PORT": "http"}, "MASTER_PORT", ["'http'"]),
    ("torchrun-rank-blank", {**TR, "RANK": ""}, "RANK", ["RANK=''"]),
    ("paddle-id-too-big", {**PD, "PADDLE_TRAINER_ID": "2"}, "PADDLE_TRAINER_ID",
     ["PADDLE_TRAINERS_NUM=2 but PADDLE_TRAINER_ID=2", "paddle.distributed.launch"]),
    ("paddle-num-not-int", {**PD, "PADDLE_TRAINERS_NUM": "two"}, "PADDLE_TRAINERS_NUM", ["'two'"]),
    ("paddle-endpoint-without-port", {**PD, "PADDLE_TRAINER_ENDPOINTS": "10.1.0.11,10.1.0.11:6171"},
     "PADDLE_TRAINER_ENDPOINTS", ["'10.1.0.11'", "has no port"]),
    ("paddle-endpoint-bad-port", {**PD, "PADDLE_TRAINER_ENDPOINTS": "10.1.0.11:6170,10.1.0.11:99999",
                                  "PADDLE_CURRENT_ENDPOINT": "10.1.0.11:99999"},
     "PADDLE_TRAINER_ENDPOINTS", ["'99999'"]),
    ("paddle-endpoint-count", {**PD, "PADDLE_TRAINER_ENDPOINTS": "10.1.0.11:6171"}, "PADDLE_TRAINER_ENDPOINTS",
     ["lists 1 endpoints", "PADDLE_TRAINERS_NUM=2"]),
    ("paddle-no-endpoints", without(PD, "PADDLE_TRAINER_ENDPOINTS"), "PADDLE_TRAINER_ENDPOINTS",
     ["PADDLE_TRAINERS_NUM=2"]),
    ("paddle-duplicate-endpoint", {**PD, "PADDLE_TRAINER_ENDPOINTS": "10.1.0.11:6171,10.1.0.11:6171"},
     "PADDLE_TRAINER_ENDPOINTS", ["'10.1.0.11:6171' twice"]),
    ("paddle-current-not-listed", {**PD, "PADDLE_CURRENT_ENDPOINT": "10.9.9.9:6171"}, "PADDLE_CURRENT_ENDPOINT",
     ["'10.9.9.9:6171'", "is not in PADDLE_TRAINER_ENDPOINTS"]),
    ("paddle-current-other-rank", {**PD, "PADDLE_CURRENT_ENDPOINT": "10.1.0.11:6170"}, "PADDLE_CURRENT_ENDPOINT",
     ["entry 0", "PADDLE_TRAINER_ID=1"]),
    ("paddle-local-rank-too-big", {**PD, "PADDLE_LOCAL_RANK": "2"}, "PADDLE_LOCAL_RANK",
     ["PADDLE_LOCAL_SIZE=2 but PADDLE_LOCAL_RANK=2"]),
    ("paddle-nodes-times-local", {**PD, "PADDLE_NNODES": "2"}, "PADDLE_NNODES", ["PADDLE_NNODES=2"]),
    ("paddle-parameter-server", {**PD, "TRAINING_ROLE": "PSERVER"}, "TRAINING_ROLE", ["'PSERVER'"]),
    ("tf-not-json", {"TF_CONFIG": "{cluster: {worker: [h1:2222]}}"}, "TF_CONFIG", ["is not JSON"]),
    ("tf-not-an-object", {"TF_CONFIG": "[]"}, "TF_CONFIG", ["no 'cluster'"]),
    ("tf-no-task", {"TF_CONFIG": json.dumps({"cluster": TF_OK["cluster"]})}, "TF_CONFIG", ["no 'task'"]),
    ("tf-index-out-of-range", tf(task={"type": "worker", "index": 2}), "TF_CONFIG",
     ["task.index=2", "cluster.worker has 2"]),
    ("tf-index-missing", tf(task={"type": "worker"}), "TF_CONFIG", ["task.index=None"]),
    ("tf-ps-task", tf(task={"type": "ps", "index": 0}), "TF_CONFIG", ["'ps'", "parameter-server"]),
    ("tf-evaluator-task", tf(task={"type": "evaluator", "index": 0}), "TF_CONFIG", ["'evaluator'"]),
    ("tf-unknown-task", tf(task={"type": "master", "index": 0}), "TF_CONFIG", ["'master'"]),
    ("tf-ps-in-cluster", tf(cluster={**TF_OK["cluster"], "ps": ["h3:2222"]}), "TF_CONFIG",
     ["ParameterServerStrategy"]),
    ("tf-address-without-port", tf(cluster={"worker": ["h1:2222", "h2"]}), "TF_CONFIG", ["'h2'", "has no port"]),
    ("tf-two-chiefs", tf(cluster={"chief": ["h0:1", "h0:2"], "worker": ["h1:2222", "h2:2222"]}), "TF_CONFIG",
     ["at most one chief"]),
    ("tf-worker-not-a-list", tf(cluster={"worker": "h1:2222,h2:2222"}), "TF_CONFIG", ["cluster.worker="]),
    ("tf-chief-task-without-chief", tf(task={"type": "chief", "index": 0}), "TF_CONFIG", ["no 'chief'"]),
    ("slurm-procid-too-big", {**SL, "SLURM_PROCID": "4"}, "SLURM_PROCID",
     ["SLURM_STEP_NUM_TASKS=4 but SLURM_PROCID=4", "srun"]),
    ("slurm-localid-too-big", {**SL, "SLURM_LOCALID": "2"}, "SLURM_LOCALID", ["SLURM_LOCALID=2"]),
    ("slurm-nodeid-too-big", {**SL, "SLURM_NODEID": "2"}, "SLURM_NODEID", ["SLURM_STEP_NUM_NODES=2"]),
    ("slurm-tasks-not-int", {**SL, "SLURM_STEP_NUM_TASKS": "four"}, "SLURM_STEP_NUM_TASKS", ["'four'"]),
    ("slurm-bad-nodelist", {**SL, "SLURM_STEP_NODELIST": "gpu-a[07-"}, "SLURM_STEP_NODELIST", ["'gpu-a[07-'"]),
    ("slurm-tasks-per-node-mismatch", {**SL, "SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "SLURM_STEP_TASKS_PER_NODE",
     ["'2(x3)'", "4 tasks over 2 nodes"]),
    ("slurm-tasks-per-node-garbage", {**SL, "SLURM_STEP_TASKS_PER_NODE": "two"}, "SLURM_STEP_TASKS_PER_NODE",
     ["'two'"]),
    ("slurm-no-job-id-for-port", without(SL, "SLURM_JOB_ID", "SLURM_JOBID"), "SLURM_JOB_ID",
     ["export MASTER_PORT"]),
    ("slurm-bad-master-port", {**SL, "MASTER_PORT": "65536"}, "MASTER_PORT", ["'65536'"]),
    ("openmpi-no-master", without(MPI, "MASTER_ADDR"), "MASTER_ADDR", ["mpirun -x MASTER_ADDR -x MASTER_PORT"]),
    ("openmpi-no-master-port", without(MPI, "MASTER_PORT"), "MASTER_PORT", ["mpirun -x MASTER_ADDR"]),
    ("openmpi-rank-too-big", {**MPI, "OMPI_COMM_WORLD_RANK": "2"}, "OMPI_COMM_WORLD_RANK",
     ["OMPI_COMM_WORLD_SIZE=2 but OMPI_COMM_WORLD_RANK=2"]),
    ("openmpi-local-rank-too-big", {**MPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK",
     ["OMPI_COMM_WORLD_LOCAL_SIZE=2"]),
    ("openmpi-size-negative", {**MPI, "OMPI_COMM_WORLD_SIZE": "-2"}, "OMPI_COMM_WORLD_SIZE", ["-2"]),
]


@pytest.mark.parametrize("env, variable, shown", [case[1:] for case in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_environment_is_one_clear_error_naming_the_variable(env, variable, shown):
    with pytest.raises(LaunchEnvironmentError) as caught:
        read_role(env)
    message = str(caught.value)
    assert variable in message and caught.value.variable == variable
    assert caught.value.launcher in message
    for text in shown:
        assert text in message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text, hosts", [
    ("gpu5", ["gpu5"]),
    ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
    ("a[1,3],b[2-3]-ib", ["a1", "a3", "b2-ib", "b3-ib"]),
    (" gpu-a[07-08] , login1", ["gpu-a07", "gpu-a08", "login1"]),
])
def test_slurm_hostlist_expands_like_scontrol_show_hostnames(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-", "node]01[", "node[a-b]", "node[4-2]", "a,,b", "node[]", "a[1[2]]"])
def test_slurm_hostlist_rejects_malformed_text(text):
    with pytest.raises(ValueError, match="in '"):
        expand_hostlist(text)


@pytest.mark.parametrize("text, counts", [("4", [4]), ("4(x2)", [4, 4]), ("2(x3),1", [2, 2, 2, 1]), ("3,2", [3, 2])])
def test_slurm_tasks_per_node_expands_repeat_counts(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["4(x)", "x2", "", "4(2)"])
def test_slurm_tasks_per_node_rejects_malformed_text(text):
    with pytest.raises(ValueError, match="task count"):
        expand_tasks_per_node(text)


@pytest.mark.parametrize("addr, port, endpoint", [
    (None, None, None), ("10.1.0.11", None, None), ("10.1.0.11", 29500, "10.1.0.11:29500"),
    ("fe80::1", 29500, "[fe80::1]:29500"),
])
def test_master_endpoint_is_host_and_port_or_none(addr, port, endpoint):
    assert Role(world_size=2, master_addr=addr, master_port=port).master_endpoint == endpoint


def test_describe_is_one_line_with_place_master_and_launcher():
    text = read_role(torchrun_env(2, 2, 1, 0)).describe()
    assert text == "rank 2 of 4, local rank 0 of 2 on node 1 of 2, master 10.1.0.11:29500 (launcher: torchrun)"
    assert Role().describe() == "rank 0 of 1 (no launcher: a single process)"


WORKER = "import json, os, pathlib, sys; pathlib.Path(sys.argv[1], os.environ['RANK']).write_text(json.dumps(dict(os.environ)))"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 2])
def test_real_torchrun_environment_reads_back_as_its_layout(tmp_path, nodes):
    script = tmp_path / "dump_env.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PADDLE_", "TF_CONFIG"))}
    env["OMP_NUM_THREADS"] = "1"
    port = _free_port()
    agents = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={node}",
                          "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}", str(script),
                          str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in range(nodes)
    ]
    for agent in agents:
        output, _ = agent.communicate(timeout=180)
        assert agent.returncode == 0, output
    roles = [read_role(json.loads((tmp_path / str(rank)).read_text())) for rank in range(2 * nodes)]
    assert [(r.rank, r.world_size, r.launcher) for r in roles] == [(i, 2 * nodes, "torchrun") for i in range(2 * nodes)]
    assert [(r.node_rank, r.local_rank) for r in roles] == [(i // 2, i % 2) for i in range(2 * nodes)]
    assert {(r.num_nodes, r.local_world_size, r.master_endpoint) for r in roles} == {(nodes, 2, f"127.0.0.1:{port}")}
