"""`pal-solver solve` / `evaluate`: files, one-line errors, earlier outputs kept."""

import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import heavy_modules_after

from solver.cli import main
from solver.synthetic import make_features
from solver.weights import WeightsFile

D = 12
PARAMS = """\
evaluate:
  device: cpu
  batch_rows: 50
solve:
  eta: 1.0
  width: 48
  seed: 0
  method: gram
  device: cpu
  dtype: float64
  batch_rows: 50
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Features, params, and a good solve + evaluate, made once per module."""
    root = tmp_path_factory.mktemp("pristine")
    make_features(
        root / "extract", [80, 60, 70], [2, 2, 2], feature_dim=D, test_rows=15, seed=4
    )
    (root / "params.yaml").write_text(PARAMS)
    ctx = context(root)
    assert invoke(ctx, "solve").exit_code == 0
    assert invoke(ctx, "evaluate").exit_code == 0
    return root


def context(root):
    return {"root": root, "features": root / "extract", "params": root / "params.yaml"}


@pytest.fixture
def run(tmp_path, pristine):
    """A working copy of `pristine`: the earlier outputs each test must keep."""
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return context(tmp_path)


def invoke(ctx, command, *args):
    root = ctx["root"]
    base = ["--features", str(ctx["features"]), "--params", str(ctx["params"])]
    if command == "solve":
        base += ["--out", str(root / "solve")]
    else:
        base += [
            "--weights",
            str(root / "solve" / "weights.h5"),
            "--out",
            str(root / "results"),
        ]
    return CliRunner().invoke(main, [command, *base, *args])


def assert_one_line_error(result, match):
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.stderr
    assert match in errors[0], errors[0]
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    )


def test_solve_and_evaluate_write_their_files(run):
    root = run["root"]
    assert sorted(p.name for p in (root / "solve").iterdir()) == ["weights.h5"]
    assert sorted(p.name for p in (root / "results").iterdir()) == [
        "accuracy_matrix.csv",
        "metrics.json",
        "step_accuracy.csv",
        "step_accuracy.png",
    ]
    m = json.loads((root / "results" / "metrics.json").read_text())
    assert set(m) == {
        "acc",
        "fg",
        "fg_diag",
        "aia",
        "last",
        "matrix",
        "step_accuracy",
        "acc_by_task",
        "acc_by_missing",
        "bp",
        "width",
        "eta",
    }
    assert (m["width"], m["eta"]) == (48, 1.0)  # what solve used
    assert [len(r) for r in m["matrix"]] == [1, 2, 3]
    final = m["matrix"][-1]
    assert m["acc_by_task"]["first"] == final[0]
    # from the unrounded matrix: within the rounding of its entries
    assert m["acc_by_task"]["later"] == pytest.approx(
        (final[1] + final[2]) / 2, abs=1e-6
    )
    with h5py.File(root / "solve" / "weights.h5", "r") as f:
        assert f.attrs["width"] == 48 and f["step_03/W"].shape == (48, 6)


def test_cli_options_override_params(run):
    root = run["root"]
    r = invoke(
        run,
        "solve",
        "--eta",
        "0.5",
        "--width",
        "32",
        "--seed",
        "9",
        "--method",
        "woodbury",
        "--batch-rows",
        "17",
    )
    assert r.exit_code == 0, r.output
    with h5py.File(root / "solve" / "weights.h5", "r") as f:
        a = dict(f.attrs)
    assert (a["eta"], a["width"], a["seed"], a["method"]) == (0.5, 32, 9, "woodbury")


