"""The scenes of tests/test_faults.py: each function injects one fault into a
scratch folder (a copy of a stage's inputs, or its unfinished work) and
returns the `Case`: the command a user runs next and what must hold after it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import h5py
import pytest
import torch
from click.testing import CliRunner
from helpers import flip_keeping_mtime

from pipeline import params as pparams
from pipeline.cli import main as pal
from pipeline.stages.extract import extract
from solver.cli import main as pal_solver

D = 12  # synthetic feature width
SOLVE = """\
solve: {eta: 1.0, width: 48, seed: 0, method: gram, device: cpu, batch_rows: 50}
evaluate: {device: cpu, batch_rows: 50}
"""
CHAINS = (
    SOLVE
    + """\
data: {tasks: 3}
protocol: {runs: [0, 1], vary: [upsampling]}
ablation: {pal: {label: PAL, changes: {}}}
pipelines: {main: [pal]}
"""
)
BOMB = """\
a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
solve: {width: *h}
"""  # 10^8 zeros once expanded


@dataclass
class Scene:
    """A scratch folder and the references a fault is compared with."""

    root: Path
    tuned: tuple[Path, Path, Path]  # params, prepare, tune folder (clean run)
    extracted: Path  # a clean extract of `tuned`
    features: Path  # synthetic features, 3 steps
    solved: Path  # a clean solve of `features` (folder with weights.h5)
    weights: Path  # a clean solve of `extracted` (predict's weights)


@dataclass
class Case:
    """The command a user runs after the fault, and what to check."""

    tool: Callable
    args: list
    survive: list[Path] = field(default_factory=list)  # files kept byte for byte
    absent: list[Path] = field(default_factory=list)  # nothing written there
    recovered: tuple[Path, Path] | None = None  # (output, clean reference)
    repair: Callable[[], None] | None = None  # what the line names, then a rerun


# ------------------------------------------------------------ building blocks


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Change one byte (the middle one by default); the size stays."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def interrupted_extract(scene: Scene, out: Path) -> None:
    """`pal extract` stopped when it reaches step 3 (steps 1-2 finished)."""
    import pipeline.stages.extract as module

    params, prepare, tune_dir = scene.tuned
    real = module.extract_step

    def stop(model, step, *args, **kwargs):
        if step == 3:
            raise KeyboardInterrupt
        return real(model, step, *args, **kwargs)

    with mock.patch.object(module, "extract_step", stop):
        with pytest.raises(KeyboardInterrupt):
            extract(prepare, tune_dir, out, pparams.load(params, "extract"))


def interrupted_tune(scene: Scene, out: Path) -> None:
    """`pal tune` stopped when it reaches task 3 (steps 1-2 finished)."""
    import pipeline.stages.tune as module

    params, prepare, _ = scene.tuned
    real = module.train_task

    def stop(model, task, *args, **kwargs):
        if task == 3:
            raise KeyboardInterrupt
        return real(model, task, *args, **kwargs)

    load = pparams.load
    with mock.patch.object(module, "train_task", stop):
        with pytest.raises(KeyboardInterrupt):
            sections = [load(params, s) for s in ("model", "prompt", "tune")]
            module.tune(prepare, out, *sections, timings=scene.root / "t.jsonl")


def tune_args(scene: Scene, out: Path, prepare: Path | None = None) -> list:
    params, clean_prepare, _ = scene.tuned
    return [
        "tune",
        "--params",
        params,
        "--prepare",
        prepare or clean_prepare,
        "--out",
        out,
        "--timings",
        scene.root / "t.jsonl",
    ]


def extract_args(scene: Scene, out: Path, prepare: Path | None = None) -> list:
    params, clean_prepare, tune_dir = scene.tuned
    return [
        "extract",
        "--params",
        params,
        "--prepare",
        prepare or clean_prepare,
        "--tune",
        tune_dir,
        "--out",
        out,
    ]


def edited_prepare(scene: Scene, line: int, edit: Callable[[bytes], bytes]) -> Path:
    """A copy of the prepare folder with line `line` of samples.jsonl edited."""
    folder = scene.root / "prepare"
    shutil.copytree(scene.tuned[1], folder)
    path = folder / "samples.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[line - 1] = edit(lines[line - 1])
    path.write_bytes(b"".join(lines))
    return folder


def chains(scene: Scene) -> Path:
    """Features of chains pal/0 and pal/1 (3 steps each) and params for them."""
    for run in ("0", "1"):
        shutil.copytree(scene.features, scene.root / "extract" / "pal" / run)
    (scene.root / "params.yaml").write_text(CHAINS)
    return scene.root / "params.yaml"


# ------------------------------------------------------------ the faults


def partial_shard(damage: Callable[[Path], None]) -> Callable[[Scene], Case]:
    def inject(scene: Scene) -> Case:
        out = scene.root / "extract"
        interrupted_extract(scene, out)
        damage(scene.root / "extract.partial")
        tune = sorted(scene.tuned[2].glob("*.pt"))
        return Case(
            pal,
            extract_args(scene, out),
            survive=tune,
            recovered=(out, scene.extracted),
        )

    return inject


def tune_partial_corrupted(scene: Scene) -> Case:
    out = scene.root / "tune"
    interrupted_tune(scene, out)
    flip_byte(scene.root / "tune.partial" / "step_01.pt")
    return Case(pal, tune_args(scene, out), recovered=(out, scene.tuned[2]))


def unsafe_pickle(scene: Scene) -> Case:
    params, prepare, clean = scene.tuned
    tune_dir = scene.root / "tune"
    shutil.copytree(clean, tune_dir)
    torch.save({"hash": print}, tune_dir / "step_02.pt")  # a global: code to run
    out = scene.root / "extract"
    shutil.copytree(scene.extracted, out)
    args = [
        "extract",
        "--params",
        params,
        "--prepare",
        prepare,
        "--tune",
        tune_dir,
        "--out",
        out,
    ]
    return Case(
        pal,
        args,
        survive=sorted(out.rglob("*.h5")),
        absent=[scene.root / "extract.partial"],
    )


def samples_line(edit: Callable[[bytes], bytes], command: str = "extract"):
    def inject(scene: Scene) -> Case:
        prepare = edited_prepare(scene, 2, edit)
        out = scene.root / command
        args = extract_args(scene, out, prepare)
        if command == "tune":
            args = tune_args(scene, out, prepare)
        return Case(pal, args, absent=[out, scene.root / f"{command}.partial"])

    return inject


def other_class_name(line: bytes) -> bytes:
    row = json.loads(line)
    return (json.dumps({**row, "class_name": "green dog"}) + "\n").encode()


def captions_surrogate(scene: Scene) -> Case:
    root = scene.root / "dataset"
    root.mkdir()
    samples = [
        {
            "id": f"s{i}",
            "split": "train",
            "class_name": f"c{i % 2}",
            "image": None,
            "text": "a caption",
        }
        for i in range(4)
    ]
    doc = {
        "format": "pal-demo",
        "version": 1,
        "samples": samples,
        "classes": [{"name": "c0"}, {"name": "c1"}],
    }
    text = json.dumps(doc).replace('"a caption"', '"a caption \\udcff"', 2)
    (root / "captions.json").write_text(text)  # JSON's escape: a lone surrogate
    (scene.root / "params.yaml").write_text(f"data: {{root: {root}, tasks: 1}}\n")
    args = [
        "prepare",
        "--params",
        scene.root / "params.yaml",
        "--out",
        scene.root / "prepare",
    ]
    return Case(pal, args, absent=[scene.root / "prepare"])


def solve_args(scene: Scene, params: Path, out: Path, *more) -> list:
    return [
        "solve",
        "--features",
        scene.features,
        "--params",
        params,
        "--out",
        out,
        *more,
    ]


def solved_copy(scene: Scene, params_text: str = SOLVE) -> tuple[Path, Path]:
    out = scene.root / "solve"
    shutil.copytree(scene.solved, out)
    (scene.root / "params.yaml").write_text(params_text)
    return scene.root / "params.yaml", out


def state_corrupted(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    first = scene.root / "first"
    shutil.copytree(scene.features, first)
    shutil.rmtree(first / "step_03")
    state = scene.root / "state.h5"
    args = [
        "solve",
        "--features",
        first,
        "--params",
        params,
        "--out",
        scene.root / "w12",
        "--save-state",
        state,
    ]
    assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    with h5py.File(state, "r") as f:
        offset = f["G"].id.get_offset()  # a byte of G's data, not of HDF5's
    flip_byte(state, offset + 8)
    return Case(
        pal_solver,
        solve_args(scene, params, out, "--state", state),
        survive=[out / "weights.h5", state],
    )


def shard_truncated(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    features = scene.root / "features"
    shutil.copytree(scene.features, features)
    path = features / "step_02" / "train.h5"
    path.write_bytes(path.read_bytes()[:3000])
    args = ["solve", "--features", features, "--params", params, "--out", out]
    return Case(pal_solver, args, survive=[out / "weights.h5"])


def missing_step(scene: Scene) -> Case:
    params = chains(scene)
    shutil.rmtree(scene.root / "extract" / "pal" / "1" / "step_03")
    args = [
        "solve",
        "--pipeline",
        "main",
        "--params",
        params,
        "--features",
        scene.root / "extract",
        "--out",
        scene.root / "solve",
    ]
    return Case(pal_solver, args, absent=[scene.root / "solve"])


def other_width(scene: Scene) -> Case:
    params = chains(scene)
    for run in ("0", "1"):
        shutil.copytree(scene.solved, scene.root / "solve" / "pal" / run)
    wide = scene.root / "solve" / "pal" / "1"
    shutil.rmtree(wide)
    (scene.root / "wide.yaml").write_text(SOLVE.replace("width: 48", "width: 64"))
    args = solve_args(scene, scene.root / "wide.yaml", wide)
    assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    args = [
        "evaluate",
        "--pipeline",
        "main",
        "--params",
        params,
        "--features",
        scene.root / "extract",
        "--solve",
        scene.root / "solve",
        "--out",
        scene.root / "evaluate",
    ]
    return Case(pal_solver, args, absent=[scene.root / "evaluate"])


def stale_temp(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    (out / "weights.h5").unlink()
    (out / f".weights.h5.tmp.{dead_pid()}").write_bytes(b"half a file")
    return Case(
        pal_solver, solve_args(scene, params, out), recovered=(out, scene.solved)
    )


def hostile_params(text: str, tool: Callable = pal_solver) -> Callable[[Scene], Case]:
    def inject(scene: Scene) -> Case:
        params, out = solved_copy(scene, text)
        if tool is pal:
            return Case(pal, ["check", "--params", params])
        return Case(
            pal_solver, solve_args(scene, params, out), survive=[out / "weights.h5"]
        )

    return inject


def truncate(name: str) -> Callable[[Path], None]:
    def damage(partial: Path) -> None:
        path = partial / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return damage


# ------------------------------------------------------------ content checks


def _dvc(root: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


OUT = "data/extract/pal/0"


def recorded_features(scene: Scene) -> Path:
    """A DVC project whose `dvc repro` recorded scene.features as the output
    of stage extract@pal-0 (its lock, its manifest and objects in the cache)."""
    root = scene.root / "project"
    root.mkdir()
    _dvc(root, "init", "--no-scm", "-q")
    stage = {
        "foreach": ["pal-0"],
        "do": {
            "cmd": f"mkdir -p data/extract/pal && cp -r {scene.features} {OUT}",
            "outs": [OUT],
        },
    }
    (root / "dvc.yaml").write_text(json.dumps({"stages": {"extract": stage}}))
    _dvc(root, "repro", "-q")
    return root


def shard_bit_rot(scene: Scene) -> Case:
    """The repair is what `pal verify` names, run as it names it."""
    project = recorded_features(scene)
    features = project / "data/extract/pal/0"
    flip_keeping_mtime(features / "step_02" / "train.h5")
    (scene.root / "params.yaml").write_text(SOLVE)
    out = scene.root / "solve"
    args = [
        "solve",
        "--features",
        features,
        "--params",
        scene.root / "params.yaml",
        "--out",
        out,
    ]

    def repair() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "verify"],
            cwd=project,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1, done.stderr
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error")]
        assert line == (
            "Error: data/extract/pal/0/step_02/train.h5 (stage extract@pal-0): its "
            "bytes differ from the lock's md5: `dvc checkout --relink "
            "data/extract/pal/0`"
        )
        _dvc(project, *line.split("`")[1].split()[1:])

    return Case(
        pal_solver, args, absent=[out], repair=repair, recovered=(out, scene.solved)
    )


def shard_float16(scene: Scene) -> Case:
    """The features rewritten as float16 under extract's stored_dtype; the
    repair (rerun extract) stands as the clean shard written back: extract
    gives the same bytes again (the table's recovery rows show it)."""
    params, _ = solved_copy(scene)
    features = scene.root / "features"
    shutil.copytree(scene.features, features)
    path = features / "step_02" / "train.h5"
    clean = path.read_bytes()
    with h5py.File(path, "a") as f:
        f.attrs["stored_dtype"] = "float32"
        x = f["features"][()]
        del f["features"]
        f["features"] = x.astype("float16")
    out = scene.root / "fresh"
    args = ["solve", "--features", features, "--params", params, "--out", out]
    return Case(
        pal_solver,
        args,
        absent=[out],
        repair=lambda: path.write_bytes(clean),
        recovered=(out, scene.solved),
    )


def oversized_width(scene: Scene) -> Case:
    """A width whose solve cannot fit this machine's memory: refused before a
    shard is read; the repair is the width the line asks for."""
    params = scene.root / "params.yaml"
    params.write_text(SOLVE.replace("width: 48", "width: 100000"))
    out = scene.root / "solve"
    return Case(
        pal_solver,
        solve_args(scene, params, out),
        absent=[out],
        repair=lambda: params.write_text(SOLVE),
        recovered=(out, scene.solved),
    )


def empty_task(scene: Scene) -> Case:
    """N24News whose test split lacks a section (no params can make an empty
    task; a layout can): prepare refuses before any GPU work. The repair is
    the listing with that section's test articles back."""
    from test_readers import make_n24news

    data = scene.root / "n24news"
    make_n24news(data)
    doc = {"data": {"dataset": "n24news", "root": str(data), "tasks": 24}}
    params = scene.root / "params.yaml"
    params.write_text(json.dumps(doc))
    clean = scene.root / "clean"
    args = ["prepare", "--params", params, "--out", clean]
    assert CliRunner().invoke(pal, [str(a) for a in args]).exit_code == 0
    test = data / "news" / "nytimes_test.json"
    whole = test.read_text()
    items = [i for i in json.loads(whole) if i["section"] != "Section 07"]
    test.write_text(json.dumps(items))
    out = scene.root / "prepare"
    return Case(
        pal,
        ["prepare", "--params", params, "--out", out],
        absent=[out],
        repair=lambda: test.write_text(whole),
        recovered=(out, clean),
    )


def predict_symlink_out(scene: Scene) -> Case:
    """A symlink in predict's input folder pointing out of it: the path is
    resolved before the outside-path rule. The line names the flag that reads
    it; with it, the row's prediction is that of the same photo in place."""
    from pipeline.data.samples import read_prepare

    params, prepare, tune_dir = scene.tuned
    samples, tasks = read_prepare(prepare)
    row = next(s for s in samples if s.split == "test" and s.missing == 0)
    (scene.root / "params.yaml").write_text(SOLVE)

    def folder(name: str, link: bool) -> Path:
        where = scene.root / name
        (where / Path(row.image).parent).mkdir(parents=True)
        photo = tasks.root / row.image
        if link:
            (scene.root / "elsewhere").mkdir()
            shutil.copy(photo, scene.root / "elsewhere" / "photo.png")
            (where / row.image).symlink_to(scene.root / "elsewhere" / "photo.png")
        else:
            shutil.copy(photo, where / row.image)
        line = {"id": row.id, "image": row.image, "text": row.text}
        (where / "in.jsonl").write_text(json.dumps(line) + "\n")
        return where

    def args(where: Path, out: Path) -> list:
        return [
            "predict",
            where / "in.jsonl",
            "--params",
            scene.root / "params.yaml",
            "--tune",
            tune_dir,
            "--weights",
            scene.weights,
            "--device",
            "cpu",
            "--out",
            out / "predictions.jsonl",
        ]

    ref = scene.root / "reference"
    ref.mkdir()
    clean = folder("in-place", link=False)
    assert CliRunner().invoke(pal, [str(a) for a in args(clean, ref)]).exit_code == 0
    out = scene.root / "predicted"
    out.mkdir()
    case = Case(pal, args(folder("input", link=True), out), recovered=(out, ref))
    case.repair = lambda: case.args.append("--allow-outside-paths")
    return case


# ------------------------------------------------------------ round 3


def stamp_into_a_data_folder(scene: Scene) -> Case:
    """`pal contracts stamp --out data`, mistyped: data/raw is the user's."""
    raw = scene.root / "data" / "raw" / "demo" / "captions.json"
    raw.parent.mkdir(parents=True)
    raw.write_text("{}")
    params = scene.root / "params.yaml"
    params.write_text(scene.tuned[0].read_text())
    args = ["contracts", "stamp", "--params", params, "--out", scene.root / "data"]
    return Case(pal, args, survive=[raw], absent=[scene.root / "data" / "pixels.json"])


def _solve_args(scene: Scene, features: Path) -> list:
    (scene.root / "params.yaml").write_text(SOLVE)
    params = scene.root / "params.yaml"
    return [
        "solve",
        "--features",
        features,
        "--params",
        params,
        "--out",
        scene.root / "solve",
    ]


def sealed_copy_bit_rot(scene: Scene) -> Case:
    """A features folder taken out by `pal-solver export`, one bit flipped
    there (mtime kept); the repair copies it again from its source."""
    from solver.export import export

    copy = scene.root / "elsewhere" / "features"
    export(scene.features, copy)
    flip_keeping_mtime(copy / "step_02" / "train.h5")

    def repair() -> None:
        shutil.rmtree(copy)
        export(scene.features, copy)

    held = sorted(scene.features.rglob("*.h5"))
    return Case(
        pal_solver,
        _solve_args(scene, copy),
        survive=held,
        absent=[scene.root / "solve"],
        repair=repair,
    )


def mixed_chains(scene: Scene) -> Case:
    """Step 2 of another run (its recorded params name another seed) in one
    chain's features folder; the repair puts the chain's own step back."""
    mixed = scene.root / "mixed"
    shutil.copytree(scene.features, mixed)
    for shard in mixed.rglob("*.h5"):
        seed = 1 if shard.parent.name == "step_02" else 0
        with h5py.File(shard, "r+") as f:
            f.attrs["params"] = json.dumps({"tune": {"seed": seed}})

    def repair() -> None:
        for shard in (mixed / "step_02").glob("*.h5"):
            with h5py.File(shard, "r+") as f:
                f.attrs["params"] = json.dumps({"tune": {"seed": 0}})

    return Case(
        pal_solver,
        _solve_args(scene, mixed),
        absent=[scene.root / "solve"],
        repair=repair,
    )


def files_listing(
    fault: str | None, command: str = "prepare", **data
) -> Callable[[Scene], Case]:
    """The files-layout dataset of tests/test_files_dataset.py (12 classes in
    4 tasks, with these `data` keys) broken by its listing fault named
    `fault` (None: none), met by `pal prepare` (which writes nothing; the
    repair is the dataset as it was, the output then a clean run's) or by
    `pal check` (the committed params with this `data`)."""

    def inject(scene: Scene) -> Case:
        import yaml
        from helpers import committed
        from test_files_dataset import LISTING_FAULTS, PER_SPLIT, SIZES

        from pipeline.fakes.trees import make_files_tree

        root = scene.root / "files"
        make_files_tree(root, 12, PER_SPLIT, sizes=SIZES)
        kept = scene.root / "files.clean"
        shutil.copytree(root, kept)
        params = scene.root / "params.yaml"
        own = {"dataset": "files", "root": str(root), "tasks": 4} | data
        if command == "check":
            doc = yaml.safe_load(committed("params.yaml"))
            doc["data"].update(own)
            params.write_text(yaml.safe_dump(doc))
        else:
            params.write_text(json.dumps({"data": own}))
        clean = scene.root / "clean"
        if command == "prepare":
            args = ["prepare", "--params", params, "--out", clean]
            assert CliRunner().invoke(pal, [str(a) for a in args]).exit_code == 0
        for f in LISTING_FAULTS:
            if f.name == fault:
                f.edit(root)
        listing = root / "listing.jsonl"
        if command == "check":
            return Case(pal, ["check", "--params", params], survive=[listing])

        def repair() -> None:
            shutil.rmtree(root)
            shutil.copytree(kept, root)

        out = scene.root / "prepare"
        return Case(
            pal,
            ["prepare", "--params", params, "--out", out],
            survive=[listing],
            absent=[out],
            repair=repair,
            recovered=(out, clean),
        )

    return inject
