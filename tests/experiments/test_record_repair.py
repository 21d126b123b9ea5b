"""Record and trace files: repair moves, never deletes; reads never rewrite.

Real files throughout: the bytes a kill or a disk error leaves behind are
written by hand, then the real writers (RecordFile, TraceFile) and readers
(load_records, analysis) open them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import stat
from pathlib import Path

from contextrender.analysis import tables
from contextrender.experiments.evaluation.traces import write_trace
from contextrender.experiments.records.jsonl import quarantine_path
from contextrender.experiments.records.schema import RecordFile, load_records
from contextrender.experiments.runtime.runner import TraceFile


def line(key: str, **kw) -> bytes:
    return json.dumps({"key": key, **kw}).encode() + b"\n"


CORRUPT = b'{"key": "k2", "x": \x00garbage}\n'  # a sector of junk in the middle of the file
TORN = b'{"key": "k9", "x"'  # a kill in the middle of the last write


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_open_for_writing_quarantines_a_middle_line_and_keeps_every_valid_one(tmp_path, caplog):
    path = write(tmp_path / "records" / "r.jsonl", line("k1") + CORRUPT + line("k3") + line("k4"))
    inode = path.stat().st_ino
    with caplog.at_level(logging.WARNING):
        rf = RecordFile(path)
    assert rf.done_keys() == {"k1", "k3", "k4"}  # today everything after the bad line is cut off
    assert path.read_bytes() == line("k1") + line("k3") + line("k4")
    assert quarantine_path(path).read_bytes() == CORRUPT  # the bad bytes, exactly, beside the file
    assert f"{path}:2" in caplog.text and "quarantine" in caplog.text
    # rewritten through a new file and os.replace, not truncated in place; no temp file left behind
    assert path.stat().st_ino != inode
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.jsonl", "r.jsonl.quarantine"]
    rf.append({"key": "k5"})
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k1", "k3", "k4", "k5"]
    # a clean file is left alone when it is opened again
    inode, before = path.stat().st_ino, digest(path)
    RecordFile(path)
    assert (path.stat().st_ino, digest(path)) == (inode, before)
    assert quarantine_path(path).read_bytes() == CORRUPT


def test_torn_tail_goes_to_quarantine_and_appends_resume(tmp_path):
    path = write(tmp_path / "records" / "r.jsonl", line("k1") + line("k2") + TORN)
    rf = RecordFile(path)
    assert rf.done_keys() == {"k1", "k2"}
    assert quarantine_path(path).read_bytes() == TORN + b"\n"
    rf.append({"key": "k3"})
    assert path.read_bytes() == line("k1") + line("k2") + b'{"key": "k3"}\n'
    assert stat.S_IMODE(quarantine_path(path).stat().st_mode) == 0o600  # it holds transcript bytes too


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = write(tmp_path / "records" / "r.jsonl", line("k1") + line("k2").rstrip(b"\n"))
    rf = RecordFile(path)
    assert rf.done_keys() == {"k1", "k2"}  # today k2 is truncated away
    rf.append({"key": "k3"})
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k1", "k2", "k3"]
    assert not quarantine_path(path).exists()


def test_reads_never_rewrite_and_name_the_bad_line(tmp_path, caplog):
    data = line("k1", method="full") + CORRUPT + line("k3") + TORN
    path = write(tmp_path / "run" / "records" / "r.jsonl", data)
    with caplog.at_level(logging.WARNING):
        recs = load_records(tmp_path / "run")
    assert [r["key"] for r in recs] == ["k1", "k3"]
    assert path.read_bytes() == data  # today load_records truncates the file at the first bad line
    assert not quarantine_path(path).exists()
    assert f"{path}:2" in caplog.text
    assert f"{path}:4" not in caplog.text  # a torn tail may be a line being written right now: no alarm
    assert RecordFile(path).load() and path.read_bytes() != data  # only opening for writing repairs


def test_analysis_reads_do_not_touch_the_files(tmp_path):
    rec = {"key": "m|b|t|full|6000|h", "model": "m", "benchmark": "appworld_x", "task": "t", "method": "full",
           "budget": 6000, "status": "ok", "score": {"tgc": 1.0}, "exceeded_budget": True,
           "usage": {"agent": {"input": 10, "output": 1, "cached": 0}}}
    data = json.dumps(rec).encode() + b"\n" + CORRUPT + TORN
    path = write(tmp_path / "run" / "records" / "m__b__full__B6000.jsonl", data)
    df, _, _, _ = tables.build([tmp_path / "run"])
    assert len(df) == 1 and path.read_bytes() == data


def test_trace_prune_quarantines_undecodable_lines(tmp_path, caplog):
    def tline(key: str) -> bytes:
        return json.dumps({"task_id": key, "key": key, "messages": [{"role": "user", "content": "hi"}]},
                          ensure_ascii=False).encode() + b"\n"

    bad = b"\xff\xfe not utf-8\n"
    path = write(tmp_path / "traces" / "t.jsonl", tline("k1") + bad + tline("orphan") + tline("k1") + tline("k2"))
    with caplog.at_level(logging.WARNING):
        report = TraceFile(path).prune({"k1", "k2"})
    # the orphan (its record was never written) and the repeat of k1 are dropped; the junk is kept aside
    assert path.read_bytes() == tline("k1") + tline("k2")
    assert quarantine_path(path).read_bytes() == bad
    assert (report.quarantined, report.dropped) == (1, 2)
    assert f"{path}:2" in caplog.text


def test_record_and_trace_lines_are_appended_whole_to_private_files(tmp_path):
    rf = RecordFile(tmp_path / "records" / "r.jsonl")
    rf.append({"key": "a", "text": "ünï\ncode"})
    rf.append({"key": "b"})
    tf = TraceFile(tmp_path / "traces" / "t.jsonl")
    tf.append("a", "task-a", [{"role": "user", "content": "line1\nline2"}])
    assert [json.loads(x)["key"] for x in rf.path.read_text().splitlines()] == ["a", "b"]
    assert [json.loads(x)["key"] for x in tf.path.read_text().splitlines()] == ["a"]
    write_trace(tmp_path / "export" / "e.jsonl", "task-e", [{"role": "user", "content": "hi"}])
    for p in (rf.path, tf.path, tmp_path / "export" / "e.jsonl"):  # complete transcripts: owner only
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
