"""The tensor engine on real procs: the same numbers as local torch, errors, streams, deletion, faults.

Meshes: 2 hosts (two host agents of this machine) x 2 procs, and this host's private agent.
No test asserts how fast anything is; fault tests print how long a failure took to arrive.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import monarch
from monarch import RemoteException, Stream, fetch_shard, inspect, no_mesh, reduce, reduce_, remote
from monarch.actor import Channel, HostMesh, SupervisionError, send, this_host
from monarch.actor._client import HostRef
from tests.helpers import start_host_agent

pytestmark = pytest.mark.timeout(180)

T = 60


@pytest.fixture
def two_hosts(client, tmp_path):
    """A 2-host x 2-proc mesh: two host agents, each with its own procs."""
    agents = [start_host_agent(client.keys, tmp_path, hostname=f"th{i}") for i in range(2)]
    try:
        hosts = HostMesh([HostRef(a.addr, a.info["host"], i) for i, a in enumerate(agents)])
        pm = hosts.spawn_procs(per_host={"gpus": 2})
        yield pm
        pm.stop().get(timeout=T)
    finally:
        for a in agents:
            a.stop()


@pytest.fixture
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=T)


def _program(x: torch.Tensor) -> dict:
    """Ordinary torch code, run on a remote tensor and on a local one alike."""
    y = (x @ x.T).relu() - x.sum()
    z = torch.nn.functional.softmax(y / 100, dim=-1)
    w = torch.cat([z, z * 2], dim=0)
    m = w.max(dim=0).values
    v = x.clone()
    v.mul_(2).add_(1)
    v[0] = 7.0
    return {"y": y, "z": z, "m": m, "v": v, "t": x.T.contiguous(), "i": (x > 5).long().sum(dim=1)}


def _local_input(h: int, g: int) -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4) + 10 * h + g


def test_ops_and_collectives_match_local_torch(two_hosts):
    pm = two_hosts
    with pm.activate():
        x = torch.arange(12.0).reshape(3, 4) + pm.rank_tensor("hosts") * 10 + pm.rank_tensor("gpus")
        out = _program(x)
        m = out["m"]
        total = reduce(m, ("hosts", "gpus"), reduction="sum")
        per_host = reduce(m, "gpus", reduction="sum")
        stacked = reduce(m, "gpus", reduction="stack")
        biggest = reduce(m, "hosts", reduction="max")
        mean = reduce(m, ("hosts", "gpus"), reduction="avg")
        rows = torch.ones(2, 3) * (pm.rank_tensor("gpus") + 1)
        scattered = reduce(rows, "gpus", reduction="sum", scatter=True)
        inplace = m.clone()
        reduce_(inplace, "hosts", reduction="sum")
    assert isinstance(x, monarch.Tensor) and x.shape == (3, 4) and stacked.shape == (2, 3)
    local = {(h, g): _program(_local_input(h, g)) for h in range(2) for g in range(2)}
    for (h, g), want in local.items():
        got = fetch_shard(out, hosts=h, gpus=g).result(timeout=T)
        for k in want:
            assert torch.allclose(got[k], want[k]), (h, g, k, got[k], want[k])
        ms = {k: v["m"] for k, v in local.items()}
        assert torch.allclose(inspect(total, hosts=h, gpus=g), sum(ms.values()))
        assert torch.allclose(inspect(per_host, hosts=h, gpus=g), ms[h, 0] + ms[h, 1])
        assert torch.allclose(inspect(stacked, hosts=h, gpus=g), torch.stack([ms[h, 0], ms[h, 1]]))
        assert torch.allclose(inspect(biggest, hosts=h, gpus=g), torch.maximum(ms[0, g], ms[1, g]))
        assert torch.allclose(inspect(mean, hosts=h, gpus=g), sum(ms.values()) / 4)
        assert torch.allclose(inspect(inplace, hosts=h, gpus=g), ms[0, g] + ms[1, g])
        assert torch.equal(inspect(scattered, hosts=h, gpus=g), torch.full((3,), 3.0))  # (1 + 2) per entry


def test_remote_functions_and_rank_tensors(procs):
    add = remote("tests.tensor.funcs.add_scaled", propagate=lambda a, b, k=1.0: a)
    halves = remote("tests.tensor.funcs.split_halves")  # no propagate: learned by running it once
    pid = remote("tests.tensor.funcs.pid", propagate="inspect")
    with procs.activate():
        a = torch.ones(4, 2) * procs.rank_tensor("gpus")
        b = add(a, torch.full((4, 2), 3.0), k=2.0)
        lo, hi = halves(b)
        pids = pid.call().get(timeout=T)
    assert lo.shape == (2, 2) and hi.shape == (2, 2)
    for g in range(2):
        assert torch.equal(inspect(b, gpus=g), torch.full((4, 2), g + 6.0))
        assert torch.equal(inspect(hi, gpus=g), torch.full((2, 2), g + 6.0))
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()


def test_send_runs_a_remote_function_whose_procs_answer_a_port(procs):
    """``send(remote_fn, args, kwargs, port)`` (Monarch's getting-started example): each proc of the
    active mesh runs it and sends its result, or its error, to the port under its rank."""
    pid = remote("tests.tensor.funcs.pid", propagate="inspect")
    boom = remote("tests.tensor.funcs.boom", propagate=lambda t: t)
    port, receiver = Channel.open()
    ranked = receiver.ranked()
    with procs.activate():
        send(pid, (), {}, port=port)
        answers = dict(ranked.recv().get(timeout=T) for _ in range(2))
        send(pid, (), {}, port=port, selection="choose")
        chosen = receiver.recv().get(timeout=T)
        send(boom, (torch.ones(2),), {}, port=port)
        with pytest.raises(ValueError, match="boom"):
            receiver.recv().get(timeout=T)
        with pytest.raises(ValueError, match="boom"):
            receiver.recv().get(timeout=T)
        send(pid, (), {})  # no port: the procs run it, nothing comes back
        assert float(inspect(torch.ones(2).sum())) == 2.0  # and the mesh goes on
    assert sorted(answers) == [0, 1] and len(set(answers.values())) == 2 and os.getpid() not in answers.values()
    assert chosen in answers.values()


def test_actors_receive_their_procs_shard(procs):
    from tests.tensor.funcs import ShardTrainer

    trainers = procs.spawn("trainers", ShardTrainer)
    with procs.activate():
        t = torch.ones(3, 4) * (procs.rank_tensor("gpus") + 1)
        for _ in range(20):
            t = t + 0  # still being made when the call is sent
    got = trainers.step.call(t[0]).get(timeout=T)
    assert sorted(got.values()) == [(0, 4.0), (1, 8.0)]


def test_endpoint_rref_makes_remote_tensors(procs):
    from tests.tensor.funcs import Linear

    linear = procs.spawn("linear", Linear)
    with procs.activate():
        t = torch.ones(2, 3) * (procs.rank_tensor("gpus") + 1)
        o = torch.relu(linear.forward.rref(t)) * 2
    assert o.shape == (2, 3)
    for g in range(2):
        assert torch.equal(inspect(o, gpus=g), torch.full((2, 3), (g + 1) * 6.0))


def test_autograd_runs_here_and_its_ops_there(procs):
    with procs.activate():
        w = torch.rand(3, requires_grad=True)
        loss = ((w * 2) ** 2).sum()
        loss.backward()
        g = w.grad
    for gpus in range(2):
        assert torch.allclose(inspect(g, gpus=gpus), inspect(w, gpus=gpus).detach() * 8)


def test_data_parallel_step_with_a_comms_stream(procs):
    """The shape of Monarch's distributed-tensors example: nn modules made on the mesh, backward here,
    gradients summed over the mesh on a stream of their own (borrowed), then an update on main."""
    comms = Stream("comms")
    with procs.activate():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        x = torch.rand(3, 4)
        loss = torch.nn.functional.cross_entropy(model(x), torch.full((3,), 1, dtype=torch.int64))
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                g, borrow = comms.borrow(p.grad, mutable=True)
                with comms.activate():
                    g.reduce_("gpus", "sum")
                borrow.drop()
                p -= 0.1 * p.grad
    grads = [inspect(model[0].weight.grad, gpus=g) for g in range(2)]
    weights = [inspect(model[0].weight, gpus=g) for g in range(2)]
    assert torch.allclose(grads[0], grads[1]) and not torch.equal(grads[0], torch.zeros(4, 4))
    assert weights[0].shape == (4, 4) and torch.isfinite(inspect(loss))


def test_random_values_differ_between_procs(procs):
    with procs.activate():
        t = torch.rand(8)
    assert not torch.equal(inspect(t, gpus=0), inspect(t, gpus=1))


def test_remote_error_names_the_op_and_the_mesh_stays_usable(procs):
    boom = remote("tests.tensor.funcs.boom", propagate=lambda t: t)
    with procs.activate():
        a = torch.rand(3, 4)
        b = boom(a)  # the line the error must name
        c = (b + 1).sum()
        ok = a * 2
    with pytest.raises(RemoteException) as ei:
        inspect(c)
    text = str(ei.value)
    assert "boom: this remote function always fails" in text and "ValueError" in text, text
    assert "b = boom(a)" in text and "test_tensor_engine.py" in text, text
    assert torch.allclose(inspect(ok), inspect(a) * 2)  # independent work is unaffected
    with procs.activate():
        assert float(inspect(torch.ones(2).sum())) == 2.0  # and the mesh takes new work
        with pytest.raises(RuntimeError, match="reduction dim|shape"):
            torch.rand(3, 4) @ torch.rand(5, 6)  # a shape error is raised here, at once (meta tensors)
        with pytest.raises(RuntimeError, match="inspect"):
            a.sum().item()
        with no_mesh.activate():
            assert torch.ones(2).sum().item() == 2.0  # local compute inside the block


def test_streams_run_in_order_and_borrows_order_them(procs):
    slow = remote("tests.tensor.funcs.slow_identity", propagate=lambda t, s: t)
    other = Stream("other")
    with procs.activate():
        a = slow(torch.ones(3), 0.3)
        with other.activate():
            b = torch.zeros(3) + 5  # runs while `a` is still being made on main
            a_on_other, borrow = other.borrow(a)
            c = a_on_other + b  # waits for `a`
        with pytest.raises(ValueError, match="another stream"):
            a + b
        borrow.drop()
        d = a * 3
    assert torch.equal(inspect(c), torch.full((3,), 6.0))
    assert torch.equal(inspect(d), torch.full((3,), 3.0))


def test_slices_and_moving_tensors_between_them(procs):
    first, second = procs.slice(gpus=0), procs.slice(gpus=1)
    with first.activate():
        t = torch.arange(6.0) * 2
    with second.activate():
        u = torch.ones(6)
    moved = t.to_mesh(second._device_mesh)
    with second.activate():
        v = moved + u
    assert torch.equal(inspect(v), torch.arange(6.0) * 2 + 1)


def test_dropped_tensors_are_deleted_on_the_procs(procs):
    live = remote("tests.tensor.funcs.live_refs", propagate="inspect")
    with procs.activate():
        keep = torch.zeros(4)
        before = live.call().get(timeout=T).values()
        for _ in range(200):
            keep = keep + 1  # each old `keep` is collected here, and deleted there
        explicit = torch.ones(4)
        explicit.drop()
        with pytest.raises(ValueError, match="dropped"):
            explicit + 1
        after = live.call().get(timeout=T).values()
    assert float(inspect(keep)[0]) == 200.0
    assert all(a <= b + 2 for a, b in zip(after, before)), (before, after)


def test_a_proc_killed_mid_ops_fails_pending_and_next_fetch(procs):
    slow = remote("tests.tensor.funcs.slow_identity", propagate=lambda t, s: t)
    pid = remote("tests.tensor.funcs.pid", propagate="inspect")
    with procs.activate():
        pids = pid.call().get(timeout=T).values()
        x = torch.ones(1000)
        for _ in range(100):
            x = x + 1
        y = slow(x, 30)  # still running when the proc dies
        pending = fetch_shard(y, gpus=0)
        time.sleep(0.2)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError) as ei:
            pending.get(timeout=T)
        print(f"\nkill -9 of a proc failed the pending fetch after {(time.monotonic() - t0) * 1000:.1f} ms")
        assert "tensor engine" in str(ei.value) and "SIGKILL" in str(ei.value), str(ei.value)
        with pytest.raises(SupervisionError, match="tensor engine"):
            inspect(x + 1)
        with pytest.raises(SupervisionError, match="tensor engine"):
            x * 2
