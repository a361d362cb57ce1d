"""The tuner's plan and apply logic on the committed knobs files and on a
recorded results file (testdata/), and its isolation of failing candidates
(a segfault, a hang, a raise) on fake units; with KPOOL_TUNE_BUNDLE (a CPU
bundle of `plan`, as tools/tune/cpu_loop.sh makes), the same failures among
the real candidates of that bundle."""

import ctypes
import faulthandler
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kpool_tune as kt  # noqa: E402
import tune_plan  # noqa: E402
import tune_run  # noqa: E402 (where run looks up open_session)
import knobs as kf  # noqa: E402 (schedules/knobs.py, on the path kpool_tune puts it)

SCHEDULES = os.path.join(kt.REPO, "schedules")
RESULTS = os.path.join(HERE, "testdata", "sm90_results.json")
FAMILIES = sorted(f[:-len(".knobs")] for f in os.listdir(SCHEDULES) if f.endswith(".knobs"))  # (cuda.base is none)


def read(family):
    return kf.Knobs(os.path.join(SCHEDULES, f"{family}.knobs"))


def test_committed_values_are_legal_and_satisfy_the_requires():
    for family in FAMILIES:
        knobs = read(family)  # the reader checks both
        assert knobs.values and knobs.satisfies(knobs.values), family


def test_the_reader_rejects_what_the_configure_must(tmp_path):
    good = open(os.path.join(SCHEDULES, "cuda.base")).read()

    def with_value(text, name, value):  # whatever the file holds now
        return re.sub(rf"^{re.escape(name)} = \S+ ", f"{name} = {value} ", text, count=1, flags=re.M)

    cases = {
        "require fwht.run <= fwht.values does not hold for fwht.run = 16, fwht.values = 8":
            with_value(with_value(good, "fwht.values", 8), "fwht.run", 16),
        "fwht.run = 5 is not among its legal values": with_value(good, "fwht.run", 5),
        "fwht.run given twice": good + "fwht.run = 4 : 4\n",
        "not \"name = value : legal values\"": good + "fwht.run 4\n",
        "exact_only names no knob: fwht.exact": good + "exact_only fwht.exact\n",
    }
    for message, text in cases.items():
        (tmp_path / "cuda.base").write_text(text)
        with pytest.raises(kf.KnobsError, match=re.escape(message)):
            kf.Knobs(tmp_path / "cuda.base")
    # write_values leaves a file that breaks a rule as it was.
    (tmp_path / "cuda.base").write_text(good)
    with pytest.raises(kf.KnobsError):
        kf.write_values(tmp_path / "cuda.base", {"fwht.run": 16, "fwht.values": 8})
    assert (tmp_path / "cuda.base").read_text() == good
    # A family's file: the base, then overrides of its knobs, each with a reason.
    overrides = {
        "says no reason": "base cuda.base\nfwht.values = 16\n",
        "overrides no knob of a base": "base cuda.base\n# why\nfwht.width = 16\n",
        "fwht.values = 4 is not among its legal values": "base cuda.base\n# why\nfwht.values = 4\n",
        "fwht.values given twice": "base cuda.base\n# why\nfwht.values = 16\nfwht.values = 8  # why\n",
        "`base` comes first, once": "# why\nfwht.run = 8 : 8\nbase cuda.base\n",
        "require fwht.run <= fwht.values does not hold": "base cuda.base\nfwht.values = 8  # why\nfwht.run = 16  # why\n",
    }
    for message, text in overrides.items():
        (tmp_path / "sm90.knobs").write_text(text)
        with pytest.raises(kf.KnobsError, match=re.escape(message)):
            kf.Knobs(tmp_path / "sm90.knobs")
    (tmp_path / "sm90.knobs").write_text("base cuda.base\n# the reason\nfwht.values = 16\n")
    knobs = kf.Knobs(tmp_path / "sm90.knobs")
    assert knobs.values["fwht.values"] == 16 and knobs.overrides == {"fwht.values": 16}
    # A tuner's winners of one unit: one reason above their run of overrides.
    kf.write_values(tmp_path / "sm90.knobs", {"expand.cols": 1024, "expand.append_cols": 512})
    assert (tmp_path / "sm90.knobs").read_text().endswith(
        f"# {kf.TUNED_REASON}\nexpand.cols = 1024\nexpand.append_cols = 512\n")
    assert kf.Knobs(tmp_path / "sm90.knobs").overrides == {"fwht.values": 16, "expand.cols": 1024,
                                                           "expand.append_cols": 512}
    (tmp_path / "sm90.knobs").write_text("base cuda.base\n# why\nfwht.values = 16  # its own\nfwht.run = 16\n")
    with pytest.raises(kf.KnobsError, match="fwht.run = 16 says no reason"):
        kf.Knobs(tmp_path / "sm90.knobs")
    assert knobs.files() == [str(tmp_path / "sm90.knobs"), str(tmp_path / "cuda.base")]


