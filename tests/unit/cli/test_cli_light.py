"""The light commands: fast, no torch or transformers imported, clean errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import RECIPES, ROOT, plain, run_cli

HEAVY = ("torch", "transformers", "peft", "datasets", "accelerate", "lm_eval")


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["validate", str(RECIPES / "encoder-classification.yaml")],
                                  ["recipes"], ["doctor"], ["runs", str(ROOT / "tests")], ["eval", "--help"],
                                  ["validate", str(RECIPES / "decoder-clm.yaml"), "--set",
                                   "eval.benchmarks.tasks=[hftoolkit_everyday_mc]"]],
                         ids=lambda a: " ".join(a[:2]) if a[0] == "eval" else a[0] + ("+bench" if len(a) > 2 else ""))
def test_light_commands_import_no_torch(argv):
    # A real process: what matters is what the command imports, which an in-process run can't show.
    code = ("import sys; from hftoolkit.cli.app import app\n"
            "try:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print('HEAVY', heavy); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


@pytest.mark.slow
def test_a_run_that_quantizes_nothing_never_imports_bitsandbytes():
    # A real process: bitsandbytes (and the torch compiler it imports) must stay out of sys.modules,
    # and a quantized model loaded afterwards in the same process must still find it.
    code = ("import sys\n"
            "from hftoolkit.config.recipe import load_recipe, replaced\n"
            "from hftoolkit.job.resolve import resolve_job\nfrom hftoolkit.models.families import formulation\n"
            f"recipe = load_recipe({str(RECIPES / 'encoder-classification.yaml')!r}, "
            "['data.label_names=[negative, positive]'])\n"
            "job = resolve_job(recipe, data=False)\n"
            "formulation(job).load_model(job)\n"
            "print('PLAIN', 'bitsandbytes' in sys.modules)\n"
            "job = resolve_job(replaced(recipe, {'model.quantization': '8bit'}), data=False)\n"
            "model, _ = formulation(job).load_model(job)\n"
            "print('8BIT', type(model.base_model.model.bert.encoder.layer[0].attention.self.query).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PLAIN False" in out.stdout and "8BIT Linear8bitLt" in out.stdout, out.stdout


def test_help_lists_every_command():
    out = run_cli("--help").output
    for command in ("train", "eval", "predict", "validate", "recipes", "init-model", "doctor", "runs"):
        assert command in out


def test_version_names_the_engines_among_the_libraries_a_manifest_records():
    import re

    from hftoolkit.runs.rundir import _versions

    out = run_cli("--version").output
    shown = re.findall(r"(?:\(|, )([a-z]+) ", out)
    assert shown == ["torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes"], out
    assert set(_versions()) == {"python", *shown, "datasets", "evaluate"}  # manifest.json's "versions"


def test_recipes_lists_shipped_recipes_with_descriptions():
    lines = run_cli("recipes").output.splitlines()
    assert any(line.startswith("encoder-classification ") and "BERT-family sequence classification" in line
               for line in lines)


def test_validate_reports_every_problem_of_every_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntask: classification\nmodel: {checkpoint: init:bert, quantisation: 8bit}\n"
                   "data: {train: builtin:sentiment}\ntraining: {batch_size: -2}\n")
    result = run_cli("validate", RECIPES / "encoder-classification.yaml", bad, expect=2)
    text = plain(result.output)
    assert "ok:" in text and "encoder-classification.yaml" in text
    assert "model.quantisation: unknown key: did you mean 'quantization'?" in text
    assert "training.batch_size: input should be greater than 0" in text


@pytest.mark.slow
def test_doctor_reports_versions_backend_and_the_hub_settings():
    out = run_cli("doctor").output
    for key in ("torch", "transformers", "bitsandbytes backend", "cuda", "hub cache", "hub endpoint", "hub token",
                "free disk"):
        assert key in out
    assert "yes (HF_HUB_OFFLINE" in out  # tests run with HF_HUB_OFFLINE=1
    # The CPU's bf16 matrix features and what auto picks, as training would (job/hardware.py, in a child process).
    from hftoolkit.job.hardware import cpu_record
    from hftoolkit.job.precision import resolve_precision

    cpu = cpu_record()
    assert f"bf16 matrix features: {', '.join(cpu['bf16_matrix_features']) or 'none'}" in out
    assert f"training.precision auto: {resolve_precision('auto', None)}" in out


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "hftoolkit", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage" in out.stdout
    # The console script ends without the interpreter's teardown: the exit status must survive that.
    out = subprocess.run([sys.executable, "-m", "hftoolkit", "validate", "missing.yaml"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("Error: missing.yaml: recipe file not found"), out.stderr


def test_parity_command_is_wired_and_exits_with_the_suite_result():
    result = run_cli("parity", "--only", "norm")
    assert "norm.layernorm" in result.stdout and "pass" in result.stdout
    assert run_cli("parity", "--only", "no-such-component", expect=2).exit_code == 2
