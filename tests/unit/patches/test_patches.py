"""Each patch of a library's code lives in hftoolkit/patches/, in a module named after the library and the versions
it was checked against; this test fails when the installed library leaves that range, or when the code a patch
relies on reads differently, so that a new release is checked before it is trusted."""

from __future__ import annotations

import re
import sys

import pytest

from hftoolkit.patches import in_range, installed, patch_modules
from tests.helpers import ROOT

PACKAGE = ROOT / "hftoolkit"
MODULES = patch_modules()


def test_the_folder_holds_the_patches_the_runs_rely_on():
    names = {m.__name__.rsplit(".", 1)[1] for m in MODULES}
    assert {"accelerate_1_15", "deepspeed_0_19", "peft_0_21", "transformers_5", "trl_1_16"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_each_patch_names_its_library_and_holds_for_the_installed_version(module):
    from importlib.metadata import version

    name = module.__name__.rsplit(".", 1)[1]
    assert name.startswith(module.LIBRARY.replace("-", "_") + "_"), "the module is named after the library it patches"
    assert re.fullmatch(r"[a-z_]+_\d+(_\d+)*", name), "and the version range"
    if not installed(module):  # (an optional library: TRL, DeepSpeed are extras of pyproject)
        pytest.skip(f"{module.LIBRARY} is not installed, so {name} is not applied: nothing to check")
    assert in_range(module), (f"{module.LIBRARY} {version(module.LIBRARY)} is outside {module.VERSIONS}, the range "
                              f"{name} was checked against: check the patch against this version, then widen it")
    assert module.still_needed() == [], "the code this patch relies on has changed"


def test_library_code_is_replaced_only_in_the_patches_folder():
    """An assignment to a library class's method (`AcceleratorState.__init__ = ...`) or an entry of a library's
    table of ops is a patch: it belongs in patches/."""
    assignment = re.compile(r"^\s*[A-Za-z_][\w.]*\.(__init__|__compatible_ops__\[.*\])\s*=", re.M)
    elsewhere = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "patches" not in p.parts and assignment.search(p.read_text(encoding="utf-8"))]
    assert elsewhere == []


def test_the_version_check_fails_outside_the_range():
    from types import SimpleNamespace

    assert not in_range(SimpleNamespace(LIBRARY="accelerate", VERSIONS=">=0.1,<0.2"))


def test_a_patch_of_a_library_that_is_not_installed_is_skipped_with_its_reason(monkeypatch):
    from hftoolkit.patches import trl_1_16

    monkeypatch.setitem(sys.modules, "trl", None)  # (as where the preference extra is not installed)
    assert not installed(trl_1_16)
    with pytest.raises(pytest.skip.Exception, match="trl is not installed, so trl_1_16 is not applied"):
        test_each_patch_names_its_library_and_holds_for_the_installed_version(trl_1_16)


def requirements() -> dict[str, object]:
    """pyproject.toml's direct requirements, core and extras, by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from setuptools.config.pyprojecttoml import read_configuration  # (tomllib is 3.11 on)

    project = read_configuration(PACKAGE.parent / "pyproject.toml", expand=False)["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {canonicalize_name(req.name): req for req in map(Requirement, listed) if req.name != "hftoolkit"}


def locked() -> dict[str, str]:
    """constraints.txt: the versions the suite passed with, by canonical name."""
    from packaging.utils import canonicalize_name

    lines = [line.split("#")[0].strip() for line in (PACKAGE.parent / "constraints.txt").read_text().splitlines()]
    return {canonicalize_name(name): pinned for name, _, pinned in (line.partition("==") for line in lines if line)}


def test_a_patched_library_s_range_is_the_one_its_patch_was_checked_against():
    """A release outside a patch's VERSIONS is checked there before pyproject allows it (trl: 1.15.0 fails where
    Triton is missing, 1.14 has no fused LM head; see trl_1_16)."""
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    required = requirements()
    patched = {canonicalize_name(m.LIBRARY): m for m in MODULES}
    assert {"trl", "peft", "accelerate", "transformers", "deepspeed"} <= set(patched) & set(required)
    for name, module in patched.items():
        if name in required:
            assert required[name].specifier == SpecifierSet(module.VERSIONS), name
    assert list(required["trl"].specifier.filter(["1.14.2", "1.15.0", "1.16.0", "1.17.0"])) == ["1.16.0"]


def test_every_range_holds_the_locked_release_and_stops_before_the_next_major():
    """The ranges state what was tested: the lock's release is inside each, none is open-ended."""
    from packaging.version import Version

    pins = locked()
    for name, requirement in requirements().items():
        if name == "torch":  # (installed first, the machine's build; not in the lock)
            continue
        assert name in pins, f"{name} is required but constraints.txt does not lock it"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{requirement} leaves out {pins[name]}"
        assert any(spec.operator == "<" for spec in requirement.specifier), f"{requirement} has no upper bound"
        upper = min(Version(spec.version) for spec in requirement.specifier if spec.operator == "<")
        assert upper <= Version(f"{Version(pins[name]).major + 1}"), f"{requirement} reaches past the next major"


