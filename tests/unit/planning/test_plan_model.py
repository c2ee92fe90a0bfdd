"""The memory and time model behind `hftoolkit plan` (planning/model.py, planning/timing.py): its rules on
meta-device models built from tiny configs. No training, no timing: benchmarks/plan.py holds the plan against
measured runs."""

from __future__ import annotations

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.job.devices import GPUS, Device, device_named, device_with_memory
from hftoolkit.planning.model import (
    CPU_HEAP_RETAINED,
    ZERO3_KEPT_COPIES,
    Spread,
    model_shape,
    plan_memory,
)
from hftoolkit.planning.timing import plan_time
from tests.helpers import RECIPES

LENGTHS = {"max_length": 32, "max_target_length": 16, "max_new_tokens": 8}
SINGLE = Spread("single", 1, 1, False, False, False)


def recipe(path="decoder-clm.yaml", *sets):
    from hftoolkit.config.recipe import load_recipe

    return load_recipe(RECIPES / path, list(sets))


def full(*sets):
    return recipe("decoder-clm.yaml", "lora.enabled=false", "training.optimizer=adamw", *sets)


def meta(config, auto="AutoModelForCausalLM", lora=False):
    import transformers
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = getattr(transformers, auto).from_config(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
    return model


@pytest.fixture(scope="module")
def gpt2():
    import transformers

    return model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                                    n_positions=128)))


def states(plan) -> int:
    return sum(plan.items[k] for k in ("weights", "adapter", "gradients", "optimizer", "master weights"))


def test_mixed_precision_adamw_is_16_bytes_a_parameter(gpt2):
    plan = plan_memory(gpt2, full(), SINGLE, GPUS["a100-80gb"], "bf16", LENGTHS)
    assert states(plan) == 16 * gpt2["parameters"]
    assert plan.items["master weights"] == 0, "the Trainer's autocast trains the fp32 weights: they are the master"
    zero = Spread("zero2", 1, 1, False, True, True, "deepspeed")  # bf16 weights, fp32 master and gradient copies
    plan = plan_memory(gpt2, full(), zero, None, "bf16", LENGTHS)
    assert plan.items["weights"] == 2 * gpt2["parameters"] and plan.items["master weights"] == 4 * gpt2["parameters"]


def test_sharding_divides_what_the_strategy_shards(gpt2):
    single = plan_memory(gpt2, full(), SINGLE, None, "fp32", LENGTHS).items
    zero2 = plan_memory(gpt2, full(), Spread("zero2", 4, 4, False, True, True), None, "fp32", LENGTHS).items
    assert zero2["weights"] == single["weights"]
    assert zero2["gradients"] == pytest.approx(single["gradients"] / 4, abs=1)
    assert zero2["optimizer"] == pytest.approx(single["optimizer"] / 4, abs=1)
    for sharded in (Spread("fsdp", 4, 4, True, True, True), Spread("zero3", 4, 4, True, True, True)):
        items = plan_memory(gpt2, full(), sharded, None, "fp32", LENGTHS).items
        for key in ("weights", "gradients", "optimizer"):
            assert items[key] == pytest.approx(single[key] / 4, abs=1), (sharded.name, key)
        assert items["buffers"] > zero2["buffers"], "one layer gathered at a time (the logits alike)"
    ddp = plan_memory(gpt2, full(), Spread("ddp", 4, 4, False, False, False), None, "fp32", LENGTHS).items
    alike = plan_memory(gpt2, full(), Spread("other", 4, 4, False, False, False), None, "fp32", LENGTHS).items
    assert ddp["buffers"] - alike["buffers"] == ddp["gradients"], "DDP's buckets are a copy of the gradients"