def test_cli_eta_sweep(run):
    root = run["root"]
    r = invoke(run, "solve", "--eta", "0.1,1,10")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (root / "solve").iterdir())
    assert names == [
        "weights-eta0.1.h5",
        "weights-eta1.h5",
        "weights-eta10.h5",
        "weights.h5",
    ]
    r = CliRunner().invoke(
        main,
        [
            "evaluate",
            "--features",
            str(run["features"]),
            "--params",
            str(run["params"]),
            "--weights",
            str(root / "solve"),
            "--out",
            str(root / "sweep"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (root / "sweep").glob("metrics*.json")) == [
        "metrics-eta0.1.json",
        "metrics-eta1.json",
        "metrics-eta10.json",
    ]


def break_features(ctx, how):
    f = ctx["features"]
    if how == "truncated":
        p = f / "step_02" / "train.h5"
        p.write_bytes(p.read_bytes()[:3000])
    elif how == "empty":
        (f / "step_02" / "train.h5").write_bytes(b"")
    elif how == "nan":  # found only while streaming, after two steps are solved
        with h5py.File(f / "step_03" / "train.h5", "r+") as h:
            h["features"][5, 0] = np.nan
    elif how == "inf_test":
        with h5py.File(f / "step_03" / "test.h5", "r+") as h:
            h["task_02/features"][3, 1] = np.inf
    elif how == "feature_dim":
        other = make_features(
            ctx["root"] / "other", [10, 10], [2, 2], feature_dim=D + 4, test_rows=3
        )
        shutil.rmtree(f / "step_02")
        shutil.copytree(other / "step_02", f / "step_02")
    elif how == "missing_step":
        shutil.rmtree(f / "step_02")
    elif how == "missing_folder":
        shutil.rmtree(f)


FEATURE_FAULTS = [
    ("truncated", "step_02/train.h5: truncated or not an HDF5 file"),
    ("empty", "step_02/train.h5: empty file"),
    ("nan", "step_03/train.h5: features row 5 is NaN or Inf"),
    ("feature_dim", "step_02/train.h5: feature_dim 16 differs from step 1's 12"),
    ("missing_step", "step_02: step folder missing (found steps [1, 3])"),
    ("missing_folder", "extract: features folder not found"),
]


@pytest.mark.parametrize("how, message", FEATURE_FAULTS)
def test_bad_features_keep_the_earlier_weights(run, how, message):
    weights = run["root"] / "solve" / "weights.h5"
    before = weights.read_bytes()
    break_features(run, how)
    assert_one_line_error(invoke(run, "solve"), message)
    assert weights.read_bytes() == before
    assert sorted(p.name for p in weights.parent.iterdir()) == ["weights.h5"]


@pytest.mark.parametrize(
    "how, message",
    [
        *(f for f in FEATURE_FAULTS if f[0] != "nan"),  # evaluate reads no train
        ("inf_test", "step_03/test.h5:task_02: features row 3 is NaN or Inf"),
    ],
)
def test_bad_features_keep_the_earlier_metrics(run, how, message):
    results = run["root"] / "results"
    before = {p.name: p.read_bytes() for p in results.iterdir()}
    break_features(run, how)
    assert_one_line_error(invoke(run, "evaluate"), message)
    assert {p.name: p.read_bytes() for p in results.iterdir()} == before


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--eta", "0", "--eta must be > 0 and finite, got 0.0"),
        ("--eta", "-1", "--eta must be > 0 and finite, got -1.0"),
        ("--eta", "abc", "--eta: 'abc' is not a number"),
        ("--eta", "0.1,x", "--eta: 'x' is not a number"),
        ("--eta", "1,1", "--eta lists 1.0 twice"),
        ("--width", "0", "--width must be >= 1, got 0"),
        ("--width", "8.5", "--width must be an integer, got '8.5'"),
        ("--seed", "-2", "--seed must be >= 0, got -2"),
        ("--method", "cg", "--method must be one of gram, woodbury, got 'cg'"),
        ("--device", "tpu", "--device must be one of auto, cpu, cuda, got 'tpu'"),
    ],
)
def test_bad_option_values_name_the_option(run, option, value, message):
    weights = run["root"] / "solve" / "weights.h5"
    before = weights.read_bytes()
    assert_one_line_error(invoke(run, "solve", option, value), message)
    assert weights.read_bytes() == before


