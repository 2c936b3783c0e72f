"""Reading the TensorBoard event files that training writes into train_dir/EXPERIMENT/ (tensorboardX names them
events.out.tfevents.<unix time>.<host>): the scalar series, with TensorBoard's own reader
(tensorboard.backend.event_processing.event_file_loader), file by file in name order (= creation order).

For python -m sf.plot, sf.card, sf.launch's run states and sf.runner.stats.read_event_scalars (tests, benchmarks).
"""
from __future__ import annotations

from pathlib import Path

# tensorboard is imported where the files are read: importing this module (sf.runner.stats does, in every training
# run) stays fast, and training never needs the reader.

EVENT_GLOB = "events.out.tfevents.*"


def event_files(exp_dir: Path) -> list[Path]:
    """The TensorBoard event files directly in exp_dir, in name order: tensorboardX names them
    events.out.tfevents.<unix time>.<host>, so a resumed run's newer file comes after the older one."""
    return sorted(p for p in Path(exp_dir).glob(EVENT_GLOB) if p.is_file() and not p.name.endswith(".profile-empty"))


def read_scalar_events(exp_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Reads every event file of exp_dir (`event_files`) with TensorBoard's reader and returns
    tag -> [(step, wall_time, value)] for the scalar summaries, in file order (no sorting, no de-duplication).
    A truncated last record (a run still writing) ends that file quietly, as in TensorBoard."""
    # LegacyEventFileLoader yields the Event protos as written (what EventAccumulator reads scalars with);
    # EventFileLoader would first rewrite simple_value into tensors for the plugin system.
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    scalars: dict[str, list[tuple[int, float, float]]] = {}
    tensor_scalar_tags: set[str] = set()  # TF2-style writers mark the plugin only on a tag's first value
    for path in event_files(exp_dir):
        for event in LegacyEventFileLoader(str(path)).Load():
            for v in event.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":  # tensorboardX's add_scalar
                    value = v.simple_value
                elif kind == "tensor" and (v.tag in tensor_scalar_tags
                                           or v.metadata.plugin_data.plugin_name == "scalars"):
                    from tensorboard.util.tensor_util import make_ndarray
                    tensor_scalar_tags.add(v.tag)
                    value = float(make_ndarray(v.tensor))
                else:
                    continue  # images, histograms, text: not curves
                scalars.setdefault(v.tag, []).append((event.step, event.wall_time, float(value)))
    return scalars


def drop_orphans(points: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """points [(step, wall_time, value)] in file order, without those a restart made orphans: when the step goes back
    (a run resumed from a checkpoint older than its last summaries), the earlier points at or past that step are
    dropped, as TensorBoard does (purge_orphaned_data). Equal steps are kept (train/policy_lag_batches repeats them)."""
    kept: list[tuple[int, float, float]] = []
    for p in points:
        if kept and p[0] < kept[-1][0]:
            kept = [q for q in kept if q[0] < p[0]]
        kept.append(p)
    return kept