def test_gradient_checkpointing_lowers_activations(gpt2):
    """(Over enough layers: the layer being recomputed and its gradients are live together, two layers' worth.)"""
    import transformers

    deep = model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=8, n_head=4, vocab_size=1000, n_positions=128)))
    plain = plan_memory(deep, full(), SINGLE, None, "fp32", LENGTHS).items["activations"]
    checkpointed = plan_memory(deep, full("training.gradient_checkpointing=true"), SINGLE, None, "fp32", LENGTHS)
    assert 0 < checkpointed.items["activations"] < plain
    bigger = plan_memory(deep, full("training.batch_size=16"), SINGLE, None, "fp32", LENGTHS).items["activations"]
    assert bigger > plain


def test_weights_shrink_with_their_precision():
    import transformers

    shape = model_shape(meta(transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                      num_attention_heads=4, vocab_size=1000), lora=True))
    weights = {}
    for name, sets in {"fp32": [], "bf16": ["model.dtype=bfloat16"], "8bit": ["model.quantization=8bit"],
                       "4bit": ["model.quantization=4bit"]}.items():
        weights[name] = plan_memory(shape, recipe("decoder-clm.yaml", *sets), SINGLE, None, "fp32",
                                    LENGTHS).items["weights"]
    assert weights["4bit"] < weights["8bit"] < weights["bf16"] < weights["fp32"]
    assert shape["quantizable"] > 0 and shape["adapter"] > 0 and shape["trainable"] == shape["adapter"]


def test_unknown_gpu_and_no_memory_are_one_line_user_errors():
    with pytest.raises(UserError) as err:
        device_named("b200x")
    assert "\n" not in err.value.message and err.value.message.startswith("--gpu b200x: unknown GPU; known: t4")
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(UserError) as err:
            device_with_memory(bad)
        assert "\n" not in err.value.message and err.value.message.startswith(f"--gpu-memory {bad}")
    assert device_named("A100-80GB") is GPUS["a100-80gb"]
    assert device_with_memory(24).memory == 24 * 2**30 and not device_with_memory(24).peak_flops


def test_model_states_match_deepspeeds_estimators_for_zero2_and_zero3():
    """DeepSpeed counts 2 + 18/N bytes a parameter under ZeRO-2: ours too (within 1%). Under ZeRO-3 it counts 18/N
    plus one fp32 layer; ours counts 20/N (the 16-bit gradient partition besides the fp32 one) and puts the gathered
    layer in the buffers: the model states differ by exactly that 2/N."""
    import transformers
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape = model_shape(meta(transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=5000)))
    n = shape["parameters"]
    z2 = plan_memory(shape, full(), Spread("zero2", 8, 8, False, True, True, "deepspeed"), None, "bf16", LENGTHS)
    assert states(z2) == pytest.approx(estimate_zero2_model_states_mem_needs(n, 8, 1, cpu_offload=False)[1], rel=0.01)
    z3 = plan_memory(shape, full(), Spread("zero3", 8, 8, True, True, True, "deepspeed"), None, "bf16", LENGTHS)
    _, theirs, layer = estimate_zero3_model_states_mem_needs(n, shape["largest_layer"], 8, 1, cpu_offload=False)
    assert states(z3) - (theirs - layer) == pytest.approx(2 * n / 8, rel=0.01)


