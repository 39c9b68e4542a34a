"""`synth calibrate`: the micro-benchmarks build and run, the model they write loads and
solves, the measured numbers land in the keys they belong to, and bad requests are exit 2.

The measurements run with `calibrate.QUICK` (one short repetition each): the numbers are
rough, and no test judges them, only where they go and that they are plausible in kind
(positive, finite)."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import the_real_machine
from typer.testing import CliRunner

from synth import calibrate
from synth.calibrate import Calibration, dump_toml, exposed_share, model_text, substitute
from synth.cli import app
from synth.constraints.result import Status
from synth.hwfile import list_builtin_hardware, load_hardware, read_model
from synth.pipeline import Request, run


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def fake(**changes: Any) -> Calibration:
    values: dict[str, Any] = dict(
        cpu="Test CPU", when="2026-01-01T00:00:00+00:00", load=(0.1, 0.2, 0.3), cpus=2,
        vector_bytes=32, clock_hz=3.0e9,
        cycles={op: 1.5 for op in calibrate.OPS},
        latency_cycles={"fma": 4.0, "add": 2.0, "max": 2.5},
        exp_sum_cycles=14.0, exp_fold_cycles=23.0, gather_cycles=20.0, grouped_gather_cycles=13.0,
        broadcast_cycles=0.5, microkernel_cycles=14.0,
        strip_cycles={"read": 10.0, "write": 45.0},
        bandwidth={"L1d": 64.0, "L2": 32.0, "L3": 16.0, "DRAM": 4.0},
        latency={"L1d": 5.0, "L2": 14.0, "L3": 50.0, "DRAM": 300.0}, run_cycles=52.0,
        sizes={"L1d": 1 << 14, "L2": 1 << 20, "L3": 1 << 23, "DRAM": 1 << 28},
        l3_kept=None, region_s=1e-6, barrier_s=2e-7, usable_cores=2)
    values.update(changes)
    return Calibration(**values)


@pytest.fixture(scope="module", autouse=True)
def this_machine() -> Iterator[None]:
    """Calibration measures the machine running the tests: its model reads it too."""
    with the_real_machine():
        yield


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Calibration]:
    out = tmp_path_factory.mktemp("calibrate") / "machine.toml"
    steps: list[str] = []
    cal = calibrate.calibrate("cpu", str(out), calibrate.QUICK, steps.append)
    assert cal.passes == 1 and len(steps) == calibrate.steps(1)  # the bar's total
    return out, cal


def test_calibration_measures_every_number(calibrated: tuple[Path, Calibration]) -> None:
    _, cal = calibrated
    numbers = [cal.clock_hz, *cal.cycles.values(), *cal.latency_cycles.values(),
               cal.exp_sum_cycles, cal.exp_fold_cycles, cal.gather_cycles,
               cal.grouped_gather_cycles, cal.broadcast_cycles,
               cal.microkernel_cycles, *cal.strip_cycles.values(),
               *cal.bandwidth.values(),
               *cal.latency.values(), cal.run_cycles, cal.region_s, cal.barrier_s]
    assert all(math.isfinite(x) and x > 0 for x in numbers), cal
    assert set(cal.cycles) == set(calibrate.OPS)
    assert set(cal.strip_cycles) in ({"read", "write"}, set())  # empty: no L1d ways in sysfs
    assert set(cal.bandwidth) == set(cal.latency) == set(calibrate.LEVELS)
    assert 1 <= cal.usable_cores <= cal.cpus
    assert cal.vector_bytes == 4 * load_hardware("cpu").compute.lanes["f32"]


def test_calibrated_model_loads_and_solves(calibrated: tuple[Path, Calibration]) -> None:
    out, cal = calibrated
    text = out.read_text()
    assert text.startswith("# Hardware model written by `synth calibrate --hw cpu`")
    assert f"load average before measuring: {cal.load[0]:.2f}" in text
    assert cal.cpu in text and cal.when in text
    hw = load_hardware(str(out))
    assert hw.compute.clock_hz == pytest.approx(cal.clock_hz, rel=1e-3)
    assert hw.compute.cycles["f32"]["exp"] == pytest.approx(cal.cycles["exp"], abs=0.01)
    assert hw.levels[1].count_max == cal.usable_cores
    outcome = run(Request("softmax", str(out), {"N": 4096}, validate=False))
    assert outcome.result.status is Status.OPTIMAL


def test_cli_writes_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate, "DEFAULT", calibrate.QUICK)
    out = tmp_path / "m.toml"
    result = invoke("calibrate", "--hw", "cpu", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout and "f32 exp" in result.stdout
    load_hardware(str(out))


@pytest.mark.parametrize(("args", "message"), [
    (("--hw", "cpu", "--out", "{tmp}/missing/m.toml"), "does not exist"),
    (("--hw", "cpu", "--out", "{tmp}/m.txt"), "expected a .toml file name"),
    (("--hw", "cpu", "--out", "{tmp}"), "expected a .toml file name"),
    (("--hw", "cpu", "--out", "{tmp}/dir.toml"), "is a directory"),
    (("--hw", "cpu"), "needs --out FILE.toml"),
    (("--hw", "nope", "--out", "{tmp}/m.toml"), "unknown hardware 'nope'"),
    (("--hw", "upmem", "--out", "{tmp}/m.toml"), "measures this machine's CPU"),
])
def test_bad_requests_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    (tmp_path / "dir.toml").mkdir()
    result = invoke("calibrate", *(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "m.toml").exists()


def test_substitute_puts_numbers_where_they_belong() -> None:
    tree = tomllib.loads(read_model("cpu")[0])
    tree["compute"]["accumulate_latency"] = {"f32": 3}  # keys set only where the base has them
    tree["level"][1]["barrier"] = "1us"
    done = substitute(tree, fake())
    assert tree["compute"]["clock"] == tree["host"]["clock"] == "3.000GHz"
    assert tree["compute"]["cycles"]["f32"]["exp"] == 1.5
    assert tree["compute"]["cycles"]["f16"]["exp"] == 20  # only f32 is measured
    assert tree["compute"]["accumulate_latency"]["f32"] == 4.0
    assert tree["compute"]["add_latency"]["f32"] == 2.5  # the slower of add and max chains
    # a fold of 8 lanes: 3 steps of an add (1.5) and a shuffle, and the add joining it
    assert tree["compute"]["shuffle_cycles"]["f32"] == 1.0  # (9 - 1.5) / 3 - 1.5
    assert tree["compute"]["gather_cycles"]["f32"] == 20.0
    assert tree["compute"]["grouped_gather_cycles"]["f32"] == 13.0
    assert tree["compute"]["broadcast_cycles"]["f32"] == 0.5
    # 14 cycles against 8 FMAs of 1.5 and loads of 8 x 0.5 + 32 B / 64 B/cycle: 0.44
    assert exposed_share(fake()) == pytest.approx(0.44, abs=0.005)
    base = {m["name"]: m for m in tomllib.loads(read_model("cpu")[0])["memory"]}
    # every share is the base model's, fitted to whole schedules: the tight loop's is not
    for memory in ("l2", "l3", "reg"):
        assert {m["name"]: m for m in tree["memory"]}[memory]["exposed"] == \
            base[memory]["exposed"]
    assert "gather_cycles" not in tree["host"]  # the host runs scalar code
    memories = {m["name"]: m for m in tree["memory"]}
    # a memory's bandwidth is its parent's reads: l1 is filled from L2, the registers
    # from L1; caches overlap their fills with compute, so their latency stays 0
    assert memories["reg"]["bandwidth"] == "64.00B/cycle"
    assert memories["l1"]["bandwidth"] == "32.00B/cycle"
    assert memories["l1"]["latency"] == "0ns"
    assert memories["l2"]["bandwidth"] == "16.00B/cycle"
    assert memories["l3"]["bandwidth"] == "4.00B/cycle"
    assert "bandwidth" not in memories["dram"]
    # a parallel region is the cores' fork (a kernel's launch stays a function call)
    assert tree["launch"] == "0us" and tree["level"][1]["fork"] == "1000ns"
    assert tree["level"][1]["count"] == "1..2" and tree["level"][1]["barrier"] == "200ns"
    assert "l1.bandwidth (L2 reads) = 32.00B/cycle" in done
    # a strip of aliasing rows: on the memory whose tiles are the L1d's, which has `ways`
    assert memories["l1"]["aliased_read"] == "10.0cycles"
    assert memories["l1"]["aliased_write"] == "45.0cycles"
    assert all("aliased_read" not in memories[m] for m in ("reg", "l2", "l3"))
    # a DRAM run: its 52 cycles less its 128 bytes at DRAM's 4 B/cycle, on the memory
    # filled from DRAM only
    assert memories["l3"]["run_latency"] == "20.0cycles"
    assert all("run_latency" not in memories[m] for m in ("reg", "l1", "l2", "dram"))
    base = tomllib.loads(read_model("cpu")[0])  # no associativity known: the base's stay
    l1 = {m["name"]: m for m in base["memory"]}["l1"]
    written = (l1.get("aliased_read"), l1.get("aliased_write"))
    substitute(base, fake(strip_cycles={}))
    assert (l1.get("aliased_read"), l1.get("aliased_write")) == written


def test_the_l3_kept_is_the_l3s_capacity(tmp_path: Path) -> None:
    """An L3 that keeps less than sysfs says (a virtual machine's host's L3) becomes the
    model's capacity, no longer detected; one that keeps it all stays detected."""
    tree = tomllib.loads(read_model("cpu")[0])
    l3 = {m["name"]: m for m in tree["memory"]}["l3"]
    substitute(tree, fake())
    assert l3["detect"] == "L3" and l3["capacity"] == "32MiB"  # the base's fallback
    done = substitute(tree, fake(l3_kept=48 << 20))
    assert "detect" not in l3 and l3["capacity"] == "49152KiB"
    assert "l3.capacity (the largest buffer one core read at the L3's rate) = 49152KiB" in done
    out = tmp_path / "kept.toml"
    out.write_text(model_text("cpu", fake(l3_kept=48 << 20)))
    assert load_hardware(str(out)).memory("l3").capacity == 48 << 20
    assert "the L3 one core keeps: 49152 KiB" in out.read_text()


