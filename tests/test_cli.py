"""The CLI, in-process: kgen build [--check], kgen show; generated source is
deterministic, standalone and echoes the spec."""
from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kgen
from kgen.cli import main
from kgen.dtypes import BY_NAME
from kgen.pipeline import generate

ROOT = Path(__file__).resolve().parent.parent
ELEMENTWISE = ["vector_add.k", "silu_mul.k", "bias_gelu.k"]
BAD = "kernel broken(X: f16[M, N]) -> Y: f16[M, N] {\n    Y = sigmod(X)\n}\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A working directory with specs/ holding the elementwise specs."""
    (tmp_path / "specs").mkdir()
    for name in ELEMENTWISE:
        shutil.copy(ROOT / "specs" / name, tmp_path / "specs" / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_build_writes_stem_py_and_prints_the_pattern(project, capsys):
    assert main(["build", "specs/vector_add.k", "-o", "out"]) == 0
    out = capsys.readouterr().out
    assert "wrote out/vector_add.py" in out and "vector_add: elementwise" in out
    text = (project / "specs" / "vector_add.k").read_text()
    assert (project / "out" / "vector_add.py").read_text() == generate(text, "specs/vector_add.k", out="out").source
    assert sorted(p.name for p in (project / "out").iterdir()) == ["vector_add.py"]   # no temp files left


@pytest.mark.parametrize("out, command", [
    (None, "kgen build specs/vector_add.k"), ("./generated/", "kgen build specs/vector_add.k"),
    ("./-out dir", "kgen build specs/vector_add.k -o './-out dir'"),
    ("{root}/x/../o/", "kgen build specs/vector_add.k -o o"),
])
def test_the_header_names_the_command_that_rebuilds_the_module(project, capsys, out, command):
    """The header's rebuild command writes the module where it is: -o names a folder other than
    generated/, relative to the working one however it was spelled, quoted for a shell; running
    it rebuilds the same bytes."""
    out = out and out.format(root=project)
    assert main(["build", "specs/vector_add.k", *(["-o", out] if out else [])]) == 0
    module = project / (out or "generated") / "vector_add.py"
    assert module.read_text().splitlines()[2] == f"# Do not edit: change the spec and run `{command}`."
    assert main(shlex.split(command)[1:] + ["--check"]) == 0
    assert "1 generated file(s) up to date" in capsys.readouterr().out


def test_a_module_from_spec_text_names_no_build_command():
    """kgen.compile("...")'s module has no spec file that a build could read."""
    header = generate("kernel f(x: f32[N]) -> y: f32[N] { y = x * 2 }").source.splitlines()[:3]
    assert header[0].endswith(" from <string>")
    assert header[2] == "# Do not edit: change the spec and compile it again."


def test_build_says_when_it_replaces_the_module_of_another_spec(project, capsys):
    """a/x.k built, then b/x.k into the same folder: the module is replaced (as a moved spec's
    is), and the build says whose it was; building b/x.k again says nothing more."""
    for folder in ("a", "b"):
        (project / folder).mkdir()
        shutil.copy(project / "specs" / "vector_add.k", project / folder / "vector_add.k")
    assert main(["build", "a/vector_add.k"]) == 0
    assert "replaced" not in capsys.readouterr().out
    assert main(["build", "b/vector_add.k"]) == 0
    assert "; it replaced the module of a/vector_add.k)" in capsys.readouterr().out
    assert main(["build", "b/vector_add.k"]) == 0
    assert "replaced" not in capsys.readouterr().out
    assert "from b/vector_add.k" in (project / "generated" / "vector_add.py").read_text().splitlines()[0]


def test_build_a_folder_into_generated_by_default(project, capsys):
    assert main(["build", "specs"]) == 0
    assert sorted(p.name for p in (project / "generated").iterdir()) == sorted(
        n.replace(".k", ".py") for n in ELEMENTWISE)
    assert capsys.readouterr().out.count("wrote generated/") == len(ELEMENTWISE)


def test_check_passes_when_fresh_and_writes_nothing(project, capsys):
    main(["build", "specs"])
    capsys.readouterr()
    before = snapshot(project)
    assert main(["build", "specs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert snapshot(project) == before


def test_check_names_stale_and_missing_files(project, capsys):
    main(["build", "specs"])
    capsys.readouterr()
    stale = project / "generated" / "silu_mul.py"
    stale.write_text(stale.read_text().replace("silu", "selu", 1))
    (project / "generated" / "bias_gelu.py").unlink()
    before = snapshot(project)
    assert main(["build", "specs", "--check"]) != 0
    out = capsys.readouterr().out
    assert "generated/silu_mul.py: stale" in out
    assert "generated/bias_gelu.py: missing" in out
    assert "vector_add" not in out
    assert snapshot(project) == before


def test_check_names_the_module_of_a_deleted_spec(project, capsys):
    """A spec deleted (or renamed) from a checked folder leaves its module behind: stale.
    A module built from a spec elsewhere and a hand-written file are not the check's."""
    (project / "other").mkdir()
    shutil.copy(ROOT / "specs" / "vector_add.k", project / "other" / "elsewhere.k")
    main(["build", "specs", "other"])
    (project / "generated" / "notes.py").write_text("# written by hand\n")
    assert main(["build", "specs", "--check"]) == 0
    (project / "specs" / "silu_mul.k").rename(project / "specs" / "silu_and_mul.k")
    capsys.readouterr()
    assert main(["build", "specs", "--check"]) == 1
    out = capsys.readouterr().out
    assert "generated/silu_mul.py: orphaned (specs/silu_mul.k is gone" in out
    assert "generated/silu_and_mul.py: missing" in out
    assert "elsewhere" not in out and "notes" not in out
    assert main(["build", "specs/vector_add.k", "--check"]) == 0   # a file checked, not a folder


def test_check_calls_orphaned_only_a_module_whose_spec_is_gone(project, capsys):
    """A module is orphaned when the spec its header names is gone, wherever the folder's name
    takes the header out of ASCII (spécs: the header prints it escaped); a spec still there
    that the folder's walk does not take (in a linked folder, or not named .k) orphans nothing."""
    (project / "spécs").mkdir()
    shutil.copy(ROOT / "specs" / "softmax.k", project / "spécs" / "softmax.k")
    assert main(["build", "spécs", "-o", "out"]) == 0
    assert b"sp\\xe9cs/softmax.k" in (project / "out" / "softmax.py").read_bytes().split(b"\n")[0]
    (project / "spécs" / "softmax.k").unlink()
    capsys.readouterr()
    assert main(["build", "specs", "spécs", "-o", "out", "--check"]) == 1
    assert "out/softmax.py: orphaned (sp\\xe9cs/softmax.k is gone" in capsys.readouterr().out
    assert main(["build", "spécs", "-o", "out", "--check"]) == 1    # the folder's last spec was the one
    assert "out/softmax.py: orphaned (sp\\xe9cs/softmax.k is gone" in capsys.readouterr().out
    assert main(["build", "spécs", "-o", "elsewhere", "--check"]) == 1      # no spec, no orphan: an error
    assert "no .k files under" in capsys.readouterr().err
    (project / "shared").mkdir()
    shutil.copy(ROOT / "specs" / "softmax.k", project / "shared" / "softmax.k")
    (project / "specs" / "linked").symlink_to(project / "shared")
    shutil.copy(ROOT / "specs" / "rmsnorm.k", project / "specs" / "rms.txt")
    assert main(["build", "specs", "specs/linked/softmax.k", "specs/rms.txt", "-o", "out2"]) == 0
    capsys.readouterr()
    assert main(["build", "specs", "-o", "out2", "--check"]) == 0, capsys.readouterr().out
    (project / "shared" / "softmax.k").unlink()
    assert main(["build", "specs", "-o", "out2", "--check"]) == 1
    assert "out2/softmax.py: orphaned (specs/linked/softmax.k is gone" in capsys.readouterr().out


def test_a_backslash_in_a_spec_path_is_no_escape(project, capsys):
    """The header escapes what is not printable ASCII (\\xe9) and doubles a backslash, so a
    spec named with a literal backslash and x41 is not read back as one named A: up to date."""
    weird = project / "specs" / "\\x41.k"
    shutil.copy(ROOT / "specs" / "softmax.k", weird)
    assert main(["build", "specs", "-o", "out"]) == 0
    assert b"specs/\\\\x41.k" in (project / "out" / "\\x41.py").read_bytes().split(b"\n")[0]
    capsys.readouterr()
    assert main(["build", "specs", "-o", "out", "--check"]) == 0, capsys.readouterr().out
    weird.unlink()
    assert main(["build", "specs", "-o", "out", "--check"]) == 1
    assert "out/\\x41.py: orphaned (specs/\\\\x41.k is gone" in capsys.readouterr().out   # as the header shows it


def test_check_notices_a_changed_spec(project, capsys):
    main(["build", "specs"])
    spec = project / "specs" / "vector_add.k"
    spec.write_text(spec.read_text().replace("z = x + y", "z = x + y * 2"))
    assert main(["build", "specs", "--check"]) != 0
    assert "generated/vector_add.py: stale" in capsys.readouterr().out


def test_a_failed_build_leaves_existing_files_untouched(project, capsys):
    main(["build", "specs"])
    generated = project / "generated" / "vector_add.py"
    generated.write_text("# Generated by kgen 0.0.1 from specs/vector_add.k (an older build)\n")
    (project / "specs" / "vector_add.k").write_text(
        (project / "specs" / "vector_add.k").read_text().replace("x + y", "x - y"))
    (project / "specs" / "broken.k").write_text(BAD)
    capsys.readouterr()
    before = snapshot(project / "generated")
    assert main(["build", "specs"]) != 0
    err = capsys.readouterr().err
    assert "specs/broken.k:2:9: unknown function 'sigmod' (did you mean 'sigmoid'?)" in err
    assert "        Y = sigmod(X)\n            ^^^^^^" in err
    assert "nothing was written" in err
    assert snapshot(project / "generated") == before
    assert generated.read_bytes() == b"# Generated by kgen 0.0.1 from specs/vector_add.k (an older build)\n"


def test_a_spec_that_cannot_be_decoded_is_one_failure_among_the_others(project, capsys):
    """A folder build reports every spec that fails, one that is not UTF-8 among them, then how
    many failed; nothing is written."""
    (project / "specs" / "broken.k").write_text(BAD)
    (project / "specs" / "latin.k").write_bytes(b"kernel a(x: f32[N]) -> y: f32[N] {\n y = x # \xe9\n}\n")
    assert main(["build", "specs"]) == 1
    err = capsys.readouterr().err
    assert "specs/broken.k:2:9: unknown function 'sigmod'" in err and "specs/latin.k" in err, err
    assert "2 spec(s) failed; nothing was written" in err
    assert not (project / "generated").exists()


def test_build_does_not_overwrite_a_file_kgen_did_not_write(project, capsys):
    (project / "generated").mkdir()
    mine = project / "generated" / "silu_mul.py"
    mine.write_text("print('hand-written')\n")
    assert main(["build", "specs"]) != 0
    assert "generated/silu_mul.py exists and was not generated by kgen" in capsys.readouterr().err
    assert mine.read_text() == "print('hand-written')\n"
    assert sorted(p.name for p in (project / "generated").iterdir()) == ["silu_mul.py"]
    assert main(["build", "specs", "--force"]) == 0
    assert mine.read_text().startswith("# Generated by kgen")


def test_check_names_what_the_build_needs_for_a_file_kgen_did_not_write(project, capsys):
    """--check's advice works as given: a stale file kgen did not write needs --force, which
    the command it prints carries; a module it cannot read is not called missing."""
    (project / "generated").mkdir()
    (project / "generated" / "silu_mul.py").write_text("print('hand-written')\n")
    assert main(["build", "specs", "--check"]) == 1
    out = capsys.readouterr().out
    assert "generated/silu_mul.py: stale (not generated by kgen: the build replaces it with --force)" in out
    command = out.strip().splitlines()[-1].split("run: ")[1].split()
    assert command[-1] == "--force"
    assert main(command[1:]) == 0
    assert main(["build", "specs", "--check"]) == 0
    capsys.readouterr()


def test_check_of_a_module_it_cannot_read_says_so(project, capsys, monkeypatch):
    """A module in a folder that cannot be searched (EACCES: whether it is there is hidden) is
    reported as unreadable, not missing."""
    import errno
    from kgen import cli
    assert main(["build", "specs"]) == 0

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))
    monkeypatch.setattr(cli, "read_regular", refused)
    assert main(["build", "specs", "--check"]) == 1
    assert "generated/silu_mul.py: stale (cannot read it: Permission denied)" in capsys.readouterr().out


def test_check_advice_works_for_a_module_it_cannot_read(project, capsys):
    """A module that cannot be read (a link to itself: root reads any file) may be anyone's:
    the build says so and replaces it only when forced, which --check's command carries."""
    (project / "generated").mkdir()
    module = project / "generated" / "silu_mul.py"
    module.symlink_to("silu_mul.py")
    assert main(["build", "specs"]) == 1
    assert "generated/silu_mul.py exists and cannot be read: Too many levels of symbolic links (use --force" \
        in capsys.readouterr().err
    assert main(["build", "specs", "--check"]) == 1
    out = capsys.readouterr().out
    assert "generated/silu_mul.py: stale (cannot read it: Too many levels of symbolic links)" in out
    command = out.strip().splitlines()[-1].split("run: ")[1].split()
    assert command[-1] == "--force"
    assert main(command[1:]) == 0
    assert not module.is_symlink() and main(["build", "specs", "--check"]) == 0
    capsys.readouterr()


def test_build_of_a_missing_path_fails(project, capsys):
    assert main(["build", "specs/nope.k"]) != 0
    assert "specs/nope.k: no such file" in capsys.readouterr().err
    assert not (project / "generated").exists()


@pytest.mark.parametrize("emit, fragments", [
    ("ast", ["Kernel(name=Name(id='bias_gelu'", "Call(func=Name(id='gelu'", "line=4"]),
    ("ir", ["kernel bias_gelu(x: f16[M, N], bias: f16[N]) -> y: f16[M, N]", "= add %0 %1 : f16[M, N]",
            "= gelu %2 : f16[M, N]", "return y = %3"]),
    ("triton", ["@triton.jit", "def bias_gelu_kernel(", "def bias_gelu(x, bias, *, out=None, config=None):",
                "    # y = gelu(x + bias)\n    y = gelu(x + bias)"]),
])
def test_show(project, capsys, emit, fragments):
    assert main(["show", "specs/bias_gelu.k", "--emit", emit]) == 0
    out = capsys.readouterr().out
    for f in fragments:
        assert f in out, out
    if emit == "triton":
        assert out == generate((project / "specs" / "bias_gelu.k").read_text(), "specs/bias_gelu.k").source


def test_show_reports_a_bad_spec(project, capsys):
    (project / "specs" / "broken.k").write_text(BAD)
    assert main(["show", "specs/broken.k", "--emit", "ir"]) == 1
    assert "error: specs/broken.k:2:9:" in capsys.readouterr().err


ODD_NAMES = ["caf\u00e9.k", "a\\b.k", "n\nl.k", "it's.k", os.fsdecode(b"odd\xff.k"), "-x.k"]


def _bash_words(command: str) -> list[str]:
    """The arguments bash makes of ``command``, as the file names they are."""
    words = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, timeout=60).stdout
    return [os.fsdecode(w) for w in words.split(b"\0")[:-1]]


