"""The order examples are batched in: similar lengths together, so that batches pad little.

Training with training.sampling group_by_length draws its batches from `LengthBucketSampler`; the Trainer mixin
that installs it is `LengthBatching`, at its end, with the eval sets' order and collation.
"""

from __future__ import annotations

import contextlib


class LengthBucketSampler:
    """Indices in batches of nearly equal length, in an order drawn from seed + epoch.

    Examples are shuffled, sorted by length (ties keep their shuffled order), cut into batches, and the batches
    shuffled, so each batch holds examples of nearly one length. That pads least, and costs learning where length
    follows the kind of example (short labels, long passages): each batch then holds one kind, and the steps pull
    in turn towards each (benchmarks/learning.py measures it; random order is the default). transformers' own
    sampler only sorts within "megabatches" of 50 batches, which at the batch sizes of a CPU run is nearly as
    segregated and pads more. The order is drawn from seed + epoch, not from the global torch RNG, whose state at
    the start of epoch 2 differs between an uninterrupted run and a resumed one: a resumed run sees the same
    batches.

    The batch holding the longest example comes first, as in transformers' sampler, so a batch
    too large for memory fails at step 1 rather than hours in. A last, smaller batch stays last:
    the data loader cuts this index stream into batches in order, and a short batch in the middle
    would shift every later cut.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed, self.epoch = list(lengths), batch_size, seed, 0

    def __len__(self) -> int:
        return len(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer (and by accelerate on every process) before each epoch."""
        self.epoch = epoch

    def __iter__(self):
        import torch

        if not self.lengths:
            return iter([])
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        shuffled = torch.randperm(len(self.lengths), generator=generator)
        lengths = torch.tensor(self.lengths)[shuffled]
        by_length = shuffled[torch.sort(lengths, descending=True, stable=True).indices]
        batches = list(by_length.split(self.batch_size))
        last = [batches.pop()] if len(batches) > 1 and len(batches[-1]) < self.batch_size else []
        middle = [batches[i] for i in (torch.randperm(len(batches) - 1, generator=generator) + 1).tolist()]
        return iter(torch.cat(batches[:1] + middle + last).tolist())


class LengthBatching:
    """Trainer mixin: the bucketed train order for group_by_length, and eval sets read in their own order.

    The Trainer would otherwise shuffle a group_by_length eval set too, and predictions would no longer line up
    with the data. `evaluation.evaluate.shortest_first` sorts an eval set by length before the Trainer reads it;
    callers map results back with the order it returns."""

    batch_order = "random"  # training.sampling as resolved (arguments.batch_order); set by build_trainer

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler).__name__ == "LengthGroupedSampler":
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return LengthBucketSampler(sampler.lengths, sampler.batch_size, seed)
        return sampler

    def batch_order_record(self) -> dict:
        """What manifest.json says of the train batches: their order, and how their examples are laid out."""
        layout = getattr(getattr(self.data_collator, "collate", None), "layout", "padded")
        return {"sampling": self.batch_order, "layout": layout}

    def get_eval_dataloader(self, eval_dataset=None):
        with self._padded_collator():
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset):
        with self._padded_collator():
            return super().get_test_dataloader(test_dataset)

    @contextlib.contextmanager
    def _padded_collator(self):
        """Eval batches padded, where training lays each batch in one row (data.packing padding_free): accelerate's
        even batches over processes, and gather_for_metrics, count an eval batch by its rows."""
        counter = self.data_collator
        padded = getattr(getattr(counter, "collate", None), "padded", None)
        if padded is not None:
            self.data_collator = type(counter)(padded)  # (the loader keeps the collator it is built with)
        try:
            yield
        finally:
            self.data_collator = counter

    def _get_eval_sampler(self, eval_dataset):
        from torch.utils.data import SequentialSampler

        if eval_dataset is None or self.args.world_size > 1:
            return None  # (several processes: accelerate shards the set in order)
        return SequentialSampler(eval_dataset)
