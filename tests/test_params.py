import pytest
from helpers import committed

from palcore.errors import ParamsError
from palcore.params import load_section
from pipeline.params import DataParams, PromptParams, load
from solver.params import SolveParams


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_load_every_section(tmp_path):
    path = write(tmp_path, committed("params.yaml"))
    for section in ("demo", "data", "model", "prompt", "tune", "extract"):
        load(path, section)
    solve = load_section(path, "solve", SolveParams)
    assert solve.method == "gram" and solve.eta == 1.0


def test_unknown_key_names_section_and_key(tmp_path):
    path = write(tmp_path, "solve:\n  etta: 1\n")
    with pytest.raises(ParamsError) as err:
        load_section(path, "solve", SolveParams)
    assert (
        str(err.value)
        == f"{path}: unknown key 'solve.etta' (did you mean 'solve.eta'?)"
    )
    path = write(tmp_path, "solve:\n  zzz: 1\n")
    with pytest.raises(ParamsError, match=r"'solve\.zzz' \(known keys: batch_rows, "):
        load_section(path, "solve", SolveParams)


@pytest.mark.parametrize(
    "body, match",
    [
        ("eta: 0", r"solve\.eta must be > 0 and finite, got 0\.0"),
        ("eta: -1", r"solve\.eta must be > 0 and finite"),
        ("eta: abc", r"solve\.eta must be a number, got 'abc'"),
        ("width: 0", r"solve\.width must be > 0, got 0"),
        ("width: 1.5", r"solve\.width must be an integer, got 1\.5"),
        ("method: cg", r"solve\.method must be one of 'gram', 'woodbury', got 'cg'"),
    ],
)
def test_bad_solve_values(tmp_path, body, match):
    path = write(tmp_path, f"solve:\n  {body}\n")
    with pytest.raises(ParamsError, match=match):
        load_section(path, "solve", SolveParams)


def test_error_names_the_file(tmp_path):
    path = write(tmp_path, "solve:\n  eta: 0\n")
    with pytest.raises(ParamsError) as info:
        load_section(path, "solve", SolveParams)
    assert str(info.value).startswith(f"{path}: solve.eta")


def test_missing_section_and_file(tmp_path):
    path = write(tmp_path, "data: {}\n")
    with pytest.raises(ParamsError, match="missing section 'solve'"):
        load_section(path, "solve", SolveParams)
    with pytest.raises(ParamsError, match="params file not found"):
        load_section(tmp_path / "nope.yaml", "solve", SolveParams)


def test_scientific_notation_string_is_a_float(tmp_path):
    path = write(tmp_path, "tune:\n  lr: 1e-4\n")
    assert load(path, "tune").lr == pytest.approx(1e-4)


def test_rate_and_choices(tmp_path):
    with pytest.raises(ParamsError, match=r"data\.missing_rate must lie in \[0, 1\]"):
        DataParams(missing_rate=1.5)
    path = write(tmp_path, "data:\n  missing_type: all\n")
    with pytest.raises(ParamsError, match=r"data\.missing_type must be one of"):
        load(path, "data")
    path = write(tmp_path, "prompt:\n  layers: [0, 0]\n")
    with pytest.raises(ParamsError, match=r"prompt\.layers must be distinct"):
        load(path, "prompt")
    assert PromptParams(layers=(0, 3)).layers == (0, 3)