def test_every_sm80_line_is_an_override_with_a_reason():
    """sm80 is unmeasured: it names the base and sets only what differs, saying why
    (the reader refuses an override without a reason)."""
    knobs = read("sm80")
    assert knobs.base is not None
    lines = [l.split("#")[0].strip() for l in open(os.path.join(SCHEDULES, "sm80.knobs"))]
    assert [l for l in lines if l] == ["base cuda.base"] + [f"{n} = {v}" for n, v in knobs.overrides.items()]


def test_gpu_families_name_the_same_knobs():
    """CudaPlan reads every CUDA family's knobs into the same fields."""
    names = {f: sorted(read(f).values) for f in FAMILIES if f != "cpu"}
    assert len(set(map(tuple, names.values()))) == 1, names


def test_units_split_by_op_and_arithmetic():
    u = kt.units(read("sm90"))
    knobs = read("sm90")
    # The runtime's decode layout rule is no knob (runtime/ops/decode_layouts.h).
    assert not [k for k in knobs.values if "per_token_" in k]
    in_units = [k for ks in u.values() for k in ks]
    tunable = sorted(k for k in knobs.values if len(knobs.legal[k]) > 1)
    assert sorted(in_units) == tunable  # each in one unit
    assert u["compress.exact"] == ["compress.exact_values", "compress.exact_words_values",
                                   "compress.exact_words_unrolled_slots"]
    assert "compress.triton_values" in u["compress"]
    assert kt.arithmetic_of("sm90", "compress.exact") == "exact"
    assert kt.arithmetic_of("sm90", "compress") == "triton"
    assert kt.arithmetic_of("cpu", "fwht") == "exact"


def test_enumeration_prunes_by_requires_and_leaves_out_the_hand_values():
    knobs = read("sm90")
    names = kt.units(knobs)["fwht"]
    settings = kt.enumerate_unit(knobs, names, None, random.Random(0))
    assert all(s["fwht.run"] <= s["fwht.values"] for s in settings)
    assert {k: knobs.values[k] for k in names} not in settings
    full = 1
    for k in names:
        full *= len(knobs.legal[k])
    assert 0 < len(settings) < full - 1  # some pruned
    sampled = kt.enumerate_unit(knobs, names, 5, random.Random(0))
    assert len(sampled) == 5 and all(s in settings for s in sampled)


