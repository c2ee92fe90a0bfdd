"""init-model: tiny random checkpoints with small tokenizers trained on the package's own text, for offline smoke runs.

`init:<arch>` in a recipe calls `ensure_tiny(arch)`, which builds the checkpoint once into a cache folder and
reuses it. Weights are random but seeded. The tokenizers were trained once and ship in
data/tiny-tokenizers/ (`python -m hftoolkit.sources.tiny` trains them again): the trainer orders tied merges
differently from one build to the next, and a tiny model must be the same model on every machine.
"""

from __future__ import annotations

import hashlib
import shutil
import string
import tempfile
from pathlib import Path

from hftoolkit.config.families import INIT_FAMILIES

ARCHS = tuple(INIT_FAMILIES)
VOCAB_SIZE = 1024
TOKENIZERS = Path(__file__).resolve().parent.parent / "data" / "tiny-tokenizers"
WIDTH = dict(hidden=64, layers=2, heads=4, ffn=128)

# Special tokens per architecture: (pre-tokenizer style, tokens, post-processing template)
SPECIALS = {
    "bert": dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"),
    "gpt2": dict(unk_token="<|endoftext|>", bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                 pad_token="<|endoftext|>"),
    "t5": dict(pad_token="<pad>", eos_token="</s>", unk_token="<unk>"),
    "bart": dict(bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>", mask_token="<mask>",
                 cls_token="<s>", sep_token="</s>"),
}


def cache_dir() -> Path:
    from hftoolkit.sources.locations import cache_root

    return cache_root() / "init"


def ensure_tiny(arch: str) -> Path:
    """Path of the cached tiny checkpoint for `arch`, creating it on first use."""
    # Keyed by this file's content and the tokenizers': a change to the tiny configs or tokenizers rebuilds them.
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in (Path(__file__), *sorted(TOKENIZERS.glob("*.json"))))
                            ).hexdigest()[:12]
    target = cache_dir() / f"{arch}-{digest}"
    if not (target / "config.json").is_file():
        try:
            init_model(arch, target)
        except Exception:
            # Two runs that start together both build it; the one that finishes second finds the
            # folder taken (not empty, or a failed rename) and uses the first one's.
            if not (target / "config.json").is_file():
                raise
    return target


def init_model(arch: str, out: Path) -> Path:
    """Write a tiny random `arch` checkpoint and its processor to `out` (safetensors), atomically: built in a
    temporary folder and renamed into place."""
    from hftoolkit.base.errors import UserError

    if arch not in ARCHS:
        raise UserError(f"init:{arch}: unknown architecture; choose one of {', '.join(ARCHS)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out}: output folder is not empty; choose a new folder or remove it")
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model, processor = _build(arch)
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _build(arch: str):
    import transformers as tf

    h, layers, heads, ffn = WIDTH["hidden"], WIDTH["layers"], WIDTH["heads"], WIDTH["ffn"]
    if arch == "vit":
        config = tf.ViTConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=ffn, image_size=32, patch_size=8)
        pil = getattr(tf, "ViTImageProcessorPil", tf.ViTImageProcessor)  # the PIL backend needs no torchvision
        processor = pil(size={"height": 32, "width": 32})
        return tf.ViTModel(config, add_pooling_layer=False), processor
    tokenizer = tiny_tokenizer(arch)
    ids = {k.removesuffix("_token") + "_token_id": tokenizer.convert_tokens_to_ids(v)
           for k, v in SPECIALS[arch].items()}
    vocab = len(tokenizer)
    if arch == "bert":
        config = tf.BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                               intermediate_size=ffn, max_position_embeddings=512, pad_token_id=ids["pad_token_id"])
        model = tf.BertForPreTraining(config)  # with the pooler, so classification heads start from saved weights
    elif arch == "gpt2":
        # The LM head is tied to the embeddings and LoRA freezes both: at GPT-2's 0.02 init and width 64 no logit
        # can exceed ~1.3, so perplexity could never fall below ~300. 0.1 is near trained GPT-2's embedding scale.
        config = tf.GPT2Config(vocab_size=vocab, n_embd=h, n_layer=layers, n_head=heads, n_inner=ffn, n_positions=512,
                               bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                               initializer_range=0.1)
        model = tf.GPT2LMHeadModel(config)
    elif arch == "t5":
        config = tf.T5Config(vocab_size=vocab, d_model=h, num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                             d_kv=h // heads, d_ff=ffn, pad_token_id=ids["pad_token_id"],
                             eos_token_id=ids["eos_token_id"], decoder_start_token_id=ids["pad_token_id"])
        model = tf.T5ForConditionalGeneration(config)
    else:
        config = tf.BartConfig(vocab_size=vocab, d_model=h, encoder_layers=layers, decoder_layers=layers,
                               encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                               decoder_ffn_dim=ffn, max_position_embeddings=512, **ids,
                               decoder_start_token_id=ids["eos_token_id"], forced_eos_token_id=ids["eos_token_id"])
        model = tf.BartForConditionalGeneration(config)
    return model, tokenizer


def tiny_tokenizer(arch: str):
    """`arch`'s tiny tokenizer as shipped, wrapped for transformers."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(TOKENIZERS / f"{arch}.json"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=512, **SPECIALS[arch])


def train_tokenizer(arch: str):
    """A WordPiece (BERT) or BPE tokenizer trained on the package's own text (builtin.corpus): what
    data/tiny-tokenizers/ holds (tied merges aside, which the trainer orders as it happens to)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from hftoolkit.sources.builtin import corpus

    specials = SPECIALS[arch]
    unique = list(dict.fromkeys(specials.values()))
    if arch == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=unique, show_progress=False,
                                           initial_alphabet=list(string.printable.strip()))
    else:
        tok = Tokenizer(models.BPE(unk_token=specials.get("unk_token")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=arch != "gpt2")
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=unique, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # (show_progress=False: the Rust trainer writes its bar's newlines straight to stdout, the results' stream)
    tok.train_from_iterator(corpus().splitlines(), trainer=trainer)
    template = {"bert": ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B [SEP]"), "t5": ("$A </s>", "$A </s> $B </s>"),
                "bart": ("<s> $A </s>", "<s> $A </s> </s> $B </s>")}.get(arch)
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single=template[0], pair=template[1],
            special_tokens=[(t, tok.token_to_id(t)) for t in unique if t in " ".join(template)])
    return tok


if __name__ == "__main__":  # train the shipped tokenizers again
    TOKENIZERS.mkdir(parents=True, exist_ok=True)
    for name in SPECIALS:
        train_tokenizer(name).save(str(TOKENIZERS / f"{name}.json"))