def test_rebuild_commands_are_printable_lines_that_a_shell_runs(project, capsys):
    """The header's rebuild command and the one --check ends with are one line of printable
    ASCII whatever the spec's name (bash's $'...' for bytes past it, a non-UTF-8 one too); the
    words bash makes of each rebuild the modules."""
    (project / "odd").mkdir()
    specs = [f"odd/{name}" for name in ODD_NAMES]
    for spec in specs:
        shutil.copy(project / "specs" / "vector_add.k", project / spec)
    assert main(["build", *specs, "-o", "out"]) == 0
    for name, spec in zip(ODD_NAMES, specs):
        header = (project / "out" / (name[:-2] + ".py")).read_bytes().decode("ascii").splitlines()[2]
        words = _bash_words(header.split("run `kgen build ", 1)[1].removesuffix("`."))
        assert words == [spec, "-o", "out"], (header, words)
        capsys.readouterr()
        assert main(["build", *words, "--check"]) == 0 and "1 generated file(s) up to date" in capsys.readouterr().out
    for module in (project / "out").iterdir():
        module.unlink()
    capsys.readouterr()
    assert main(["build", *specs, "-o", "out", "--check"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.isascii() and last.isprintable(), last
    words = _bash_words(last.split("run: kgen build ", 1)[1])
    assert words == [*specs, "-o", "out"] and main(["build", *words]) == 0
    assert sorted(p.name for p in (project / "out").iterdir()) == sorted(name[:-2] + ".py" for name in ODD_NAMES)


def test_generated_source_is_deterministic(project):
    """Built again, a module is the same bytes; built into another folder, it differs only in
    the header's rebuild command."""
    main(["build", "specs", "-o", "a"])
    first = {name: (project / "a" / name.replace(".k", ".py")).read_bytes() for name in ELEMENTWISE}
    main(["build", "specs", "-o", "b"])
    main(["build", "specs", "-o", "a"])
    for name in ELEMENTWISE:
        py = name.replace(".k", ".py")
        assert (project / "a" / py).read_bytes() == first[name]
        assert (project / "b" / py).read_bytes() == first[name].replace(b" -o a`.", b" -o b`.", 1)


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
    return names



@pytest.mark.parametrize("name", ELEMENTWISE)
def test_generated_module_is_standalone_and_echoes_the_spec(name):
    text = (ROOT / "specs" / name).read_text()
    gen = generate(text, f"specs/{name}")
    source = gen.source
    assert _imports(source) <= {"torch", "triton", "triton.language", "math"}
    assert f"# Generated by kgen {kgen.__version__} from specs/{name}" in source
    assert f"# spec sha256: {hashlib.sha256(text.encode()).hexdigest()}" in source
    assert "Do not edit" in source
    for kir in gen.kernels:
        for stmt in kir.stmts:
            assert f"    # {stmt.source}\n" in source
        assert f"\ndef {kir.name}(" in source
    assert source.endswith("\n") and not source.endswith("\n\n")
    assert all(line == line.rstrip() for line in source.splitlines())


def test_comments_never_break_lines():
    text = "kernel k(X: f32[N]) -> Y {\n    Y = where(X > 0,   # keep positives\n              X, 0)\n}\n"
    source = generate(text, "odd\npath\u00e9.k").source
    assert "    # Y = where(X > 0, X, 0)\n" in source
    compile(source, "<generated>", "exec")                    # the path cannot end a comment line
    assert "odd\\x0apath\\xe9.k" in source


def test_python_dash_m_kgen(project):
    result = subprocess.run([sys.executable, "-m", "kgen", "show", "specs/vector_add.k", "--emit", "ir"],
                            capture_output=True, text=True, cwd=project,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr
    assert "kernel vector_add(x: f32[N], y: f32[N]) -> z: f32[N]" in result.stdout


def test_bench_times_kgen_and_baselines_in_turn_and_reports_medians():
    from kgen.bench import interleaved
    order, clock = [], iter([5.0, 1.0, 9.0, 4.0, 3.0, 7.0, 6.0, 2.0, 8.0])

    def time_it(fn):
        order.append(fn())
        return next(clock)
    times = interleaved({"kgen": lambda: "kgen", "eager": lambda: "eager", "compile": lambda: "compile"}, 3, time_it)
    assert order == ["kgen", "eager", "compile"] * 3
    assert times == {"kgen": 5.0, "eager": 2.0, "compile": 8.0}


@pytest.mark.gpu
@pytest.mark.parametrize("clock", [[], ["--graph"], ["--kernel-time"]])
def test_gpu_bench_prints_a_row_per_size_timed_by_calls_from_graphs_or_by_kernels(project, capsys, tmp_path, clock):
    import json
    assert main(["bench", "specs/vector_add.k", "--shape", "N=2**20", "--rounds", "1", "--no-compile",
                 "--json", str(tmp_path / "rows.json"), *clock]) == 0
    out = capsys.readouterr().out
    assert ("from CUDA graphs" in out, "from CUPTI" in out) == (clock == ["--graph"], clock == ["--kernel-time"])
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["kgen_us"] > 0 and row["eager_us"] > 0 and row["unit"] == "GB/s"


def test_bench_takes_one_clock(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "softmax", "--graph", "--kernel-time"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_kernel_time_counts_each_kernel_of_a_call_and_not_the_l2_flush():
    import torch
    from kgen import bench
    x = torch.empty(2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    once = bench._kernel_spans(lambda: y.add_(1), 5)
    twice = bench._kernel_spans(lambda: (y.add_(1), x.mul_(3)), 5)
    assert len(once) == 5 and len(twice) == 10     # one and two kernels a call, no flush among them
    assert len({name for name, _ in twice}) == 2 and all(us > 0 for _, us in twice)
    # torch's int fill, as the flush is, but of kilobytes (a split row's flags): the call's own
    zeroed = bench._kernel_spans(lambda: torch.zeros(4096, dtype=torch.int32, device="cuda"), 5)
    assert len(zeroed) == 5


def test_kernel_time_is_the_kernels_time_per_call(monkeypatch, capsys):
    from kgen import bench
    monkeypatch.setattr(bench, "_kernel_spans", lambda fn, calls: [("a", 2.0), ("b", 4.5), ("a", 3.5)])
    assert bench._kernel_time(lambda: None, 2) == (2.0 + 4.5 + 3.5) / 2
    monkeypatch.setattr(bench, "_kernel_spans", lambda fn, calls: [])     # no kernel: the call's time instead
    monkeypatch.setattr(bench, "_call_time", lambda fn: 7.25)
    assert bench._kernel_time(lambda: None, 2) == 7.25
    assert "no kernel recorded" in capsys.readouterr().err


@pytest.mark.parametrize("name, shape", [("layernorm", "M=4,N=8"), ("rmsnorm", "M=4,N=8"),
                                         ("matmul_leaky_relu", "M=16,K=16,N=16")])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_run_retypes_tensors_not_scalar_parameters(project, capsys, name, shape, dtype):
    """--dtype f16 retypes the tensors of specs/layernorm.k, not its `eps: f32` (a scalar is f32,
    i32 or bool: `eps: f16` had been a SpecError at a line the file does not hold)."""
    assert main(["run", str(ROOT / "specs" / f"{name}.k"), "--dtype", dtype, "--shape", shape]) == 0
    assert f"torch.float{dtype[1:]}" in capsys.readouterr().out


def test_the_gemm_sweep_keeps_a_batch_of_four():
    """`kgen bench specs/bmm.k` sweeps n x n x n matrices in a batch of 4: B = n had asked for 51 GB
    of inputs at n = 2048 and 3.3 TB at 8192."""
    from kgen.bench import SWEEPS, sizes_for
    kir = generate((ROOT / "specs" / "bmm.k").read_text(), "specs/bmm.k").kernels[0]
    assert [sizes_for(kir, point, sweep=True) for point in SWEEPS["gemm"][-1:]] == [{"B": 4, "M": 8192, "K": 8192,
                                                                                      "N": 8192}]
    plain = generate((ROOT / "specs" / "matmul_leaky_relu.k").read_text(), "specs/matmul_leaky_relu.k").kernels[0]
    assert set(sizes_for(plain, SWEEPS["gemm"][0], sweep=True).values()) == {512}


@pytest.mark.parametrize("spec, cols, rows", [
    ("kernel f(X: f32[M, N]) -> Y: f32[M, N] { Y = X - max(X) }", "N", "M"),
    ("kernel f(X: f32[M, K]) -> S: f32[M, 1] { S = sum(X) }", "K", "M"),       # the output has no K
    ("kernel f(X: f32[B, R, K], w: f32[K]) -> Y: f32[B, R, K] { Y = X / sum(X) * w }", "K", "B"),
    ("kernel f(X: f32[M, 8]) -> Y: f32[M, 8] { Y = X - max(X) }", None, "M"),
    ("kernel f(X: f32[4, 8]) -> S: f32[4, 1] { S = sum(X) }", None, None),
])
def test_the_row_sweep_sets_the_reduced_axis(spec, cols, rows):
    """`kgen bench` of a row reduction sweeps the reduced axis (the last of a reduction's input)
    over the columns and one other axis over the rows; fixed sizes stay as the spec gives them."""
    from kgen.bench import SWEEPS, sizes_for
    kir = generate(spec).kernels[0]
    for point in SWEEPS["row_reduce"]:
        want = {d: 1 for d in kir.params[0].shape if isinstance(d, str)}
        want.update({d: point[key] for d, key in ((cols, "cols"), (rows, "rows")) if d})
        assert sizes_for(kir, point, sweep=True) == want


def test_retyped_changes_only_tensor_types():
    from kgen.bench import retyped
    text = ("# f32[N] in a comment: f32\nkernel k(x: f32[N], w: [f16[N]], eps: f32 = 1e-5, n: i32) -> (y: f32[N], "
            "z: f32) {\n    y = x * eps + f32(n)  # f32[1]\n    z = bf16(x)\n}\n")
    assert retyped(text, BY_NAME["bf16"]) == text.replace("x: f32[N]", "x: bf16[N]").replace(
        "[f16[N]]", "[bf16[N]]").replace("y: f32[N]", "y: bf16[N]").replace("z: f32)", "z: bf16)")


@pytest.mark.parametrize("name, dtype", [("softmax", "f16"), ("softmax", "f32"), ("layernorm", "f16"),
                                         ("rmsnorm", "f16"), ("linear_gelu", "f16"), ("grouped_gemm", "bf16")])
def test_the_suites_specs_compile_as_they_retype_them(name, dtype):
    """`kgen bench --suite` times the specs of specs/ retyped: each compiles, its tensors in the
    suite's dtype and its scalars as the spec declares them."""
    from kgen import suites
    kernel = suites._spec(name, dtype)
    params = kernel.ir.params
    assert {p.dtype.name for p in params if p.shape is not None} == {dtype}
    assert all(p.dtype.name in ("f32", "i32", "bool") for p in params if p.shape is None)


def test_bench_suites_are_the_ones_the_cli_offers():
    from kgen import cli, suites
    assert set(cli.SUITE_NAMES) == set(suites.SUITES)


def test_run_refuses_a_bf16_matmul_on_the_interpreter_before_making_inputs(project, capsys, monkeypatch):
    """The interpreter cannot compute a bf16 tl.dot: kgen run says so before it makes --shape's
    inputs (gigabytes of them, maybe), not at the kernel's call after them."""
    from kgen import bench, runtime

    def made(*args):
        raise AssertionError("inputs made for a kernel the interpreter refuses")
    monkeypatch.setattr(runtime, "use_interpreter_if_no_gpu", lambda: True)
    monkeypatch.setattr(bench, "make_inputs", made)
    assert main(["run", str(ROOT / "specs" / "matmul_leaky_relu.k"), "--dtype", "bf16",
                 "--shape", "M=2**14,N=2**14,K=2**14"]) == 1
    assert "error: matmul_leaky_relu: bf16 matmuls need a CUDA device" in capsys.readouterr().err


def test_run_checks_a_kernel_against_the_reference(project, capsys):
    assert main(["run", "specs/vector_add.k", "--shape", "N=2**7"]) == 0
    out = capsys.readouterr().out
    assert "with N=128" in out and "z: torch.float32 (128,)  max abs error" in out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_run_over_rows_of_no_columns(project, capsys, name):
    """max over 0 columns: the reference gives the kernel's -inf, where torch's amax raises."""
    assert main(["run", str(ROOT / "specs" / f"{name}.k"), "--shape", "M=4,N=0"]) == 0
    assert "Y: torch.float16 (4, 0)  max abs error 0" in capsys.readouterr().out


def test_run_in_f32_a_gemm_whose_schedule_lists_tma(project, capsys):
    """matmul_leaky_relu's schedule lists TMA = [0, 1]: f32 operands take the tiled candidates."""
    assert main(["run", str(ROOT / "specs" / "matmul_leaky_relu.k"), "--dtype", "f32",
                 "--shape", "N=32,K=32"]) == 0
    out = capsys.readouterr().out   # the sizes in the kernel's order, M not given: 64
    assert "with M=64, K=32, N=32:" in out and "C: torch.float32 (64, 32)  max abs error" in out


BIG = "kernel big(S: f32[M, 1], W: f32[N]) -> Y: f32[M, N] {\n    Y = S + W - max(S + W)\n}\n"


def test_run_says_which_outputs_it_cannot_make(project, capsys):
    """Small inputs, outputs of 2**48 elements (1 PiB: past any address space, so no
    allocator can grant it lazily): an error, not torch's RuntimeError."""
    (project / "specs" / "big.k").write_text(BIG)
    from kgen.runtime import use_interpreter_if_no_gpu
    use_interpreter_if_no_gpu()   # its notice, once a process, said before
    capsys.readouterr()
    assert main(["run", "specs/big.k", "--shape", "M=2**24,N=2**24"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot make outputs of M=16777216, N=16777216: ") and "Traceback" not in err


def test_run_says_when_the_reference_cannot_be_evaluated(project, capsys, monkeypatch):
    """The float64 reference takes twice an f32 output's memory: its allocation failing is
    an error too (stood in for by an evaluator that fails as torch's allocator does)."""
    import kgen.bench

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 64 bytes")
    monkeypatch.setattr(kgen.bench, "evaluate", out_of_memory)
    assert main(["run", "specs/vector_add.k", "--shape", "N=8"]) == 1
    assert "error: cannot evaluate the reference of N=8: DefaultCPUAllocator" in capsys.readouterr().err


@pytest.mark.parametrize("shape, message", [
    ("N=-3", "expected NAME=SIZE"), ("N=abc", "expected NAME=SIZE"), ("N=2**100000000", "SIZE < 2**40"),
    ("N=2**-1", "expected NAME=SIZE"), ("Q=3", "Q is not a dimension of vector_add (its dimensions: N)"),
    ("N=3,N=5", "N is given twice"), ("N=1_0", "expected NAME=SIZE"), ("N=\u0663", "expected NAME=SIZE"),
    ("=3", "expected NAME=SIZE"), (",", "got ','"), ("", "got ''"),
])
def test_run_refuses_a_bad_shape(project, capsys, shape, message):
    assert main(["run", "specs/vector_add.k", "--shape", shape]) != 0
    assert message in capsys.readouterr().err


def test_run_refuses_a_list_kernel_with_a_dimension_named_groups(project, capsys):
    """--shape groups= is a list kernel's number of problems: a dimension of that name would be
    read as both (64 problems where none was asked for, 5000 with no bound checked)."""
    (project / "specs" / "gg.k").write_text(
        "kernel g(A: [f16[groups, K]], B: [f16[K, N]]) -> C: [f16[groups, N]] {\n    C = A @ B\n}\n")
    for shape in (["--shape", "N=2,K=2"], ["--shape", "groups=5000,N=1,K=1"], []):
        assert main(["run", "specs/gg.k", *shape]) == 1
        assert "error: g has a dimension named groups, the name --shape gives the number of problems" \
            in capsys.readouterr().err


def test_run_takes_dimensions_named_like_the_sweep_keys(project, capsys):
    """--shape names are the spec's dimensions, even ones called rows, cols or square."""
    (project / "specs" / "cube.k").write_text("kernel f(x: f32[batch, rows, cols]) -> y: f32[batch, rows, cols] {\n"
                                              "    y = x + 1.0\n}\n")
    assert main(["run", "specs/cube.k", "--shape", "batch=2,rows=3,cols=4"]) == 0
    out = capsys.readouterr().out
    assert "with batch=2, rows=3, cols=4" in out and "y: torch.float32 (2, 3, 4)" in out


def test_run_on_several_kernels_gives_each_its_own_dimensions(project, capsys):
    (project / "specs" / "two.k").write_text("kernel add(x: f32[N]) -> y: f32[N] {\n    y = x + 1.0\n}\n"
                                             "kernel mm(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {\n"
                                             "    C = A @ B\n}\n")
    assert main(["run", "specs/two.k", "--shape", "M=8,N=16,K=4"]) == 0
    out = capsys.readouterr().out
    assert "y: torch.float32 (16,)" in out and "C: torch.float32 (8, 16)" in out
    assert main(["run", "specs/two.k", "--shape", "Q=8"]) != 0
    assert "error: --shape: Q is not a dimension of any of the file's kernels (theirs: K, M, N)" \
        in capsys.readouterr().err
    assert main(["run", "specs/vector_add.k", "--shape", "Q=8,R=2"]) != 0
    assert "error: --shape: Q, R are not dimensions of vector_add (its dimensions: N)" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["show", "specs/bare.k", "--emit", "ir"], ["build", "specs/bare.k"]])
def test_statements_without_a_header_ask_for_one_to_build_or_show(project, capsys, command):
    (project / "specs" / "bare.k").write_text("y = x * 2\n")
    assert main(command) != 0
    err = capsys.readouterr().err
    assert "specs/bare.k:1:1: statements without a kernel header take their types from a call" in err
    assert "kernel NAME(x: f32[N])" in err
    assert not (project / "generated" / "bare.py").exists()


def test_build_refuses_targets_it_cannot_write_before_writing_any(project, capsys):
    """Two specs of one stem, an output folder that is a file (or under one, or a link to
    nothing), a target that is a folder: an error each, and nothing written."""
    (project / "a").mkdir()
    (project / "b").mkdir()
    for folder in ("a", "b"):
        shutil.copy(project / "specs" / "vector_add.k", project / folder / "k.k")
    assert main(["build", "a", "b", "-o", "out"]) != 0
    assert "a/k.k and b/k.k would both write out/k.py" in capsys.readouterr().err
    assert not (project / "out").exists()
    (project / "outfile").write_text("")
    assert main(["build", "specs", "-o", "outfile", "--force"]) != 0
    assert "outfile is a file, not a folder" in capsys.readouterr().err
    os.symlink("nowhere", project / "dangling")
    for out, why in (("outfile/sub", "outfile is a file, not a folder"),
                     ("dangling", "dangling is a symbolic link (nowhere) that leads to no folder"),
                     ("dangling/sub", "dangling is a symbolic link (nowhere) that leads to no folder")):
        for check in ([], ["--check"]):   # --check, too, says the build could not write there
            assert main(["build", "specs", "-o", out, *check]) == 1
            assert f"error: {why}" in capsys.readouterr().err
    (project / "gen" / "silu_mul.py").mkdir(parents=True)
    for check in (["--force"], ["--check"]):   # --check: an error, not a stale module that a build would replace
        assert main(["build", "specs", "-o", "gen", *check]) == 1
        captured = capsys.readouterr()
        assert "error: gen/silu_mul.py is a folder" in captured.err and "run: kgen build" not in captured.out
    assert sorted(p.name for p in (project / "gen").iterdir()) == ["silu_mul.py"]


def test_paths_with_control_characters_print_on_one_line(project, capsys):
    """A newline or a terminal escape in a spec's name reaches the output escaped, in what the
    build wrote, what --check finds stale and what it finds orphaned."""
    (project / "nl").mkdir()
    shutil.copy(project / "specs" / "vector_add.k", project / "nl" / "a\nb\x1b[2J.k")
    assert main(["build", "nl", "-o", "out"]) == 0
    assert "wrote out/a\\nb\\x1b[2J.py (vector_add: elementwise)\n" in capsys.readouterr().out
    (project / "out" / "a\nb\x1b[2J.py").write_text("# Generated by kgen 0 from nl/a\\x0ab.k\n")
    assert main(["build", "nl", "-o", "out", "--check"]) == 1
    assert "out/a\\nb\\x1b[2J.py: stale\n" in capsys.readouterr().out
    (project / "nl" / "a\nb\x1b[2J.k").unlink()
    (project / "nl" / "keep.k").write_text((project / "specs" / "vector_add.k").read_text())
    assert main(["build", "nl", "-o", "out", "--check"]) == 1
    out = capsys.readouterr().out
    assert "out/a\\nb\\x1b[2J.py: orphaned (nl/a\\x0ab.k is gone" in out and "\x1b" not in out
    (project / "e\nmpty").mkdir()
    assert main(["build", "e\nmpty"]) == 1
    assert "error: no .k files under e\\nmpty\n" in capsys.readouterr().err


def test_build_skips_what_is_not_a_file_and_writes_readable_files(project, capsys):
    os.mkfifo(project / "specs" / "pipe.k")          # reading it would block for ever
    (project / "specs" / "folder.k").mkdir()
    umask = os.umask(0o077)    # as a user may set it after importing kgen: the write takes it
    try:
        assert main(["build", "specs", "-o", "out"]) == 0
    finally:
        os.umask(umask)
    written = sorted(p.name for p in (project / "out").iterdir())
    assert "pipe.py" not in written and "folder.py" not in written and "vector_add.py" in written
    assert (project / "out" / "vector_add.py").stat().st_mode & 0o777 == 0o600


def test_check_is_byte_for_byte(project, capsys):
    assert main(["build", "specs/vector_add.k", "-o", "out"]) == 0
    target = project / "out" / "vector_add.py"
    target.write_bytes(target.read_bytes().replace(b"\n", b"\r\n"))
    assert main(["build", "specs/vector_add.k", "-o", "out", "--check"]) == 1
    assert "out/vector_add.py: stale" in capsys.readouterr().out


def test_a_symlinked_spec_is_named_as_linked(project, capsys):
    (project / "specs" / "sub").mkdir()
    shutil.copy(project / "specs" / "vector_add.k", project / "specs" / "sub" / "one.k")
    (project / "specs" / "link.k").symlink_to("sub/one.k")
    assert main(["build", "specs/link.k", "-o", "out"]) == 0
    assert "from specs/link.k" in (project / "out" / "link.py").read_text().splitlines()[0]


def test_dot_dot_after_a_symlinked_folder_names_the_spec_it_reaches(project, capsys):
    """specs/deep/../one.k, where deep links to sub/deeper, is sub/one.k (the file system takes
    '..' from where the link leads): the header and --check's command name that file."""
    (project / "sub" / "deeper").mkdir(parents=True)
    shutil.copy(project / "specs" / "vector_add.k", project / "sub" / "one.k")
    (project / "specs" / "deep").symlink_to(project / "sub" / "deeper")
    assert main(["build", "specs/deep/../one.k", "-o", "specs/deep/.."]) == 0
    assert "wrote sub/one.py" in capsys.readouterr().out
    assert "from sub/one.k" in (project / "sub" / "one.py").read_text().splitlines()[0]
    (project / "sub" / "one.py").unlink()
    assert main(["build", "specs/deep/../one.k", "-o", "specs/deep/..", "--check"]) == 1
    command = capsys.readouterr().out.strip().splitlines()[-1].split("run: ")[1]
    assert command == "kgen build sub/one.k -o sub"
    assert main(command.split()[1:]) == 0 and (project / "sub" / "one.py").is_file()
    # a folder past the '..' that only the linked-to side has (or has yet to make): written there
    assert main(["build", "specs/vector_add.k", "-o", "specs/deep/../made"]) == 0
    assert "wrote sub/made/vector_add.py" in capsys.readouterr().out
    assert not (project / "made").exists()
    assert "-o sub/made" in (project / "sub" / "made" / "vector_add.py").read_text()
    assert main(["build", "specs/vector_add.k", "-o", "sub/made", "--check"]) == 0


@pytest.mark.parametrize("paths", [
    ["specs/vector_add.k", "specs/vector_add.k"], ["specs", "specs/vector_add.k"],
    ["./specs/vector_add.k", "specs/../specs/vector_add.k"],
], ids=["twice", "folder-and-file", "spelled-differently"])
def test_a_spec_named_twice_is_built_once(project, capsys, paths):
    assert main(["build", *paths, "-o", "g"]) == 0
    out = capsys.readouterr().out
    assert out.count("wrote g/vector_add.py") == 1
    assert "from specs/vector_add.k" in (project / "g" / "vector_add.py").read_text().splitlines()[0]
    assert main(["build", *paths, "-o", "g", "--check"]) == 0
    assert "generated file(s) up to date" in capsys.readouterr().out


def test_a_link_of_another_name_still_builds_its_own_module(project, capsys):
    (project / "specs" / "link.k").symlink_to("vector_add.k")
    assert main(["build", "specs", "specs/link.k", "-o", "g"]) == 0
    assert sorted(p.name for p in (project / "g").iterdir()) == sorted(
        [n.replace(".k", ".py") for n in ELEMENTWISE] + ["link.py"])
    assert main(["build", "specs", "-o", "g", "--check"]) == 0


def test_a_failed_build_says_what_failed(project, capsys):
    """Targets two specs would write are not failed specs; both kinds are counted apart."""
    (project / "a").mkdir()
    shutil.copy(project / "specs" / "vector_add.k", project / "a" / "vector_add.k")
    assert main(["build", "specs", "a", "-o", "out"]) == 1
    err = capsys.readouterr().err
    assert "error: specs/vector_add.k and a/vector_add.k would both write out/vector_add.py" in err
    assert "1 target(s) cannot be written; nothing was written" in err and "spec(s) failed" not in err
    (project / "a" / "broken.k").write_text(BAD)
    assert main(["build", "specs", "a", "-o", "out"]) == 1
    assert "1 spec(s) failed and 1 target(s) cannot be written; nothing was written" in capsys.readouterr().err
    (project / "a" / "vector_add.k").unlink()
    assert main(["build", "specs", "a", "-o", "out"]) == 1
    err = capsys.readouterr().err
    assert "1 spec(s) failed; nothing was written" in err and "target(s)" not in err
    assert not (project / "out").exists()


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_out_naming_a_module_is_refused(project, capsys, check):
    """-o takes a folder: -o out/vector_add.py would make a folder of that name."""
    assert main(["build", "specs/vector_add.k", "-o", "out/vector_add.py", *check]) == 1
    err = capsys.readouterr().err
    assert "error: out/vector_add.py: -o takes a folder" in err and "try -o out" in err
    assert not (project / "out").exists()
    (project / "odd.py").mkdir()   # a folder that exists is a folder, whatever its name
    assert main(["build", "specs/vector_add.k", "-o", "odd.py"]) == 0
    assert (project / "odd.py" / "vector_add.py").is_file()


# --------------------------------------------------------------------------- bad input never hangs or crashes

def kgen_cli(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m kgen ARGS`` in ``cwd``; a command still running after ``timeout`` seconds (a
    read blocked on a FIFO) is killed and fails the test."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "kgen", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path, **(env or {})})


def assert_clean_error(result: subprocess.CompletedProcess, message: str) -> None:
    """Exit status 1, ``error: message`` on stderr, no traceback."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert f"error: {message}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("command, message", [
    (["show", "specs/pipe.k"], "specs/pipe.k: expected a spec file, got a named pipe (FIFO)"),
    (["run", "specs/pipe.k"], "specs/pipe.k: expected a spec file, got a named pipe (FIFO)"),
    (["bench", "specs/pipe.k"], "specs/pipe.k: expected a spec file, got a named pipe (FIFO)"),
    (["build", "specs/pipe.k"], "specs/pipe.k: expected a .k file or a folder, got a named pipe (FIFO)"),
], ids=["show", "run", "bench", "build"])
def test_a_spec_that_is_a_named_pipe_is_refused_without_blocking(project, fifo_released_after, command, message):
    fifo_released_after(project / "specs" / "pipe.k")
    assert_clean_error(kgen_cli(*command, cwd=project), message)


@pytest.mark.parametrize("check", [[], ["--force"], ["--check"]])
def test_a_target_that_is_a_named_pipe_is_refused_without_blocking(project, fifo_released_after, check):
    """A FIFO where a module goes is never read (to see whether kgen wrote it) nor replaced, even
    with --force: it may be someone's; --check says so too."""
    (project / "out").mkdir()
    fifo = fifo_released_after(project / "out" / "vector_add.py")
    result = kgen_cli("build", "specs", "-o", "out", *check, cwd=project)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "error: out/vector_add.py is a named pipe (FIFO), not a module kgen can replace" in result.stderr
    assert sorted(p.name for p in (project / "out").iterdir()) == ["vector_add.py"] and fifo.is_fifo()


def test_a_named_pipe_in_the_module_cache_is_replaced_without_blocking(project, tmp_path, fifo_released_after):
    """The cached module of a spec is read back to see that it is intact: a FIFO under its name is
    not intact, and is replaced by the module."""
    cache = tmp_path / "cache"
    cache.mkdir()
    source = generate((project / "specs" / "vector_add.k").read_text(), "specs/vector_add.k").source
    module = cache / f"kgen_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"
    fifo_released_after(module)
    result = kgen_cli("run", "specs/vector_add.k", "--shape", "N=8", cwd=project, env={"KGEN_CACHE_DIR": str(cache)})
    assert result.returncode == 0, result.stderr
    assert module.is_file() and module.read_text() == source


def test_a_named_pipe_among_generated_modules_is_passed_over_by_check(project, capsys, fifo_released_after):
    """--check reads the header of every module in the folder to find orphans: not a FIFO's."""
    main(["build", "specs"])
    fifo_released_after(project / "generated" / "notes.py")
    result = kgen_cli("build", "specs", "--check", cwd=project)
    assert result.returncode == 0 and "3 generated file(s) up to date" in result.stdout, result.stderr


def test_the_tuning_cache_never_blocks_on_a_named_pipe(tmp_path, fifo_released_after):
    """A FIFO in place of an autotune file is a file to ignore, read in a thread here so that a
    blocked read fails the test instead of hanging it (the fixture releases the thread after)."""
    import threading
    from kgen.autotune import DiskCache
    path = fifo_released_after(tmp_path / "tuned.json")
    found = []
    reader = threading.Thread(target=lambda: found.append(DiskCache(path, {}, []).entries()), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive() and found == [{}]


@pytest.mark.parametrize("header", [
    b"# Generated by kgen 0.1.0 from sp\xe9cs/vector_add.k\n",      # Latin-1: not UTF-8
    "# Generated by kgen 0.1.0 from spécs/vector_add.k\n".encode(),  # UTF-8, not ASCII
    b"\xff\xfe# Generated by kgen 0.1.0 from specs/vector_add.k\n",   # UTF-16's byte-order mark
], ids=["latin-1", "utf-8", "binary"])
def test_a_target_with_non_ascii_bytes_was_not_generated_by_kgen(project, capsys, header):
    """kgen prints its headers in ASCII (non-ASCII path characters escaped): a first line of other
    bytes is someone else's file, overwritten only with --force, and never a crash."""
    (project / "out").mkdir()
    target = project / "out" / "vector_add.py"
    target.write_bytes(header + b"print('mine')\n")
    assert main(["build", "specs/vector_add.k", "-o", "out"]) == 1
    assert "out/vector_add.py exists and was not generated by kgen (use --force" in capsys.readouterr().err
    assert target.read_bytes() == header + b"print('mine')\n"
    with pytest.raises(kgen.KgenError, match="not generated by kgen"):
        kgen.build("specs/vector_add.k", "out")
    assert main(["build", "specs/vector_add.k", "-o", "out", "--force"]) == 0
    text = (project / "specs" / "vector_add.k").read_text()
    assert target.read_text() == generate(text, "specs/vector_add.k", out="out").source


def test_a_folder_that_cannot_be_read_is_an_error_not_a_gap(project, capsys, monkeypatch):
    """A folder under a built one that cannot be listed (no permission) is an error naming it:
    skipped, its specs' modules would be left stale by a build and called orphaned by --check."""
    more = project / "specs" / "more"
    more.mkdir()
    shutil.copy(ROOT / "specs" / "vector_add.k", more / "vector_add2.k")
    assert main(["build", "specs", "-o", "out"]) == 0
    assert (project / "out" / "vector_add2.py").is_file()
    capsys.readouterr()
    listing = os.scandir

    def unreadable(path="."):   # as a folder without read permission lists, for root too
        if Path(path).resolve() == more.resolve():
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return listing(path)
    monkeypatch.setattr(os, "scandir", unreadable)
    before = snapshot(project / "out")
    for command in (["build", "specs", "--check", "-o", "out"], ["build", "specs", "-o", "out"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err == "error: specs/more: cannot read the folder (Permission denied)\n", err
    assert snapshot(project / "out") == before


def test_a_spec_is_never_overwritten_by_its_own_module(project, capsys):
    """A spec named like a module (x.py) built into its own folder would be replaced by what it
    generated: refused, --force or not, by the command line and by kgen.build alike."""
    spec = project / "sp" / "va.py"
    spec.parent.mkdir()
    text = (project / "specs" / "vector_add.k").read_text()
    spec.write_text(text)
    for force in ([], ["--force"], ["--check"]):
        assert main(["build", "sp/va.py", "-o", "sp", *force]) == 1
        captured = capsys.readouterr()
        assert "error: sp/va.py is a spec being built; build it into another folder" in captured.err
        assert "--force" not in captured.out
    for force in (False, True):
        with pytest.raises(kgen.KgenError, match="is a spec being built"):
            kgen.build("sp/va.py", "sp", force=force)
    assert spec.read_text() == text
    assert main(["build", "sp/va.py", "-o", "out"]) == 0
    assert (project / "out" / "va.py").read_text() == generate(text, "sp/va.py", out="out").source


@pytest.mark.parametrize("seed", [-1, 2**64, -(2**63)])
def test_run_refuses_a_seed_torch_does_not_take(project, capsys, seed):
    assert main(["run", "specs/vector_add.k", "--shape", "N=8", "--seed", str(seed)]) == 1
    assert f"error: --seed: expected an integer from 0 to 2**64 - 1 (as torch.manual_seed takes it), got {seed}" \
        in capsys.readouterr().err


def test_run_takes_the_largest_seed_torch_takes(project, capsys):
    assert main(["run", "specs/vector_add.k", "--shape", "N=8", "--seed", str(2**64 - 1)]) == 0
    assert "z: torch.float32 (8,)  max abs error" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["show", "specs/vector_add.k"], ["build", "specs", "--check"],
                                     ["build", "specs", "-o", "out"]], ids=["show", "check", "build"])
def test_a_closed_stdout_ends_quietly_with_the_status_of_sigpipe(project, command):
    """``kgen show x.k | head -1``: the reader is gone before kgen writes; kgen exits 141 as a shell
    reports a writer killed by SIGPIPE, with no BrokenPipeError traceback, and a build still writes
    every module."""
    main(["build", "specs"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "kgen", *command], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()     # the reader goes away at once
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    if "-o" in command:
        assert sorted(p.name for p in (project / "out").iterdir()) == sorted(
            n.replace(".k", ".py") for n in ELEMENTWISE)


@pytest.mark.parametrize("redirect", ["1>&-", ">/dev/full"], ids=["closed", "full"])
def test_a_stdout_that_cannot_be_written_is_an_error_after_the_work(project, redirect):
    """Stdout closed (no descriptor 1) or on a full disk: the build still writes every module, then
    says on stderr why nothing was printed and exits 1, with no traceback."""
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs Linux's /dev/full")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = f"{shlex.quote(sys.executable)} -m kgen build specs -o out {redirect}"
    result = subprocess.run(["sh", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "error: cannot write to standard output" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in (project / "out").iterdir()) == sorted(n.replace(".k", ".py") for n in ELEMENTWISE)


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"], ids=["closed", "full"])
def test_a_notice_that_stderr_cannot_take_never_stops_the_work(project, redirect):
    """kgen's notices (the interpreter's, autotuning's progress) are news: with stderr closed or on
    a full disk, kgen run still runs and checks the kernel."""
    if not os.path.exists("/dev/full"):
        pytest.fail("this test needs Linux's /dev/full")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = f"{shlex.quote(sys.executable)} -m kgen run specs/vector_add.k --shape N=8 {redirect}"
    result = subprocess.run(["sh", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "z: torch.float32 (8,)  max abs error" in result.stdout, result.stdout


def test_file_names_that_are_not_utf8_print_as_escapes(project):
    """A spec whose file name is not UTF-8 (its byte read back as a surrogate) builds, and its name
    prints escaped on a stdout that takes UTF-8 strictly; every other spec builds too."""
    name = os.fsdecode(b"odd\xff.k")
    shutil.copy(ROOT / "specs" / "vector_add.k", project / "specs" / name)
    result = kgen_cli("build", "specs", "-o", "out", cwd=project, env={"PYTHONIOENCODING": "utf-8"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "wrote out/odd\\udcff.py" in result.stdout, result.stdout
    assert sorted(p.name for p in (project / "out").iterdir()) == sorted(
        [os.fsdecode(b"odd\xff.py")] + [n.replace(".k", ".py") for n in ELEMENTWISE])
    assert kgen_cli("build", "specs", "-o", "out", "--check", cwd=project,
                    env={"PYTHONIOENCODING": "utf-8"}).returncode == 0


def test_the_command_line_imports_torch_only_to_run_a_command():
    """kgen.cli answers --help and bad arguments without importing torch and Triton (seconds), and
    a Ctrl-C while a command imports them is its own: "error: interrupted", no traceback."""
    code = "import sys, kgen.cli; print(sorted({'torch', 'triton', 'kgen.runtime'} & set(sys.modules)))"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 0 and result.stdout.strip() == "[]", (result.stdout, result.stderr)


def test_a_ctrl_c_during_the_imports_comes_after_them(tmp_path, monkeypatch):
    """A Ctrl-C while a command imports torch (seconds) is held until the import is done, then
    raised, so that the command says "error: interrupted" rather than leaving torch half-loaded
    (numpy then refuses a second load, or C++ aborts)."""
    from kgen.cli import import_held
    (tmp_path / "slow_probe.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_probe", raising=False)
    with pytest.raises(KeyboardInterrupt):
        import_held(("slow_probe",))
    assert sys.modules["slow_probe"].DONE
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Ctrl-C is handled as before"


def test_a_signal_during_a_file_write_comes_after_it(tmp_path, monkeypatch):
    """A Ctrl-C or SIGTERM while kgen writes a module (build, cache) or a tuning file is held
    until the file is whole and in place, then raised to its own handler: no temp file is
    left beside it, and the handlers are as they were."""
    from kgen import runtime
    target = tmp_path / "module.py"
    target.write_text("old\n")
    real_fdopen = os.fdopen

    def interrupted(signum):
        def fdopen(*args, **kwargs):
            os.kill(os.getpid(), signum)     # arrives mid-write
            return real_fdopen(*args, **kwargs)
        return fdopen
    monkeypatch.setattr(runtime.os, "fdopen", interrupted(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        runtime.write_atomic(target, "new\n")
    assert target.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["module.py"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    came = []
    before = signal.signal(signal.SIGTERM, lambda number, _frame: came.append(target.read_text()))
    try:
        monkeypatch.setattr(runtime.os, "fdopen", interrupted(signal.SIGTERM))
        runtime.write_atomic(target, "newer\n")
        assert came == ["newer\n"], "SIGTERM's handler ran once the file was in place"
        assert [p.name for p in tmp_path.iterdir()] == ["module.py"]
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("option, path, message", [
    ("--json", "nowhere/rows.json", "--json: nowhere is missing; expected the folder to write rows.json into"),
    ("--json", "specs/vector_add.k/rows.json", "--json: specs/vector_add.k is a regular file; expected the folder"),
    ("--json", "specs", "--json: specs is a folder; expected a file to write"),
    ("--plot", "specs", "--plot: specs is a folder; expected a file to write"),
    ("--plot", "rows.txt", "--plot: rows.txt: expected a name ending in an image format matplotlib writes"),
    ("--plot", "rows", "got no suffix"),
    ("--json", "a" * 300 + ".json", "is 305 bytes long; the file system takes at most"),
])
def test_bench_checks_where_it_writes_before_timing(project, capsys, option, path, message):
    """A benchmark's rows are written at its end: a destination that cannot take them is refused
    first, before the GPU is even asked for (here without one, the GPU error would come first)."""
    assert main(["bench", "specs/vector_add.k", option, path]) == 1
    err = capsys.readouterr().err
    assert f"error: {message}" in err or message in err and err.startswith("error: "), err
    assert "CUDA" not in err


@pytest.mark.parametrize("options, message", [
    (["--json", "specs/vector_add.k"], "--json: specs/vector_add.k is a spec; expected a new file for the rows"),
    (["--json", "rows.json"], "--json: rows.json is a spec; expected a new file for the rows"),   # a link to it
    (["--json", "specs/other.k"], "--json: specs/other.k is a spec"),
    (["--plot", "specs/vector_add.k"], "--plot: specs/vector_add.k is a spec; expected a new file for the plot"),
    (["--json", "rows.png", "--plot", "rows.png"], "--plot: rows.png is --json's file too; give each its own"),
    # a new file named through a linked folder and through the folder itself
    (["--json", "linked/rows.png", "--plot", "specs/rows.png"], "--plot: specs/rows.png is --json's file too"),
])
def test_bench_never_writes_over_a_spec_or_its_other_file(project, capsys, options, message):
    """The rows are written at the run's end: a slip of the destination must not lose the spec."""
    (project / "rows.json").symlink_to(project / "specs" / "vector_add.k")
    (project / "linked").symlink_to(project / "specs")
    before = snapshot(project)
    assert main(["bench", "specs/vector_add.k", *options]) == 1
    assert f"error: {message}" in capsys.readouterr().err
    assert snapshot(project) == before


def test_bench_refuses_a_folder_it_cannot_write_into(project, capsys):
    """Probed by making a file there, as the write will; root writes past a folder's mode, so
    where the test can still write into the read-only folder, one that no one can write into
    (/sys) stands in."""
    from kgen.files import display_path
    folder = project / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    if _can_create_in(folder):
        folder = Path("/sys")
        assert not _can_create_in(folder)
    assert main(["bench", "specs/vector_add.k", "--json", str(folder / "rows.json")]) == 1
    assert f"error: --json: cannot write into {display_path(folder)} (" in capsys.readouterr().err
    (project / "readonly").chmod(0o755)


def _can_create_in(folder: Path) -> bool:
    try:
        (folder / "kgen-probe").touch()
    except OSError:
        return False
    (folder / "kgen-probe").unlink()
    return True


def test_a_plot_of_rates_in_two_units_says_each_bars_unit(tmp_path, monkeypatch):
    """A file of a GEMM and a row kernel times one in TFLOP/s, the other in GB/s: one axis
    labelled with the first's unit had mislabelled the other's bars."""
    from matplotlib.figure import Figure
    from kgen import bench
    drawn = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), real(fig, *a, **k))[1])
    rows = [bench.Row("mm", "M=64", "f16", 1.0, 2.0, None, "TFLOP/s", 500.0, 250.0, None),
            bench.Row("softmax", "N=64", "f16", 1.0, 2.0, None, "GB/s", 2000.0, 1000.0, None)]
    bench._plot(rows, tmp_path / "rates.png")
    ax = drawn[0].axes[0]
    assert ax.get_ylabel() == "TFLOP/s or GB/s"
    assert [t.get_text().split("\n")[-1] for t in ax.get_xticklabels()] == ["TFLOP/s", "GB/s"]
    assert (tmp_path / "rates.png").stat().st_size > 0


def test_bench_plot_needs_matplotlib_before_timing(project, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    assert main(["bench", "specs/vector_add.k", "--plot", "rows.png"]) == 1
    assert "error: --plot needs matplotlib (pip install matplotlib)" in capsys.readouterr().err
    # a name no image format ends in is named first, matplotlib or not
    assert main(["bench", "specs/vector_add.k", "--plot", "rows.txt"]) == 1
    assert "error: --plot: rows.txt: expected a name ending in an image format" in capsys.readouterr().err


@pytest.mark.parametrize("command, message", [
    (["build", ""], "kgen build: PATH: expected the path of a .k file or a folder, got an empty string"),
    (["build", "specs", "-o", ""], "kgen build: -o: expected the path of a folder, got an empty string"),
    (["show", ""], "kgen show: PATH: expected the path of a spec file, got an empty string"),
    (["run", ""], "kgen run: PATH: expected the path of a spec file, got an empty string"),
    (["bench", ""], "kgen bench: PATH: expected the path of a spec file, got an empty string"),
    (["bench", "specs/vector_add.k", "--json", ""], "kgen bench: --json: expected the path of a file to write"),
    (["bench", "specs/vector_add.k", "--plot", ""], "kgen bench: --plot: expected the path of an image to write"),
])
def test_empty_paths_are_refused(project, capsys, command, message):
    """An empty path would be the working folder: ``kgen build ""`` would build every spec under it."""
    before = snapshot(project)
    assert main(command) == 1
    assert f"error: {message}" in capsys.readouterr().err
    assert snapshot(project) == before


def test_run_takes_one_shape_and_bench_several(project, capsys):
    """kgen run checks one point: --shape given twice is refused, not the last one taken; kgen
    bench times each --shape as a point, and checks every one's names before timing."""
    assert main(["run", "specs/vector_add.k", "--shape", "N=8", "--shape", "N=16"]) == 1
    assert "error: --shape: kgen run takes one point (--shape M=64,N=128), got 2: N=8 N=16" in \
        capsys.readouterr().err
    assert main(["bench", "specs/vector_add.k", "--shape", "N=8", "--shape", "Q=16"]) == 1
    assert "error: --shape: Q is not a dimension of vector_add" in capsys.readouterr().err


GROUPED = str(ROOT / "specs" / "grouped_gemm.k")


@pytest.mark.parametrize("command, message", [
    (["run", "specs/vector_add.k", "--shape", "groups=3"],
     "--shape: groups is not a dimension of vector_add (its dimensions: N); groups= sets the number of problems "
     "of a kernel with list parameters"),
    (["run", GROUPED, "--shape", "groups=0"], "--shape: groups= is the number of problems of grouped_gemm's lists, "
                                              "expected 1 to 4096, got 0"),
    (["run", GROUPED, "--shape", "groups=2**20"], "--shape: groups= is the number of problems of grouped_gemm's lists, "
                                                  "expected 1 to 4096, got 1048576"),
    (["bench", "specs/vector_add.k", "--shape", "groups=3"], "--shape: groups is not a dimension of vector_add"),
    (["bench", GROUPED, "--shape", "groups=0"], "--shape: groups= is the number of problems of grouped_gemm's lists, "
                                                "expected 1 to 4096, got 0"),
])
def test_groups_is_for_kernels_with_lists_and_in_range(project, capsys, command, message):
    assert main(command) == 1
    assert f"error: {message}" in capsys.readouterr().err


def test_groups_sets_the_number_of_problems(project, capsys):
    assert main(["run", GROUPED, "--shape", "M=16,K=16,N=16,groups=3"]) == 0
    assert "C: 3 x torch.float16 [(16, 16), (16, 16), (16, 16)]" in capsys.readouterr().out
    assert main(["run", GROUPED, "--shape", "M=1,K=1,N=1,groups=40"]) == 0   # one short line for many
    assert f"C: 40 x torch.float16 [{'(1, 1), ' * 7}... 33 more]  max abs error" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--rounds", "0"], "--rounds: expected at least 1 round, got 0"),
    (["--suite", "grouped", "--no-compile"], "--no-compile: --suite grouped times no torch.compile baseline"),
    (["--rounds", "-2"], "--rounds: expected at least 1 round, got -2"),
    (["--shape", "M=64"], "--shape: --suite softmax times its own shapes; it takes no --shape"),
    (["--dtype", "f32"], "--dtype: --suite softmax times its own dtypes; it takes no --dtype"),
    (["--plot", "rows.png"], "--plot: --suite softmax draws no plot (--json writes its rows)"),
    (["--no-compile"], "--no-compile: --suite softmax always times torch.compile"),
    (["specs/vector_add.k"], "kgen bench: give a spec (specs/vector_add.k) or --suite softmax, not both"),
])
def test_bench_suite_refuses_options_it_would_ignore(project, capsys, extra, message):
    """(--suite softmax unless the case names another suite, which then comes last)"""
    assert main(["bench", "--suite", "softmax", *extra]) == 1
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "CUDA" not in err


def test_bench_checks_rounds_for_a_spec_too(project, capsys):
    assert main(["bench", "specs/vector_add.k", "--rounds", "0"]) == 1
    assert "error: --rounds: expected at least 1 round, got 0" in capsys.readouterr().err


INF = "kernel to_inf(x: f32[N]) -> y: f32[N] {\n    y = x / 0.0\n}\n"
LOG = "kernel lg(x: f32[N]) -> y: f32[N] {\n    y = log(x)\n}\n"


def test_run_counts_inf_and_nan_mismatches(project, capsys, monkeypatch):
    """Where either side is inf or NaN, kernel and reference must agree (as the tests compare them,
    reference.compare): matching infs and NaNs are no mismatch; a NaN where the reference has a
    number is one, and so is a number where it has inf."""
    import kgen.bench
    from kgen.reference import evaluate
    (project / "specs" / "to_inf.k").write_text(INF)
    (project / "specs" / "lg.k").write_text(LOG)
    assert main(["run", "specs/to_inf.k", "--shape", "N=32"]) == 0   # +-inf on both sides
    assert "y: torch.float32 (32,)  max abs error 0\n" in capsys.readouterr().out
    assert main(["run", "specs/lg.k", "--shape", "N=32"]) == 0       # NaN on both sides where x < 0
    capsys.readouterr()
    references = []

    def without_nans(kir, inputs, **kwargs):   # a reference with numbers where the kernel has NaN
        want = evaluate(kir, inputs, **kwargs)
        references.append(want[0])
        return tuple(torch.nan_to_num(w, nan=0.0) for w in want)
    monkeypatch.setattr(kgen.bench, "evaluate", without_nans)
    assert main(["run", "specs/lg.k", "--shape", "N=32"]) == 1
    nans = int(torch.isnan(references[0]).sum())
    assert nans > 0
    captured = capsys.readouterr()
    assert re.search(rf"y: torch.float32 \(32,\)  max abs error [^,]+, {nans} inf/NaN mismatch\(es\)\n", captured.out)
    assert f"error: inf/NaN mismatches against the reference in lg.y ({nans})" in captured.err


def test_compare_counts_what_assert_close_refuses():
    """reference.compare's mismatches are the elements torch.testing.assert_close(equal_nan=True)
    refuses for being inf or NaN against the reference rounded to the output's dtype."""
    from kgen.reference import compare
    inf, nan = float("inf"), float("nan")
    got = torch.tensor([1.0, inf, -inf, nan, nan, 2.0, inf, 3.0, 70000.0], dtype=torch.float32)
    want = torch.tensor([1.5, inf, -inf, nan, 1.0, inf, -inf, nan, 70000.0], dtype=torch.float64)
    error, mismatched = compare(got, want)
    finite = torch.isfinite(got.double()) & torch.isfinite(want)
    refused = [i for i in range(len(got)) if not finite[i] and not _close(got[i:i + 1], want[i:i + 1])]
    assert refused and mismatched == len(refused)
    assert error == (got.double() - want)[finite].abs().max().item()
    half = torch.tensor([inf], dtype=torch.float16)   # 70000 rounds to f16's inf: no mismatch
    assert compare(half, torch.tensor([70000.0], dtype=torch.float64))[1] == 0


def _close(got, want) -> bool:
    try:
        torch.testing.assert_close(got.double(), want.to(got.dtype).double(), equal_nan=True, atol=0.0, rtol=0.0)
    except AssertionError:
        return False
    return True


LONG = "a" * 300


def test_names_too_long_for_the_file_system_are_refused_before_writing(project, capsys):
    """A module name (a spec stem of 253 bytes and .py), or an -o component, past the file system's
    255 bytes: an error before anything is written, in --check too."""
    spec = project / "specs" / ("b" * 253 + ".k")
    shutil.copy(project / "specs" / "vector_add.k", spec)
    for check in ([], ["--check"]):
        assert main(["build", "specs", "-o", "out", *check]) == 1
        err = capsys.readouterr().err
        assert "is 256 bytes long; the file system takes at most 255" in err and "Traceback" not in err
        assert "1 target(s) cannot be written; nothing was written" in err
        assert main(["build", "specs/vector_add.k", "-o", f"out/{LONG}", *check]) == 1
        assert "is 300 bytes long; the file system takes at most 255" in capsys.readouterr().err
        assert main(["build", "specs/vector_add.k", "-o", f"{LONG}.py", *check]) == 1   # named like a module
        assert "-o takes a folder, not a module's path" in capsys.readouterr().err
    (project / "none").mkdir()
    assert main(["build", "none", "-o", LONG, "--check"]) == 1   # no spec: the folder looked at for orphans
    assert "no .k files under none" in capsys.readouterr().err
    assert not (project / "out").exists()
    with pytest.raises(kgen.KgenError, match="takes a folder, not a module's path"):
        kgen.build(project / "specs" / "vector_add.k", f"{LONG}.py")
    spec.unlink()
    assert main(["show", f"specs/{LONG}.k"]) == 1
    assert "cannot read the spec (File name too long)" in capsys.readouterr().err


@pytest.mark.parametrize("out", [[], ["-o", "out"]])
def test_check_ends_with_the_command_that_regenerates(project, capsys, out):
    assert main(["build", "specs", *out]) == 0
    folder = project / (out[1] if out else "generated")
    (folder / "silu_mul.py").write_text((folder / "silu_mul.py").read_text() + "# edited\n")
    (folder / "bias_gelu.py").unlink()
    capsys.readouterr()
    assert main(["build", "specs", *out, "--check"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"2 generated file(s) out of date; run: kgen build specs -o {folder.name}"
    assert main(lines[-1].split("run: kgen ")[1].split()) == 0    # the command does regenerate them
    assert main(["build", "specs", *out, "--check"]) == 0


@pytest.mark.parametrize("command, message", [
    (["show", "specs"], "specs: expected a spec file, got a folder"),
    (["run", "specs"], "specs: expected a spec file, got a folder"),
    (["build", "specs/vector_add.k", "-o", "specs/vector_add.k"], "specs/vector_add.k is a file, not a folder"),
    (["build", "specs/vector_add.k", "-o", "specs/vector_add.k", "--check"],
     "specs/vector_add.k is a file, not a folder"),
    (["run", "specs/vector_add.k", "--shape", "N=2**"], "--shape: expected NAME=SIZE"),
    (["run", "specs/vector_add.k", "--dtype", "f64"], "--dtype: expected f16, bf16 or f32, got 'f64'"),
    (["bench", "specs/vector_add.k", "--dtype", "i32"], "--dtype: expected f16, bf16 or f32, got 'i32'"),
    (["bench", "specs/vector_add.k", "--shape", "N="], "--shape: expected NAME=SIZE"),
])
def test_other_bad_arguments_are_kgen_errors(project, capsys, command, message):
    assert main(command) == 1
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "CUDA" not in err


def test_an_unreadable_spec_is_a_kgen_error(project, capsys):
    """chmod 000 (root reads it all the same: then it builds)."""
    spec = project / "specs" / "vector_add.k"
    spec.chmod(0)
    try:
        spec.read_bytes()
        readable = True
    except PermissionError:
        readable = False
    status = main(["show", "specs/vector_add.k"])
    spec.chmod(0o644)
    err = capsys.readouterr().err
    assert (status, "error: specs/vector_add.k: cannot read the spec (Permission denied)" in err) == \
        ((0, False) if readable else (1, True))


def test_errors_never_reach_stdout_when_stderr_is_closed(project):
    """With fd 2 closed Python has no sys.stderr, and print(file=None) writes to stdout: an
    error goes nowhere instead, and the exit status still says it."""
    (project / "specs" / "bad.k").write_text(BAD)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "kgen", "show", "specs/bad.k", "--emit", "ir"], cwd=project,
                            stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(2), timeout=120,
                            env={**os.environ, "PYTHONPATH": path})
    assert result.returncode == 1 and result.stdout == ""


def test_python_dash_m_kgen_without_a_command_prints_its_usage(project):
    result = kgen_cli(cwd=project)
    assert result.returncode == 2 and "usage: kgen" in result.stderr and "Traceback" not in result.stderr