def test_every_value_runs_each_legal_value_once_within_the_requires():
    for family in FAMILIES:
        knobs = read(family)
        u = kt.units(knobs)
        settings = kt.every_value(knobs, u)
        assert all(knobs.satisfies({**knobs.values, **s}) for _, s in settings)
        for unit, names in u.items():
            for name in names:
                seen = sorted({s[name] for x, s in settings if x == unit and name in s and
                               s[name] != knobs.values[name]})
                assert seen == sorted(v for v in knobs.legal[name] if v != knobs.values[name]), (family, name)
    knobs = read("sm90")
    settings = kt.every_value(knobs, kt.units(knobs))
    # 8 values a lane do not fit shared memory with 4 unrolled slots (a
    # require): the unit's own knob moves, not compress.row_threads.
    v8 = [s for u, s in settings if s.get("compress.exact_words_values") == 8]
    assert v8 == [{"compress.exact_words_values": 8, "compress.exact_words_unrolled_slots": 16}]
    # A knob of both arithmetics runs in both units; a triton one in the triton unit only.
    assert {u for u, s in settings if s.get("compress.row_threads") == 512} == {"compress", "compress.exact"}
    assert {u for u, s in settings if "compress.triton_values" in s} == {"compress"}


def test_the_knobs_files_keep_compress_logits_within_48_kib_of_shared_memory():
    """The generator refuses a words kernel whose P x V f32 logits a thread
    (past exact_words_unrolled_slots) take more than 48 KiB a block: the
    require lines keep every legal combination under it at P = 16."""
    for family in FAMILIES:
        knobs = read(family)
        if "compress.exact_words_values" not in knobs.values:
            continue
        names = ["compress.row_threads", "compress.exact_words_values", "compress.exact_words_unrolled_slots"]
        for combo in itertools.product(*(knobs.legal[n] for n in names)):
            threads, values, unrolled = combo
            legal = knobs.satisfies({**knobs.values, **dict(zip(names, combo))})
            assert legal == (unrolled >= 16 or threads * values * 16 * 4 <= 48 * 1024), (family, combo)


def test_launch_bounds_read_from_the_stmt_and_ptxas():
    """every_value_builds.py's launch check, on the forms Halide 21's stmt
    and ptxas -v write: a grid size with commas of its own, the block's
    threads, its shared memory as an expression, a block the call sizes
    (not checked); each limit broken once."""
    import every_value_builds as ev
    stmt = ('let r = halide_cuda_run(cuda[0], "_kernel_a", max(t1, (t2 + 3)), 1, 1, 32, 32, 1, 0 + (8192*4), '
            '(void *)make_struct((int64)8))\n'
            'let q = halide_cuda_run(cuda[0], "_kernel_b", t9, 1, 1, 16, 8, 1, 0 + (16384*4), (void *)make_struct())\n'
            'let z = halide_cuda_run(cuda[0], "_kernel_c", t9, 1, 1, n, 8, 1, 0, (void *)make_struct())\n')
    assert ev.launches(stmt) == {"_kernel_a": (1024, 32768), "_kernel_b": (128, 65536), "_kernel_c": (None, 0)}
    report = ("ptxas info    : Compiling entry function '_kernel_a' for 'sm_90'\n"
              "ptxas info    : Used 57 registers, used 0 barriers\n"
              "ptxas info    : Compiling entry function '_kernel_b' for 'sm_90'\n"
              "ptxas info    : Used 128 registers, used 1 barriers\n")
    assert ev.registers(report) == {"_kernel_a": 57, "_kernel_b": 128}
    # 57 registers a thread take 64 (a warp's in units of 256): 64 x 1024 = 65536, at the limit.
    assert ev.launch_bounds_errors(stmt, report) == [
        "_kernel_b: 65536 bytes of shared memory a block, over 49152"]
    assert ev.launch_bounds_errors(stmt, report.replace("57 registers", "65 registers")) == [
        "_kernel_a: 65 registers x 1024 threads = 73728 a block, over 65536",
        "_kernel_b: 65536 bytes of shared memory a block, over 49152"]
    assert ev.launch_bounds_errors(stmt.replace("32, 32, 1", "64, 32, 1"), report)[0] == \
        "_kernel_a: 2048 threads a block, over 1024"


