"""`pal tune`: frozen earlier slices, determinism, resume, CLI errors."""

import json

import pytest
import torch
from click.testing import CliRunner
from helpers import make_prepare, write_params

from pipeline import params as pparams
from pipeline.model.checkpoint import checkpoint_path, load_checkpoint
from pipeline.model.train import lr_factor
from pipeline.stages.tune import cli, tune


def _run(params, prepare, out, **kw):
    load = pparams.load
    return tune(
        prepare,
        out,
        load(params, "model"),
        load(params, "prompt"),
        load(params, "tune"),
        **kw,
    )


def _cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


def test_checkpoints_log_and_frozen_earlier_slices(tuned):
    _, _, out = tuned
    states = [load_checkpoint(checkpoint_path(out, k))["state"] for k in (1, 2, 3)]
    assert "prompts.text.P.2" in states[2] and "prompts.text.P.1" not in states[0]
    for k in range(2):  # everything of tasks ≤ k+1 is bit-identical at step k+2
        for key, value in states[k].items():
            assert torch.equal(states[k + 1][key], value), key
    # the slice trained at step k moved away from nothing: it differs per task
    assert not torch.equal(states[2]["prompts.text.P.2"], states[2]["prompts.text.P.1"])
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [(e["task"], e["epoch"]) for e in lines] == [(1, 1), (2, 1), (3, 1)]
    assert set(lines[0]) == {
        "task",
        "epoch",
        "steps",
        "samples",
        "ce",
        "recon",
        "train_acc",
        "loss",
    }  # no timings: same inputs, same bytes
    assert all(e["recon"] > 0 for e in lines)
    assert sorted(p.name for p in out.iterdir()) == [
        "contract.json",
        "log.jsonl",
        "step_01.pt",
        "step_02.pt",
        "step_03.pt",
    ]
    from pipeline.contracts import read_versions

    made_under = json.loads((out / "contract.json").read_text())
    version = read_versions().versions
    assert made_under == {  # the output records its contract (DESIGN §2)
        "stage": "tune",
        "version": version["tune"],
        "method": "pal",
        "method_version": version["tune.pal"],
    }
    assert not out.with_name("tune.partial").exists()
    timings = [
        json.loads(x) for x in (out.parent / "timings.jsonl").read_text().splitlines()
    ]
    assert [(e["task"], e["epoch"]) for e in timings] == [(1, 1), (2, 1), (3, 1)]
    assert all(e["seconds"] >= e["data_wait"] >= 0 for e in timings)
    assert [e["ce"] for e in timings] == [e["ce"] for e in lines]


