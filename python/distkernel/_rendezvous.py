"""A rank's part in torch's env:// rendezvous that the kernel leaves to its
ranks: MASTER_PORT, when rank 0 picks it on its own node and sends it to the
others (master_port_from_rank0), and rank 0's TCPStore, held for its peers
until every rank has checked out of it (check_out_of_store,
hold_store_for_peers).
"""

import os
import struct
import sys

from distkernel import _backchannel as bc


# Where rank 0 looks for a free MASTER_PORT first: above the usual service
# ports and below Linux's ephemeral range (32768-60999), where the node's own
# outgoing connections take theirs and could take it back once released.
_PORT_RANGE = (20000, 32768)
_PORT_TRIES = 64


def _bind_free_port():
    """Sockets bound to a TCP port free on this node on every address (IPv4
    and, where the node has it, IPv6), and the port: a random one in
    _PORT_RANGE, else one the system picks. Held bound, they keep it free
    until closed."""
    import errno
    import random
    import socket

    def bind_all(port):
        held = []
        try:
            s4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s4)
            s4.bind(("", port))
            port = s4.getsockname()[1]
            if socket.has_ipv6:
                try:
                    s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                except OSError:
                    return held, port       # no IPv6 on this node
                held.append(s6)
                s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    s6.bind(("::", port))
                except OSError as exc:
                    if exc.errno != errno.EADDRNOTAVAIL:    # no IPv6 address here
                        raise
            return held, port
        except OSError:
            for sock in held:
                sock.close()
            return None, 0

    rng = random.SystemRandom()
    for _ in range(_PORT_TRIES):
        held, port = bind_all(rng.randrange(*_PORT_RANGE))
        if held:
            return held, port
    held, port = bind_all(0)
    if not held:
        raise OSError("rank 0 found no free TCP port on its node for MASTER_PORT")
    return held, port


def master_port_from_rank0(channel, rank):
    """MASTER_PORT when the kernel leaves it to rank 0 (ranks on other nodes:
    DISTKERNEL_MASTER_PORT=rank0): rank 0 binds a port free on its node, the
    one MASTER_ADDR names, and sends it; every rank is sent it back before its
    work. Returns the sockets holding it (rank 0's), to close as the work
    starts."""
    if os.environ.pop("DISTKERNEL_MASTER_PORT", None) != "rank0":
        return []
    held = []
    if rank == 0:
        held, port = _bind_free_port()
        channel.send(bc.PORT, struct.pack(">I", port))
    kind, payload = channel.recv()
    if kind != bc.PORT or len(payload) != 4:
        raise bc.BackChannelError(f"expected the run's MASTER_PORT, got frame type {kind}")
    os.environ["MASTER_PORT"] = str(struct.unpack(">I", payload)[0])
    return held


EXIT_HOLD_S = 60.0
CHECK_OUT_KEY = "distkernel_warm_exit"


def _default_store():
    """The env:// process group's store, or None."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        from torch.distributed import distributed_c10d
        return distributed_c10d._get_default_store()
    except Exception:
        return None


def check_out_of_store():
    """Tell rank 0 (which may be warm and hold the store for its peers) that
    this rank is done with the store."""
    store = _default_store()
    try:
        if store is not None:
            store.add(CHECK_OUT_KEY, 1)
    except Exception:
        pass    # a store that is gone already: nobody waits


def hold_store_for_peers():
    """Rank 0 of an env:// process group hosts its TCPStore: when it exits,
    a peer still finishing init_process_group (which talks to the store after
    its barrier) gets "Connection reset by peer". A cold rank 0 takes long
    enough over its interpreter's teardown that this is never seen; a warm one
    exits at once. So every rank, cold or warm, checks out in the store as its
    main() ends (check_out_of_store), and a warm rank 0 waits (at most
    EXIT_HOLD_S, for a peer that died without checking out) until every rank
    has."""
    store = _default_store()
    try:
        if store is None:
            return
        import time
        dist = sys.modules["torch.distributed"]
        if dist.get_rank() != 0:
            return
        world = dist.get_world_size()
        deadline = time.monotonic() + EXIT_HOLD_S
        # The job stops its ranks (SIGTERM, after a peer failed) while we
        # hold: this rank has its result in and is done, so it exits as
        # done, not as stopped by the job.
        import signal

        class _Stop(Exception):
            pass

        def stop(_sig, _frame):
            raise _Stop

        old = signal.signal(signal.SIGTERM, stop)
        try:
            while store.add(CHECK_OUT_KEY, 0) < world and time.monotonic() < deadline:
                time.sleep(0.005)
        except _Stop:
            pass
        finally:
            signal.signal(signal.SIGTERM, old)
    except Exception:
        pass    # a store that is gone already: nothing to hold