def test_cmake_line_names_the_candidate():
    c = dict(id=7, unit="compress.exact", arithmetic="exact", knobs={"a.b": 1, "c.d": 2})
    assert kt.cmake_line("sm90", c) == ('kpool_add_device_kernels(sm90 CANDIDATE 7 KNOBS "a.b:1,c.d:2" OPS compress '
                                        'ARITHMETICS exact)\n')
    c["autoscheduler"] = "Anderson2021"
    assert kt.cmake_line("cpu", c).endswith('OPS compress AUTOSCHEDULER Halide::Anderson2021)\n')


def test_a_twin_the_first_autoscheduler_cannot_build_goes_to_the_next():
    candidates = [dict(id=0, unit="fwht", knobs={}), dict(id=1, unit="fwht", autoscheduler="Anderson2021"),
                  dict(id=2, unit="decode", autoscheduler="Anderson2021")]
    configured = []

    def build_one(c):
        if c["unit"] == "decode" and c["autoscheduler"] == "Anderson2021":
            c["error"] = "for loop over weighted_sum.s0.token.token is inside GPU block loop"

    failed = tune_plan.build_twins(candidates, ("Anderson2021", "Li2018"), lambda cs: configured.append(
        [c["id"] for c in cs]), build_one)
    assert [c["id"] for c in failed] == [2]
    assert candidates[3] == dict(id=3, unit="decode", autoscheduler="Li2018")
    assert configured == [[0, 1, 2], [0, 1, 3]]  # the failed twin out of the second configure
    # The last autoscheduler failing too: both recorded, none left to try.
    candidates = [dict(id=0, unit="decode", autoscheduler="Anderson2021")]
    failed = tune_plan.build_twins(candidates, ("Anderson2021", "Li2018"), lambda cs: None,
                                   lambda c: c.update(error="no"))
    assert [(c["id"], c["autoscheduler"]) for c in failed] == [(0, "Anderson2021"), (1, "Li2018")]


def test_winners_take_only_valid_complete_and_clearly_faster_candidates():
    with open(RESULTS) as f:
        results = json.load(f)
    w = kt.winners(results)
    best, auto = w["fwht"]
    assert best["id"] == 0  # id 1 has wrong bytes, id 2 misses a case
    assert auto["autoscheduler"] == "Anderson2021"
    assert w["decode"][0] is None  # 1 % faster: within timing noise
    assert kt.winners(results, min_gain=0.0)["decode"][0]["id"] == 4


def test_apply_rewrites_only_the_winning_values(tmp_path, capsys):
    for name in ("sm90.knobs", "cuda.base"):
        shutil.copy(os.path.join(SCHEDULES, name), tmp_path / name)
    base = (tmp_path / "cuda.base").read_text()
    before = (tmp_path / "sm90.knobs").read_text().splitlines()
    kt.main(["apply", RESULTS, "--knobs-dir", str(tmp_path)])
    after = (tmp_path / "sm90.knobs").read_text().splitlines()
    # The winner becomes the family's override, with its reason; the base is as it was.
    assert after[:len(before)] == before and after[len(before):] == [f"# {kf.TUNED_REASON}", "fwht.values = 16"]
    assert (tmp_path / "cuda.base").read_text() == base
    assert kf.Knobs(tmp_path / "sm90.knobs").values["fwht.values"] == 16
    out = capsys.readouterr().out
    assert "| fwht (triton) | rows=65536 | 11.5 | 10.0 | 9.0 | fwht.values:16 | 30.0 (Anderson2021) |" in out
    assert "| decode (triton) | requests=64 next_n=1 P=4 | - | 3.0 |" in out
    assert "decode: the reference was not timed: AssertionError: a recorded failure" in out
    assert "decode: Anderson2021 could not schedule it: kpool_sm90_decode_update_p4_triton_c9" in out