@pytest.mark.parametrize(
    "line, message",
    [
        ("eta: 0", "solve.eta must be > 0 and finite, got 0.0"),
        ("eta: -0.5", "solve.eta must be > 0 and finite, got -0.5"),
        ("eta: abc", "solve.eta must be a number, got 'abc'"),
        ("eta: [0.1, -1]", "solve.eta[1] must be > 0 and finite, got -1.0"),
        ("width: 0", "solve.width must be > 0, got 0"),
        ("width: -3", "solve.width must be > 0, got -3"),
        ("method: cg", "solve.method must be one of 'gram', 'woodbury', got 'cg'"),
        ("etta: 1", "unknown key 'solve.etta'"),
    ],
)
def test_bad_params_name_the_file_and_key(run, line, message):
    key = line.split(":")[0]
    text = "\n".join(x for x in PARAMS.splitlines() if not x.strip().startswith(key))
    run["params"].write_text(text + f"\n  {line}\n")
    weights = run["root"] / "solve" / "weights.h5"
    before = weights.read_bytes()
    result = invoke(run, "solve")
    assert_one_line_error(result, message)
    assert f"{run['params']}: " in result.stderr
    assert weights.read_bytes() == before


def test_bad_weights_keep_the_earlier_metrics(run):
    root = run["root"]
    results = root / "results"
    before = {p.name: p.read_bytes() for p in results.iterdir()}
    weights = root / "solve" / "weights.h5"
    weights.write_bytes(weights.read_bytes()[:2000])
    assert_one_line_error(
        invoke(run, "evaluate"), "weights.h5: truncated or not an HDF5 file"
    )
    weights.unlink()
    assert_one_line_error(invoke(run, "evaluate"), "weights.h5: weights file not found")
    assert {p.name: p.read_bytes() for p in results.iterdir()} == before


def test_help_explains_the_options():
    r = CliRunner().invoke(main, ["solve", "--help"])
    assert r.exit_code == 0
    for text in (
        "--features DIR",
        "--eta X[,X…]",
        "--width N",
        "gram|woodbury",
        "auto|cpu|cuda",
        "--params FILE",
        "weights-eta<η>.h5",
    ):
        assert text in r.output
    r = CliRunner().invoke(main, ["evaluate", "--help"])
    assert "--weights PATH" in r.output and "bp_logits" in r.output


def test_subprocess_error_is_one_line_without_traceback(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "solver",
            "solve",
            "--eta",
            "-1",
            "--params",
            str(tmp_path / "params.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 1
    assert r.stderr == "Error: --eta must be > 0 and finite, got -1.0\n"


def test_solver_cli_never_imports_torch_or_transformers():
    imports = "import solver.cli, solver.solve, solver.evaluate, solver.synthetic"
    assert heavy_modules_after(imports) == []


def test_defaults_follow_params_in_the_working_folder(tmp_path, pristine, monkeypatch):
    """No path options: data/extract -> data/solve -> data/evaluate (never
    results/, the report's), sweep from params."""
    shutil.copytree(pristine / "extract", tmp_path / "data" / "extract")
    (tmp_path / "params.yaml").write_text(PARAMS.replace("eta: 1.0", "eta: [0.5, 2]"))
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["solve"]).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "data" / "solve").iterdir()) == [
        "weights-eta0.5.h5",
        "weights-eta2.h5",
    ]
    r = CliRunner().invoke(main, ["evaluate"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "data/evaluate").glob("*.json")) == [
        "metrics-eta0.5.json",
        "metrics-eta2.json",
    ]
    assert not (tmp_path / "results").exists()


CHAIN_PARAMS = (
    PARAMS
    + """\
protocol:
  runs: [0, 1]
  vary: [upsampling]
ablation:
  pal:
    label: PAL
    bp: {label: w/o AL module (BP head)}
    changes: {}
  wide: {label: wider, changes: {solve: {width: 64}}}
pipelines:
  main: [pal, wide]
  other: [wide, gone]
"""
)


