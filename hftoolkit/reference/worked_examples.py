"""The course's worked examples, recomputed with the reference layers, beside the numbers the course prints.

The printed numbers come from the course's lecture notes (000_*.txt,
sections named in `source`). Each example is recomputed exactly; it "agrees"
when every computed value is within half a unit of the last digit the course
prints. Where it does not, `note` says what the exact computation gives and, as
far as it can be told, why the printed value differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hftoolkit.reference import attention, blocks, lora, norm, optim, positional, vit


@dataclass(frozen=True)
class WorkedExample:
    name: str
    source: str  # where the course prints it
    computed: tuple[float, ...]
    printed: tuple[float, ...]
    printed_text: str  # as the course writes it
    resolution: float  # half a unit of the last printed digit
    note: str = ""

    @property
    def agrees(self) -> bool:
        return all(abs(c - p) <= self.resolution + 1e-12 for c, p in zip(self.computed, self.printed, strict=True))


def _values(t: torch.Tensor | list[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in (t.detach().flatten() if isinstance(t, torch.Tensor) else t))


def self_attention_examples() -> list[WorkedExample]:
    """16.2.1: "the cat sat", d_k = 4, queries = keys = the embeddings."""
    x = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])  # the, cat, sat
    q = k = v = x[None, None]  # (B=1, nh=1, T=3, hs=4)
    _, weights = attention.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(4) = 1/2
    scaled = (x @ x.T) / math.sqrt(4)
    source = "16.2.1 Worked Example - Self-Attention on a 3-word sentence"
    examples = [WorkedExample(
        "self-attention QK^T / sqrt(d_k)", source, _values(scaled), (1.0, 0.0, 0.5, 0.0, 1.0, 0.5, 0.5, 0.5, 1.0),
        "1.0 0.0 0.5 / 0.0 1.0 0.5 / 0.5 0.5 1.0", 0.05,
    )]
    printed = {"the": (0.58, 0.11, 0.31), "cat": (0.11, 0.58, 0.31), "sat": (0.23, 0.23, 0.54)}
    for i, (word, row) in enumerate(printed.items()):
        exact = ", ".join(f"{w:.3f}" for w in weights[0, 0, i])
        examples.append(WorkedExample(
            f"self-attention weights, row '{word}'", source, _values(weights[0, 0, i]), row,
            " ".join(f"{v:.2f}" for v in row), 0.005,
            f"softmax of the printed scaled scores is [{exact}]; the printed row is not that softmax",
        ))
    return examples


def masked_attention_examples() -> list[WorkedExample]:
    """16.4.1: softmax of given scaled scores under the causal mask, 4 tokens."""
    scores = torch.tensor([[2.1, 1.3, 0.8, 0.2], [1.3, 3.0, 1.5, 0.6], [0.8, 1.5, 2.8, 1.9], [0.2, 0.6, 1.9, 3.2]])
    weights = attention.attention_weights(scores, attention.causal_mask(4)[0, 0])
    # The extracted text lists these matrices column by column (its masked scores show -inf below the
    # diagonal when read row by row), so column i of the printed weights is softmax row i.
    printed_columns = [(1.00, 0, 0, 0), (0.15, 0.85, 0, 0), (0.09, 0.18, 0.73, 0), (0.03, 0.05, 0.15, 0.77)]
    examples = []
    for i, (token, column) in enumerate(zip(["<START>", "I", "love", "NLP"], printed_columns)):
        exact = ", ".join(f"{w:.3f}" for w in weights[i])
        examples.append(WorkedExample(
            f"masked attention, row '{token}'", "16.4.1 Worked Example - Masked Attention Matrix", _values(weights[i]),
            column, f"column {i + 1} of the printed matrix: " + " ".join(f"{v:g}" for v in column), 0.005,
            f"the text lists the matrix column by column, as it does the masked scores above it; exact row [{exact}]",
        ))
    return examples


def positional_example() -> WorkedExample:
    return WorkedExample(
        "sinusoidal encoding, position 3, d_model 4", "16.2.2 Worked Example - Positional Encoding for Position 3",
        _values(positional.sinusoidal_encoding(4, 4)[3]), (0.141, -0.990, 0.030, 1.000),
        "[0.141, -0.990, 0.030, 1.000]", 0.0005,
    )


def layernorm_examples() -> list[WorkedExample]:
    x = torch.tensor([5.0, 10.0, -5.0, 25.0])
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    source = "16.3.1 Worked Example - LayerNorm on a 4D vector"
    return [
        WorkedExample("LayerNorm mean", source, (float(mu),), (8.75,), "8.75", 0.005),
        WorkedExample("LayerNorm squared deviations", source, _values((x - mu) ** 2), (14.06, 1.56, 189.06, 264.06),
                      "14.06 + 1.56 + 189.06 + 264.06", 0.005),
        WorkedExample("LayerNorm variance", source, (float(var),), (117.19,), "117.19", 0.005),
        WorkedExample("LayerNorm standard deviation", source, (float(var.sqrt()),), (10.83,), "10.83", 0.005),
        WorkedExample("LayerNorm output (gamma=1, beta=0)", source, _values(norm.LayerNorm(4)(x)),
                      (-0.346, 0.115, -1.270, 1.501), "[-0.346, 0.115, -1.270, 1.501]", 0.0005),
    ]


def momentum_examples() -> list[WorkedExample]:
    """16.12.8: v_{t-1} = -2 (steady state), gradient 0 at a local minimum, beta 0.9, eta 0.01."""
    source = "16.12.8 Worked Example - Momentum Escaping a Local Minimum"
    w, v = torch.tensor(0.0), torch.tensor(0.0)
    for _ in range(100):  # "strongly downhill for 100 steps (gradient ~ -2 each step)"
        w, v = optim.momentum_step(w, torch.tensor(-2.0), v, lr=0.01, beta=0.9)
    steady = float(v)
    w_new, v_new = optim.momentum_step(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(-2.0), lr=0.01, beta=0.9)
    w_plain, _ = optim.momentum_step(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(-2.0), lr=0.01, beta=0.0)
    return [
        WorkedExample("momentum velocity after 100 steps of g = -2", source, (steady,), (-2.0,), "-2 (steady state)",
                      0.5, f"exactly -2 (1 - 0.9^100) = {steady:.5f}"),
        WorkedExample("momentum velocity at the minimum (g = 0)", source, (float(v_new),), (-1.8,), "-1.8", 0.05),
        WorkedExample("momentum step W_{t+1} - W_t", source, (float(w_new),), (0.018,), "+0.018", 0.0005),
        WorkedExample("step without momentum (beta = 0)", source, (float(w_plain),), (0.0,), "0 (stuck)", 0.0005),
    ]


def lora_examples() -> list[WorkedExample]:
    from hftoolkit.reference.bert import Bert, BertConfig

    source = "16.9.2 Low-Rank Adaptation (LoRA)"
    lora_count = lora.lora_parameter_count(4096, 4096, 16)
    full = lora.full_update_parameter_count(4096, 4096)
    with torch.device("meta"):  # RoBERTa-base shapes, no memory
        model = Bert(BertConfig(vocab_size=50265, max_positions=514, type_vocab_size=1, d_model=768, n_layers=12,
                                n_heads=12, d_ff=3072))
        lora.apply_lora(model, ("q_proj", "v_proj"), r=8, alpha=16)
    return [
        WorkedExample("LoRA parameters, d = 4096, r = 16 (2 d r)", source, (lora_count,), (131_000,), "131K", 500,
                      f"exactly {lora_count:,}"),
        WorkedExample("full update parameters, d = 4096 (d^2)", source, (full,), (16_800_000,), "16.8M", 50_000,
                      f"exactly {full:,}"),
        WorkedExample("LoRA reduction d^2 / (2 d r)", source, (full / lora_count,), (128,), "128x", 0.5),
        WorkedExample("LoRA on RoBERTa-base, r = 8, W_q and W_v", "LoRA paper (Hu et al., 2021), Table 2",
                      (lora.trainable_parameters(model),), (300_000,), "0.3M", 50_000,
                      f"exactly 12 layers x 2 matrices x 8 x (768 + 768) = {lora.trainable_parameters(model):,}"),
    ]


def vit_examples() -> list[WorkedExample]:
    source = "16.10.1 ViT patches"
    patches = vit.patchify(torch.zeros(1, 3, 224, 224), 16)  # (1, N, C*P*P)
    tokens_14 = vit.patchify(torch.zeros(1, 3, 224, 224), 14).shape[1]
    tokens_8 = vit.patchify(torch.zeros(1, 3, 224, 224), 8).shape[1]
    return [
        WorkedExample("ViT patches, 224 x 224, P = 16", source, (patches.shape[1],), (196,), "196", 0.5),
        WorkedExample("ViT values per patch, 16 x 16 x 3", source, (patches.shape[2],), (768,), "768", 0.5),
        WorkedExample("ViT tokens with 14 x 14 and 8 x 8 patches", "16.10 pitfalls", (tokens_14, tokens_8), (256, 784),
                      "256, 784", 0.5),
        WorkedExample("attention cost, 8 x 8 vs 14 x 14 patches", "16.10 pitfalls", ((tokens_8 / tokens_14) ** 2,),
                      (10,), "nearly 10x", 1.0, f"(784 / 256)^2 = {(tokens_8 / tokens_14) ** 2:.2f}"),
    ]


def decoder_surplus_example() -> WorkedExample:
    """16.4.5: decoder block (+ cross-attention, + a third LayerNorm) vs encoder block, d = 512, h = 8, d_ff = 2048."""
    with torch.device("meta"):
        encoder = blocks.TransformerBlock(blocks.BlockConfig(512, 8, 2048, "relu"))
        decoder = blocks.TransformerBlock(blocks.BlockConfig(512, 8, 2048, "relu", cross_attention=True))
    n_enc = sum(p.numel() for p in encoder.parameters())
    n_dec = sum(p.numel() for p in decoder.parameters())
    return WorkedExample(
        "decoder block parameters over encoder block", "16.4.5 Parameter Comparison with Encoder",
        (100 * (n_dec / n_enc - 1),), (33,), "about 33%", 0.5,
        f"{n_dec:,} vs {n_enc:,} (d=512, h=8, d_ff=2048): +{n_dec - n_enc:,}; the 'extra layer norm "
        "(2 parameters)' is 2 vectors of 512, i.e. 1,024 parameters",
    )


def llama_full_finetuning_example() -> WorkedExample:
    """16.9 Real-World Connection: full fine-tuning of LLaMA-7B "requires ~56GB". The model states of mixed-precision
    AdamW are 16 bytes a parameter: fp32 weights (4, the master copy the optimizer updates), fp32 gradients (4)
    and Adam's two fp32 moments (8); with bf16 weights, 2 + 2 + an fp32 master copy (4) + 8, the same 16."""
    d, ffn, layers, vocab = 4096, 11008, 32, 32000
    per_layer = 4 * d * d + 3 * d * ffn + 2 * d  # q, k, v, o; gate, up, down; two RMSNorm weights
    params = layers * per_layer + 2 * vocab * d + d  # untied embeddings and LM head, the final norm
    states = 16 * params / 1e9
    return WorkedExample(
        "LLaMA-7B full fine-tuning model states, mixed-precision AdamW (GB)", "16.9 Real-World Connection",
        (states,), (56,), "~56GB", 4.0,
        f"{params:,} parameters x 16 bytes = {states:.1f} GB before activations; 56 GB is {56e9 / params:.1f} bytes "
        "a parameter, what bf16 weights, bf16 gradients and two bf16 Adam moments take (2+2+2+2) with no fp32 "
        "master copy, or fp32 weights and gradients with no optimizer state: not mixed-precision AdamW",
    )


