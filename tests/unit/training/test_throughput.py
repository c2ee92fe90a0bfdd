"""Throughput figures: padding counted per batch, the FLOPs convention, totals over processes."""

from __future__ import annotations

import json

import pytest

from hftoolkit.training.throughput import (
    TokenCounter,
    efficiency,
    elementwise_seconds_per_byte,
    matmul_flops_per_second,
    training_flops,
)


@pytest.fixture(autouse=True)
def own_rate_file(monkeypatch, tmp_path):
    """Each test measures into a cache of its own: other workers rewrite the shared matmul-rate.json, and a write
    made from what they read before this test's would put back a rate the test has replaced."""
    monkeypatch.setenv("HFTOOLKIT_CACHE", str(tmp_path))
    matmul_flops_per_second.cache_clear()
    elementwise_seconds_per_byte.cache_clear()
    yield
    matmul_flops_per_second.cache_clear()
    elementwise_seconds_per_byte.cache_clear()


def test_token_counter_counts_real_and_padding_tokens_and_drops_length():
    import torch

    def pad(features):
        longest = max(len(f["input_ids"]) for f in features)
        mask = [[1] * len(f["input_ids"]) + [0] * (longest - len(f["input_ids"])) for f in features]
        return {"attention_mask": torch.tensor(mask)}

    counter = TokenCounter(pad)
    features = [{"input_ids": [1, 2, 3], "length": 3}, {"input_ids": [1], "length": 1}]
    counter(features)
    assert "length" not in features[0], "the sampler's column never reaches the model"
    assert counter.snapshot() == {"real": 4, "total": 6, "samples": 2, "batches": 1, "token_length_product": 4 * 3}


def test_lora_counts_four_n_and_full_training_six_n_per_token():
    shape = {"non_embedding": 1000, "layers": 2, "width": 8}
    counts = {"real": 10, "total": 12, "samples": 2, "token_length_product": 10 * 6}
    attention = 4 * 2 * 8 * 60
    assert training_flops(shape, counts, lora=True) == 4 * 1000 * 10 + attention * 2
    assert training_flops(shape, counts, lora=False) == 6 * 1000 * 10 + attention * 3


def test_efficiency_reports_run_totals_over_processes():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 vocab_size=50))
    counts = {"real": 900, "total": 1000, "samples": 40, "batches": 4, "token_length_product": 900 * 25}
    one = efficiency(model, counts, seconds=2.0, lora=True)
    two = efficiency(model, counts, seconds=2.0, lora=True, processes=2)
    assert one["tokens_per_second"] == 450 and two["tokens_per_second"] == 900
    assert one["padding_fraction"] == two["padding_fraction"] == pytest.approx(0.1)
    assert two["flops_per_second"] == pytest.approx(2 * one["flops_per_second"], rel=1e-6)
    assert two["matmul_fraction"] == pytest.approx(one["matmul_fraction"], abs=1e-4)  # both rounded to 4 places
    # Against the rate of the run's own products: 250 tokens a batch through width 32 and intermediate 64.
    rate = matmul_flops_per_second("fp32", 250, 32, 64)
    assert one["matmul_fraction"] == pytest.approx(one["flops_per_second"] / rate, abs=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_matmul_rate_is_measured_once_per_precision_and_size_and_cached_for_the_host(precision, monkeypatch):
    from hftoolkit.sources.locations import cache_root
    from hftoolkit.training import throughput

    throughput.matmul_flops_per_second.cache_clear()
    first = throughput.matmul_flops_per_second(precision, 100, 48, 96)
    assert first > 0
    measured = []
    monkeypatch.setattr(throughput, "_measure", lambda *a: measured.append(a) or 1.0)
    throughput.matmul_flops_per_second.cache_clear()
    assert throughput.matmul_flops_per_second(precision, 120, 48, 96) == first, "the same 128-token bucket, from disk"
    assert not measured
    throughput.matmul_flops_per_second(precision, 100, 64, 96)
    assert len(measured) == 1, "another width is measured anew"
    keys = json.loads((cache_root() / "matmul-rate.json").read_text())
    assert any(k.endswith(f"-{precision}-128x48x96") for k in keys)
    throughput.matmul_flops_per_second.cache_clear()


def test_a_rate_cached_while_the_machine_was_busy_is_measured_again_when_a_run_beats_it():
    from transformers import BertConfig, BertModel

    from hftoolkit.sources.locations import cache_root
    from hftoolkit.training import throughput


    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 vocab_size=50))
    counts = {"real": 900, "total": 1000, "samples": 40, "batches": 4, "token_length_product": 900 * 25}
    throughput.matmul_flops_per_second.cache_clear()
    honest = throughput.matmul_flops_per_second("fp32", 250, 32, 64)
    path = cache_root() / "matmul-rate.json"
    (key,) = json.loads(path.read_text())
    path.write_text(json.dumps({key: honest / 1e6}))  # as if measured while something else ran
    throughput.matmul_flops_per_second.cache_clear()
    achieved = throughput.efficiency(model, counts, seconds=2.0, lora=False)["flops_per_second"]
    assert achieved > honest / 1e6  # the run beat the cached rate, so it was measured again
    assert json.loads(path.read_text())[key] > honest / 10