# --- isolation: a candidate that faults, hangs or raises is recorded, and the run goes on ---------
def fail_as_told(c):
    fault = c.get("fake")
    if fault == "segfault":
        faulthandler.disable()  # pytest's handler would print the worker's stack
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif fault == "hang":
        if os.environ.get("KPOOL_TUNE_TEST_PIDS"):
            with open(os.environ["KPOOL_TUNE_TEST_PIDS"], "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(3600)
    elif fault == "raise":
        raise RuntimeError("a fake candidate's failure")


class FakeSession:
    """A unit whose candidates fail as their "fake" field says, in the worker
    process itself (a real segfault, a real hang), in place of the library."""

    def __init__(self, *args):
        pass

    def device_name(self):
        return "a fake device"

    def hand_times(self):
        return {"case": 10.0}

    def reference_times(self):
        return None

    def candidate(self, c, timed):
        fail_as_told(c)
        return {"case": 9.0 - c["id"] * 0.1} if timed else {}

    def healthy(self):
        return False  # as on CUDA: a fresh process after any failure


def fake_bundle(tmp_path, faults):
    candidates = [dict(id=i, unit="fwht", arithmetic="exact", changed={"fwht.rows_per_task": 4 * (i + 1)},
                       knobs={"fwht.rows_per_task": 4 * (i + 1)}, fake=f) for i, f in enumerate(faults)]
    (tmp_path / "candidates.json").write_text(json.dumps(dict(family="cpu", knobs={}, candidates=candidates,
                                                              failed=[])))
    return str(tmp_path)


@pytest.mark.parametrize("preflight", [True, False])
def test_run_records_a_segfault_a_hang_and_a_raise_and_goes_on(tmp_path, monkeypatch, capsys, preflight):
    monkeypatch.setattr(tune_run, "open_session", FakeSession)
    bundle = fake_bundle(tmp_path, [None, "segfault", None, "hang", "raise", None])
    out = tmp_path / "results.json"
    kt.main(["run", bundle, "--candidate-timeout", "3", "--out", str(out)] + ([] if preflight else ["--no-preflight"]))
    results = json.loads(out.read_text())
    by_id = {c["id"]: c for c in results["units"]["fwht"]["candidates"]}
    assert sorted(by_id) == [0, 1, 2, 3, 4, 5]
    assert [i for i, c in by_id.items() if c["valid"]] == [0, 2, 5]
    assert "SIGSEGV" in by_id[1]["error"]
    assert "no result after 3 s" in by_id[3]["error"]
    assert "a fake candidate's failure" in by_id[4]["error"]
    assert by_id[1]["knobs"] == {"fwht.rows_per_task": 8}  # a failure keeps its knobs
    assert by_id[5]["times"] == {"case": 8.5}
    assert results["summary"] == dict(measured=3, failed=3, not_reached=0, not_built=0)
    assert results["device"] == "a fake device"
    assert "3 of 6 candidates measured, 3 failed, 0 not reached" in capsys.readouterr().out
    assert kt.winners(results)["fwht"][0]["id"] == 5


def test_check_fails_on_a_faulting_candidate(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tune_run, "open_session", FakeSession)
    assert kt.main(["check", fake_bundle(tmp_path, [None, None]), "--candidate-timeout", "3"]) == 0
    assert kt.main(["check", fake_bundle(tmp_path, [None, "segfault"]), "--candidate-timeout", "3"]) == 1
    assert "1 failed, 0 not reached" in capsys.readouterr().out


def test_sigterm_ends_the_run_and_its_workers(tmp_path):
    """`timeout` (the GPU call's deadline) sends SIGTERM to the tuner only: its
    workers must not outlive it (a hung one would hold the GPU)."""
    bundle = fake_bundle(tmp_path, [None, "hang"])
    pids = tmp_path / "pids"
    script = (f"import sys; sys.path[:0] = [{HERE!r}]; import kpool_tune as kt, tune_run, test_kpool_tune as t; "
              f"tune_run.open_session = t.FakeSession; "
              f"kt.main(['run', {bundle!r}, '--no-preflight', '--out', {str(tmp_path / 'r.json')!r}])")
    p = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "KPOOL_TUNE_TEST_PIDS": str(pids)})
    deadline = time.time() + 30
    while not pids.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert pids.exists(), "the hanging candidate never started"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) != 0
    worker = int(pids.read_text().split()[0])
    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(f"/proc/{worker}"):
        time.sleep(0.1)
    outlived = os.path.exists(f"/proc/{worker}")
    if outlived:
        os.kill(worker, signal.SIGKILL)  # not left behind by a failing test
    assert not outlived, "the worker outlived the run"
    results = json.loads((tmp_path / "r.json").read_text())
    assert [c["id"] for c in results["units"]["fwht"]["candidates"]] == [0]  # measured before the signal


