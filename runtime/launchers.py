"""One reader per launcher: the variables each launcher really sets, turned into a validated Role.

Each reader answers ``detect(env)`` (did this launcher start us?) and ``read(env)`` (the Role, or a
:class:`LaunchEnvironmentError` naming the variable, its value, the launcher and the fix), as Lightning
Fabric's cluster environments do. :data:`LAUNCHERS` is the order :func:`dpmigrate.runtime.read_role`
tries them in, and why is documented in :mod:`dpmigrate.runtime.role_reader`. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from .hostlist import expand_hostlist, expand_tasks_per_node
from .role import LaunchEnvironmentError, Role

_REQUIRED = object()
_MASTER_FIX = "export MASTER_ADDR=<host of rank 0> MASTER_PORT=29500"


class _Vars:
    """One launcher's view of the environment: typed reads whose errors name variable, value and launcher."""

    def __init__(self, env: Mapping[str, str], launcher: str, origin: str):
        self.env, self.launcher, self.origin = env, launcher, origin

    def error(self, message: str, variable: str, value: str | None = None) -> LaunchEnvironmentError:
        return LaunchEnvironmentError(f"{message} ({self.origin})", variable=variable, value=value,
                                      launcher=self.launcher)

    def text(self, name: str) -> str | None:
        """The stripped value, or None when unset or blank."""
        return self.env.get(name, "").strip() or None

    def pick(self, *names: str) -> str | None:
        """The first of ``names`` that is set to a non-blank value."""
        return next((name for name in names if self.text(name) is not None), None)

    def integer(self, name: str, default=_REQUIRED) -> int:
        raw = self.env.get(name)
        if raw is None or (not raw.strip() and default is not _REQUIRED):
            if default is _REQUIRED:
                raise self.error(f"{name} is not set", name)
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise self.error(f"{name}={raw!r} is not an integer", name, raw) from None
        if value < 0:
            raise self.error(f"{name}={value} is negative", name, raw)
        return value

    def size(self, name: str, default=_REQUIRED) -> int:
        value = self.integer(name, default)
        if value == 0:
            raise self.error(f"{name}=0: a job has at least one process", name, self.env.get(name))
        return value

    def check_rank(self, rank_name: str, rank: int, size_name: str, size: int) -> None:
        if rank >= size:
            raise self.error(f"{size_name}={size} but {rank_name}={rank}: ranks run from 0 to {size_name}-1",
                             rank_name, str(rank))

    def port(self, name: str, raw: str, where: str | None = None) -> int:
        port = int(raw) if raw.isdigit() else -1
        if not 1 <= port <= 65535:
            raise self.error(f"{where or name}={raw!r} is not a port: use a number from 1 to 65535", name, raw)
        return port

    def endpoint(self, name: str, item: str) -> tuple[str, int]:
        """``"host:port"`` or ``"[v6addr]:port"`` -> (host, port)."""
        host, colon, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise self.error(f"{name} entry {item!r}: write IPv6 endpoints as [address]:port", name, item)
        if not colon or not host:
            raise self.error(f"{name} entry {item!r} has no port: endpoints are written host:port", name, item)
        return host, self.port(name, port, where=f"{name} entry {item!r}: port")

    def master(self, world: int, fix: str) -> tuple[str | None, int | None]:
        """MASTER_ADDR and MASTER_PORT, required when there is more than one process."""
        addr, port = self.text("MASTER_ADDR"), self.text("MASTER_PORT")
        for name, value in (("MASTER_ADDR", addr), ("MASTER_PORT", port)):
            if value is None and world > 1:
                raise self.error(f"{name} is not set but the job has {world} processes: every process must "
                                 f"find rank 0 there; {fix}", name)
        return addr, None if port is None else self.port("MASTER_PORT", port)


def _locality(hosts: list[str], index: int) -> tuple[int, int, int, int]:
    """(local rank, local world size, node rank, num nodes) of member ``index``, nodes in first-seen order."""
    host, nodes = hosts[index], list(dict.fromkeys(hosts))
    return hosts[:index].count(host), hosts.count(host), nodes.index(host), len(nodes)