def test_model_shape_of_tiny_bert_gpt2_and_t5(gpt2):
    import transformers

    bert = model_shape(meta(transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128, vocab_size=1000),
                            "AutoModelForSequenceClassification"))
    assert (bert["hidden"], bert["layers"], bert["heads"], bert["intermediate"], bert["vocab"]) == (64, 2, 4, 128, 1000)
    assert bert["embedding"] == (1000 + 512 + 2) * 64 and bert["trainable"] == bert["parameters"]
    assert bert["quantizable"] == 2 * (4 * 64 * 64 + 2 * 64 * 128) + 64 * 64, "the pooler too, not the classifier"
    assert (gpt2["hidden"], gpt2["layers"], gpt2["intermediate"], gpt2["seq2seq"]) == (64, 2, 256, False)
    block = 4 * 64 + 3 * 64 * 64 + 3 * 64 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64
    assert gpt2["parameters"] == (1000 + 128) * 64 + 2 * block + 2 * 64, "the LM head tied to the embeddings: once"
    assert gpt2["quantizable"] == 2 * (3 * 64 * 64 + 64 * 64 + 2 * 64 * 256), "Conv1D layers, not the tied head"
    t5 = model_shape(meta(transformers.T5Config(d_model=64, num_layers=2, num_decoder_layers=3, num_heads=4, d_kv=16,
                                                d_ff=128, vocab_size=1000), "AutoModelForSeq2SeqLM", lora=True))
    assert (t5["encoder_layers"], t5["decoder_layers"], t5["layers"], t5["seq2seq"]) == (2, 3, 5, True)
    assert t5["adapter"] > 0 and t5["trainable"] == t5["adapter"] and t5["base"] == t5["parameters"] - t5["adapter"]


def test_time_follows_the_flops_convention(gpt2):
    plan = plan_time(gpt2, full("training.max_steps=10"), SINGLE, GPUS["a100-80gb"], "bf16", LENGTHS, None, 100)
    tokens = 8 * 32
    per_token = 6 * gpt2["non_embedding"] + 3 * 4 * gpt2["layers"] * 32 * gpt2["hidden"]
    head = 3 * 2 * gpt2["hidden"] * gpt2["vocab"]  # the tied head trains: forward, input and weight gradients
    assert plan.flops_per_step == tokens * (per_token + head)
    assert set(plan.items) == {"products", "vocabulary"}
    assert plan.step_seconds == pytest.approx(sum(plan.items.values()))
    assert plan.rate == 312e12 * 0.4 and plan.train_seconds == pytest.approx(10 * plan.step_seconds)
    assert plan.eval_seconds > 0
    unknown = plan_time(gpt2, full(), SINGLE, device_with_memory(16), "bf16", LENGTHS, 100, 10)
    assert unknown.step_seconds is None and unknown.flops_per_step == plan.flops_per_step
    assert GPUS["t4"].peak_flops.get("bf16") is None, "no bf16 on a T4: no rate is made up"


def test_lora_adapters_add_their_own_products_which_outweigh_the_frozen_ones_at_a_rank_near_the_width():
    import transformers

    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128)
    plain = model_shape(meta(config))

    def flops(rank):
        from peft import LoraConfig, get_peft_model

        shape = model_shape(get_peft_model(meta(config), LoraConfig(r=rank, target_modules="all-linear")))
        plan = plan_time(shape, recipe("decoder-clm.yaml", f"lora.r={rank}"), SINGLE, GPUS["a100-80gb"], "bf16",
                         LENGTHS, None, None)
        return shape, plan.flops_per_step

    small, small_flops = flops(4)
    large, large_flops = flops(64)
    rows = recipe().training.batch_size
    assert large_flops - small_flops == rows * 32 * 6 * (large["adapter"] - small["adapter"])
    assert large["adapter"] > plain["non_embedding"], "at rank 64 on a 64-wide model the adapters outweigh the base"


def test_cpu_heap_keeps_a_fraction_of_the_activations_unless_the_mmap_threshold_is_fixed(gpt2, monkeypatch):
    cpu = Device("cpu", "cpu", 64 * 2**30, {})
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    plan = plan_memory(gpt2, full(), SINGLE, cpu, "fp32", LENGTHS)
    assert plan.items["heap"] == pytest.approx(CPU_HEAP_RETAINED * plan.items["activations"], abs=1)
    assert "heap" not in plan_memory(gpt2, full(), SINGLE, GPUS["a100-80gb"], "fp32", LENGTHS).items
    checkpointed = plan_memory(gpt2, full("training.gradient_checkpointing=true"), SINGLE, cpu, "fp32", LENGTHS)
    assert checkpointed.items["heap"] == plan.items["heap"], "the backward pass allocates the activations again"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert plan_memory(gpt2, full(), SINGLE, cpu, "fp32", LENGTHS).items["heap"] == 0


