"""``coevolve export`` and ``coevolve eval DIR`` under hostile conditions (issue 42): two exports into one folder, a
run that rotates its checkpoint away mid-export, a full disk, an ``--out`` that cannot be written, a bad shard size,
a damaged or unlabelled exported folder, an exported AZR model; and what makes an export shareable (issue 44): the
umask, the model card's base model, license, generation example and sampling, and the docs' snippets that run."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import torch
from export_checks import export
from filelock import FileLock
from safetensors import SafetensorError
from safetensors.torch import load_file
from typer.testing import CliRunner

import coevolve.export as export_module
from coevolve.cli import app
from coevolve.export import base_model_facts, exported_eval_sets
from coevolve.rundir import LOCK_NAME

RUN = ["run", "grpo", "--quiet", "--set", "steps=2", "--set", "params.questions_per_step=4",
       "--set", "params.group_size=4", "--set", "rollout.max_new_tokens=16", "--set", "eval_sets=[arith_l1]",
       "--set", "eval_limit=4", "--set", "eval_max_new_tokens=24"]
EVAL = ["--sets", "arith_l1", "--limit", "4", "--max-new-tokens", "24"]
DOCS = Path(__file__).resolve().parents[1] / "docs" / "export.md"


@pytest.fixture(scope="module")
def run(small_tiny_arith, tmp_path_factory):
    out = tmp_path_factory.mktemp("export-faults") / "run"
    done = CliRunner().invoke(app, [*RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out)])
    assert done.exit_code == 0, done.output
    return out


def one_error(result, code: int = 2) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == code and len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """What an export left beside ``folder`` under a temporary name."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def test_a_second_export_into_a_folder_being_written_is_refused(run, tmp_path, monkeypatch):
    """Two exports into one --out (the issue's mixed folder): the second, started while the first writes, stops with
    one line and the folder ends with the first export's files only, all listed in its manifest."""
    out, seconds = tmp_path / "out", []
    write = export_module._write_model

    def write_then_race(*args, **kwargs):
        write(*args, **kwargs)
        seconds.append(export(run, out, "--step", "1", "--max-shard-size", "100KB"))

    monkeypatch.setattr(export_module, "_write_model", write_then_race)
    assert export(run, out, "--step", "2").exit_code == 0
    assert "another process is writing" in one_error(seconds[0])
    manifest = json.loads((out / "coevolve_export.json").read_text())
    assert manifest["step"] == 2 and sorted(p.name for p in out.iterdir()) == manifest["files"]
    assert not leftovers(out)


def test_an_export_refuses_a_folder_another_process_holds(run, tmp_path):
    out = tmp_path / "held"
    out.mkdir()
    lock = FileLock(out / LOCK_NAME, timeout=0)
    lock.acquire()
    try:
        assert "another process is writing" in one_error(export(run, out))
    finally:
        lock.release()
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]
    done = export(run, out)  # a stale lock file (its holder gone) is no obstacle, and is not left behind
    assert done.exit_code == 0, done.output
    assert LOCK_NAME not in os.listdir(out)