def all_worked_examples() -> list[WorkedExample]:
    return [
        *self_attention_examples(),
        *masked_attention_examples(),
        positional_example(),
        *layernorm_examples(),
        *momentum_examples(),
        *lora_examples(),
        *vit_examples(),
        decoder_surplus_example(),
        llama_full_finetuning_example(),
    ]


def _format(example: WorkedExample) -> str:
    """Computed values with one digit more than the course prints; whole numbers with thousands separators."""
    digits = max(0, round(-math.log10(2 * example.resolution))) + 1

    def one(v: float) -> str:
        return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 10 else f"{v:.{digits}f}"

    return ", ".join(one(v) for v in example.computed)


def print_worked_examples(console: Any) -> None:
    """Print the examples as a rich table: computed, printed, and a note where they differ."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="The course's worked examples, recomputed with the reference layers")
    for column in ("example", "computed", "course prints", "agrees", "note"):
        table.add_column(column)
    examples = all_worked_examples()
    for ex in examples:
        verdict = "[green]yes[/green]" if ex.agrees else "[yellow]differs[/yellow]"
        cells = (ex.name, _format(ex), ex.printed_text)
        table.add_row(*(escape(cell) for cell in cells), verdict, escape(ex.note))
    console.print(table)
    differing = [ex.name for ex in examples if not ex.agrees]
    agree = len(examples) - len(differing)
    console.print(f"{agree} of {len(examples)} printed values agree with the exact computation.")
