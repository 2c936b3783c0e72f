"""The stop's pieces without processes (sf/runner/health/stopping.py, sf/utils/files.py): a save's progress as its
bytes go out, the SIGTERM deadline, the Done line's account of the checkpoints as they are on disk."""
import io

import torch

from sf.learning.checkpoint import make_checkpoint_state
from sf.learning.checkpoint_store import CheckpointManager
from sf.runner.health.stopping import checkpoint_note, sigterm_deadline
from sf.utils.files import ProgressFile, write_atomic


def test_progress_file_beats_per_chunk_and_writes_the_same_bytes(monkeypatch):
    monkeypatch.setattr(ProgressFile, "CHUNK", 1000)
    beats, out = [], io.BytesIO()
    f = ProgressFile(out, lambda: beats.append(out.tell()))
    data = bytes(range(256)) * 10  # 2,560 bytes: chunks of 1000, 1000, 560
    assert f.write(data) == len(data)
    assert out.getvalue() == data and beats == [1000, 2000, 2560]


def test_a_checkpoint_saved_with_progress_loads_as_one_saved_without(tmp_path):
    model = torch.nn.Linear(300, 300)
    beats = []
    state = make_checkpoint_state(model, torch.optim.Adam(model.parameters()), 3, 96, {"k": 1})
    with_progress = CheckpointManager(tmp_path / "a", progress=lambda: beats.append(1)).save(state, 3, 96)
    without = CheckpointManager(tmp_path / "b").save(state, 3, 96)
    assert len(beats) >= 3  # the tensors' records, and the fsync
    assert with_progress.read_bytes() == without.read_bytes()
    write_atomic(tmp_path / "x", lambda f: f.write(b"abc"), progress=lambda: beats.append(2))
    assert (tmp_path / "x").read_bytes() == b"abc" and beats[-2:] == [2, 2]  # the write, then the fsync


def test_sigterm_deadline_leaves_the_runner_a_margin_of_the_grace():
    assert sigterm_deadline(None, 30.0) is None  # no SIGTERM
    assert sigterm_deadline(100.0, 0.0) is None  # --sigterm_grace_sec 0: as Ctrl-C
    assert sigterm_deadline(100.0, 30.0) == 125.0  # 5 s for the runner's own exit
    assert sigterm_deadline(100.0, 4.0) == 103.0  # at most a quarter of a short grace


def test_checkpoint_note_names_the_files_as_they_are(tmp_path):
    exp = tmp_path / "exp"
    assert checkpoint_note(exp, [0], set()) == f"No checkpoint written: {exp / 'checkpoint_p0'} holds none"
    model = torch.nn.Linear(2, 2)
    state = make_checkpoint_state(model, torch.optim.Adam(model.parameters()), 5, 640, {})
    kept = CheckpointManager(exp, policy_id=0).save(state, 5, 640)
    assert checkpoint_note(exp, [0], set()) == f"No final checkpoint; the last one kept: {kept}"
    assert checkpoint_note(exp, [0], {str(kept)}) == f"Final checkpoint: {kept}"
    population = checkpoint_note(exp, [0, 1], set())
    assert population == (f"Checkpoints in {exp}: policy 0 no final (kept checkpoint_p0/{kept.name}), "
                          "policy 1 none written")
    assert checkpoint_note(exp, [0, 1], {str(kept)}).endswith(f"policy 0 final checkpoint_p0/{kept.name}, "
                                                              "policy 1 none written")
