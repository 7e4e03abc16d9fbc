"""The cap on connections not yet authenticated: one more shuts the oldest down, never the newest."""

import socket

from monarch_agents.unproven import UnprovenConnections


def _pair():
    a, b = socket.socketpair()
    b.settimeout(5)
    return a, b


def test_one_more_than_the_limit_shuts_the_oldest_and_a_proven_one_no_longer_counts():
    cap = UnprovenConnections(2)
    (s1, p1), (s2, p2), (s3, p3) = _pair(), _pair(), _pair()
    try:
        cap.admit(s1)
        cap.admit(s2)
        cap.proven(s2)  # authenticated: its slot is free again
        cap.admit(s3)
        assert len(cap) == 2 and cap.shed == 0
        s4, p4 = _pair()
        cap.admit(s4)  # full: the oldest (s1) goes, the newcomer is held
        assert cap.shed == 1 and len(cap) == 2
        assert p1.recv(1) == b""  # s1's peer reads EOF
        s4.sendall(b"x")
        assert p4.recv(1) == b"x"  # the newest still works
        cap.shut_all()
        assert len(cap) == 0 and p3.recv(1) == b"" and p4.recv(1) == b""
        s2.sendall(b"y")
        assert p2.recv(1) == b"y"  # a proven connection is never touched
    finally:
        for s in (s1, s2, s3, s4, p1, p2, p3, p4):
            s.close()