def test_zero3_keeps_the_whole_model_gathered_below_its_live_parameter_limit(gpt2):
    fsdp = plan_memory(gpt2, full(), Spread("fsdp", 4, 4, True, True, True), None, "fp32", LENGTHS).items
    zero3 = plan_memory(gpt2, full(), Spread("zero3", 4, 4, True, True, True, "deepspeed"), None, "fp32",
                        LENGTHS).items
    kept = ZERO3_KEPT_COPIES * 4 * zero3["weights"]
    assert zero3["buffers"] - fsdp["buffers"] == pytest.approx(kept, abs=4)


def test_fsdp_heap_keeps_the_larger_of_the_activations_and_the_gathered_parameters(gpt2, monkeypatch):
    cpu = Device("cpu", "cpu", 64 * 2**30, {})
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    for batch in ("training.batch_size=2", "training.batch_size=256"):
        ddp = plan_memory(gpt2, full(batch), Spread("ddp", 2, 2, False, False, False), cpu, "fp32", LENGTHS).items
        fsdp = plan_memory(gpt2, full(batch), Spread("fsdp", 2, 2, True, True, True), cpu, "fp32", LENGTHS).items
        gathered = 6 * 2 * fsdp["weights"]  # gathered twice, gradients reduced: each with FSDP2's copy
        assert fsdp["heap"] == pytest.approx(max(ddp["heap"], CPU_HEAP_RETAINED * gathered), abs=8)


def test_frozen_products_keep_no_input_and_lora_dropout_keeps_a_copy():
    import transformers
    from peft import LoraConfig, get_peft_model

    from hftoolkit.planning.model import activation_bytes

    def adapted(config, auto, targets, dropout):
        model = meta(config, auto)
        return model_shape(get_peft_model(model, LoraConfig(r=4, target_modules=targets, lora_dropout=dropout)))

    t5 = transformers.T5Config(d_model=64, num_layers=2, num_heads=4, d_kv=16, d_ff=128, vocab_size=1000)
    plain = model_shape(meta(t5, "AutoModelForSeq2SeqLM"))
    lora = adapted(t5, "AutoModelForSeq2SeqLM", ["q", "v"], 0.0)
    assert plain["lora_saved"] == [(0.0, 0.0), (0.0, 0.0)]
    # the encoder: no input of o, wi, wo (dropped out after the ReLU), nor the two RMSNorms' normalized inputs
    assert lora["lora_saved"][0] == (-4 * 64 - 128 + 2 * 4, 0.0)
    gpt2 = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128)
    dropped = adapted(gpt2, "AutoModelForCausalLM", ["c_attn", "c_proj", "c_fc"], 0.1)["lora_saved"]
    assert dropped == [(4 * 4, 3 * 64 + 256)], "each input copied once dropped out (in place of the base's), a mask"
    recipe, lengths = full(), {"max_length": 32}
    assert (activation_bytes(lora, recipe, 8, "fp32", lengths | {"max_target_length": 32}, False)[0]
            < activation_bytes(plain, recipe, 8, "fp32", lengths | {"max_target_length": 32}, False)[0])


def test_the_trainers_freed_gradients_share_memory_with_the_activations(gpt2):
    plan = plan_memory(gpt2, full("training.batch_size=64"), SINGLE, None, "fp32", LENGTHS).items
    assert plan["activations"] > plan["gradients"] > 0
    assert plan["gradients freed"] == -plan["gradients"], "zero_grad sets them to None: the larger of the two counts"
    zero2 = plan_memory(gpt2, full("training.batch_size=64"), Spread("zero2", 2, 2, False, True, True, "deepspeed"),
                        None, "fp32", LENGTHS).items
    assert zero2["gradients freed"] == 0, "DeepSpeed keeps its gradient partitions"