def test_the_l3_kept_is_the_last_buffer_read_at_its_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers grow by sqrt(2) from twice the L3 buffer (8 MiB); the first read below 0.7
    of the L3's rate ends the search, and the one before it is kept."""
    mib = 1 << 20
    monkeypatch.setattr(calibrate, "cache_sizes", lambda: {"L1d": 48 << 10, "L2": 2 * mib,
                                                           "L3": 300 * mib})

    def seconds(lib: Any, settings: Any, size: int, threads: int, rate: float) -> float:
        return size / (rate if size <= 48 * mib else rate / 2)

    l3_rate = 24e9
    monkeypatch.setattr(calibrate, "_bandwidth", lambda *a: seconds(*a, rate=l3_rate))
    reads = calibrate.l3_reads(None, calibrate.QUICK, l3_rate, 8 * mib)
    sizes = sorted(reads)
    assert sizes[0] == 16 * mib and sizes[-1] > 48 * mib and reads[sizes[-1]] == l3_rate / 2
    kept = calibrate.kept_of(reads, l3_rate, 8 * mib)
    assert kept == sizes[-2] <= 48 * mib and kept > 48 * mib / math.sqrt(2)
    assert calibrate.kept_of({}, l3_rate, 8 * mib) is None  # the detected L3 is no larger
    assert calibrate.kept_of({16 * mib: l3_rate / 2}, l3_rate, 8 * mib) == 8 * mib
    monkeypatch.setattr(calibrate, "_bandwidth", lambda *a: seconds(*a, rate=2 * l3_rate))
    reads = calibrate.l3_reads(None, calibrate.QUICK, l3_rate, 8 * mib)
    assert max(reads) < 300 * mib and calibrate.kept_of(reads, l3_rate, 8 * mib) is None


