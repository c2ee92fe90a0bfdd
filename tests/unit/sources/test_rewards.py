"""Task grpo's built-in rewards (an exact answer, a format, a length penalty) and a user's reward function, found
and tried on a dry batch."""

from __future__ import annotations

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.sources import rewards


@pytest.mark.parametrize(("answer", "reference", "right"), [
    ("12", "12", True),
    (" The answer is 12.", "12", True),  # a number: its last number
    ("7 plus 5 is 12", "12", True),
    ("12.0", "12", True),
    ("1,200", "1200", True),
    ("We add them: 40 + 32 = 72 #### 72", "Natalia sold 48 clips ... #### 72", True),  # GSM8K's layout
    ("<answer>Paris</answer> or maybe Lyon", "paris", True),
    ("13", "12", False),
    ("12 then 13", "12", False),  # the last number is the answer
    ("Paris.", "Paris", True),
    ("the city of Paris", "Paris", False),  # not a number: the whole answer, normalised
    ("", "12", False),
])
def test_the_exact_answer_compares_the_final_answer_after_normalising(answer, reference, right):
    reward = rewards.exact_answer("answer")
    assert reward(completions=[answer], answer=[reference]) == [float(right)]


def test_the_exact_answer_reads_a_conversation_s_answer():
    reward = rewards.exact_answer("answer")
    answers = [[{"role": "assistant", "content": "It is 9."}], [{"role": "assistant", "content": "8"}]]
    assert reward(completions=answers, answer=["9", "9"]) == [1.0, 0.0]


def test_the_format_reward_matches_the_whole_answer():
    reward = rewards.format_match(r"-?\d+")
    assert reward(completions=["42", " -3 ", "42 apples", "four"]) == [1.0, 1.0, 0.0, 0.0]


def test_the_length_penalty_starts_past_its_limit():
    reward = rewards.length_penalty(4)
    assert reward(completion_ids=[[1] * 2, [1] * 4, [1] * 6, [1] * 12]) == [0.0, 0.0, -0.5, -2.0]


def test_a_function_is_found_by_file_or_module_and_refused_in_one_line_when_it_is_not(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def brevity(completions, **_):\n"
                                            "    return [-len(c) for c in completions]\n"
                                            "def _helper():\n    pass\n")
    by_file = rewards.load_function(f"{tmp_path}/my_rewards.py:brevity", "rl.rewards.0.function")
    assert by_file(completions=["ab", "abcd"]) == [-2, -4]
    monkeypatch.chdir(tmp_path)
    assert rewards.load_function("my_rewards:brevity", "k")(completions=["a"]) == [-1]
    for spec, said in [(f"{tmp_path}/my_rewards.py:shortness", "has no function 'shortness' (its functions: brevity)"),
                       ("missing/file.py:f", "reward file missing/file.py not found"),
                       ("no_such_module_here:f", "no module named 'no_such_module_here'"),
                       ("my_rewards", "names no function: write module:function or path/to/file.py:function")]:
        with pytest.raises(UserError) as caught:
            rewards.load_function(spec, "rl.rewards.0.function")
        assert said in caught.value.message and "\n" not in caught.value.message
        assert caught.value.message.startswith("rl.rewards.0.function: ")


def test_a_file_that_fails_to_import_is_said_in_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(UserError, match=r"importing .*broken.py failed: ModuleNotFoundError"):
        rewards.load_function(f"{tmp_path}/broken.py:f", "k")


def test_the_dry_batch_catches_a_raise_a_wrong_count_and_values_that_are_not_numbers():
    prompts, columns = ["What is 1 plus 1?", "What is 2 minus 1?"], {"answer": ["2", "1"]}

    def fine(completions, answer, **_):
        assert len(answer) == len(completions)  # the columns come one entry per answer
        return [0.5 if c else None for c in completions]

    def raises(completions, **_):
        raise KeyError("solution")

    def one(completions, **_):
        return [1.0]

    def words(completions, **_):
        return ["good"] * len(completions)

    def nothing(completions, **_):
        return None

    assert rewards.dry_call(fine, "k", prompts, columns) is None
    said = {f.__name__: rewards.dry_call(f, "rl.rewards.1.function", prompts, columns)
            for f in (raises, one, words, nothing)}
    assert said["raises"] == ("rl.rewards.1.function: reward function raises raised KeyError: 'solution' on a dry "
                              "batch of 4 answers: fix the function")
    assert "returned 1 value for a dry batch of 4 answers" in said["one"]
    assert "returned 'good' for an answer" in said["words"]
    assert "returned a NoneType for a dry batch" in said["nothing"]


def test_a_reward_run_must_be_a_finished_reward_run(tmp_path):
    other, unfinished, done = tmp_path / "other", tmp_path / "unfinished", tmp_path / "done"
    for folder, task in ((other, "classification"), (unfinished, "reward"), (done, "reward")):
        folder.mkdir()
        (folder / "recipe.yaml").write_text(f"task: {task}\n")
    (done / "model").mkdir()
    assert "is a task classification run, and a reward comes from a task reward run" in \
        rewards.reward_run_problem(str(other), "k")
    assert "has no trained weights yet" in rewards.reward_run_problem(str(unfinished), "k")
    assert "is not a run directory" in rewards.reward_run_problem(str(tmp_path / "nowhere"), "k")
    assert rewards.reward_run_problem(str(done), "k") is None