class _Launcher:
    name = "none"  # Role.launcher
    origin = ""  # who sets the variables, and the usual fix; ends every error message

    def detect(self, env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def read(self, env: Mapping[str, str]) -> Role:
        raise NotImplementedError

    def _vars(self, env: Mapping[str, str]) -> _Vars:
        return _Vars(env, self.name, f"{self.name} launch: {self.origin}")


class Torchrun(_Launcher):
    """torchrun / torch.distributed.run, and env:// variables exported by hand.

    torchrun gives every worker RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (its node),
    GROUP_WORLD_SIZE (the number of nodes), MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID. The hand
    written env:// recipe exports only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: without LOCAL_RANK
    each process is taken to be alone on its machine, local rank 0 of 1 (Lightning's default too) and
    node rank = rank; export LOCAL_RANK and LOCAL_WORLD_SIZE too when a machine runs several processes.
    """

    name = "torchrun"
    origin = "set by torchrun, or exported by hand for env://; unset stale exports or relaunch with torchrun"

    def detect(self, env):
        return ("RANK" in env and "WORLD_SIZE" in env) or "TORCHELASTIC_RUN_ID" in env

    def read(self, env):
        v = self._vars(env)
        world, rank = v.size("WORLD_SIZE"), v.integer("RANK")
        v.check_rank("RANK", rank, "WORLD_SIZE", world)
        for present, missing in (("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("LOCAL_WORLD_SIZE", "LOCAL_RANK")):
            if present in env and missing not in env:
                raise v.error(f"{present}={env[present]!r} is set but {missing} is not: export both, or neither "
                              "for one process per machine", missing)
        if "LOCAL_RANK" not in env:
            local_rank, local_world, node_rank, num_nodes = 0, 1, rank, world
        else:
            local_world, local_rank = v.size("LOCAL_WORLD_SIZE"), v.integer("LOCAL_RANK")
            v.check_rank("LOCAL_RANK", local_rank, "LOCAL_WORLD_SIZE", local_world)
            if local_world > world:
                raise v.error(f"LOCAL_WORLD_SIZE={local_world} but WORLD_SIZE={world}: a node cannot run "
                              "more processes than the whole job", "LOCAL_WORLD_SIZE", str(local_world))
            if world % local_world and "GROUP_WORLD_SIZE" not in env:
                raise v.error(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world} and "
                              "GROUP_WORLD_SIZE (the number of nodes) is not set", "GROUP_WORLD_SIZE")
            num_nodes = v.size("GROUP_WORLD_SIZE", default=world // local_world)
            node_rank = v.integer("GROUP_RANK", default=rank // local_world)
            v.check_rank("GROUP_RANK", node_rank, "GROUP_WORLD_SIZE", num_nodes)
        # Under dpmigrate launch on one node the ranks meet in a file (DPMIGRATE_RENDEZVOUS): no master needed.
        needs_master = world if v.text("DPMIGRATE_RENDEZVOUS") is None else 1
        addr, port = v.master(needs_master, f"{_MASTER_FIX} (torchrun sets both)")
        return Role(rank, world, local_rank, local_world, node_rank, num_nodes, addr, port, self.name)


class Paddle(_Launcher):
    """``python -m paddle.distributed.launch``, collective mode.

    Every worker gets PADDLE_TRAINER_ID (rank), PADDLE_TRAINERS_NUM (world size),
    PADDLE_TRAINER_ENDPOINTS (every worker's host:port, in rank order), PADDLE_CURRENT_ENDPOINT (its
    own) and PADDLE_RANK_IN_NODE; the current launcher adds PADDLE_LOCAL_RANK, PADDLE_LOCAL_SIZE and
    PADDLE_NNODES. Missing local values are derived from the endpoints sharing this worker's host. The
    master is the first endpoint, rank 0's, the one Paddle itself rendezvouses on. FLAGS_selected_gpus
    is the GPU *id* Paddle pins (``--gpus 2,3`` gives local rank 0 the id 2), not a local rank, so it is
    left to Paddle.
    """

    name = "paddle"
    origin = "set by python -m paddle.distributed.launch; unset stale exports or relaunch with it"

    def detect(self, env):
        return "PADDLE_TRAINER_ID" in env and "PADDLE_TRAINERS_NUM" in env

    def read(self, env):
        v = self._vars(env)
        role = v.text("TRAINING_ROLE")
        if (role or "TRAINER").upper() != "TRAINER" or v.text("PADDLE_PSERVERS_IP_PORT_LIST"):
            raise v.error(f"TRAINING_ROLE={role!r}, PADDLE_PSERVERS_IP_PORT_LIST="
                          f"{v.text('PADDLE_PSERVERS_IP_PORT_LIST')!r}: this is a parameter-server job, not data "
                          "parallel; launch collective mode (no --server_num / --servers)", "TRAINING_ROLE", role)
        world, rank = v.size("PADDLE_TRAINERS_NUM"), v.integer("PADDLE_TRAINER_ID")
        v.check_rank("PADDLE_TRAINER_ID", rank, "PADDLE_TRAINERS_NUM", world)
        raw = v.text("PADDLE_TRAINER_ENDPOINTS")
        endpoints = [item.strip() for item in (raw or "").split(",") if item.strip()]
        if not endpoints and world > 1:
            raise v.error(f"PADDLE_TRAINER_ENDPOINTS is not set but PADDLE_TRAINERS_NUM={world}: every worker "
                          "needs all workers' host:port", "PADDLE_TRAINER_ENDPOINTS", raw)
        if endpoints and len(endpoints) != world:
            raise v.error(f"PADDLE_TRAINER_ENDPOINTS={raw!r} lists {len(endpoints)} endpoints but "
                          f"PADDLE_TRAINERS_NUM={world}: one host:port per worker", "PADDLE_TRAINER_ENDPOINTS", raw)
        parsed = [v.endpoint("PADDLE_TRAINER_ENDPOINTS", item) for item in endpoints]
        twice = [item for i, item in enumerate(endpoints) if item in endpoints[:i]]
        if twice:
            raise v.error(f"PADDLE_TRAINER_ENDPOINTS={raw!r} lists {twice[0]!r} twice: every worker needs its own "
                          "host:port", "PADDLE_TRAINER_ENDPOINTS", raw)
        current = v.text("PADDLE_CURRENT_ENDPOINT")
        if current is not None and endpoints:
            if current not in endpoints:
                raise v.error(f"PADDLE_CURRENT_ENDPOINT={current!r} is not in PADDLE_TRAINER_ENDPOINTS={raw!r}",
                              "PADDLE_CURRENT_ENDPOINT", current)
            if endpoints.index(current) != rank:
                raise v.error(f"PADDLE_CURRENT_ENDPOINT={current!r} is entry {endpoints.index(current)} of "
                              f"PADDLE_TRAINER_ENDPOINTS but PADDLE_TRAINER_ID={rank}", "PADDLE_CURRENT_ENDPOINT",
                              current)
        hosts = [host for host, _ in parsed]
        local_rank, local_world, node_rank, num_nodes = _locality(hosts, rank) if hosts else (0, 1, 0, 1)
        local_name = v.pick("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE")
        local_rank = v.integer(local_name) if local_name else local_rank
        if "PADDLE_LOCAL_SIZE" in env and "PADDLE_NNODES" in env:
            # The launcher's own layout (every node runs PADDLE_LOCAL_SIZE workers) is exact even when two
            # "nodes" share one test machine's address.
            local_world, num_nodes = v.size("PADDLE_LOCAL_SIZE"), v.size("PADDLE_NNODES")
            if local_world * num_nodes != world:
                raise v.error(f"PADDLE_NNODES={num_nodes} x PADDLE_LOCAL_SIZE={local_world} is not "
                              f"PADDLE_TRAINERS_NUM={world}", "PADDLE_NNODES", env["PADDLE_NNODES"])
            node_rank = rank // local_world
        v.check_rank(local_name or "PADDLE_LOCAL_RANK", local_rank, "PADDLE_LOCAL_SIZE", local_world)
        addr, port = parsed[0] if parsed else (None, None)
        return Role(rank, world, local_rank, local_world, node_rank, num_nodes, addr, port, self.name)


class TFConfig(_Launcher):
    """A ``TF_CONFIG`` cluster spec, as tf.distribute's multi-worker strategies read it.

    ``{"cluster": {"chief": ["h0:port"], "worker": ["h1:port", ...]}, "task": {"type": "worker",
    "index": 0}}``. The rank is the position in chief-then-worker order, as MultiWorkerMirroredStrategy
    numbers tasks, and the master is the first of them. Local rank and node come from the tasks that
    share this task's host. Parameter-server and evaluator tasks are not data-parallel workers.
    """

    name = "tf_config"
    origin = ('TF_CONFIG is set by the cluster manager or `dpmigrate launch`; expected {"cluster": '
              '{"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}')

    def detect(self, env):
        return bool(env.get("TF_CONFIG", "").strip())

    def read(self, env):
        v, raw = self._vars(env), env["TF_CONFIG"]
        shown = raw if len(raw) <= 200 else raw[:200] + "..."
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise v.error(f"TF_CONFIG={shown!r} is not JSON ({exc.msg} at column {exc.colno})", "TF_CONFIG",
                          raw) from None
        cluster = config.get("cluster") if isinstance(config, dict) else None
        task = config.get("task") if isinstance(config, dict) else None
        for key, value in (("cluster", cluster), ("task", task)):
            if not isinstance(value, dict) or not value:
                raise v.error(f"TF_CONFIG={shown!r} has no {key!r} object", "TF_CONFIG", raw)
        kind, index = task.get("type"), task.get("index")
        if kind in ("ps", "evaluator"):
            raise v.error(f"TF_CONFIG task type {kind!r}: parameter-server and evaluator tasks are not "
                          "data-parallel workers; run only chief and worker tasks with dpmigrate", "TF_CONFIG", raw)
        if kind not in ("chief", "worker"):
            raise v.error(f"TF_CONFIG task type {kind!r} is not 'chief' or 'worker'", "TF_CONFIG", raw)
        if cluster.get("ps"):
            raise v.error(f"TF_CONFIG cluster has 'ps' tasks {cluster['ps']!r}: that is a ParameterServerStrategy"
                          " job, not data parallel; drop 'ps' from the cluster", "TF_CONFIG", raw)
        chief, workers = (self._addresses(v, cluster, key, raw) for key in ("chief", "worker"))
        if len(chief) > 1:
            raise v.error(f"TF_CONFIG cluster.chief lists {len(chief)} addresses; a cluster has at most one chief",
                          "TF_CONFIG", raw)
        group = chief if kind == "chief" else workers
        if not group:
            raise v.error(f"TF_CONFIG task type is {kind!r} but the cluster lists no {kind!r} address", "TF_CONFIG",
                          raw)
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(group):
            raise v.error(f"TF_CONFIG task.index={index!r} but cluster.{kind} has {len(group)} address(es): "
                          f"the index runs from 0 to {len(group) - 1}", "TF_CONFIG", raw)
        members = [v.endpoint("TF_CONFIG", item) for item in chief + workers]
        rank = index if kind == "chief" else len(chief) + index
        local_rank, local_world, node_rank, num_nodes = _locality([host for host, _ in members], rank)
        addr, port = members[0]
        return Role(rank, len(members), local_rank, local_world, node_rank, num_nodes, addr, port, self.name)

    @staticmethod
    def _addresses(v: _Vars, cluster: dict, key: str, raw: str) -> list[str]:
        value = cluster.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise v.error(f"TF_CONFIG cluster.{key}={value!r} is not a list of 'host:port' strings", "TF_CONFIG", raw)
        return value


class OpenMPI(_Launcher):
    """``mpirun`` / ``mpiexec`` of Open MPI.

    Open MPI gives every process OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE, but no
    rendezvous address and no node index: OMPI_COMM_WORLD_NODE_RANK, despite its name, is the rank among
    the processes on this node. So MASTER_ADDR and MASTER_PORT must be exported and forwarded with -x.
    node_rank and num_nodes assume mpirun's default placement, consecutive ranks filling a node
    (``--map-by slot``), and are exact when every node runs the same number of processes.
    """

    name = "openmpi"
    origin = "set by Open MPI's mpirun; unset stale exports or relaunch with mpirun"

    def detect(self, env):
        return "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env

    def read(self, env):
        v = self._vars(env)
        world, rank = v.size("OMPI_COMM_WORLD_SIZE"), v.integer("OMPI_COMM_WORLD_RANK")
        v.check_rank("OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", world)
        local_world, local_rank = v.size("OMPI_COMM_WORLD_LOCAL_SIZE"), v.integer("OMPI_COMM_WORLD_LOCAL_RANK")
        v.check_rank("OMPI_COMM_WORLD_LOCAL_RANK", local_rank, "OMPI_COMM_WORLD_LOCAL_SIZE", local_world)
        node_rank = max(rank - local_rank, 0) // local_world
        num_nodes = max(-(-world // local_world), node_rank + 1)
        addr, port = v.master(world, f"MPI does not provide one: {_MASTER_FIX} and run "
                                     "`mpirun -x MASTER_ADDR -x MASTER_PORT ...`")
        return Role(rank, world, local_rank, local_world, node_rank, num_nodes, addr, port, self.name)


class Slurm(_Launcher):
    """``srun``: one process per Slurm task.

    srun gives every task SLURM_PROCID (rank), SLURM_LOCALID, SLURM_NODEID and its job step's
    SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE (the job
    level SLURM_NODELIST, SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_TASKS_PER_NODE and SLURM_NTASKS_PER_NODE
    stand in for missing step values). Only an srun step of more than one task is a launch: an
    interactive allocation (salloc: SLURM_JOB_ID and no step) and the batch script itself (it runs once,
    even under ``--ntasks=4``, and has no SLURM_STEP_NUM_TASKS) are one process, read as "none".
    Master address: MASTER_ADDR if exported, else the first host of the node list (task 0 runs there).
    Master port: MASTER_PORT if exported, else 15000 + the last four digits of SLURM_JOB_ID, as
    Lightning does: every task of the job derives the same port without talking to the others.
    """

    name = "slurm"
    origin = "set by srun; unset stale exports or start one process per task with srun"

    def detect(self, env):
        return "SLURM_PROCID" in env and env.get("SLURM_STEP_NUM_TASKS", "").strip() not in ("", "1")

    def read(self, env):
        v = self._vars(env)
        world, rank = v.size("SLURM_STEP_NUM_TASKS"), v.integer("SLURM_PROCID")
        v.check_rank("SLURM_PROCID", rank, "SLURM_STEP_NUM_TASKS", world)
        local_rank, node_rank = v.integer("SLURM_LOCALID"), v.integer("SLURM_NODEID")
        list_name = v.pick("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
        hosts = self._expand(v, list_name, expand_hostlist, "a Slurm host list like node[01-04],gpu5")
        nodes_name = v.pick("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        num_nodes = v.size(nodes_name) if nodes_name else len(hosts)
        if not num_nodes:
            raise v.error("neither SLURM_STEP_NUM_NODES nor SLURM_STEP_NODELIST is set", "SLURM_STEP_NUM_NODES")
        v.check_rank("SLURM_NODEID", node_rank, nodes_name or f"len({list_name})", num_nodes)
        tasks_name = v.pick("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")
        counts = self._expand(v, tasks_name, expand_tasks_per_node, "task counts like 4(x2),3")
        tasks_name = tasks_name or "SLURM_STEP_TASKS_PER_NODE"
        counts = counts if len(counts) != 1 else counts * num_nodes  # "4" means 4 on every node
        if not counts and world % num_nodes == 0:
            counts = [world // num_nodes] * num_nodes
        if len(counts) != num_nodes or sum(counts) != world or not counts[node_rank]:
            raise v.error(f"{tasks_name}={env.get(tasks_name)!r} does not spread {world} tasks over {num_nodes} "
                          f"nodes with one or more on node {node_rank}", tasks_name, env.get(tasks_name))
        if local_rank >= counts[node_rank]:
            raise v.error(f"SLURM_LOCALID={local_rank} but {tasks_name}={env.get(tasks_name)!r} runs {counts[node_rank]}"
                          f" task(s) on node {node_rank}: local ids run from 0 to {counts[node_rank] - 1}",
                          "SLURM_LOCALID", str(local_rank))
        addr = v.text("MASTER_ADDR") or (hosts[0] if hosts else None)
        if addr is None:
            raise v.error("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set, so rank 0's host is unknown; "
                          "export MASTER_ADDR=<host of rank 0>", "SLURM_STEP_NODELIST")
        port = self._port(v)
        return Role(rank, world, local_rank, counts[node_rank], node_rank, num_nodes, addr, port, self.name)

    @staticmethod
    def _expand(v: _Vars, name: str | None, parse, what: str) -> list:
        if name is None:
            return []
        try:
            return parse(v.env[name])
        except ValueError as exc:
            raise v.error(f"{name}={v.env[name]!r} is not {what}: {exc}", name, v.env[name]) from None

    @staticmethod
    def _port(v: _Vars) -> int:
        if v.text("MASTER_PORT") is not None:
            return v.port("MASTER_PORT", v.text("MASTER_PORT"))
        job_name = v.pick("SLURM_JOB_ID", "SLURM_JOBID") or "SLURM_JOB_ID"
        job = v.text(job_name)
        if job is None or not job.isdigit():
            raise v.error(f"{job_name}={job!r}: the master port is derived from the numeric job id; "
                          "export MASTER_PORT=29500 instead", job_name, job)
        return 15000 + int(job[-4:])


LAUNCHERS: tuple[_Launcher, ...] = (Torchrun(), Paddle(), TFConfig(), OpenMPI(), Slurm())
