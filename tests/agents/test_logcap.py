"""A rank's log under its cap: head and tail kept, the middle left out and said so, files bounded."""

from __future__ import annotations

import os

import pytest

from monarch._workbench.logs import LogReader, local_fetch
from monarch_agents.logcap import DEFAULT_LOG_MAX, LOG_MAX_ENV, CappedLog, log_cap, parse_size


def _read(run_dir, streams=("stdout", "stderr")):
    r = LogReader(local_fetch(str(run_dir)), [0], streams)
    (run_dir / "0.exit").write_text("{}")
    chunks = r.poll()
    return b"".join(c.data for c in chunks), chunks


def test_sizes_and_bad_values():
    assert parse_size("1048576") == 1 << 20 and parse_size("256M") == 256 << 20 and parse_size("2GiB") == 2 << 30
    assert parse_size("512k") == 512 << 10 and parse_size("0") == 0
    for bad in ("soon", "-1M", "1X", "M"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size(bad)
    assert log_cap({}) == (DEFAULT_LOG_MAX, "")
    assert log_cap({LOG_MAX_ENV: "1M"}, {LOG_MAX_ENV: "2M"}) == (1 << 20, "")  # the rank's own first
    cap, problem = log_cap({LOG_MAX_ENV: "lots"})
    assert cap == DEFAULT_LOG_MAX and problem.startswith(f"{LOG_MAX_ENV}: 'lots' is not a size")


def test_under_the_cap_the_log_is_whole(tmp_path):
    log = CappedLog(str(tmp_path / "0"), 1 << 20)
    for i in range(100):
        log.write("stdout" if i % 2 else "stderr", f"line {i}\n".encode())
    assert not log.truncated and log.note() == ""
    log.close()
    data, chunks = _read(tmp_path)
    assert data == b"".join(f"line {i}\n".encode() for i in range(100))
    assert sorted(os.listdir(tmp_path)) == ["0.exit", "0.order", "0.stderr", "0.stdout"]


def test_over_the_cap_head_note_and_tail_in_order(tmp_path):
    cap = 64 << 10
    log = CappedLog(str(tmp_path / "0"), cap)
    lines = [f"{i:07d}\n".encode() for i in range(40_000)]  # 320 KB, five times the cap
    peak = 0
    for i, line in enumerate(lines):
        log.write("stderr" if i % 1000 == 999 else "stdout", line)
        if i % 97 == 0:
            peak = max(peak, sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path)))
    assert log.truncated
    note = log.note()
    log.close()
    on_disk = sum(os.path.getsize(tmp_path / n) for n in os.listdir(tmp_path))
    assert peak <= cap + 64 and on_disk <= cap + 1024, (peak, on_disk)  # data, order records and the note
    # Tail files gone; their index stays (where the tail went, for a follower that comes late).
    assert sorted(os.listdir(tmp_path)) == ["0.order", "0.stderr", "0.stdout", "0.tails"]
    data, chunks = _read(tmp_path)
    head_end = data.index(b"\n[monarch: ")
    head, rest = data[:head_end], data[head_end:]
    marker, tail = rest[1:].split(b"\n", 1)
    assert marker.decode() == f"[monarch: {note}]"
    assert "left out" in note and "MONARCH_RUN_LOG_MAX" in note and str(tmp_path / "0") in note
    # The head is the output's beginning, the tail its end, each whole lines in order.
    assert data.startswith(b"0000000\n0000001\n") and head == b"".join(lines)[:len(head)]
    assert tail and b"".join(lines).endswith(tail)
    # At least one tail file's worth: a quarter of the cap in records (5 bytes of order, 8 of output each).
    assert len(tail) >= (cap // 4) * 8 // 13 - 16
    assert any(c.stream == "stderr" and c.data == b"0039999\n" for c in chunks)  # streams kept apart


def test_a_chunk_bigger_than_the_cap_keeps_its_end(tmp_path):
    log = CappedLog(str(tmp_path / "0"), 4096)
    log.write("stdout", b"a" * 10_000 + b"THE END")
    log.close()
    data, _ = _read(tmp_path)
    assert data.startswith(b"a" * 1000) and data.endswith(b"THE END")
    assert os.path.getsize(tmp_path / "0.stdout") <= 4096


def test_no_cap(tmp_path):
    log = CappedLog(str(tmp_path / "0"), 0)
    for _ in range(64):
        log.write("stdout", b"x" * 4096)
    log.close()
    assert os.path.getsize(tmp_path / "0.stdout") == 64 * 4096


def test_capped_file_keeps_head_note_and_tail(tmp_path):
    from monarch_agents.logcap import CappedFile

    path = tmp_path / "p.log"
    f = CappedFile(str(path), 4096)
    lines = [f"{i:07d}\n".encode() for i in range(5000)]
    for line in lines:
        f.write(line)
    f.close()
    data = path.read_bytes()
    head, rest = data.split(b"\n[monarch: this log was cut at 4 KiB", 1)
    tail = rest.split(b"]\n", 1)[1]
    whole = b"".join(lines)
    assert whole.startswith(head) and len(head) == 2048 and whole.endswith(tail) and len(tail) >= 1024
    assert len(data) <= 4096 + 200 and sorted(p.name for p in tmp_path.iterdir()) == ["p.log"]


def test_the_proc_log_pump_caps_what_children_write_and_stops(tmp_path):
    """Real children writing into the pump's pipes (as procs do): each file capped, whole below the cap,
    the tails appended once each child is gone, the thread joined by stop()."""
    import subprocess
    import sys
    import time

    from monarch_agents.logcap import LogPump

    pump = LogPump(64 << 10)
    try:
        big, small = tmp_path / "big.log", tmp_path / "small.log"
        children = []
        for path, n in ((big, 200_000), (small, 10)):
            w = pump.add(str(path))
            code = f"import sys\nfor i in range({n}): sys.stdout.write(f'{{i:07d}}\\n')\nprint('END', file=sys.stderr)"
            children.append(subprocess.Popen([sys.executable, "-c", code], stdout=w, stderr=w))
            os.close(w)
        for c in children:
            assert c.wait(120) == 0
        assert pump.stop(time.monotonic() + 30)
    finally:
        pump.stop(time.monotonic() + 5)
    assert small.read_bytes() == b"".join(f"{i:07d}\n".encode() for i in range(10)) + b"END\n"
    data = big.read_bytes()
    assert len(data) <= (64 << 10) + 200 and b"[monarch: this log was cut at 64 KiB" in data
    assert data.startswith(b"0000000\n") and data.endswith(b"0199999\nEND\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.log", "small.log"]


def test_a_follower_sees_the_tail_as_it_is_written_and_each_byte_once(tmp_path):
    """Past the cap the head stops growing: a follower (``monarch logs -f``) reads the tail files as the
    rank writes them, across rotations, then the log's note, and nothing of the tail twice."""
    cap = 16 << 10
    log = CappedLog(str(tmp_path / "0"), cap)
    reader = LogReader(local_fetch(str(tmp_path)), [0])
    lines = [f"{i:07d}\n".encode() for i in range(20_000)]  # 160 KB: ten times the cap, many rotations
    seen: list = []
    got_while_cut = 0
    for i, line in enumerate(lines):
        log.write("stderr" if i % 1000 == 999 else "stdout", line)
        if i % 50 == 0:
            new = reader.poll()
            if log.truncated:
                got_while_cut += sum(len(c.data) for c in new)
                # Each poll shows up to what was written (whole records): the follower keeps up.
                assert new and new[-1].data == line, (i, new[-1:])
            seen += new
    seen += reader.poll()
    assert got_while_cut > cap, "the tail was shown as it came"
    log.close()
    (tmp_path / "0.exit").write_text("{}")
    seen += reader.poll()
    assert reader.done
    data = b"".join(c.data for c in seen)
    # Every line once, in order (this reader kept up: nothing was left out for it, so no note on the
    # way), then the log's own note (the log on disk left the middle out).
    shown, note = data.rsplit(b"\n[monarch: its log was cut", 1)
    assert shown == b"".join(lines)
    assert note.endswith(b"]\n") and b"[monarch:" not in shown
    assert any(c.stream == "stderr" and c.data == b"0019999\n" for c in seen)
    # A reader that comes after the end sees the log as kept: head, note, tail.
    whole, _ = _read(tmp_path)
    assert whole.startswith(b"0000000\n") and whole.endswith(b"0019999\n") and len(whole) < len(b"".join(lines))


def test_a_follower_that_falls_behind_says_what_it_missed(tmp_path):
    """A follower slower than a whole tail file: a note where output is missing, then the newest."""
    cap = 16 << 10
    log = CappedLog(str(tmp_path / "0"), cap)
    reader = LogReader(local_fetch(str(tmp_path)), [0], ("stdout", "stderr"))
    lines = [f"{i:07d}\n".encode() for i in range(10_000)]
    seen = []
    for line in lines[:2000]:
        log.write("stdout", line)
    seen += reader.poll()  # the head, and into the tail
    for line in lines[2000:]:
        log.write("stdout", line)  # many tail files' worth before the next poll
    seen += reader.poll()
    log.close()
    (tmp_path / "0.exit").write_text("{}")
    seen += reader.poll()
    data = b"".join(c.data for c in seen)
    assert b"moved on faster than it was read: some output left out here" in data
    assert data.endswith(b"]\n") and b"0009999\n" in data
    assert data.count(b"0009999\n") == 1


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_follower_of_one_stream_sees_its_tail_once(tmp_path, stream):
    """``logs -f --stdout`` (or ``--stderr``) of a cut log: that stream's bytes, each once, in order."""
    log = CappedLog(str(tmp_path / "0"), 16 << 10)
    reader = LogReader(local_fetch(str(tmp_path)), [0], (stream,))
    lines = [(("stderr" if i % 3 == 0 else "stdout"), f"{i:07d}\n".encode()) for i in range(20_000)]
    seen = []
    for i, (s, line) in enumerate(lines):
        log.write(s, line)
        if i % 50 == 0:
            seen += reader.poll()
    log.close()
    (tmp_path / "0.exit").write_text("{}")
    seen += reader.poll()
    assert reader.done and {c.stream for c in seen} == {stream}
    data = b"".join(c.data for c in seen)
    mine = b"".join(line for s, line in lines if s == stream)
    if stream == "stdout":
        assert data == mine  # the log's notes are on stderr
    else:  # the log's note once, where the rank ended (before what this reader had not read yet)
        before, rest = data.split(b"\n[monarch: its log was cut", 1)
        note, after = rest.split(b"]\n", 1)
        assert before + after == mine and b"[monarch:" not in before + after