def test_trl_s_still_needed_says_when_its_code_reads_otherwise(monkeypatch):
    pytest.importorskip("trl", reason="TRL is an extra: pip install 'hftoolkit[preference]'")
    from trl import DPOTrainer, KTOTrainer

    from hftoolkit.patches import trl_1_16

    def reads_more(self, model, inputs, return_outputs):
        return self.beta * self.a_new_coefficient

    monkeypatch.setattr(DPOTrainer, "_compute_loss", reads_more)
    monkeypatch.setattr(KTOTrainer, "_precompute_ref_logps", lambda self, dataset, name: dataset)
    problems = trl_1_16.still_needed()
    assert any("DPOTrainer._compute_loss reads ['a_new_coefficient']" in p for p in problems), problems
    assert any("KTOTrainer._precompute_ref_logps is gone or takes other arguments" in p for p in problems), problems
    assert len(problems) == 2, problems


def test_kto_s_mismatched_answers_are_the_batch_of_all_processes_rotated_by_one():
    """TokenizedPreference adds KL_completion_ids to tokenized KTO rows (shuffled for training) and passes DPO's on."""
    from types import SimpleNamespace

    pytest.importorskip("trl", reason="TRL is an extra: pip install 'hftoolkit[preference]'")
    import datasets
    from trl import DPOTrainer, KTOTrainer

    from hftoolkit.patches import trl_1_16

    rows = datasets.Dataset.from_dict({"prompt_ids": [[1]] * 6, "completion_ids": [[i] for i in range(6)],
                                       "label": [True, False] * 3})
    args = SimpleNamespace(seed=0, per_device_train_batch_size=3)
    kto_class = type("Kto", (trl_1_16.TokenizedPreference, KTOTrainer), {})
    kto = kto_class.__new__(kto_class)
    kto.calculate_KL = True
    prepared = kto._prepare_dataset(rows, None, args, "eval")
    assert prepared["KL_completion_ids"] == [[2], [0], [1], [5], [3], [4]]
    shuffled = kto._prepare_dataset(rows, None, args, "train")
    assert sorted(shuffled["completion_ids"]) == rows["completion_ids"] != shuffled["completion_ids"]
    dpo = type("Dpo", (trl_1_16.TokenizedPreference, DPOTrainer), {})
    assert dpo.__new__(dpo)._prepare_dataset(rows, None, args, "train") is rows
    assert dpo.__new__(dpo)._precompute_ref_logps(rows, "train", 3) is rows


def test_attention_under_cpu_bf16_autocast_runs_in_fp32_while_the_patch_is_on(monkeypatch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hftoolkit.patches.transformers_5 import attention_in_fp32_on_cpu

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append(_dtype_computed_in(q)) or sdpa(q, k, v, **kw))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
    ids = torch.randint(0, 50, (2, 9))
    reference = model(ids, labels=ids).loss
    losses = {}
    try:
        for enabled in (True, False):
            attention_in_fp32_on_cpu(enabled)
            seen.clear()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                losses[enabled] = model(ids, labels=ids).loss
            assert seen == [torch.float32 if enabled else torch.bfloat16]
    finally:
        attention_in_fp32_on_cpu(False)
    seen.clear()
    assert model(ids, labels=ids).loss == reference and seen == [torch.float32]  # outside autocast: as it was
    assert all(abs(loss.item() - reference.item()) < 0.05 for loss in losses.values())


def test_an_additive_attention_mask_is_computed_with_the_query_while_the_patch_is_on():
    """T5 hands sdpa its position bias as a float mask, in bf16 under autocast: it must go to fp32 with the query."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from hftoolkit.patches.transformers_5 import attention_in_fp32_on_cpu

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                num_heads=4, decoder_start_token_id=0, dropout_rate=0.0,
                                                attn_implementation="sdpa"))
    ids = torch.randint(1, 40, (2, 7))
    reference = model(input_ids=ids, labels=ids).loss
    try:
        attention_in_fp32_on_cpu(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
    finally:
        attention_in_fp32_on_cpu(False)
    assert abs(loss.item() - reference.item()) < 0.05


def _dtype_computed_in(tensor):
    """The dtype an op computes `tensor` in: autocast's, where autocast is on (it casts inside the op)."""
    import torch

    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else tensor.dtype