# ---------------------------------------------------------------- passes

MIB = 1 << 20


def slower(cal: Calibration, by: float) -> Calibration:
    """`cal` as a pass that ran `by` times slower throughout (the same clock)."""
    return calibrate.replace(
        cal, **{name: calibrate._map(getattr(cal, name), lambda v: v * by)
                for name in (*calibrate.CYCLE_FIELDS, *calibrate.SECOND_FIELDS)},
        bandwidth={k: v / by for k, v in cal.bandwidth.items()},
        l3_reads={size: rate / by for size, rate in cal.l3_reads.items()})


def measured(passes: list[Calibration], settings: calibrate.Settings,
             monkeypatch: pytest.MonkeyPatch, pass_s: float = 1.0, machine_cpus: int = 2
             ) -> Calibration:
    """`calibrate.measure` with these passes in place of the micro-benchmarks, each
    taking `pass_s` seconds of a fake clock, on a machine of `machine_cpus` CPUs."""
    now = [0.0]
    queue = list(passes)

    def one_pass(lib: Any, settings: Any, vb: int, tell: Any) -> Calibration:
        now[0] += pass_s
        return queue.pop(0)

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return now[0]

    monkeypatch.setattr(calibrate, "build", lambda vb, directory: None)
    monkeypatch.setattr(calibrate, "measure_pass", one_pass)
    monkeypatch.setattr(calibrate, "time", Clock)
    monkeypatch.setattr(calibrate.os, "getloadavg", lambda: (0.1, 0.2, 0.3))
    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: machine_cpus)
    monkeypatch.setattr(calibrate, "cache_sizes", lambda: {"L1d": 48 << 10, "L2": 2 * MIB,
                                                           "L3": 300 * MIB})
    return calibrate.measure(load_hardware("cpu"), settings)