CPU = Device("cpu", "cpu", 64 * 2**30, {})


def test_a_cpu_step_counts_its_fixed_work_optimizer_and_vocabulary_besides_the_products(gpt2):
    from hftoolkit.planning.timing import CPU_ROW_SECONDS, cpu_pace, cpu_step_seconds

    plan = plan_time(gpt2, full(), SINGLE, CPU, "fp32", LENGTHS, None, None)
    assert set(plan.items) == {"products", "vocabulary", "element-wise", "optimizer", "communication", "overhead",
                               "rows"}
    assert plan.items["rows"] == pytest.approx(8 * CPU_ROW_SECONDS * cpu_pace()), "a batch of 8 rows read and collated"
    assert plan.step_seconds == pytest.approx(sum(plan.items.values()))
    fixed = cpu_step_seconds(gpt2) * cpu_pace()
    assert plan.items["overhead"] == pytest.approx(fixed) and plan.step_seconds > fixed, \
        "a tiny model's step is the Trainer's work, not its few FLOPs"
    lora = model_shape(meta(__import__("transformers").GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                                                  n_positions=128), lora=True))
    adapted = plan_time(lora, recipe("decoder-clm.yaml"), SINGLE, CPU, "fp32", LENGTHS, None, None)
    assert adapted.items["optimizer"] < plan.items["optimizer"], "the optimizer steps the trained parameters only"
    assert adapted.items["vocabulary"] < plan.items["vocabulary"], "a frozen head computes no weight gradient"
    checkpointed = plan_time(gpt2, full("training.gradient_checkpointing=true"), SINGLE, CPU, "fp32", LENGTHS, None,
                             None)
    assert checkpointed.items["element-wise"] > plan.items["element-wise"], "the forward pass runs twice"


def test_a_cpu_run_is_the_trainers_start_then_its_steps_and_a_gpu_run_its_steps(gpt2):
    """A small job's run is more than its steps: the Trainer's once-a-run work, scaled by the CPU's pace like the
    step's fixed work; on a GPU (no start measured there) the steps alone."""
    from hftoolkit.planning.timing import CPU_START_SECONDS, cpu_pace

    plan = plan_time(gpt2, full("training.max_steps=10"), SINGLE, CPU, "fp32", LENGTHS, None, None)
    assert plan.start_seconds == pytest.approx(CPU_START_SECONDS * cpu_pace()) and plan.start_seconds > 0
    assert plan.train_seconds == pytest.approx(plan.start_seconds + 10 * plan.step_seconds)
    gpu = plan_time(gpt2, full("training.max_steps=10"), SINGLE, GPUS["a100-80gb"], "bf16", LENGTHS, None, None)
    assert gpu.start_seconds == 0 and gpu.train_seconds == pytest.approx(10 * gpu.step_seconds)


def test_attention_keeps_its_probabilities_on_a_cpu_only_where_attention_itself_drops_out():
    """BART drops out its hidden states (dropout 0.1) but not its attention (attention_dropout 0): torch's attention
    then runs fused on a CPU and keeps no probabilities, as it does on a GPU."""
    import transformers

    def activations(**dropouts) -> float:
        config = transformers.BartConfig(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                         decoder_ffn_dim=128, max_position_embeddings=128, **dropouts)
        shape = model_shape(meta(config, "AutoModelForSeq2SeqLM"))
        return shape, plan_memory(shape, recipe("seq2seq-translation-bart.yaml", "lora.enabled=false"), SINGLE, CPU,
                                  "fp32", LENGTHS).items["activations"]

    (plain, kept_none), (dropping, kept) = activations(attention_dropout=0.0), activations(attention_dropout=0.1)
    assert plain["dropout"] and not plain["attention_dropout"] and dropping["attention_dropout"]
    assert kept > kept_none, "attention dropout on a CPU keeps the probabilities and their dropped copy"


