"""The nodes' meeting point dpmigrate serves for Paddle's launcher, and what each node learns from it (fast).

On this machine's loopback, without Paddle: the store speaks Paddle's KV protocol (as its launcher's
KVClient uses it) for the run's keys only; a node gives up with a message naming who never came; a
rank that failed on one node is seen, and named, by the other. The real thing is test_multinode_paddle.py.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from dpmigrate.launch import diagnosis, paddle_nodes, rank_status
from dpmigrate.launch.backend import RankExit

RUN = "r" * 32


@pytest.fixture
def store():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    served = paddle_nodes.MasterStore("127.0.0.1", port, RUN)
    yield served
    served.close()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method),
                         timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def meeting(tmp_path, node: int, port: int, store=None, start_timeout_s: float = 60.0) -> paddle_nodes.Meeting:
    folder = tmp_path / f"node{node}"
    (folder / "status").mkdir(parents=True)
    (folder / "diagnosis").mkdir()
    return paddle_nodes.Meeting(node=node, nnodes=2, nproc=2, master=("127.0.0.1", port), run_id=RUN,
                                start_timeout_s=start_timeout_s, status_dir=folder / "status",
                                diagnosis_dir=folder / "diagnosis", started=time.monotonic(), store=store)


def test_the_store_speaks_paddles_protocol_for_the_runs_keys_only(store):
    port = store.server_address[1]
    assert request(port, "GET", "/healthy") == (200, b'{"/healthy": "ok"}')  # KVClient.wait_server_ready
    assert request(port, "POST", f"/{RUN}/info/pod-a/0", b'{"rank": 0}')[0] == 200  # KVClient.put
    assert request(port, "PUT", f"/{RUN}/info/pod-b/1", b'{"rank": 1}')[0] == 200
    code, body = request(port, "GET", f"/{RUN}/info")  # KVClient.get_prefix
    assert code == 200 and json.loads(body) == {f"/{RUN}/info/pod-a/0": '{"rank": 0}',
                                                f"/{RUN}/info/pod-b/1": '{"rank": 1}'}
    assert request(port, "GET", f"/{RUN}/nothing")[0] == 404
    assert request(port, "GET", "/")[0] == 404  # no listing without the run id
    assert request(port, "POST", "/another-run/info/x/0", b"1")[0] == 403
    assert request(port, "DELETE", f"/{RUN}/info/pod-a/0")[0] == 200
    assert store.server_address[0] == "127.0.0.1"


def test_a_node_that_never_reaches_the_master_says_which_it_tried_and_who_never_came(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    node1 = meeting(tmp_path, 1, port, start_timeout_s=0.5)
    assert node1.poll(time.monotonic()) is None
    time.sleep(0.6)
    assert node1.poll(time.monotonic()) == (
        f"dpmigrate launch: node 1 could not reach the master 127.0.0.1:{port} within --start-timeout 0.5 s: "
        "node 0 (ranks 0-1) never arrived; start it with the same --master, or check the address and any firewall "
        "between the nodes")


def test_the_master_names_the_nodes_that_never_arrived_and_the_meeting_ends_when_all_have(tmp_path, store):
    port = store.server_address[1]
    node0 = meeting(tmp_path, 0, port, store=store, start_timeout_s=0.3)
    store.put(f"/{RUN}/info/pod-a/0", "{}")
    time.sleep(0.4)
    why = node0.poll(time.monotonic())
    assert why.startswith(f"dpmigrate launch: node 1 (ranks 2-3) never arrived at the master 127.0.0.1:{port} within "
                          "--start-timeout 0.3 s (seen from node 0)"), why
    node1 = meeting(tmp_path, 1, port)
    assert request(port, "POST", f"/{RUN}/info/pod-b/1", b"{}")[0] == 200
    assert node1.poll(time.monotonic()) is None and node1.met
    assert node0.poll(time.monotonic()) is None and node0.met


def test_a_rank_that_failed_on_one_node_is_named_by_the_other_which_then_stops(tmp_path, store):
    port = store.server_address[1]
    store.put(f"/{RUN}/info/pod-a/0", "{}")
    store.put(f"/{RUN}/info/pod-b/1", "{}")
    node0, node1 = meeting(tmp_path, 0, port, store=store), meeting(tmp_path, 1, port)
    now = time.monotonic()
    assert node0.poll(now) is None and node1.poll(now) is None  # met
    rank_status.write_status(node1.status_dir, RankExit(3, -9, stopped=False, ended=time.time()))
    assert node1.poll(now) is None  # published
    assert node0.poll(now) is None  # seen: its ranks now have PEER_GRACE_S to fail by themselves
    assert node0.poll(now + paddle_nodes.PEER_GRACE_S) == (
        "dpmigrate launch: rank 3 failed on node 1 (killed by SIGKILL); stopping the ranks of node 0")
    rank_status.write_status(node0.status_dir, RankExit(0, -15, stopped=True, ended=time.time()))  # stopped by us
    node0.record_lost(), node1.record_lost()
    assert diagnosis.lost_ranks(node0.diagnosis_dir) == {3: 0}
    assert node1.lost_elsewhere == {} and diagnosis.lost_ranks(node1.diagnosis_dir) == {}


def test_a_failure_seen_before_this_nodes_earlier_one_was_recorded_is_not_blamed(tmp_path, store):
    """The race a loaded machine makes: node 1's rank 2 aborts because node 0's rank 0 was killed, and node 0
    sees that before rank 0's wrapper has written rank 0's status. Rank 2 is a candidate then; once rank 0's
    status (ended earlier) is in, it is not recorded as the rank node 0 lost."""
    port = store.server_address[1]
    store.put(f"/{RUN}/info/pod-a/0", "{}")
    store.put(f"/{RUN}/info/pod-b/1", "{}")
    node0, node1 = meeting(tmp_path, 0, port, store=store), meeting(tmp_path, 1, port)
    node0.poll(time.monotonic()), node1.poll(time.monotonic())
    killed_at = time.time() - 0.5
    rank_status.write_status(node1.status_dir, RankExit(2, -6, stopped=False, ended=time.time()))
    node1.poll(time.monotonic())
    assert node0.poll(time.monotonic()) is None and sorted(node0.lost_elsewhere) == [2]  # seen first
    rank_status.write_status(node0.status_dir, RankExit(0, -9, stopped=False, ended=killed_at))  # written late
    node0.record_lost()
    assert diagnosis.lost_ranks(node0.diagnosis_dir) == {}


def test_a_rank_of_this_node_killed_from_outside_is_the_culprit_whatever_the_clocks_say(tmp_path, store):
    """The same race, one step worse (CI, a loaded machine: the multinode kill test failed 1 run in many): rank
    0's wrapper saw its SIGKILL only after node 1's rank 2 had aborted and written its status, so rank 0's
    recorded end is the later one. A rank killed by SIGKILL that nobody asked to stop was killed from outside:
    no peer's loss makes a process SIGKILL itself, so node 0 blames no other node."""
    port = store.server_address[1]
    store.put(f"/{RUN}/info/pod-a/0", "{}")
    store.put(f"/{RUN}/info/pod-b/1", "{}")
    node0, node1 = meeting(tmp_path, 0, port, store=store), meeting(tmp_path, 1, port)
    node0.poll(time.monotonic()), node1.poll(time.monotonic())
    rank_status.write_status(node1.status_dir, RankExit(2, -6, stopped=False, ended=time.time()))
    node1.poll(time.monotonic())
    assert node0.poll(time.monotonic()) is None and sorted(node0.lost_elsewhere) == [2]
    rank_status.write_status(node0.status_dir, RankExit(0, -9, stopped=False, ended=time.time() + 0.5))
    node0.record_lost()
    assert diagnosis.lost_ranks(node0.diagnosis_dir) == {}


def test_a_rank_that_failed_after_this_nodes_own_is_not_blamed(tmp_path, store):
    port = store.server_address[1]
    store.put(f"/{RUN}/info/pod-a/0", "{}")
    store.put(f"/{RUN}/info/pod-b/1", "{}")
    node0, node1 = meeting(tmp_path, 0, port, store=store), meeting(tmp_path, 1, port)
    node0.poll(time.monotonic()), node1.poll(time.monotonic())
    rank_status.write_status(node0.status_dir, RankExit(0, -9, stopped=False, ended=time.time() - 1))
    rank_status.write_status(node1.status_dir, RankExit(2, -6, stopped=False, ended=time.time()))
    node1.poll(time.monotonic())
    node0.settle(time.monotonic(), wait_s=0)
    assert node0.lost_elsewhere == {}  # rank 2 broke because rank 0 was killed first
    node1.settle(time.monotonic(), wait_s=0)
    assert sorted(node1.lost_elsewhere) == [0]