def quiet_pass() -> Calibration:
    reads = {16 * MIB: 48e9, 22 * MIB: 47e9, 32 * MIB: 20e9}  # the L3: 16 B/cycle at 3 GHz
    return fake(l3_reads=reads, l3_kept=calibrate.kept_of(reads, 48e9, 8 * MIB))


PASSES = calibrate.Settings(passes=5, min_passes=2, settle=0.1, budget_s=100.0)


def test_passes_keep_each_numbers_best_until_one_improves_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass slowed by another process (2x) is not the model: the next quiet pass
    improves every number, a third improves none by more than a tenth and ends it."""
    quiet = quiet_pass()
    busy = replace_reads(slower(quiet, 2.0), {16 * MIB: 24e9, 22 * MIB: 10e9})
    cal = measured([busy, quiet, slower(quiet, 1.05), quiet], PASSES, monkeypatch)
    assert cal.passes == 3 and cal.unsettled == () and cal.notes == ()
    assert cal.bandwidth == quiet.bandwidth and cal.cycles == quiet.cycles
    assert cal.microkernel_cycles == quiet.microkernel_cycles and cal.region_s == quiet.region_s
    assert busy.l3_kept == 16 * MIB and cal.l3_kept == quiet.l3_kept == 22 * MIB
    calm = measured([quiet, slower(quiet, 1.05), quiet], PASSES, monkeypatch)
    assert calm.passes == 2  # at least `min_passes`


def replace_reads(cal: Calibration, reads: dict[int, float]) -> Calibration:
    return calibrate.replace(cal, l3_reads=reads,
                             l3_kept=calibrate.kept_of(reads, cal.bandwidth["L3"] * 3e9,
                                                       8 * MIB))


def test_numbers_that_never_settle_are_said(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """Every pass faster than the last by a fifth: the last pass ends it, and the model
    warns which numbers still moved."""
    quiet = quiet_pass()
    passes = [slower(quiet, 1.25 ** (4 - n)) for n in range(5)]
    cal = measured(passes, PASSES, monkeypatch)
    assert cal.passes == 5 and "the GEMM tile loop" in cal.unsettled
    assert "L1d read bandwidth" in cal.unsettled and "clock" not in cal.unsettled
    assert "f32 exp throughput" in cal.unsettled and "L3 latency" in cal.unsettled
    assert cal.bandwidth == quiet.bandwidth
    text = model_text("cpu", cal)
    assert "# WARNING: after 5 passes these numbers still improved by more than 10%" in text
    (tmp_path / "m.toml").write_text(text)
    load_hardware(str(tmp_path / "m.toml"))


def test_a_process_limited_to_fewer_cpus_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibrated under `taskset -c 1` on a 2-CPU machine, the model's core count is 1
    (a 1024^3 GEMM solved with it ran 18.5-19.2 ms, with a model of both cores 11.1:
    RESULTS.md, "A calibration on a busy host"): the notes say so; a process that may
    use every CPU has no such note."""
    quiet = quiet_pass()
    cal = measured([quiet, quiet], PASSES, monkeypatch, machine_cpus=4)
    assert any("may run on 2 of the machine's 4 CPUs" in note and "2 core(s)" in note
               for note in cal.notes), cal.notes
    assert measured([quiet, quiet], PASSES, monkeypatch, machine_cpus=2).notes == ()