def test_a_cpu_step_s_fixed_work_grows_with_the_model_s_layers(gpt2):
    """Each layer's modules are called and differentiated every step whatever the batch: a deeper tiny model's step
    has more fixed work, a layer's share of CPU_STEP_SECONDS each."""
    import transformers

    from hftoolkit.planning.timing import CPU_STEP_SECONDS, cpu_pace

    deeper = model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=8, n_head=4, vocab_size=1000,
                                                      n_positions=128)))
    two, eight = (plan_time(shape, full(), SINGLE, CPU, "fp32", LENGTHS, None, None).items["overhead"]
                  for shape in (gpt2, deeper))
    assert eight - two == pytest.approx(6 * CPU_STEP_SECONDS[1] * cpu_pace())


def test_a_reference_model_s_forward_pass_adds_the_forward_share_of_the_element_wise_work(gpt2):
    """DPO scores each pair again with its reference model, without gradients; ORPO has none. Only the forward share
    of the element-wise work is done again, as checkpointing's second forward pass does."""
    from hftoolkit.planning.timing import FORWARD_WORK

    def element_wise(method: str, *sets) -> float:
        planned = recipe("decoder-preference.yaml", f"preference.method={method}", *sets)
        return plan_time(gpt2, planned, SINGLE, CPU, "fp32", LENGTHS, None, None).items["element-wise"]

    dpo = element_wise("dpo")
    assert dpo > (1 + FORWARD_WORK) * element_wise("orpo"), "(DPO also holds the reference's log-probabilities)"
    assert element_wise("dpo", "training.gradient_checkpointing=true") == pytest.approx(
        dpo * (1 + 2 * FORWARD_WORK) / (1 + FORWARD_WORK)), "checkpointing does the policy's forward share again"


def test_a_prompted_decoder_projects_onto_the_vocabulary_only_where_its_answer_is(gpt2):
    def vocabulary(prompt: int, answer: int) -> float:
        lengths = {"max_length": prompt, "max_target_length": answer, "max_new_tokens": 8}
        instruction = full("task=instruction")
        plan = plan_time(gpt2, instruction, SINGLE, CPU, "fp32", lengths, None, None)
        return plan.items["vocabulary"] * plan.rate  # (its FLOPs: the matmul rate differs with the batch's size)

    assert vocabulary(64, 8) == pytest.approx(vocabulary(8, 8)), "the prompt's positions make no logits"
    assert vocabulary(8, 32) == pytest.approx(4 * vocabulary(8, 8))
    clm = plan_time(gpt2, full(), SINGLE, CPU, "fp32", LENGTHS, None, None)
    assert clm.items["vocabulary"] * clm.rate == pytest.approx(vocabulary(8, 32)), "a text predicts everywhere"


def test_processes_pay_for_their_collectives_and_sharded_optimizers_step_their_shard(gpt2):
    items = {name: plan_time(gpt2, full(), spread, CPU, "fp32", LENGTHS, None, None).items
             for name, spread in (("single", SINGLE), ("ddp", Spread("ddp", 2, 2, False, False, False)),
                                  ("zero2", Spread("zero2", 2, 2, False, True, True, "deepspeed")),
                                  ("fsdp", Spread("fsdp", 2, 2, True, True, True)))}
    assert items["single"]["communication"] == 0 and items["ddp"]["communication"] > 0
    assert items["fsdp"]["communication"] > items["ddp"]["communication"], "parameters gathered twice a step"
    assert items["zero2"]["optimizer"] == pytest.approx(items["single"]["optimizer"] / 2)
    assert items["ddp"]["optimizer"] == items["single"]["optimizer"], "DDP steps every parameter on every process"