def test_a_rate_file_cut_short_or_run_together_is_measured_again_not_fatal():
    """Ranks and parallel runs share matmul-rate.json: a file left half-written (before writes were atomic,
    two writers made `{...}{...}`) must cost a measurement, never the run."""
    from hftoolkit.sources.locations import cache_root
    from hftoolkit.training import throughput

    path = cache_root() / "matmul-rate.json"
    for broken in ('{"a": 1.0}{"a": 1.0, "b": 2.0}', '{"a": 1.', "[1, 2]"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(broken)
        throughput.matmul_flops_per_second.cache_clear()
        assert throughput.matmul_flops_per_second("fp32", 64, 16, 32) > 0
        rates = json.loads(path.read_text())
        assert list(rates) == [next(k for k in rates if k.endswith("-fp32-64x16x32"))]


@pytest.mark.slow
def test_the_element_wise_pace_is_measured_once_per_host_and_leaves_a_run_s_random_draws_as_they_were():
    """The plan measures it before a run draws anything: its dropout must not move the run's generator."""
    import torch

    torch.manual_seed(1)
    expected = torch.rand(4)
    torch.manual_seed(1)
    pace = elementwise_seconds_per_byte()
    assert torch.equal(torch.rand(4), expected)
    assert 0 < pace < 1e-6, "seconds per byte"
    elementwise_seconds_per_byte.cache_clear()
    assert elementwise_seconds_per_byte() == pace, "read back from the host's cache, not measured again"


def test_machines_sharing_a_name_and_a_home_or_a_machine_restarted_measure_their_own_rates(monkeypatch):
    """Cloud machines and containers often share a host name and a home directory: a reading is kept per boot."""
    import os
    import platform

    from hftoolkit.training import throughput

    here = throughput._this_boot()
    assert here.startswith(platform.node())
    if os.path.exists("/proc/sys/kernel/random/boot_id"):
        assert len(here) == len(platform.node()) + 9, "the name and the boot's first 8 characters"
    monkeypatch.setattr(throughput, "_this_boot", lambda: "vm-aaaa")
    monkeypatch.setattr(throughput, "_measure", lambda *a: 1.0)
    assert matmul_flops_per_second("fp32", 64, 16, 32) == 1.0
    matmul_flops_per_second.cache_clear()
    monkeypatch.setattr(throughput, "_this_boot", lambda: "vm-bbbb")
    monkeypatch.setattr(throughput, "_measure", lambda *a: 2.0)
    assert matmul_flops_per_second("fp32", 64, 16, 32) == 2.0, "the other boot's reading is not this one's"
