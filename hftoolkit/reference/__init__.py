"""From-scratch PyTorch implementations of the mechanisms the course teaches, each proven equal to a library.

One architecture or concept per module (attention, t5_attention, positional, norm,
feedforward, blocks, bert, gpt2, vit, lora, optim, objectives, decoding, preference), weight
maps from HF state dicts in `weight_map`, the parity suite in `parity` (the
`hftoolkit parity` command) and the course's worked examples in `worked_examples`.

Importing this package imports nothing heavy: import the module you need.
"""