def test_a_pipeline_is_fitted_and_scored_in_one_process(tmp_path, pristine):
    """solve/evaluate --pipeline: each (variant, run) chain gets exactly the
    bytes of its own `--run r --variant v` process; evaluate --report writes
    the report over them."""
    for chain in ("pal/0", "pal/1", "wide/0", "wide/1"):
        shutil.copytree(pristine / "extract", tmp_path / "extract" / chain)
    (tmp_path / "params.yaml").write_text(CHAIN_PARAMS)
    base = ["--params", str(tmp_path / "params.yaml")]
    r = CliRunner().invoke(main, ["solve", *base, "--pipeline", "main",
                                  "--features", str(tmp_path / "extract"),
                                  "--out", str(tmp_path / "solve")])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["evaluate", *base, "--pipeline", "main",
                                  "--features", str(tmp_path / "extract"),
                                  "--solve", str(tmp_path / "solve"),
                                  "--out", str(tmp_path / "evaluate"),
                                  "--report", str(tmp_path / "results")])  # fmt: skip
    assert r.exit_code == 0, r.output
    for chain in ("pal/0", "pal/1", "wide/0", "wide/1"):
        variant, run = chain.split("/")
        one = ["--run", run, "--variant", variant]
        paths = ["--features", str(tmp_path / "extract" / chain),
                 "--out", str(tmp_path / "one" / chain)]  # fmt: skip
        r = CliRunner().invoke(main, ["solve", *base, *one, *paths])
        assert r.exit_code == 0, r.output
        merged = (tmp_path / "solve" / chain / "weights.h5").read_bytes()
        assert merged == (tmp_path / "one" / chain / "weights.h5").read_bytes()
        info = WeightsFile(tmp_path / "solve" / chain / "weights.h5").info
        assert (info.width, info.seed) == (64 if variant == "wide" else 48, int(run))
        assert (tmp_path / "evaluate" / chain / "metrics.json").is_file()
    table = (tmp_path / "results" / "table.md").read_text()
    rows = [line.split(" | ")[0] for line in table.splitlines()[4:]]
    # the labels of params in table order, PAL's BP head after PAL
    assert rows == ["| PAL", "| w/o AL module (BP head)", "| wider"]
    report = json.loads((tmp_path / "results" / "metrics.json").read_text())
    assert report["runs"] == [0, 1] and set(report) >= {"pal", "wide"}


def test_a_variant_of_head_bp_reports_its_bp_metrics(tmp_path, pristine):
    """`head: bp` in a variant's params row: its report row holds the BP
    metrics evaluate wrote for its chains, no analytic numbers."""
    for chain in ("pal/0", "pal/1", "wide/0", "wide/1"):
        shutil.copytree(pristine / "extract", tmp_path / "extract" / chain)
    params = CHAIN_PARAMS.replace(
        "  wide: {label: wider, changes: {solve: {width: 64}}}",
        "  wide: {label: BP of wider, head: bp, paper: MAP,\n"
        "         changes: {solve: {width: 64}}}",
    )
    assert "head: bp" in params
    (tmp_path / "params.yaml").write_text(params)
    base = ["--params", str(tmp_path / "params.yaml"), "--pipeline", "main"]
    base += ["--features", str(tmp_path / "extract")]
    r = CliRunner().invoke(main, ["solve", *base, "--out", str(tmp_path / "solve")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["evaluate", *base,
                                  "--solve", str(tmp_path / "solve"),
                                  "--out", str(tmp_path / "evaluate"),
                                  "--report", str(tmp_path / "results")])  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "results" / "metrics.json").read_text())
    chains = [
        json.loads((tmp_path / "evaluate" / "wide" / run / "metrics.json").read_text())
        for run in ("0", "1")
    ]
    wide = report["wide"]
    assert wide["acc"]["runs"] == [m["bp"]["acc"] for m in chains]
    assert wide["acc"]["runs"] != [m["acc"] for m in chains]  # not the AL head's
    assert wide["fg"]["mean"] == pytest.approx(sum(m["bp"]["fg"] for m in chains) / 2)
    # the same shards under pal: its BP row holds the same numbers
    assert {k: wide[k] for k in ("acc", "fg", "step_accuracy")} == {
        k: report["bp"][k] for k in ("acc", "fg", "step_accuracy")
    }
    assert (wide["label"], wide["paper"]) == ("BP of wider", "MAP")
    assert "width" not in wide  # the BP head was not solved


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pipeline", "main", "--run", "0"],
         "Error: --pipeline does not combine with --run or --variant\n"),
        (["--pipeline", "nope"], "Error: params.yaml: unknown pipeline "
         "'pipelines.nope' (known: main, other)\n"),
        (["--pipeline", "other"],
         "Error: params.yaml: unknown variant 'ablation.gone' (known: pal, wide)\n"),
    ],
)  # fmt: skip
def test_pipeline_errors_are_one_line(tmp_path, monkeypatch, args, message):
    (tmp_path / "params.yaml").write_text(CHAIN_PARAMS)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["solve", *args])
    assert (r.exit_code, r.output) == (1, message)