def _run_interrupted(monkeypatch, params, prepare, out, task):
    """A tune run that stops (KeyboardInterrupt) when it reaches `task`."""
    import pipeline.stages.tune as tune_module

    real = tune_module.train_task

    def train_task(model, k, *args, **kwargs):
        if k == task:
            raise KeyboardInterrupt
        return real(model, k, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(tune_module, "train_task", train_task)
        with pytest.raises(KeyboardInterrupt):
            _run(params, prepare, out)


def test_interrupted_run_resumes_to_the_same_bytes(
    tuned, tmp_path, monkeypatch, caplog
):
    params, prepare, out = tuned
    half = tmp_path / "tune"
    _run_interrupted(monkeypatch, params, prepare, half, 3)
    partial = tmp_path / "tune.partial"
    assert not half.exists()  # nothing reaches the output before the end
    assert sorted(p.name for p in partial.iterdir()) == [
        "SIGNATURE",
        "log.jsonl",
        "step_01.pt",
        "step_02.pt",
    ]
    with caplog.at_level("INFO", logger="pipeline.stages.tune"):
        _run(params, prepare, half)
    assert (
        "reusing steps 1-2 of an interrupted run with the same code, params and "
        f"inputs ({partial}; `pal tune --fresh` discards them)" in caplog.messages
    )
    assert not partial.exists()
    for name in ("step_01.pt", "step_02.pt", "step_03.pt", "log.jsonl"):
        assert (half / name).read_bytes() == (out / name).read_bytes(), name


@pytest.mark.parametrize("where", ["save_checkpoint", "_write_log"])
def test_a_kill_between_a_steps_writes_resumes_to_the_same_bytes(
    tuned, tmp_path, monkeypatch, where
):
    """A step writes its log, then its checkpoint: stopped between the two
    writes of step 2 (or between step 1's), the resumed run's log.jsonl is
    the uninterrupted run's. (The checkpoint came first once: a kill after
    it lost that step's log lines for good.)"""
    import pipeline.stages.tune as tune_module

    params, prepare, out = tuned
    real, calls = getattr(tune_module, where), []

    def stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == (2 if where == "save_checkpoint" else 1):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    half = tmp_path / "tune"
    with monkeypatch.context() as m:
        m.setattr(tune_module, where, stop)
        with pytest.raises(KeyboardInterrupt):
            _run(params, prepare, half)
    _run(params, prepare, half)
    for name in ("step_01.pt", "step_02.pt", "step_03.pt", "log.jsonl"):
        assert (half / name).read_bytes() == (out / name).read_bytes(), name


def _edit_train_sample(prepare, dst, task):
    """A copy of the prepare folder whose first training sample of `task` lost
    its text (as when a file turns out unreadable and counts as missing)."""
    import shutil

    shutil.copytree(prepare, dst)
    lines = (dst / "samples.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        row = json.loads(line)
        if row["split"] == "train" and row["task"] == task:
            row["text"] = "edited"
            lines[i] = json.dumps(row)
            break
    (dst / "samples.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def test_a_rerun_keeps_the_steps_whose_own_inputs_did_not_change(
    tuned, tmp_path, monkeypatch, caplog
):
    params, prepare, _ = tuned
    out = tmp_path / "tune"
    _run_interrupted(monkeypatch, params, prepare, out, 3)  # steps 1, 2 done
    edited = _edit_train_sample(prepare, tmp_path / "prepare-edited", task=2)
    with caplog.at_level("INFO"):
        _run_interrupted(monkeypatch, params, edited, out, 2)  # redoes step 2
    # step 2 of the old inputs is gone: only step 1 waits for the next rerun
    assert sorted(p.name for p in (tmp_path / "tune.partial").iterdir()) == [
        "SIGNATURE",
        "log.jsonl",
        "step_01.pt",
    ]
    with caplog.at_level("INFO"):
        _run(params, edited, out)
    assert (
        f"{out}.partial: keeping steps 1-1; the inputs of step 2 on changed "
        "(--fresh discards all)" in caplog.messages
    )
    assert (
        "reusing steps 1-1 of an interrupted run with the same code, params and "
        f"inputs ({out}.partial; `pal tune --fresh` discards them)" in caplog.messages
    )
    fresh = tmp_path / "fresh"
    _run(params, edited, fresh)
    for name in ("step_01.pt", "step_02.pt", "step_03.pt", "log.jsonl"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


def test_changed_params_or_fresh_discard_unfinished_work(
    tuned, tmp_path, monkeypatch, caplog
):
    params, prepare, _ = tuned
    out = tmp_path / "tune"
    _run_interrupted(monkeypatch, params, prepare, out, 2)
    changed = write_params(
        tmp_path / "p.yaml",
        pparams.load(params, "model").backbone,
        prompt={"length": 2},
    )
    with caplog.at_level("INFO", logger="pipeline.stages.resume"):
        code, output = _cli("--params", changed, "--prepare", prepare, "--out", out)
    assert code == 0, output
    assert (
        f"{out}.partial: discarding unfinished work (code, params or inputs changed)"
        in caplog.messages
    )
    assert load_checkpoint(checkpoint_path(out, 3))["params"]["prompt"]["length"] == 2
    _run_interrupted(monkeypatch, changed, prepare, out, 2)
    caplog.clear()
    with caplog.at_level("INFO", logger="pipeline.stages.resume"):
        _run(changed, prepare, out, fresh=True)
    assert f"{out}.partial: discarding unfinished work (--fresh)" in caplog.messages


def test_stale_steps_of_a_longer_run_are_removed(tuned, tmp_path):
    params, prepare, out = tuned
    again = tmp_path / "tune"
    again.mkdir()
    (again / "step_07.pt").write_bytes(b"from a run with 7 tasks")
    _run(params, prepare, again)
    assert sorted(p.name for p in again.iterdir()) == [
        "contract.json",
        "log.jsonl",
        "step_01.pt",
        "step_02.pt",
        "step_03.pt",
    ]


@pytest.mark.parametrize(
    "section, values, match",
    [
        (
            "model",
            {"backbone": "{tmp}/nope"},
            r"^Error: model\.backbone '.*nope': no such folder, and no hub model of "
            r"that id in the local HF cache$",
        ),
        (
            "model",
            {"backbone": "{tmp}"},
            r"^Error: model\.backbone '.*': not a ViLT folder \(no config\.json\)$",
        ),
        (
            "prompt",
            {"layers": [0, 2]},
            r"^Error: prompt\.layers \[0, 2\]: layer 2 is beyond the backbone's 2 "
            r"layers \(0\.\.1\)$",
        ),
        (
            "prompt",
            {"pool_size": 2},
            r"^Error: prompt\.pool_size 2 is smaller than the number of tasks "
            r"\(3\): each task needs ≥ 1 component$",
        ),
        (
            "tune",
            {"epochs": -1},
            r"^Error: .*p\.yaml: tune\.epochs must be >= 0, got -1$",
        ),
    ],
)
def test_bad_input_is_one_line(
    tmp_path,
    tiny_vilt,
    tiny_prepare,
    section,
    values,
    match,
):
    values = {
        k: v.format(tmp=tmp_path) if isinstance(v, str) else v
        for k, v in values.items()
    }
    params = write_params(tmp_path / "p.yaml", tiny_vilt, **{section: values})
    code, output = _cli(
        "--params", params, "--prepare", tiny_prepare, "--out", tmp_path / "tune"
    )
    assert code == 1 and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1
    assert output.strip() == output.strip().splitlines()[0]
    import re

    assert re.match(match, output.strip()), output
    assert not (tmp_path / "tune" / "step_01.pt").exists()


def test_corrupt_image_names_sample_and_file(tmp_path, tiny_vilt):
    prepare = make_prepare(
        tmp_path, n_tasks=1, classes=2, train=2, test=1, missing_rate=0.0
    )
    bad = tmp_path / "dataset" / "images" / "train-1-0.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    params = write_params(tmp_path / "p.yaml", tiny_vilt, prompt={"pool_size": 2})
    code, output = _cli(
        "--params", params, "--prepare", prepare, "--out", tmp_path / "tune"
    )
    assert code == 1 and "Traceback" not in output
    assert output.strip().splitlines() == [
        f"Error: sample 'train-1-0': cannot read image {bad} (cannot identify image "
        f"file '{bad}')"
    ]


def test_lr_schedule_warms_up_then_decays_to_zero():
    f = [lr_factor(s, 100, 10) for s in range(100)]
    assert f[0] == pytest.approx(1 / 11) and f[9] == pytest.approx(10 / 11)
    assert f[10] == 1.0 and all(a >= b for a, b in zip(f[10:], f[11:], strict=False))
    assert lr_factor(100, 100, 10) == pytest.approx(0.0)


def test_lr_schedule_without_decay_keeps_the_full_rate():
    """`tune.decay: none` (L2P's constant schedule): the warm-up, then 1."""
    assert [lr_factor(s, 100, 0, "none") for s in (0, 50, 99)] == [1.0, 1.0, 1.0]
    f = [lr_factor(s, 100, 10, "none") for s in range(100)]
    assert f[:10] == [lr_factor(s, 100, 10) for s in range(10)]
    assert f[10:] == [1.0] * 90


def test_clip_norm_clips_every_step_and_beta2_reaches_adamw(
    tmp_path, tiny_vilt, tiny_prepare, monkeypatch
):
    """`tune.clip_norm`: each step's gradient over the trained tensors is
    clipped to that global norm before AdamW steps; `tune.beta2` is AdamW's."""
    import pipeline.model.train as train_mod

    seen, real = [], torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        params = list(params)
        before = real(params, max_norm)
        after = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
        )
        seen.append((max_norm, float(before), float(after)))
        return before

    monkeypatch.setattr(train_mod.torch.nn.utils, "clip_grad_norm_", spy)
    betas = []
    real_adamw = torch.optim.AdamW

    def adamw(groups, **kw):
        betas.append(kw["betas"])
        return real_adamw(groups, **kw)

    monkeypatch.setattr("pipeline.model.optim.torch.optim.AdamW", adamw)
    params = write_params(
        tmp_path / "p.yaml",
        tiny_vilt,
        tune={"epochs": 1, "clip_norm": 1e-3, "beta2": 0.999, "device": "cpu"},
    )
    _run(params, tiny_prepare, tmp_path / "tune")
    assert len(seen) > 0 and {m for m, _, _ in seen} == {1e-3}
    assert all(b > 1e-3 for _, b, _ in seen)  # every step's gradient was larger
    assert all(a == pytest.approx(1e-3, rel=1e-4) for _, _, a in seen)
    assert betas and set(betas) == {(0.9, 0.999)}


@pytest.mark.gpu
def test_cuda_graph_tuning_matches_eager_tuning(tmp_path, tiny_vilt, tiny_prepare):
    """`tune.cuda_graphs` changes speed, not results (up to bf16 noise); with
    loader workers, whose pin-memory thread allocates while a graph is captured."""
    runs = {}
    for graphs in (False, True):
        params = write_params(
            tmp_path / f"params-{graphs}.yaml",
            tiny_vilt,
            tune={
                "device": "cuda",
                "cuda_graphs": graphs,
                "epochs": 2,
                "num_workers": 2,
            },
        )
        out = tmp_path / f"tune-{graphs}"
        _run(params, tiny_prepare, out)
        log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
        runs[graphs] = (log, load_checkpoint(checkpoint_path(out, 3))["state"])
    (log_e, state_e), (log_g, state_g) = runs[False], runs[True]
    assert len(log_e) == len(log_g) == 6
    for a, b in zip(log_e, log_g, strict=True):
        assert (a["task"], a["epoch"], a["samples"]) == (
            b["task"],
            b["epoch"],
            b["samples"],
        )
        assert b["ce"] == pytest.approx(a["ce"], rel=0.05, abs=0.01)
        assert b["recon"] == pytest.approx(a["recon"], rel=0.05, abs=0.01)
    assert state_e.keys() == state_g.keys()
    for key, value in state_e.items():
        torch.testing.assert_close(state_g[key], value, rtol=0, atol=2e-2)


def test_zero_epochs_keep_prompts_and_head_at_their_init(
    tmp_path, tiny_vilt, tiny_prepare
):
    """The "never trained" ablation (tune.epochs 0): step k holds exactly the
    model that k calls of add_task with tune's per-task seeds build."""
    from pipeline.data.samples import read_prepare
    from pipeline.methods import build_model
    from pipeline.model.backbone import load_backbone
    from pipeline.model.train import task_seed

    params = write_params(tmp_path / "p.yaml", tiny_vilt, tune={"epochs": 0, "seed": 3})
    _run(params, tiny_prepare, tmp_path / "tune")
    assert (tmp_path / "tune" / "log.jsonl").read_text() == ""
    _, tasks = read_prepare(tiny_prepare)
    backbone = load_backbone(str(tiny_vilt), 12)
    prompt = pparams.load(params, "prompt")
    model = build_model(backbone, prompt, tasks.classes_per_task)
    for k in (1, 2, 3):
        torch.manual_seed(task_seed(3, k))
        model.add_task(torch.Generator().manual_seed(task_seed(3, k)))
        state = load_checkpoint(checkpoint_path(tmp_path / "tune", k))["state"]
        expected = model.tuned_state()
        assert sorted(state) == sorted(expected)
        for key, value in expected.items():
            assert torch.equal(state[key], value), key


def test_prompt_tasks_train_the_prompts_of_the_first_tasks_only(
    tmp_path, tiny_vilt, tiny_prepare
):
    """tune.prompt_tasks 1 (beyond the paper): task 1 trains its slice, tasks 2
    and 3 keep theirs at the init and train only their head rows."""
    params = write_params(tmp_path / "p.yaml", tiny_vilt, tune={"prompt_tasks": 1})
    _run(params, tiny_prepare, tmp_path / "a")
    init = write_params(tmp_path / "i.yaml", tiny_vilt, tune={"epochs": 0})
    _run(init, tiny_prepare, tmp_path / "i")
    last = load_checkpoint(checkpoint_path(tmp_path / "a", 3))["state"]
    first = load_checkpoint(checkpoint_path(tmp_path / "a", 1))["state"]
    at_init = load_checkpoint(checkpoint_path(tmp_path / "i", 1))["state"]
    assert not torch.equal(first["prompts.text.P.0"], at_init["prompts.text.P.0"])
    # the later slices: Gram–Schmidt of the same seeds against the trained
    # slice 1, never moved: orthogonal to it, unit rows as drawn
    for t in (1, 2):
        rows = last[f"prompts.text.P.{t}"].flatten(2)  # (J, n, L·D)
        norms = rows.norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
        trained = last["prompts.text.P.0"].flatten(2)
        overlap = torch.einsum(
            "jnd,jmd->jnm", rows, trained / trained.norm(dim=-1, keepdim=True)
        )
        assert overlap.abs().max() < 1e-5
    # task 3's head rows trained: they left the init the untrained run keeps
    never = load_checkpoint(checkpoint_path(tmp_path / "i", 3))["state"]
    head = [k for k in never if k.startswith("head.") and k.endswith(".2")]
    assert head and all(not torch.equal(last[k], never[k]) for k in head)


def test_keys_added_after_the_contract_are_recorded_only_when_set():
    """tune.decay, tune.beta2 and tune.clip_norm came after tune's outputs were
    first recorded: a checkpoint of params that leave them at their defaults
    holds the record it held before they existed (same bytes)."""
    from palcore.params import outcome_record

    record = outcome_record(pparams.TuneParams())
    assert not {"decay", "beta2", "clip_norm"} & set(record)
    assert list(record) == [
        "epochs",
        "batch_size",
        "lr",
        "head_lr",
        "weight_decay",
        "warmup",
        "recon_weight",
        "prompt_tasks",
        "seed",
        "device",
        "cuda_graphs",
    ]
    own = outcome_record(pparams.TuneParams(decay="none", beta2=0.999, clip_norm=1.0))
    assert (own["decay"], own["beta2"], own["clip_norm"]) == ("none", 0.999, 1.0)
    assert outcome_record(pparams.TuneParams(beta2=0.999)).keys() - record.keys() == {
        "beta2"
    }