def test_a_sharded_strategy_on_cpus_pays_per_byte_its_collectives_move_beyond_their_own_time(gpt2):
    """FSDP and ZeRO-3 gather the weights twice a step and reduce-scatter the gradients, ZeRO-2 moves the gradients
    twice: each byte costs the strategy's measured constant at this CPU's pace; DDP and one process pay none."""
    import transformers

    from hftoolkit.planning.items import weight_bytes
    from hftoolkit.planning.timing import CPU_SHARDED_SECONDS_PER_BYTE, cpu_pace

    spreads = {"ddp": Spread("ddp", 2, 2, False, False, False),
               "zero2": Spread("zero2", 2, 2, False, True, True, "deepspeed"),
               "zero3": Spread("zero3", 2, 2, True, True, True, "deepspeed"),
               "fsdp": Spread("fsdp", 2, 2, True, True, True)}
    items = {name: plan_time(gpt2, full(), spread, CPU, "fp32", LENGTHS, None, None).items
             for name, spread in spreads.items()}
    grads, weights = 4 * gpt2["trainable"], weight_bytes(gpt2, full())[0]
    assert "sharding" not in items["ddp"]
    assert "sharding" not in plan_time(gpt2, full(), SINGLE, CPU, "fp32", LENGTHS, None, None).items
    assert items["zero2"]["sharding"] == pytest.approx(2 * grads * CPU_SHARDED_SECONDS_PER_BYTE["zero2"] * cpu_pace())
    for name in ("fsdp", "zero3"):
        moved = 2 * weights + grads
        assert items[name]["sharding"] == pytest.approx(moved * CPU_SHARDED_SECONDS_PER_BYTE[name] * cpu_pace())
    adapted = model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000,
                                                       n_positions=128), lora=True))
    lora = plan_time(adapted, recipe("decoder-clm.yaml", "training.max_steps=10"), spreads["fsdp"], CPU, "fp32",
                     LENGTHS, None, None).items
    assert items["fsdp"]["sharding"] > lora["sharding"] > 0, "LoRA's frozen weights are gathered all the same"
    assert "sharding" not in plan_time(gpt2, full(), spreads["fsdp"], GPUS["a100-80gb"], "bf16", LENGTHS, None,
                                       None).items, "a GPU's collectives run beside its products"


def test_a_cpu_step_of_an_image_model_decodes_and_transforms_its_rows():
    """Images are decoded and transformed as a batch is drawn: a fixed cost per row and one per value of its
    pixel_values, for each row a process draws in a step; text draws none."""
    import transformers

    from hftoolkit.planning.timing import CPU_IMAGE_SECONDS, cpu_pace

    def images(size: int, *sets):
        shape = model_shape(meta(transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                        intermediate_size=64, image_size=size, patch_size=8),
                                 "AutoModelForImageClassification"))
        vision = recipe("vision-classification.yaml", "training.max_steps=10", *sets)
        return plan_time(shape, vision, SINGLE, CPU, "fp32", LENGTHS, None, None).items["images"]

    per_row = CPU_IMAGE_SECONDS[0] + CPU_IMAGE_SECONDS[1] * 3 * 32 * 32
    assert images(32) == pytest.approx(32 * per_row * cpu_pace())  # (the recipe's batch of 32)
    assert images(32, "training.batch_size=8", "training.gradient_accumulation=2") == pytest.approx(images(32) / 2)
    assert images(224) > 5 * images(32), "a larger image costs more to transform"
    assert "images" not in plan_time(model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4,
                                                                              vocab_size=1000, n_positions=128))),
                                     full(), SINGLE, CPU, "fp32", LENGTHS, None, None).items