def test_a_pipeline_with_a_chain_missing_writes_nothing(tmp_path, pristine):
    """Every chain's shards are checked before the first chain is fitted."""
    shutil.copytree(pristine / "extract", tmp_path / "extract" / "pal" / "0")
    shutil.copytree(pristine / "extract", tmp_path / "extract" / "pal" / "1")
    (tmp_path / "params.yaml").write_text(CHAIN_PARAMS)
    r = CliRunner().invoke(
        main,
        ["solve", "--params", str(tmp_path / "params.yaml"), "--pipeline", "main",
         "--features", str(tmp_path / "extract"), "--out", str(tmp_path / "solve")],
    )  # fmt: skip
    assert r.exit_code == 1
    missing = tmp_path / "extract" / "wide" / "0"
    assert r.output == f"Error: {missing}: features folder not found\n"
    assert not (tmp_path / "solve").exists()


def test_a_chain_missing_a_step_writes_nothing(tmp_path, pristine):
    """Without data.tasks in the params, each chain's steps are checked
    against the other chains' before the first chain is fitted."""
    for chain in ("pal/0", "pal/1", "wide/0", "wide/1"):
        shutil.copytree(pristine / "extract", tmp_path / "extract" / chain)
    shutil.rmtree(tmp_path / "extract" / "wide" / "1" / "step_03")
    (tmp_path / "params.yaml").write_text(CHAIN_PARAMS)
    r = CliRunner().invoke(
        main,
        ["solve", "--params", str(tmp_path / "params.yaml"), "--pipeline", "main",
         "--features", str(tmp_path / "extract"), "--out", str(tmp_path / "solve")],
    )  # fmt: skip
    where = tmp_path / "extract" / "wide" / "1"
    assert (r.exit_code, r.output) == (
        1,
        f"Error: {where}: chain wide/1 has 2 steps, but chain pal/0 has 3 (a step "
        "is missing: rerun its `pal extract`)\n",
    )
    assert not (tmp_path / "solve").exists()


def test_a_solve_wider_than_the_memory_stops_before_reading(run):
    """`--width 100000` on the CPU: one line with the figure, before a shard
    is read or a weights file written (`pal check` says it first)."""
    import os

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    before = (run["root"] / "solve" / "weights.h5").read_bytes()
    result = invoke(run, "solve", "--width", "100000", "--device", "cpu")
    assert_one_line_error(
        result,
        "solve.width 100000: the solve holds about 149.0 GiB (2 × 100000² "
        f"float64), but this machine's memory is {ram:.1f} GiB: lower solve.width",
    )
    assert (run["root"] / "solve" / "weights.h5").read_bytes() == before
