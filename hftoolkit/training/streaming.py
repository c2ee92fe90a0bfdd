"""Training on a stream (data.streaming) and resuming it where it stopped, without reading it again.

The Trainer resumes by skipping the batches already trained on (accelerate's `skip_first_batches`), which on a
stream means reading, tokenizing and collating every row again; a datasets `IterableDataset` instead saves its
position (`state_dict()`): `row_stream` notes it, `StreamPosition` saves it with each checkpoint and restores it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

POSITION_FILE = "stream_position.json"
# Positions kept: enough to cover the batches the data loader has read ahead of training.
KEPT_POSITIONS = 64


def row_stream(stream, rows_per_batch: int):
    """The Trainer's train data set for an encoded `datasets.IterableDataset` (a torch IterableDataset).

    It notes the stream's position (the shard, the row in it, the rows a batched map has already given out of its
    current batch) after every `rows_per_batch` rows it gives out. The data loader reads ahead of training, so the
    position a checkpoint needs is the one noted at the rows its step had taken (optimizer steps x rows per step),
    not the rows read so far. On resume nothing before the position is read again but the one map batch in flight,
    whose rows already given out are dropped. A stream that ends before training.max_steps starts again from its
    first row (the Trainer's next epoch).
    """
    import torch

    class RowStream(torch.utils.data.IterableDataset):
        def __init__(self):
            self.stream, self.every = stream, rows_per_batch
            self.start = stream.state_dict()  # the first row: where a new pass begins
            self.rows = 0  # rows given out, over all passes
            self.positions: OrderedDict[int, dict] = OrderedDict()
            self.resumed: dict | None = None
            self.on_resume = None

        def __iter__(self):
            state, self.resumed = self.resumed or self.start, None
            self.stream.load_state_dict(state)  # (datasets keeps it: every later pass would start there too)
            self._note(state)
            if self.on_resume is not None:
                self.on_resume()
                self.on_resume = None
            for row in self.stream:
                yield row
                self.rows += 1  # the consumer asked for the next row: this one is taken
                if self.rows % self.every == 0:
                    self._note(self.stream.state_dict())

        def _note(self, state: dict) -> None:
            self.positions[self.rows] = state
            while len(self.positions) > KEPT_POSITIONS:
                self.positions.popitem(last=False)

        def position(self, rows: int) -> dict | None:
            return self.positions.get(rows)

        def resume(self, rows: int, state: dict, on_resume=None) -> None:
            self.rows, self.resumed, self.on_resume = rows, state, on_resume

    return RowStream()


class StreamPosition:
    """Trainer mixin: the stream's position saved with each checkpoint and restored on resume.

    The position goes into each checkpoint as stream_position.json, beside the RNG states; on --resume it is loaded
    into the stream, with `ignore_data_skip` set so the Trainer skips nothing. The RNG states are loaded as the first
    resumed batch is read, after the data loader's iterator has drawn its seed, which is where the uninterrupted
    run's RNG stood at that step.
    """

    def _rows_per_step(self) -> int:
        a = self.args
        return a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        stream = self.train_dataset
        if not hasattr(stream, "position") or not self.args.should_save:
            return
        rows = self.state.global_step * self._rows_per_step()
        state = stream.position(rows)
        if state is None:
            raise RuntimeError(f"the stream's position at row {rows} was not noted (noted: {list(stream.positions)})")
        (Path(output_dir) / POSITION_FILE).write_text(json.dumps({"rows": rows, "state": state}))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        stream = self.train_dataset
        saved = Path(checkpoint) / POSITION_FILE if checkpoint else None
        if hasattr(stream, "resume") and saved is not None and saved.is_file():
            position = json.loads(saved.read_text())
            stream.resume(position["rows"], position["state"], on_resume=lambda: self._load_rng_state(checkpoint))