def test_grpo_prices_its_sampling_its_cache_and_the_reference_pass(gpt2):
    """A grpo step samples batch_size answers of rl.max_completion_length tokens before it learns from them: the
    time plan has that generation, the memory plan its key-value cache; a KL term (rl.beta) adds the reference's
    pass over each answer, and longer answers cost more of all three."""
    def grpo(*sets):
        return recipe("decoder-grpo.yaml", "lora.enabled=false", "training.max_steps=10", *sets)

    a100 = GPUS["a100-80gb"]
    plain = plan_time(gpt2, grpo(), SINGLE, a100, "bf16", LENGTHS, None, 100)
    assert {"products", "vocabulary", "generation"} == set(plain.items) and plain.items["generation"] > 0
    longer = plan_time(gpt2, grpo("rl.max_completion_length=32"), SINGLE, a100, "bf16", LENGTHS, None, 100)
    assert longer.items["generation"] > 1.5 * plain.items["generation"]  # (64 tokens a row, not 40)
    referenced = plan_time(gpt2, grpo("rl.beta=0.04"), SINGLE, a100, "bf16", LENGTHS, None, 100)
    assert referenced.items["products"] > plain.items["products"]
    assert referenced.items["generation"] == plain.items["generation"]
    # Answers are sampled for every accumulated micro-batch at once: their cache outgrows one micro-batch's
    # activations (it counts where it does).
    cache = [plan_memory(gpt2, grpo(f"rl.max_completion_length={n}", "training.gradient_accumulation=64"), SINGLE,
                         a100, "bf16", LENGTHS).items["generation cache"] for n in (8, 96)]
    assert cache[1] > cache[0] >= 0 and cache[1] > 0
    assert plan_memory(gpt2, full(), SINGLE, a100, "bf16", LENGTHS).items.get("generation cache") is None


def test_a_cpu_grpo_step_pays_each_sampled_token_s_pass_through_every_layer_and_trl_s_scoring(gpt2):
    """On a CPU a small model's sampling is its fixed work per token, not its products: each answer token is a
    forward pass of every layer, once per rl.num_iterations steps; TRL's scoring of the answers is fixed per step."""
    import transformers

    from hftoolkit.planning.timing import CPU_DECODE_SECONDS, CPU_RL_STEP_SECONDS, cpu_pace, cpu_step_seconds

    def items(shape, *sets):
        grpo = recipe("decoder-grpo.yaml", "training.max_steps=10", *sets)
        return plan_time(shape, grpo, SINGLE, CPU, "fp32", LENGTHS, None, None).items

    plain, longer = items(gpt2), items(gpt2, "rl.max_completion_length=32")
    assert plain["sampling"] == pytest.approx(8 * (CPU_DECODE_SECONDS[0] + 2 * CPU_DECODE_SECONDS[1]) * cpu_pace())
    assert longer["sampling"] == pytest.approx(4 * plain["sampling"])
    assert items(gpt2, "rl.num_iterations=2")["sampling"] == pytest.approx(plain["sampling"] / 2)
    deeper = model_shape(meta(transformers.GPT2Config(n_embd=64, n_layer=8, n_head=4, vocab_size=1000,
                                                      n_positions=128)))
    assert items(deeper)["sampling"] > 2 * plain["sampling"]
    assert plain["overhead"] == pytest.approx((cpu_step_seconds(gpt2) + CPU_RL_STEP_SECONDS) * cpu_pace())
    assert "sampling" not in plan_time(gpt2, full(), SINGLE, CPU, "fp32", LENGTHS, None, None).items


def test_a_slower_cpu_plans_its_element_wise_optimizer_and_fixed_work_slower_in_proportion(gpt2, monkeypatch):
    from hftoolkit.planning.timing import CPU_REFERENCE_PACE
    from hftoolkit.training import throughput

    def plan_at(pace: float):
        monkeypatch.setattr(throughput, "elementwise_seconds_per_byte", lambda: pace)
        return plan_time(gpt2, full(), SINGLE, CPU, "fp32", LENGTHS, None, None).items

    here, slower = plan_at(CPU_REFERENCE_PACE), plan_at(2 * CPU_REFERENCE_PACE)
    for item in ("element-wise", "optimizer", "overhead"):
        assert slower[item] == pytest.approx(2 * here[item])
    assert slower["products"] == here["products"], "the products are planned at the measured matmul rate"