def test_a_file_that_appears_during_the_export_is_never_replaced(run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    write = export_module._write_model

    def write_while_another_program_writes(*args, **kwargs):
        write(*args, **kwargs)
        (out / "config.json").write_text("someone else's")

    monkeypatch.setattr(export_module, "_write_model", write_while_another_program_writes)
    assert "config.json appeared" in one_error(export(run, out))
    assert [p.name for p in out.iterdir()] == ["config.json"] and (out / "config.json").read_text() == "someone else's"
    assert not leftovers(out)


def test_export_reads_its_own_copy_while_the_run_rotates_checkpoints(run, tmp_path, monkeypatch):
    """A run still training removes old checkpoints (keep_checkpoints): once the export holds its copy, removing the
    run's folder changes nothing; removed before the copy, one line says so and nothing is written."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    step_1 = copy / "checkpoints" / "step_000001"
    trained = load_file(step_1 / "solver.safetensors")
    trained.setdefault("model.embed_tokens.weight", trained["lm_head.weight"])  # tied: the checkpoint names the head
    load_role = export_module.load_role

    def rotate_then_load(checkpoint, **kwargs):
        shutil.rmtree(step_1)  # the run saved two newer checkpoints meanwhile
        return load_role(checkpoint, **kwargs)

    monkeypatch.setattr(export_module, "load_role", rotate_then_load)
    done = export(copy, tmp_path / "out", "--step", "1")
    assert done.exit_code == 0, done.output
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(weights[k], trained[k]) for k in weights)
    monkeypatch.undo()

    link = os.link

    def rotated_before_the_copy(source, target):
        shutil.rmtree(Path(source).parent, ignore_errors=True)
        return link(source, target)

    monkeypatch.setattr(export_module.os, "link", rotated_before_the_copy)
    line = one_error(export(copy, tmp_path / "late", "--step", "2"))
    assert "step_000002" in line and "removed while it was read" in line
    assert not (tmp_path / "late").exists() and not leftovers(tmp_path / "late")


def test_a_checkpoint_copied_across_file_systems_is_verified_the_same(run, tmp_path, monkeypatch):
    """Where hard links fail (another file system), the role's files are copied; a damaged file is still found."""
    def no_links(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(export_module.os, "link", no_links)
    assert export(run, tmp_path / "out").exit_code == 0
    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    weights = damaged / "checkpoints" / "step_000002" / "solver.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-4:] = b"\x00\x00\xc0\x7f"  # a NaN in place: the same size, another checksum
    weights.write_bytes(bytes(raw))
    line = one_error(export(damaged, tmp_path / "out2"))
    assert "step_000002/solver.safetensors" in line and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("failure", ["safetensors", "oserror"])
def test_a_full_disk_is_one_line_and_leaves_nothing(run, tmp_path, monkeypatch, failure):
    import transformers.modeling_utils

    def full(*args, **kwargs):
        if failure == "safetensors":  # what safetensors raises at 40-200 KB free
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    if failure == "safetensors":
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    else:
        monkeypatch.setattr(export_module, "atomic_write_text", full)
    out = tmp_path / "out"
    assert "no space left" in one_error(export(run, out), code=2)
    assert not out.exists() and not leftovers(out)


def test_bad_shard_sizes_and_paths_are_one_line_before_the_model_loads(run, tmp_path, monkeypatch):
    def tripwire(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")

    monkeypatch.setattr(export_module, "load_role", tripwire)
    for size in ("abc", "0", "-1", "0KB", "-5MB", "nanGB"):
        assert "--max-shard-size" in one_error(export(run, tmp_path / "out", "--max-shard-size", size))
    (tmp_path / "file").write_text("")
    assert "is a file" in one_error(export(run, tmp_path / "file" / "out"))
    assert "cannot be created" in one_error(export(run, Path("/proc/coevolve-export")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_unwritable_out_is_one_line(run, tmp_path, monkeypatch):
    """A read-only file system (simulated: this runs as any user, root included) under --out."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(export_module.tempfile, "mkdtemp", read_only)
    line = one_error(export(run, tmp_path / "out"))
    assert "Read-only file system" in line and not (tmp_path / "out").exists()


def test_eval_out_that_cannot_be_written_is_one_line_before_the_model_loads(run, tmp_path, monkeypatch):
    import coevolve.run_models

    def tripwire(*args, **kwargs):
        raise AssertionError("the model was loaded before the error")

    monkeypatch.setattr(coevolve.run_models, "load_run_policy", tripwire)
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "eval"):
        line = one_error(CliRunner().invoke(app, ["eval", str(run), *EVAL, "--out", str(out)]))
        assert "cannot write the results" in line
    monkeypatch.undo()
    line = one_error(CliRunner().invoke(app, ["eval", str(run), *EVAL, "--out", "/proc/coevolve-eval"]))
    assert "cannot write the results to /proc/coevolve-eval" in line  # found when it writes: /proc lets root in


def test_umask_is_followed(run, tmp_path):
    for umask, folder_mode, file_mode in ((0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)):
        before = os.umask(umask)
        try:
            out = tmp_path / f"umask{umask:03o}"
            assert export(run, out).exit_code == 0
        finally:
            os.umask(before)
        assert stat.S_IMODE(out.stat().st_mode) == folder_mode
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == \
            {p.name: file_mode for p in out.iterdir()}


def test_eval_of_a_truncated_export_is_one_line_naming_the_file(run, tmp_path):
    out = tmp_path / "out"
    assert export(run, out).exit_code == 0
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:len(weights.read_bytes()) // 2])
    line = one_error(CliRunner().invoke(app, ["eval", str(out), *EVAL]))
    assert "model.safetensors is cut short or damaged" in line


@pytest.mark.parametrize("manifest", ["missing", "unreadable", "not a mapping"])
def test_an_export_without_its_manifest_is_prompted_as_it_was_trained(run, tmp_path, manifest, caplog):
    """The issue's silent 0.000: a tiny-arith export with no readable manifest was prompted as a chat model. Its
    tokenizer (no chat template, one character per token) says how to prompt it, and one line says so."""
    folder = tmp_path / "export"
    assert export(run, folder).exit_code == 0
    results = {}
    for name in ("with", "without"):
        if name == "without":
            {"missing": lambda p: p.unlink(), "unreadable": lambda p: p.write_bytes(b"{\xff"),
             "not a mapping": lambda p: p.write_text("[1]")}[manifest](folder / "coevolve_export.json")
        caplog.clear()
        done = CliRunner().invoke(app, ["eval", str(folder), *EVAL, "--out", str(tmp_path / name)])
        assert done.exit_code == 0, done.output
        results[name] = [json.loads(line) for line in (tmp_path / name / "arith_l1" / "results.jsonl").open()]
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "prompt" in r.getMessage()]
        assert len(said) == (name == "without") and all("raw formats (compact)" in line for line in said)
    assert [r["prompt"] for r in results["without"]] == [r["prompt"] for r in results["with"]]
    assert all(r["prompt"].startswith("Q:") for r in results["with"])
    assert [r["completions"] for r in results["without"]] == [r["completions"] for r in results["with"]]


def test_a_folder_with_a_chat_template_is_prompted_through_it(run, tmp_path):
    from coevolve.models import load_policy

    folder = tmp_path / "chat"
    assert export(run, folder).exit_code == 0
    with_chat_template(folder)
    (folder / "coevolve_export.json").unlink()
    policy = load_policy(str(folder))
    assert policy.prompt_style == "chat" and policy.format_prompt("hi").startswith("<|user|>")


def with_chat_template(folder: Path) -> None:
    """Give an exported folder's tokenizer a minimal chat template (a stand-in for a chat model's)."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    config_path.write_text(json.dumps(config))


def test_an_exported_program_world_model_evaluates_the_program_sets(random_model_dir, tmp_path, monkeypatch):
    """An exported AZR (tiny-program) model evaluated on the arithmetic sets by default; its manifest records the
    run's task and sets, and `coevolve eval DIR` defaults to them."""
    import coevolve.evaluation.harness as harness
    from coevolve.config import to_yaml
    from coevolve.models import load_policy
    from coevolve.recipes import resolve
    from coevolve.store import RunStore

    config, _, _ = resolve("azr", sets=[f"model={random_model_dir}", "steps=1", "task=program"])
    assert config.task == "program"
    run_dir = tmp_path / "azr"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(config))
    model = load_policy(str(random_model_dir)).model
    RunStore(run_dir).save_checkpoint(1, {"solver": model}, {"solver": torch.optim.AdamW(model.parameters())}, {})
    folder = tmp_path / "export"
    done = export(run_dir, folder)
    assert done.exit_code == 0, done.output
    manifest = json.loads((folder / "coevolve_export.json").read_text())
    program_sets = ["prog_deduction", "prog_abduction", "prog_induction"]
    assert manifest["task"] == "program" and manifest["eval_sets"] == (config.eval_sets or program_sets)
    asked = []
    monkeypatch.setattr(harness, "evaluate", lambda policy, engine, sets, **kwargs: asked.append(sets) or {})
    assert CliRunner().invoke(app, ["eval", str(folder)]).exit_code == 0
    assert asked == [manifest["eval_sets"]] and all(name.startswith("prog_") for name in asked[0])
    # an export made before the manifest named its sets: its task, or its base model tiny-program
    for old in ({"task": "program"}, {"base_model": "tiny-program"}, {"task": "arith"}):
        (folder / "coevolve_export.json").write_text(json.dumps({**old, "prompt_style": "compact"}))
        assert exported_eval_sets(folder) == (program_sets if old != {"task": "arith"} else
                                              [f"arith_l{n}" for n in range(1, 7)])
    (folder / "coevolve_export.json").unlink()
    assert exported_eval_sets(folder) is None


def test_the_model_card_names_its_base_license_example_and_sampling(run, tmp_path):
    folder = tmp_path / "out"
    assert export(run, folder).exit_code == 0
    card = (folder / "README.md").read_text()
    front = card.split("---")[1]
    assert "license: apache-2.0" in front  # a tiny build (build_info.json): coevolve's own license
    assert "base_model:" not in front  # a local folder is no Hub id
    assert "sampled with greedy decoding" in card and "Greedy accuracy" not in card
    assert "tokenizer('Q:" in card and "apply_chat_template" not in card
    sampled = tmp_path / "sampled"
    shutil.copytree(run, sampled)
    config = (sampled / "config.yaml").read_text()
    (sampled / "config.yaml").write_text(re.sub(r"eval_preset: \w+", "eval_preset: ttrl", config))
    assert export(sampled, tmp_path / "out2").exit_code == 0
    card = (tmp_path / "out2" / "README.md").read_text()
    assert "the mean over 16 samples per question at temperature 0.6, top-p 0.95 (the `ttrl` protocol)" in card


def test_base_model_facts(tmp_path, small_tiny_arith):
    assert base_model_facts("smollm2-135m") == ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")
    assert base_model_facts("tiny-arith") == (None, "apache-2.0")
    assert base_model_facts(str(small_tiny_arith[1])) == (None, "apache-2.0")
    (tmp_path / "README.md").write_text("---\nlicense: mit\nbase_model: someone/base\n---\n# a model\n")
    assert base_model_facts(str(tmp_path)) == ("someone/base", "mit")
    assert base_model_facts("someone/not-cached") == ("someone/not-cached", None)  # offline: no card to read
    assert base_model_facts(str(tmp_path / "nothing")) == (None, None)


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.S)


def _run_snippet(code: str, capsys) -> str:
    exec(compile(code, "<snippet>", "exec"), {"__name__": "snippet"})  # the docs' own text, not model output
    return capsys.readouterr().out


def test_the_cards_generation_example_runs(run, tmp_path, capsys):
    folder = tmp_path / "out"
    assert export(run, folder).exit_code == 0
    [example] = _python_blocks((folder / "README.md").read_text())
    capsys.readouterr()
    assert _run_snippet(example.replace('"DIR"', repr(str(folder))), capsys).strip()
    from coevolve.export import generation_example
    from coevolve.models import load_policy
    from coevolve.run_models import find_checkpoint

    with_chat_template(folder)
    (folder / "coevolve_export.json").unlink()
    lines = generation_example(load_policy(str(folder)), find_checkpoint(run).config, repr(str(folder))[1:-1])
    assert any("apply_chat_template" in line for line in lines)
    assert _run_snippet("\n".join(lines), capsys).strip()


def test_the_docs_snippets_run(run, tmp_path, capsys):
    """docs/export.md: both transformers snippets run (the chat one on a folder with a chat template; the old one
    failed on tiny-arith), and the vLLM one starts its engine under a main guard (not run here: 2-3 minutes)."""
    import ast

    blocks = _python_blocks(DOCS.read_text())
    chat, raw = (b for b in blocks if "AutoModelForCausalLM" in b)
    tiny, templated = tmp_path / "tiny", tmp_path / "templated"
    assert export(run, tiny).exit_code == 0
    shutil.copytree(tiny, templated)
    with_chat_template(templated)
    capsys.readouterr()
    assert _run_snippet(raw.replace('"models/grpo"', repr(str(tiny))), capsys).strip()
    assert _run_snippet(chat.replace('"models/grpo"', repr(str(templated))), capsys).strip()
    [vllm] = [b for b in blocks if "from vllm" in b]
    guard = [node for node in ast.parse(vllm).body if isinstance(node, ast.If)]
    assert len(guard) == 1 and "__main__" in ast.unparse(guard[0].test) and "LLM(" in ast.unparse(guard[0])
    assert "LLM(" not in "".join(ast.unparse(n) for n in ast.parse(vllm).body if not isinstance(n, ast.If))
