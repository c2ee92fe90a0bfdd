"""Padding-free packing: whole examples packed into full rows (data.packing: true), or each batch's examples in
one row (padding_free), attention kept apart.

Position ids restart at 0 for every example of a row, and transformers 5 lets each token attend only within its
own example (job/architectures.packs_by_positions says which model types do). Rows are filled best-fit, longest
first, up to data.max_length tokens; docs/architecture.md says how the collator and flash attention read them.
"""

from __future__ import annotations

import bisect

from hftoolkit.sources.labels import IGNORE_INDEX


def pack(dataset, capacity: int):
    """Rows of whole examples (input_ids, labels, position_ids, length), each at most `capacity` tokens."""
    import datasets

    lengths = dataset["length"]
    capacity = max(capacity, max(lengths, default=0))
    rows = _best_fit(lengths, capacity)
    ids, labels = dataset["input_ids"], dataset["labels"]
    columns = {"input_ids": [], "labels": [], "position_ids": [], "length": []}
    for row in rows:
        columns["input_ids"].append([t for i in row for t in ids[i]])
        columns["labels"].append([t for i in row for t in labels[i]])
        columns["position_ids"].append([p for i in row for p in range(len(ids[i]))])
        columns["length"].append(sum(lengths[i] for i in row))
    return datasets.Dataset.from_dict(columns)


def _best_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """Example indices grouped into rows: longest first, each into the row it fills most tightly."""
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (space left, row), sorted
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            rows.append([i])
            bisect.insort(free, (capacity - lengths[i], len(rows) - 1))
            continue
        space, row = free.pop(at)
        rows[row].append(i)
        bisect.insort(free, (space - lengths[i], row))
    return rows


class PackedCollator:
    """Batches of packed rows: each row flattened by DataCollatorWithFlattening (position ids restarting per
    example, no attention mask), the rows right-padded and stacked; or, for flash attention, one flat row."""

    layout = "packed_rows"  # (what manifest.json's batch_order says)

    def __init__(self, tokenizer, flat: bool = False):
        from transformers import DataCollatorWithFlattening

        self.flatten = DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE_INDEX)
        self.pad_id, self.flat = tokenizer.pad_token_id, flat

    def __call__(self, rows: list[dict]) -> dict:
        return self.collate([split_row(row) for row in rows])

    def collate(self, rows: list[list[dict]]) -> dict:
        """A batch of rows, each a list of examples (input_ids, labels)."""
        import torch

        if self.flat:
            return self.flatten([e for row in rows for e in row], return_tensors="pt")
        batches = [self.flatten(row, return_tensors="pt") for row in rows]
        width = max(b["input_ids"].shape[1] for b in batches)
        out = {}
        for key, fill in (("input_ids", self.pad_id), ("labels", IGNORE_INDEX), ("position_ids", None)):
            parts = []
            for b in batches:
                missing = width - b[key].shape[1]
                # padding positions count up from 0: a segment of its own that no real token attends to
                pad = torch.arange(missing) if fill is None else torch.full((missing,), fill)
                parts.append(torch.cat([b[key][0], pad.to(b[key].dtype)]))
            out[key] = torch.stack(parts)
        return out


class FlatCollator(PackedCollator):
    """A batch of examples packed into rows (data.packing: padding_free, `rows_of`): position ids restarting per
    example, the first label of each example -100 so that no example's loss reads the one before it; no attention
    mask, and little padding. Rows, not one row for the batch: attention over a row costs its length squared (its
    block-diagonal mask is computed in full), so rows are as long as `break_even` makes them pay. For flash
    attention, whose kernel reads each example's bounds from the position ids, one row. Eval batches are padded by
    `padded` (training.batching.LengthBatching)."""

    layout = "padding_free"

    def __init__(self, tokenizer, padded, flat: bool = False, break_even: float = float("inf")):
        super().__init__(tokenizer, flat)
        self.padded, self.break_even = padded, break_even

    def __call__(self, examples: list[dict]) -> dict:
        examples = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in examples]
        rows = rows_of([len(e["input_ids"]) for e in examples], self.break_even)
        return self.collate([[examples[i] for i in row] for row in rows])


# What a FLOP of attention over a masked row costs against one of a matrix product: torch's kernels compute the
# mask's every block and run below the matmuls' rate (benchmarks/decoder_step.py --layouts measures the two layouts).
ATTENTION_FLOP_COST = 4


def attention_break_even(config) -> float:
    """The row length at which a token's attention costs as much as its layer's linear products: per token, the
    products cost 2 x the layer's weights in FLOPs, and attention over a row of L tokens 4 x hidden x L (scores and
    values), each FLOP ATTENTION_FLOP_COST times dearer."""
    get = lambda *names, default=0: next((getattr(config, n) for n in names if getattr(config, n, None)), default)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model")
    heads = get("num_attention_heads", "n_head")
    kv = get("num_key_value_heads", default=heads) * hidden // max(1, heads)
    gated = getattr(config, "hidden_act", None) in ("silu", "swish")  # (llama's MLP and its kin: three products)
    weights = hidden * (2 * hidden + 2 * kv) + (3 if gated else 2) * hidden * get("intermediate_size", "n_inner",
                                                                                   default=4 * hidden)
    return weights / (2 * hidden * ATTENTION_FLOP_COST) if hidden else float("inf")


def rows_of(lengths: list[int], break_even: float = float("inf")) -> list[list[int]]:
    """The batch's examples best-fit into the rows that cost least: rows of the longest example's length, twice it,
    and so on up to one row for the whole batch; the rows are padded to the longest, and a row of width W costs
    W x (1 + W / break_even) (its tokens' linear products and their attention)."""
    capacity, total = max(lengths, default=0), sum(lengths)
    best, best_cost = None, float("inf")
    while True:
        rows = _best_fit(lengths, capacity)
        width = max(sum(lengths[i] for i in row) for row in rows) if rows else 0
        cost = len(rows) * width * (1 + width / break_even)
        if cost < best_cost:
            best, best_cost = rows, cost
        if capacity >= total:
            return best
        capacity *= 2


def split_row(row: dict) -> list[dict]:
    """A packed row's examples, where its position ids restart."""
    positions = list(row["position_ids"])
    starts = [i for i, p in enumerate(positions) if p == 0] + [len(positions)]
    return [{"input_ids": list(row["input_ids"][a:b]), "labels": list(row["labels"][a:b])}
            for a, b in zip(starts, starts[1:])]
