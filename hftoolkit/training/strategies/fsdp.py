"""FSDP (torch's FSDP2, `fully_shard`): each process holds 1/N of every weight, its gradients and its optimizer
states, and gathers a block's weights for the moment it computes with them. CPU processes over gloo take the GPU
path (Trainer -> Accelerator.prepare -> fsdp2_prepare_model, save_fsdp_model, load_fsdp_model) once
`building_trainer` completes the decision accelerate skips on a CPU (`patches.accelerate_1_15.fsdp_on_cpu`).
"""

from __future__ import annotations

from hftoolkit.training.strategies.base import Strategy, has_cuda


class FSDP(Strategy):
    name = "fsdp"
    label = "FSDP"
    shards_parameters = shards_gradients = shards_optimizer = True
    sharding = record_name = "FSDP"

    def problems(self, recipe, cuda: bool | None = None, model_type: str | None = None) -> list[str]:
        problems = super().problems(recipe, cuda, model_type)
        quantization = recipe.model.quantization
        # QLoRA under FSDP: 4-bit weights stored in the training dtype (bnb_4bit_quant_storage) are floating tensors
        # FSDP can shard; 8-bit weights are int8 tensors with their scales beside them, which it can't.
        if quantization == "8bit":
            problems.append(f"model.quantization: 8bit (bitsandbytes) weights cannot be sharded across processes, "
                            f"which FSDP ({self.launch.source}) does to every weight (4-bit weights can: set "
                            "model.quantization to 4bit): use DDP (--num-processes N or recipes/accelerate/ddp.yaml) "
                            "or DeepSpeed ZeRO-2, or set model.quantization to none")
        elif quantization == "4bit" and not (has_cuda() if cuda is None else cuda):
            # On 2 CPU processes the first step's gradient norm came out infinite in some runs, with FSDP's reshard
            # after forward on or off (bitsandbytes' CPU 4-bit path under FSDP2); one process trains normally.
            problems.append(f"model.quantization: 4bit under FSDP ({self.launch.source}) trains on GPUs only; on CPU "
                            "processes its first gradients come out infinite in some runs: use DDP (--num-processes "
                            "N) for 4-bit on the CPU, or set model.quantization to none for FSDP")
        return problems

    def load_arguments(self, quantization) -> dict:
        # FSDP shards a unit's parameters as one flat tensor of one dtype: the unquantized ones in the dtype the
        # 4-bit weights are stored in, the training dtype.
        return {"dtype": quantization.bnb_4bit_quant_storage} if quantization is not None else {}

    def quantization_arguments(self, compute_dtype) -> dict:
        # The packed 4-bit weights stored in the training dtype (QLoRA with FSDP, as peft documents it), so that
        # FSDP can shard them with the other parameters; elsewhere bitsandbytes' default (uint8).
        return {"bnb_4bit_quant_storage": compute_dtype}

    def receives_weights(self) -> bool:
        """RAM-efficient loading (fsdp_cpu_ram_efficient_loading): only the first process reads the checkpoint, and
        fsdp2_prepare_model broadcasts its weights to the others as it shards the model."""
        from hftoolkit.training.strategies.launch import this_process

        return self.launch.ram_efficient_loading and this_process().rank > 0

    def building_trainer(self):
        from hftoolkit.patches.accelerate_1_15 import fsdp_on_cpu

        return fsdp_on_cpu()

    def prepare(self, trainer, run) -> None:
        wrap_blocks_without_embeddings(trainer.accelerator.state.fsdp_plugin, trainer.model)
        one_module_per_shared_embedding(trainer.model)
        trainer.add_callback(sharding_recorded(run, self))

    def save(self, trainer, target) -> None:
        save_sharded(trainer, target)


def save_sharded(trainer, target) -> None:
    """The Trainer's save_model gathers the shards (a collective call) and writes on the main process alone."""
    trainer.save_model(str(target))
    if trainer.args.should_save:
        (target / "training_args.bin").unlink(missing_ok=True)  # pickled arguments: not weights, not kept


def wrap_blocks_without_embeddings(plugin, model) -> None:
    """Wrap the model's blocks as FSDP units, leaving out a block class that holds the input embeddings.

    Why: accelerate's fsdp2_prepare_model wraps each class in the model's _no_split_modules, then shards the input
    embeddings as a unit of their own; where a wrapped class holds them (BERT's BertEmbeddings and ViT's
    ViTEmbeddings are in _no_split_modules) they would be sharded twice and fully_shard fails ("value was None" in
    DeviceMesh._concatenate). Left out of the list, that class's other weights (position embeddings, a LayerNorm)
    go to the root unit. A config that names its classes (fsdp_transformer_layer_cls_to_wrap) is left as it is.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if plugin.auto_wrap_policy is not transformer_auto_wrap_policy or plugin.transformer_cls_names_to_wrap:
        return
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    holders = {type(m).__name__ for m in model.modules()
               if embeddings is not None and any(e is embeddings for e in m.modules())}
    plugin.transformer_cls_names_to_wrap = [name for name in getattr(model, "_no_split_modules", None) or []
                                            if name not in holders]


def one_module_per_shared_embedding(model) -> None:
    """Make every embedding module that holds the input embeddings' weight that module itself.

    Why: T5 and BART keep the shared embedding as three modules over one weight (`shared`, the encoder's and the
    decoder's `embed_tokens`). accelerate's fsdp2_prepare_model shards `shared` with the output head as one unit,
    and the stacks' copies would leave the same weight to the root unit too, which FSDP2 refuses ("shared with a
    parameter already managed by another FSDP group"). A copy of the same class and settings (BART's embed_scale)
    computes exactly what `shared` computes, so the module itself takes its place; another kind is left alone.
    """
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if weight is None:
        return
    settings = lambda m: {k: v for k, v in vars(m).items() if not k.startswith("_") and k != "training"}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if (module is not embeddings and getattr(module, "weight", None) is weight and type(module) is type(embeddings)
                and settings(module) == settings(embeddings)):
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attribute, embeddings)


def sharding_record(model) -> dict:
    """How much of the model this process holds: the share of the elements of the sharded parameters
    (DTensors) that are local here, and how many parameters are sharded (manifest.json's "distributed")."""
    from torch.distributed.tensor import DTensor

    sharded = [p for p in model.parameters() if isinstance(p, DTensor)]
    local = sum(p.to_local().numel() for p in sharded)
    total = sum(p.numel() for p in sharded)
    return {"sharded_parameters": len(sharded), "of_parameters": sum(1 for _ in model.parameters()),
            "local_fraction": round(local / total, 4) if total else None}


def sharding_recorded(run, strategy: FSDP):
    """A callback that, once the Trainer has sharded the model, adds to manifest.json's "distributed" record
    each process's share of the sharded parameters (`local_fraction`, one per process: 1/N each under FULL_SHARD)
    and how many parameters are sharded, and which processes read the checkpoint (`read_checkpoint`: only the
    first under RAM-efficient loading). Every process computes its share; the main process writes."""
    from accelerate.utils import gather_object
    from transformers import TrainerCallback

    class ShardingRecorded(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            mine = sharding_record(model)
            shares = gather_object([mine["local_fraction"]])
            read = gather_object([not strategy.receives_weights()])
            if args.should_save:  # (the run directory's writer: workflows/train.writes_run)
                record = run.manifest().get("distributed") or {}
                run.update_manifest(distributed={**record, "sharded_parameters": mine["sharded_parameters"],
                                                 "of_parameters": mine["of_parameters"], "local_fraction": shares,
                                                 "read_checkpoint": read})

    return ShardingRecorded()
