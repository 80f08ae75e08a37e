"""A rank's `ray stop` runs once, wherever the kernel's interrupt lands
(python/distkernel/_ray.py, RayCluster._stop_ray).

When a Ray driver fails, the kernel ends the other ranks with SIGINT just as
their wait for the driver ends, so the interrupt can land in _ray_stop before
it holds SIGINT and SIGTERM. `ray stop` must still run (a rank that skips it
leaves Ray's daemons on its node), once, and the interrupt must still reach
the rank after it. The interrupt is injected at each point through
signal.pthread_sigmask, which _ray_stop calls to hold the signals and to let
them go; `ray` is a script that logs its calls.
"""
import os
import signal
import sys

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "python"))

from distkernel import _ray  # noqa: E402


@pytest.fixture
def ray_log(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    ray = tmp_path / "ray"
    ray.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    ray.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


def started_cluster():
    """A rank's cluster after its `ray start`, without a store or a run."""
    cluster = object.__new__(_ray.RayCluster)
    cluster._started = True
    cluster._ray_stopped = []
    return cluster


def interrupt_at(monkeypatch, how):
    """KeyboardInterrupt from pthread_sigmask: before the signals are held
    ("hold", as if SIGINT landed first), or after they are let go ("let go",
    as if it was held back while `ray stop` ran)."""
    real = signal.pthread_sigmask
    fired = []

    def sigmask(op, mask):
        if how == "hold" and op == signal.SIG_BLOCK and not fired:
            fired.append(op)
            raise KeyboardInterrupt
        old = real(op, mask)
        if how == "let go" and op == signal.SIG_SETMASK and not fired:
            fired.append(op)
            raise KeyboardInterrupt
        return old

    monkeypatch.setattr(_ray.signal, "pthread_sigmask", sigmask)
    return fired


@pytest.mark.parametrize("how", ["hold", "let go"])
def test_an_interrupt_anywhere_in_ray_stop_runs_it_once_and_still_reaches_the_rank(
        ray_log, monkeypatch, how):
    fired = interrupt_at(monkeypatch, how)
    cluster = started_cluster()
    with pytest.raises(KeyboardInterrupt):
        cluster._stop_ray()
    assert fired, "the interrupt was not injected"
    assert calls(ray_log) == ["stop"]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    cluster._stop_ray()     # once: a later stop (the end of the rank) runs nothing
    assert calls(ray_log) == ["stop"]


def test_without_an_interrupt_ray_stop_runs_once(ray_log):
    cluster = started_cluster()
    cluster._stop_ray()
    cluster._stop_ray()
    assert calls(ray_log) == ["stop"]


def test_a_rank_that_never_ran_ray_start_runs_no_ray_stop(ray_log):
    cluster = started_cluster()
    cluster._started = False
    cluster._stop_ray()
    assert calls(ray_log) == []
