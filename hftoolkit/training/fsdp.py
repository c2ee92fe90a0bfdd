"""FSDP on CPU processes: the one place hftoolkit steps in where accelerate decides by the device type.

accelerate 1.15 turns a launch with ACCELERATE_USE_FSDP=true into DistributedType.FSDP only for
accelerator processes (AcceleratorState.__init__, state.py: the MULTI_GPU, MULTI_XPU... list); CPU
processes (MULTI_CPU, gloo) keep MULTI_CPU and the plugin is dropped, so they would train as plain DDP,
every process holding the whole model. torch's FSDP2 (`fully_shard`) shards over gloo on CPU as it
does over NCCL, so `fsdp_on_cpu` completes the decision accelerate skipped, while the Trainer builds
its Accelerator: the state becomes FSDP with the plugin that Accelerator built from the launcher's
environment, and from there the run takes the GPU path (Trainer -> Accelerator.prepare ->
fsdp2_prepare_model, save_fsdp_model, load_fsdp_model).

Also here: RAM-efficient loading (fsdp_cpu_ram_efficient_loading), where only the main process reads
the checkpoint and fsdp2_prepare_model broadcasts its weights to the others.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def fsdp_on_cpu():
    """Inside the block, an AcceleratorState that resolves MULTI_CPU under an FSDP launch becomes FSDP.

    Does what AcceleratorState.__init__ does for MULTI_GPU in the same case: the type, the plugin, the
    plugin's mixed precision, and PartialState's copy of the type. Nothing else in it depends on the device.
    """
    from hftoolkit.processes import sharding_launched

    if sharding_launched() != "FSDP":
        yield
        return
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = init
    try:
        yield
    finally:
        AcceleratorState.__init__ = original


def wrap_blocks_without_embeddings(plugin, model) -> None:
    """Wrap the model's blocks as FSDP units, leaving out a block class that holds the input embeddings.

    Why: accelerate 1.15's fsdp2_prepare_model wraps each class in the model's _no_split_modules, then
    shards the input embeddings as a unit of their own; where a wrapped class holds them (BERT's
    BertEmbeddings and ViT's ViTEmbeddings are in _no_split_modules) they would be sharded twice and
    fully_shard fails ("value was None" in DeviceMesh._concatenate). Left out of the list, that class's
    other weights (position embeddings, a LayerNorm) go to the root unit. A config that names its
    classes (fsdp_transformer_layer_cls_to_wrap) is left as it is.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if plugin.auto_wrap_policy is not transformer_auto_wrap_policy or plugin.transformer_cls_names_to_wrap:
        return
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    holders = {type(m).__name__ for m in model.modules()
               if embeddings is not None and any(e is embeddings for e in m.modules())}
    plugin.transformer_cls_names_to_wrap = [name for name in getattr(model, "_no_split_modules", None) or []
                                            if name not in holders]


def sharding_record(model) -> dict:
    """How much of the model this process holds: the share of the elements of the sharded parameters
    (DTensors) that are local here, and how many parameters are sharded (manifest.json's "distributed")."""
    from torch.distributed.tensor import DTensor

    sharded = [p for p in model.parameters() if isinstance(p, DTensor)]
    local = sum(p.to_local().numel() for p in sharded)
    total = sum(p.numel() for p in sharded)
    return {"sharded_parameters": len(sharded), "of_parameters": sum(1 for _ in model.parameters()),
            "local_fraction": round(local / total, 4) if total else None}


def sharding_recorded(run):
    """A callback that, once the Trainer has sharded the model, adds to manifest.json's "distributed" record
    each process's share of the sharded parameters (`local_fraction`, one per process: 1/N each under FULL_SHARD)
    and how many parameters are sharded, and which processes read the checkpoint (`read_checkpoint`: only the
    first under RAM-efficient loading). Every process computes its share; the main process writes."""
    from accelerate.utils import gather_object
    from transformers import TrainerCallback

    from hftoolkit.models.loading import receives_weights

    class ShardingRecorded(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            mine = sharding_record(model)
            shares = gather_object([mine["local_fraction"]])
            read = gather_object([not receives_weights()])
            if args.should_save:  # (the run directory's writer: workflows/train.writes_run)
                record = run.manifest().get("distributed") or {}
                run.update_manifest(distributed={**record, "sharded_parameters": mine["sharded_parameters"],
                                                 "of_parameters": mine["of_parameters"], "local_fraction": shares,
                                                 "read_checkpoint": read})

    return ShardingRecorded()