def test_no_pass_starts_that_would_end_past_the_budget(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Passes of 10 s under a 25 s budget: two run (a third would end at 30 s)."""
    quiet = quiet_pass()
    settings = calibrate.Settings(passes=5, min_passes=2, settle=0.1, budget_s=25.0)
    cal = measured([slower(quiet, 2.0), quiet, quiet], settings, monkeypatch, pass_s=10.0)
    assert cal.passes == 2 and cal.unsettled != ()
    assert cal.seconds == 20.0


def test_passes_are_compared_at_one_clock() -> None:
    """A pass whose clock read slow (interrupted) counts its loops in fewer, longer
    cycles; combined, the faster clock's cycles count: the same seconds in seconds."""
    quiet = fake()
    slow_clock = calibrate.at_clock(quiet, 2.0e9)  # the same seconds, counted at 2 GHz
    assert slow_clock.cycles["fma"] == pytest.approx(1.0)
    assert slow_clock.bandwidth["L1d"] == pytest.approx(96.0)
    both = calibrate.combine(slow_clock, quiet)
    assert both.clock_hz == 3.0e9 and both.passes == 2
    assert both.cycles["fma"] == pytest.approx(1.5)
    assert both.bandwidth["L1d"] == pytest.approx(64.0)
    assert calibrate.improved(slow_clock, both, 0.1) == ("clock",)


def test_a_zero_latency_stays_zero() -> None:
    """A model whose caches overlap their transfers with compute says latency 0; the
    measured load-to-use latency must not put a per-tile cost back."""
    tree = tomllib.loads(read_model("cpu")[0])
    memories = {m["name"]: m for m in tree["memory"]}
    memories["l1"]["latency"] = "0ns"
    memories["l2"]["latency"] = "10cycles"  # a latency that is paid: measured
    memories["l2"].pop("overlap", None)
    substitute(tree, fake())
    assert memories["l1"]["latency"] == "0ns"
    assert memories["l1"]["bandwidth"] == "32.00B/cycle"
    assert memories["l2"]["latency"] == "50cycles"


def test_busy_machine_is_said(tmp_path: Path) -> None:
    cal = fake(load=(1.9, 1.0, 0.5), notes=("the machine was busy (load average 1.90)",))
    assert cal.busy and not fake().busy
    text = model_text("cpu", cal)
    assert "# WARNING: the machine was busy (load average 1.90)" in text
    (tmp_path / "m.toml").write_text(text)
    load_hardware(str(tmp_path / "m.toml"))


@pytest.mark.parametrize("name", list_builtin_hardware())
def test_dump_toml_round_trips(name: str) -> None:
    tree = tomllib.loads(read_model(name)[0])
    assert tomllib.loads(dump_toml(tree)) == tree


def test_no_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(calibrate, "DEFAULT", calibrate.QUICK)
    result = invoke("calibrate", "--out", str(tmp_path / "m.toml"))
    assert result.exit_code == 2, result.output
    assert "cannot run the C compiler" in result.output
    assert not (tmp_path / "m.toml").exists()