def test_a_spent_budget_leaves_candidates_not_reached(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_run, "open_session", FakeSession)
    out = tmp_path / "results.json"
    kt.main(["run", fake_bundle(tmp_path, [None, None, None]), "--budget", "0", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["summary"] == dict(measured=0, failed=0, not_reached=3, not_built=0)


@pytest.mark.skipif(not os.environ.get("KPOOL_TUNE_BUNDLE"), reason="needs a CPU bundle (tools/tune/cpu_loop.sh)")
def test_run_on_a_real_bundle_goes_on_past_failing_candidates(tmp_path, monkeypatch):
    real = os.environ["KPOOL_TUNE_BUNDLE"]
    bundle = json.loads(open(os.path.join(real, "candidates.json")).read())
    unit = bundle["candidates"][0]["unit"]
    knobs = bundle["candidates"][0]["knobs"]
    fakes = [dict(id=1000 + i, unit=unit, arithmetic="exact", changed={"fake": i}, knobs=knobs, fake=f)
             for i, f in enumerate(["segfault", "hang", "raise"])]
    # The fakes first: every real candidate after them must still be measured.
    bundle["candidates"] = fakes + bundle["candidates"]
    (tmp_path / "candidates.json").write_text(json.dumps(bundle))
    for name in ("libkpool.so", "kpool_ops.json"):
        os.symlink(os.path.join(real, name), tmp_path / name)
    real_candidate = kt.Session.candidate
    monkeypatch.setattr(kt.Session, "candidate", lambda self, c, timed: fail_as_told(c) or real_candidate(self, c, timed))
    out = tmp_path / "results.json"
    kt.main(["run", str(tmp_path), "--quick", "--candidate-timeout", "30", "--out", str(out)])
    results = json.loads(out.read_text())
    by_id = {c["id"]: c for e in results["units"].values() for c in e["candidates"]}
    assert "SIGSEGV" in by_id[1000]["error"] and "no result after 30 s" in by_id[1001]["error"]
    assert "a fake candidate's failure" in by_id[1002]["error"]
    real_ids = [c["id"] for c in bundle["candidates"] if "fake" not in c]
    assert all(by_id[i]["valid"] and by_id[i]["times"] for i in real_ids), [by_id[i] for i in real_ids]
    assert results["summary"]["measured"] == len(real_ids) and results["summary"]["failed"] == 3


def test_apply_keep_writes_the_results_and_the_table_once(tmp_path):
    shutil.copy(os.path.join(SCHEDULES, "sm90.knobs"), tmp_path / "sm90.knobs")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tuning.md").write_text("# Schedule tuning\n\ntext\n")
    args = ["apply", RESULTS, "--knobs-dir", str(tmp_path), "--docs-dir", str(docs), "--keep", "--no-knobs"]
    kt.main(args)
    kt.main(args)  # again: the section is replaced, not added twice
    doc = (docs / "tuning.md").read_text()
    assert doc.startswith("# Schedule tuning\n\ntext\n") and doc.count("<!-- tune table sm90") == 1
    assert "| fwht (triton) | rows=65536 | 11.5 | 10.0 | 9.0 | fwht.values:16 | 30.0 (Anderson2021) |" in doc
    assert json.loads((docs / "measured" / "tune_sm90.json").read_text())["family"] == "sm90"
    assert (tmp_path / "sm90.knobs").read_text() == open(os.path.join(SCHEDULES, "sm90.knobs")).read()
