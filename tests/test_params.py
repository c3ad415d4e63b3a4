import pytest
from helpers import committed

from palcore.errors import ParamsError
from palcore.params import load_section
from pipeline.params import DataParams, PromptParams, load
from solver.params import EvaluateParams, SolveParams


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


def test_device_choices_and_run_seeds_have_one_home(tmp_path):
    from palcore.params import DEVICES, RUN_SEEDS, ProtocolParams

    assert DEVICES == ("auto", "cpu", "cuda")
    path = write(tmp_path, "tune:\n  device: gpu\n")
    with pytest.raises(
        ParamsError,
        match=r"tune\.device must be one of 'auto', 'cpu', 'cuda', got 'gpu'",
    ):
        load(path, "tune")
    # protocol.vary's names and its default are RUN_SEEDS' keys, in their order
    assert ProtocolParams().vary == tuple(RUN_SEEDS)
    assert tuple(RUN_SEEDS) == ("class_order", "missing", "prompts", "upsampling")
    path = write(tmp_path, "protocol:\n  vary: [prompts, solver]\n")
    with pytest.raises(
        ParamsError,
        match=r"protocol\.vary\[1\] must be one of 'class_order', 'missing', "
        r"'prompts', 'upsampling', got 'solver'",
    ):
        load_section(path, "protocol", ProtocolParams)


def test_step_of_name_inverts_step_dir_name():
    from palcore.outputs import step_dir_name, step_of_name

    for step in (1, 9, 10, 123):
        assert step_of_name(step_dir_name(step)) == step
    assert step_dir_name(3) == "step_03"
    for other in ("step_3", "step_03.pt", "step_0x", "task_03", "step_", "steps_03"):
        assert step_of_name(other) is None


def test_the_section_registry_names_every_section_once():
    from palcore.params import ProtocolParams
    from pipeline.params import SECTIONS
    from pipeline.sections import KNOWN_SECTIONS, PARAM_CLASSES

    assert PARAM_CLASSES == {
        **SECTIONS,
        "solve": SolveParams,
        "evaluate": EvaluateParams,
        "protocol": ProtocolParams,
    }
    assert KNOWN_SECTIONS == (
        "demo", "data", "pixels", "model", "prompt", "tune", "extract",
        "solve", "evaluate", "protocol", "ablation", "pipelines",
    )  # fmt: skip


def test_a_params_file_read_twice_gives_fresh_copies_of_its_current_text(tmp_path):
    # the parse is cached per text: a caller's edit of what it got must not
    # reach the next reader, and an edited file is read anew
    from palcore.paramsfile import read_params_file

    path = tmp_path / "params.yaml"
    path.write_text("solve: {eta: 1.0, etas: [0.1, 1.0]}\n")
    first = read_params_file(path)
    first["solve"]["etas"].append(5.0)
    assert read_params_file(path) == {"solve": {"eta": 1.0, "etas": [0.1, 1.0]}}
    path.write_text("solve: {eta: 0.5}\n")
    assert read_params_file(path) == {"solve": {"eta": 0.5}}


def test_a_method_is_a_module_that_declares_method(tmp_path):
    """pipeline/methods' modules that assign METHOD at their top level, by
    file name: the paper's in its order, then the others alphabetically; a
    helper module, a private one or a METHOD inside a function is none."""
    from pipeline.params import method_names

    files = {
        "zeta.py": "METHOD = object\n",
        "alpha.py": "import x\n\nMETHOD: type = x.Alpha  # annotated\n",
        "map.py": "METHOD = Map\n",
        "pal.py": "class Pal:\n    pass\n\n\nMETHOD = Pal\n",
        "helper.py": "METHODS = {}\n\n\ndef f():\n    METHOD = 1\n",
        "_private.py": "METHOD = object\n",
        "notes.txt": "METHOD = object\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert method_names(tmp_path) == ("pal", "map", "alpha", "zeta")
    (tmp_path / "zeta.py").write_text("METHOD = (\n")
    with pytest.raises(ParamsError) as err:
        method_names(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'zeta.py'}: not Python (line 1: '(' was never closed), so "
        "no prompt method can be listed"
    )


def test_prompt_method_is_checked_against_the_method_modules(tmp_path):
    from pipeline.params import method_names

    names = method_names()
    assert names[:6] == ("pal", "map", "msp", "rebq", "l2p", "dualprompt")
    path = write(tmp_path, "prompt:\n  method: tyo\n")
    with pytest.raises(ParamsError) as err:
        load(path, "prompt")
    assert str(err.value) == (
        f"{path}: prompt.method must be one of {', '.join(map(repr, names))}, got 'tyo'"
    )
    assert str(err.value).startswith(
        f"{path}: prompt.method must be one of 'pal', 'map', 'msp', 'rebq', 'l2p', "
    )
    path = write(tmp_path, "prompt:\n  method: 3\n")
    with pytest.raises(ParamsError) as err:
        load(path, "prompt")
    assert str(err.value) == f"{path}: prompt.method must be a string, got 3"


def test_listing_the_methods_imports_no_torch():
    from helpers import heavy_modules_after

    imports = (
        "import pipeline.params as p, pipeline.contract_code as c, "
        "palpaper.cards as k; p.load('params.yaml', 'prompt'); "
        "assert c.method_names() == p.method_names() and k.methods()"
    )
    assert heavy_modules_after(imports) == []
