"""A newcomer's mistakes: every usage error of the `kevin` command is one `kevin: error: ...` line
and exit code 2, found before anything slow starts (a compile, a GPU check, a worker, a download),
never a traceback; a bad policy in torch.compile's options fails at the first compile, before
anything is generated; `kevin train` with a missing local model folder names it and the command
that builds it; the quickstart runs on the base install and counts the two caches apart.

The command runs in this process (imports already paid for), its stderr captured at the file
descriptor, so a worker process's traceback would show up too; the time asserted is the call's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kevin_backend.cli.main import EXIT_USAGE, main
from kevin_backend.config import POLICY_NAMES, Config, ConfigError

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
TINY_CONFIG = ROOT / "configs" / "train" / "tiny.yaml"
FAST = 2.0  # seconds: a usage error is found before anything slow starts


def _usage_error(capfd: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `kevin ARGV`; assert exit 2, one `kevin: error:` line, no traceback, done fast; the line."""
    capfd.readouterr()
    began = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - began
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code == EXIT_USAGE, (code, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("kevin: error: "), err
    assert seconds < FAST, f"{seconds:.1f} s: {err}"
    return lines[0]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _prewarm(cache_dir: Path, *argv: str) -> list[str]:
    # A source that would compile a model if the arguments got that far.
    return ["--cache-dir", str(cache_dir), "prewarm", "--model", f"{TESTS}/prewarm_helpers.py:mlp", *argv]


# -- kevin prewarm ----------------------------------------------------------------------------------


def test_prewarm_unknown_policy(cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capfd, _prewarm(cache_dir, "--policy", "nosuch"))
    assert "'nosuch'" in line and POLICY_NAMES in line
    assert not cache_dir.exists()  # nothing compiled, nothing recorded


def test_prewarm_unknown_generator_module(cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capfd, _prewarm(cache_dir, "--generator", "nosuch_mod:factory"))
    assert "no module 'nosuch_mod'" in line
    assert not cache_dir.exists()


def test_prewarm_generator_module_without_the_factory(cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capfd, _prewarm(cache_dir, "--generator", "prewarm_helpers:nosuch"))
    assert "defines no 'nosuch'" in line


@pytest.mark.parametrize("spec", ["nosuch_mod", "nosuch_mod:", ":factory", "a-b:c"])
def test_prewarm_generator_of_the_wrong_form(spec: str, cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert "expects MODULE:FACTORY" in _usage_error(capfd, _prewarm(cache_dir, "--generator", spec))


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--per-gpu", "0", "--per-gpu must be at least 1, got 0"),
    ("--turns", "0", "--turns must be at least 1, got 0"),
    ("--trajectories", "0", "--trajectories must be at least 1, got 0"),
    ("--workers", "0", "--workers must be at least 1, got 0"),
    ("--beam", "-1", "--beam must be at least 0, got -1"),
    ("--turns", "x", "argument --turns: invalid int value: 'x'"),
])
def test_prewarm_counts(flag: str, value: str, message: str, cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert message in _usage_error(capfd, _prewarm(cache_dir, flag, value))
    assert not cache_dir.exists()


def test_prewarm_beam_wider_than_the_trajectories(cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert "--beam (5) must not exceed" in _usage_error(capfd, _prewarm(cache_dir, "--trajectories", "2", "--beam", "5"))


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "nosuch.py:mlp"], "--model expects FILE.py:FACTORY with an existing file"),
    (["--model", f"{TESTS}/prewarm_helpers.py:nosuch"], "defines no 'nosuch'"),
    (["--bench-model", "nope"], "unknown bench model 'nope'"),
    (["--kernelbench", "{tmp}/missing"], "--kernelbench: no such folder"),
    (["--tasks", "{tmp}/missing"], "--tasks: no such folder"),
    (["--gpus", "x"], "--gpus expects indices like 0,1 or 'all'"),
    (["--policy", "replay:{tmp}/missing.json"], "no such replies file"),
    (["--policy", "hf:"], "names no model folder"),
])
def test_prewarm_sources_checked_before_any_compile(argv: list[str], message: str, tmp_path: Path, cache_dir: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    # the model source comes first: a later bad argument must not wait for its compile
    assert message in _usage_error(capfd, _prewarm(cache_dir, *argv))


def test_prewarm_policy_from_the_environment(cache_dir: Path, capfd: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEVIN_POLICY", "nosuch")
    line = _usage_error(capfd, _prewarm(cache_dir))
    assert "KEVIN_POLICY" in line and "'nosuch'" in line


def test_prewarm_search_without_a_gpu_is_refused_before_any_compile(cache_dir: Path, capfd: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The search judges on a GPU: without one (and without --ray or --generator) prewarm says so in
    one line, exit 2, instead of compiling the model and finding nothing to do."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capfd.readouterr()
    code = main(_prewarm(cache_dir, "--policy", "builtin"))
    err = capfd.readouterr().err
    assert code == EXIT_USAGE, err
    assert err.strip().splitlines() == ["kevin: error: prewarming with the kernel search needs a CUDA GPU to judge "
                                        "kernels on (--ray ADDRESS for a cluster's GPUs, or --generator for your own generator)"]
    assert not cache_dir.exists()  # nothing compiled, nothing recorded


def test_prewarm_help_describes_the_command(capfd: pytest.CaptureFixture[str]) -> None:
    """`kevin prewarm --help` says what the command does between its usage and its options, as
    bench, cache and train do."""
    capfd.readouterr()
    assert main(["prewarm", "--help"]) == 0
    out = capfd.readouterr().out
    description = out.split("\n\n")[1]
    assert description.startswith("Fill the kernel cache offline") and "options:" not in description


def test_prewarm_usage_error_in_a_fresh_process(cache_dir: Path) -> None:
    """The installed command as a user runs it: one line on stderr, exit 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "kevin_backend", *_prewarm(cache_dir, "--policy", "nosuch")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"kevin: error: --policy: unknown policy 'nosuch'; valid policies: {POLICY_NAMES}"]


# -- kevin generate, eval, bench, train -------------------------------------------------------------


@pytest.fixture
def task(tmp_path: Path) -> Path:
    from judge_cases import GATED_TASK

    path = tmp_path / "task.py"
    path.write_text(GATED_TASK)
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", "nosuch"], "unknown policy 'nosuch'"),
    (["--trajectories", "0"], "--trajectories must be at least 1, got 0"),
    (["--turns", "0"], "--turns must be at least 1, got 0"),
    (["--beam", "-1"], "--beam must be at least 0"),
    (["--patience", "0"], "--patience must be at least 1"),
    (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--margin", "nan"], "--margin must be >= 0"),
    (["--trajectories", "2", "--beam", "3"], "--beam (3) must not exceed --trajectories (2)"),
])
def test_generate_usage_errors(argv: list[str], message: str, task: Path, cache_dir: Path,
                               capfd: pytest.CaptureFixture[str]) -> None:
    # checked before the GPU check: the same message on a machine with or without one
    line = _usage_error(capfd, ["--cache-dir", str(cache_dir), "generate", str(task), *argv])
    assert message in line


def test_generate_unknown_policy_names_the_valid_ones(task: Path, cache_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert POLICY_NAMES in _usage_error(capfd, ["--cache-dir", str(cache_dir), "generate", str(task), "--policy", "gpt"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--trials", "0"], "--trials must be at least 1"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--salt", "-1"], "--salt must be between 0 and 2^31 - 1"),
])
def test_eval_counts(argv: list[str], message: str, task: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert message in _usage_error(capfd, ["eval", str(task), str(task), "--static-only", *argv])


def test_eval_static_pass_is_no_correctness_verdict(tmp_path: Path, task: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A static pass was never run: `correct` and `score` are null, not false; exit 0."""
    from judge_cases import HONEST

    good = tmp_path / "good.py"
    good.write_text(HONEST[0].source)
    capfd.readouterr()
    assert main(["eval", str(task), str(good), "--static-only", "--json"]) == 0
    verdict = json.loads(capfd.readouterr().out)
    assert verdict["reason"] == "STATIC_OK" and verdict["correct"] is None and verdict["score"] is None
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "good.py").write_text(HONEST[0].source)
    assert main(["eval", str(task), str(folder), "--static-only", "--json"]) == 0
    [verdict] = json.loads(capfd.readouterr().out)
    assert verdict["correct"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--trials", "0"], "--trials must be at least 1"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
    (["--timeout", "0"], "--timeout must be more than 0 seconds"),
    (["--models", "nope"], "unknown model 'nope'"),
])
def test_bench_usage_errors(argv: list[str], message: str, capfd: pytest.CaptureFixture[str]) -> None:
    assert message in _usage_error(capfd, ["bench", "--device", "cpu", *argv])


def test_train_batches(capfd: pytest.CaptureFixture[str]) -> None:
    assert "--batches must be at least 1, got 0" in _usage_error(capfd, ["train", "--config", str(TINY_CONFIG), "--batches", "0"])


def test_argparse_errors_are_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    assert "invalid choice: 'nosuch'" in _usage_error(capfd, ["nosuch"])
    line = _usage_error(capfd, ["prewarm", "--per-gpu", "many"])
    assert "prewarm: argument --per-gpu: invalid int value: 'many'" in line and "kevin prewarm --help" in line


# -- kevin train: the local model folder ------------------------------------------------------------


def test_train_names_the_missing_tiny_model_and_its_builder(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's order run backwards: the tiny config before its model is built. Before: a
    model hub retried for 50 s. Now: the folder and the command that builds it, at once."""
    pytest.importorskip("yaml")
    monkeypatch.chdir(tmp_path)  # a checkout where runs/tiny-lm was never built
    line = _usage_error(capfd, ["train", "--config", str(TINY_CONFIG)])
    assert "model.path runs/tiny-lm: no such model folder" in line
    assert "python tests/test_rl_train.py runs/tiny-lm" in line
    missing = tmp_path / "elsewhere" / "lm"
    line = _usage_error(capfd, ["train", "--config", str(TINY_CONFIG), "--set", f"model.path={missing}"])
    assert f"model.path {missing}: no such model folder" in line and f"python tests/test_rl_train.py {missing}" in line


def test_train_missing_folder_of_another_config(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("yaml")
    config = tmp_path / "mine.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nmodel: {{path: {tmp_path / 'models' / 'lm'}}}\n"
                      f"tasks: {{folders: [{tmp_path}]}}\n")
    line = _usage_error(capfd, ["train", "--config", str(config)])
    assert f"model.path {tmp_path / 'models' / 'lm'}: no such model folder" in line and "--set model.path=" in line


def test_train_hub_names_are_not_taken_for_folders(tmp_path: Path) -> None:
    from kevin_backend.cli.train_cmd import missing_model_folder
    from kevin_backend.rl.train_config import TrainConfig

    def problem(path: str, config: str = "mine.yaml") -> str | None:
        train_config = TrainConfig.from_dict({"run_dir": "r", "model": {"path": path}, "tasks": {"folders": ["t"]}})
        return missing_model_folder(train_config, Path(config))

    assert problem("Qwen/QwQ-32B") is None and problem("gpt2") is None  # left to the hub
    assert problem(str(tmp_path)) is None  # exists
    assert problem("./lm") and problem("runs/tiny-lm") and problem("a/b/c") and problem(str(tmp_path / "x"))
    assert "python -m kevin_backend.rl.tiny make-model runs/h200-builtin-lm --tasks t" in problem(
        "runs/h200-builtin-lm", "configs/train/h200-builtin.yaml")


# -- torch.compile options --------------------------------------------------------------------------


def test_bad_policy_option_fails_at_the_first_compile(tmp_path: Path, inductor_cache: Path) -> None:
    """options={"mode": "generate", "policy": "nosuch"}: the first call fails with the bad name and
    the valid ones, before Inductor compiles or anything is generated (the cache stays empty)."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    cache = tmp_path / "cache"
    compiled = torch.compile(model, backend="kevin", options={"mode": "generate", "policy": "nosuch", "cache_dir": cache})
    began = time.perf_counter()
    with pytest.raises(Exception) as info:
        compiled(torch.randn(4, 8))
    seconds = time.perf_counter() - began
    torch._dynamo.reset()
    error = info.value
    while not isinstance(error, ConfigError) and (getattr(error, "inner_exception", None) or error.__cause__):
        error = getattr(error, "inner_exception", None) or error.__cause__  # Dynamo's BackendCompilerFailed
    assert isinstance(error, ConfigError), repr(info.value)
    assert "'nosuch'" in str(error) and POLICY_NAMES in str(error) and "policy" in str(error)
    assert "nosuch" in str(info.value)  # Dynamo's wrapper carries the message too
    assert not cache.exists() and seconds < 10


@pytest.mark.parametrize("policy", ["auto", "builtin", "openai", "openai:my-model", "vllm:m", "hf:some/folder", "replay:r.json"])
def test_valid_policy_names_pass(policy: str) -> None:
    assert Config.from_options({"policy": policy}).policy == policy


def test_policy_object_still_accepted() -> None:
    class Mine:
        def generate(self, conversations, sampling):  # noqa: ANN001, ANN201
            return []

    assert isinstance(Config.from_options({"policy": Mine()}).policy, Mine)


# -- the quickstart ---------------------------------------------------------------------------------


def test_quickstart_names_the_seed_and_the_user_cache_apart(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from quickstart import describe_caches
    finally:
        sys.path.remove(str(ROOT / "examples"))
    from kevin_backend.cache.store import KernelCache, default_seed_dir

    seed = default_seed_dir()
    text = describe_caches(KernelCache(tmp_path / "absent", seed))
    seeded = len([p for p in seed.iterdir() if p.is_dir()]) if seed is not None else 0
    assert f"seed cache (shipped, read-only): {seeded} entries" in text or seed is None
    assert f"your cache {tmp_path / 'absent'}: 0 entries (not created yet)" in text
    assert not (tmp_path / "absent").exists()
    assert "seed cache (shipped, read-only): off" in describe_caches(KernelCache(tmp_path / "absent", None))


def test_quickstart_imports_only_the_base_install() -> None:
    """The quickstart's own imports (not run) need none of the extras."""
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'examples')!r}); import quickstart; "
              "extras = ('transformers', 'datasets', 'ray', 'matplotlib', 'yaml', 'accelerate', 'peft', 'tensorboard', "
              "'openai', 'httpx', 'vllm', 'pytest'); print([m for m in extras if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


# -- small things: a closed pipe, every command's description, the README's examples ----------------


def test_cache_ls_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`kevin cache ls | head -1`: the reader is gone before the listing is written; no traceback, no
    error line, exit 0 (the closed pipe is no failure of the command)."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "kevin_backend", "--cache-dir", str(tmp_path / "c"), "cache", "ls"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize("command, opening", [("eval", "Judge a candidate kernel program"),
                                              ("generate", "Search for a kernel for one KernelBench-format task")])
def test_eval_and_generate_help_describe_the_command(command: str, opening: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Their --help says what the command does between the usage and the arguments, as the others do."""
    capfd.readouterr()
    assert main([command, "--help"]) == 0
    description = capfd.readouterr().out.split("\n\n")[1]
    assert description.startswith(opening) and "arguments:" not in description and len(description) > 200


def test_the_readmes_cache_examples_say_where_a_key_prefix_comes_from() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "3f2a1b" not in readme
    for action in ("rm", "show"):
        lines = [line for line in readme.splitlines() if line.startswith(f"kevin cache {action} ")]
        assert lines, action
        assert all("kevin cache ls" in line or "`cache ls`" in line for line in lines), lines
