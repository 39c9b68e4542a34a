"""Tests for reading hardware models: built-ins, units, validation messages and overrides."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from synth import hwfile, hwunits
from synth.errors import InputError
from synth.hardware import OP_CLASSES, Hardware
from synth.hwfile import list_builtin_hardware, load_hardware, parse_override
from synth.hwunits import (
    UnitError,
    detect_cache_size,
    parse_bandwidth,
    parse_count,
    parse_frequency,
    parse_size,
    parse_time,
)
from synth.workload import DType

DTYPES = [d.value for d in DType]


def _cycles_line(dtype: str, skip: str = "") -> str:
    ops = ", ".join(f"{op} = {i + 1}" for i, op in enumerate(OP_CLASSES) if op != skip)
    return f"{dtype} = {{ {ops} }}"


# A small valid model; each validation test edits one piece of it.
MINI = f"""\
name = "mini"
description = "a test model"
launch = "1us"

[[level]]
name = "top"

[[level]]
name = "unit"
symbol = "U"
count = "1..4"

[[memory]]
name = "main"
level = "top"
capacity = "1MiB"
symbol = "A"

[[memory]]
name = "local"
level = "unit"
capacity = "4KiB"
reserved = "1KiB"
symbol = "B"
latency = "10cycles"
bandwidth = "4B/cycle"
transfer = {{ min = "4B", max = "256B", multiple = "4B", align = "4B" }}

[compute]
clock = "1GHz"

[compute.cycles]
{_cycles_line("f32")}
{_cycles_line("i32")}

[host]
clock = "2GHz"

[host.cycles]
{_cycles_line("i32")}
"""


def write_model(tmp_path: Path, text: str) -> str:
    path = tmp_path / "model.toml"
    path.write_text(text)
    return str(path)


def edited(old: str, new: str) -> str:
    """MINI with one edit; fails loudly if the edit does not apply (a broken test)."""
    assert MINI.count(old) == 1, f"edit target {old!r} not unique in MINI"
    return MINI.replace(old, new)


def load_error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(InputError) as info:
        load_hardware(write_model(tmp_path, text), overrides)
    return str(info.value)


# ------------------------------------------------------------------------------------------
# Built-ins


def test_builtins_are_listed() -> None:
    names = list_builtin_hardware()
    assert {"upmem", "cpu"} <= set(names)
    assert names == sorted(names)


def test_upmem_levels() -> None:
    hw = load_hardware("upmem")
    assert [(lvl.name, lvl.symbol, lvl.count_min, lvl.count_max) for lvl in hw.levels] == [
        ("host", None, 1, 1), ("rank", "R", 1, 8), ("dpu", "D", 1, 64), ("tasklet", "T", 1, 16)]
    assert hw.level("tasklet").issue_share == 11
    assert hw.level("dpu").issue_share == 1
    assert hw.root.is_root
    assert hw.count_symbols == ("R", "D", "T")


def test_upmem_memories() -> None:
    hw = load_hardware("upmem")
    assert [m.name for m in hw.memories] == ["host", "mram", "wram"]
    assert hw.root_memory.level == "host"
    wram = hw.memory("wram")
    assert (wram.level, wram.instance_level, wram.shared_by) == ("tasklet", "dpu", "dpu")
    assert wram.capacity == 65536
    assert wram.reserved == 2048 and wram.usable == 63488
    rules = wram.rules
    assert (rules.min_bytes, rules.max_bytes, rules.multiple, rules.align) == (8, 2048, 8, 8)
    assert wram.latency_ps == 220_000  # 77 cycles at 350 MHz, exactly
    assert wram.ps_per_byte == 1429  # 2 B/cycle at 350 MHz = 1428.57 ps/B
    assert wram.symbol == "Q"
    mram = hw.memory("mram")
    assert mram.capacity == 64 * 2**20
    assert (mram.level, mram.instance_level) == ("dpu", "dpu")
    push = mram.push  # host <-> MRAM as dpu_push_xfer, one per tensor per rank (issue 13)
    assert push is not None and push.level == "rank"
    for way in (push.into, push.out):  # one DPU alone is slower than a rank's share
        assert way.one_ps_per_byte > 5 * way.full_ps_per_byte
    assert push.out.one_ps_per_byte > push.into.one_ps_per_byte  # DPU->CPU is slower
    assert push.out.per_unit_ps > 0
    # the host caps the ranks together: below two ranks' full rate, above one's
    assert push.into.full_ps_per_byte / 2 < push.cap_ps_per_byte < push.into.full_ps_per_byte
    assert wram.store_latency_ps < wram.latency_ps  # mram_write alpha 61 < mram_read 77
    assert wram.blocking  # mram_read blocks the tasklet
    assert mram.rules.max_bytes is None and mram.rules.align == 8
    assert hw.root_memory.latency_ps == 0 and hw.root_memory.ps_per_byte == 0


def test_upmem_compute() -> None:
    hw = load_hardware("upmem")
    assert hw.compute.clock_hz == 350_000_000
    assert hw.compute.cycle_ps == 2857
    assert hw.host.clock_hz > hw.compute.clock_hz
    assert hw.launch_ps == 47_000_000 and hw.launch_level == "dpu"  # measured dpu_launch
    assert 0 < hw.launch_per_unit_ps * 64 < hw.launch_ps
    tasklet = hw.level("tasklet")
    assert tasklet.barrier_per_unit_ps * 16 > tasklet.barrier_per_unit_ps * 1 > 0
    assert set(hw.compute.cycles) == set(DTYPES) == set(hw.host.cycles)
    for table in (*hw.compute.cycles.values(), *hw.host.cycles.values()):
        assert set(table) == set(OP_CLASSES)
    f32, i32 = hw.compute.cycles["f32"], hw.compute.cycles["i32"]
    assert f32["add"] >= 10 * i32["add"]  # floating point is emulated
    assert i32["mul"] >= 10 * i32["add"]  # no 32-bit hardware multiplier
    assert f32["exp"] > f32["mul"] and f32["div"] > f32["mul"]
    # (base 4 + add 60) cycles at 350 MHz
    assert hw.compute.point_ps(Counter({"add": 1}), DType.F32) == round(64 * 1e12 / 350e6)
    assert hw.source.endswith("upmem.toml")
    assert hw.name == "upmem"


def test_cpu_structure() -> None:
    hw = load_hardware("cpu")
    assert [lvl.name for lvl in hw.levels] == ["system", "core"]
    core = hw.level("core")
    assert core.symbol == "P" and core.count_min == 1
    assert core.count_max == hwunits.auto_count()
    assert core.fork_ps > 0  # starting a parallel region costs
    assert [m.name for m in hw.memories] == ["dram", "l3", "l2", "l1", "reg"]
    assert [m.level for m in hw.memories] == ["system", "system", "core", "core", "core"]
    for memory, kind, default in (("l3", "L3", 32 * 2**20), ("l2", "L2", 2**20),
                                  ("l1", "L1d", 32 * 2**10)):
        assert hw.memory(memory).capacity == (detect_cache_size(kind) or default)
        assert hw.memory(memory).cache and hw.memory(memory).overlap
    registers, width = hwunits.vector_isa()
    reg = hw.memory("reg")
    assert reg.capacity == registers * width and reg.overlap and not reg.cache
    assert hw.memory("l3").warm
    assert set(hw.compute.cycles) == set(DTYPES)
    assert hw.compute.vector_tiles and hw.compute.fused_multiply_add
    # lanes "auto": the dtypes the C emitter vectorises, at this machine's width
    assert hw.compute.lanes == {"f32": width // 4, "i32": width // 4}
    assert hw.compute.accumulate_latency["f32"] >= 1


def test_lanes_must_be_whole_numbers(tmp_path: Path) -> None:
    builtin = Path(hwfile.__file__).parent / "hardware" / "cpu.toml"
    text = builtin.read_text().replace('lanes = "auto"', "lanes = { f32 = 0 }", 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=r"compute: lanes: f32: expected an integer in 1\.\."):
        load_hardware(str(path))


def test_cpu_uses_detected_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sysfs(tmp_path)
    monkeypatch.setattr(hwunits, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(hwunits.os, "cpu_count", lambda: 6)
    hw = load_hardware("cpu")
    assert hw.memory("l1").capacity == 48 * 1024
    assert hw.memory("l2").capacity == 1280 * 1024
    assert hw.memory("l3").capacity == 96 * 2**20
    assert hw.level("core").count_max == 6


def test_cpu_falls_back_to_file_capacities(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hwunits, "CACHE_DIR", tmp_path / "missing")
    hw = load_hardware("cpu")
    assert [hw.memory(n).capacity for n in ("l3", "l2", "l1")] == [
        32 * 2**20, 2**20, 32 * 2**10]


def test_unknown_builtin_lists_builtins() -> None:
    with pytest.raises(InputError) as info:
        load_hardware("upmemm")
    assert "'upmemm'" in str(info.value)
    assert "upmem" in str(info.value) and "cpu" in str(info.value)


def test_missing_file_lists_builtins(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a built-in model .*upmem.*and not a file"):
        load_hardware(str(tmp_path / "nope.toml"))


# ------------------------------------------------------------------------------------------
# Cache detection


def fake_sysfs(root: Path) -> None:
    entries = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1280K"),
               (3, "Unified", "96M")]
    for i, (level, kind, size) in enumerate(entries):
        index = root / f"index{i}"
        index.mkdir()
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
        (index / "ways_of_associativity").write_text(f"{4 * (level + 2)}\n")


def test_detect_cache_size(tmp_path: Path) -> None:
    fake_sysfs(tmp_path)
    assert detect_cache_size("L1d", tmp_path) == 48 * 1024  # not the instruction cache
    assert detect_cache_size("L2", tmp_path) == 1280 * 1024
    assert detect_cache_size("L3", tmp_path) == 96 * 2**20


def test_l1_ways_detected_file_or_command_line(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu's l1 `ways`: this machine's associativity where sysfs says it (the fake tree:
    12), the file's where it cannot be read, and --hw-set's above both; the other memories
    leave it unmodelled (0)."""
    fake_sysfs(tmp_path)
    assert hwunits.detect_cache_ways("L1d", tmp_path) == 12
    monkeypatch.setattr(hwunits, "CACHE_DIR", tmp_path)
    (tmp_path / "index0" / "ways_of_associativity").write_text("8\n")
    hw = load_hardware("cpu")
    assert hw.memory("l1").ways == 8
    assert [hw.memory(m).ways for m in ("dram", "l3", "l2", "reg")] == [0, 0, 0, 0]
    assert load_hardware("cpu", ("l1.ways=4",)).memory("l1").ways == 4
    monkeypatch.setattr(hwunits, "CACHE_DIR", tmp_path / "missing")
    assert load_hardware("cpu").memory("l1").ways == 12  # cpu.toml's fallback
    with pytest.raises(InputError, match=r"ways: expected an integer"):
        load_hardware("cpu", ("l1.ways=-1",))


def test_detect_cache_size_unreadable(tmp_path: Path) -> None:
    assert detect_cache_size("L2", tmp_path / "missing") is None
    index = tmp_path / "index0"
    index.mkdir()
    (index / "level").write_text("two\n")
    assert detect_cache_size("L2", tmp_path) is None


# ------------------------------------------------------------------------------------------
# Units


@pytest.mark.parametrize(("text", "expected"), [
    (8, 8), ("8", 8), ("8B", 8), ("64KiB", 65536), ("64MiB", 64 * 2**20),
    ("16GiB", 16 * 2**30), ("1KB", 1000), ("2MB", 2_000_000), ("1.5KiB", 1536), (0, 0),
    (" 4 KiB ", 4096),
])
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", [
    "64 furlongs", "-8", -8, "1.5B", "KiB", "", 1.5, True, None, "64kib", "8 B B",
])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(UnitError, match="expected a size like '64KiB'"):
        parse_size(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("350MHz", 350_000_000), ("2.5GHz", 2_500_000_000), ("1000Hz", 1000), ("400 MHz", 4 * 10**8),
])
def test_parse_frequency(text: str, expected: int) -> None:
    assert parse_frequency(text) == expected


@pytest.mark.parametrize("text", [350, "350", "0MHz", "350mhz", "fast", "-1GHz"])
def test_parse_frequency_rejects(text: object) -> None:
    with pytest.raises(UnitError, match="frequency"):
        parse_frequency(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("77cycles", 220_000), ("1cycle", 2857), ("4cycles", 11_429), ("20us", 20_000_000),
    ("5ns", 5000), ("1ms", 10**9), ("100ps", 100), ("0.5ns", 500), (0, 0), ("0", 0),
    ("2s", 2 * 10**12),
])
def test_parse_time(text: object, expected: int) -> None:
    assert parse_time(text, 350_000_000) == expected


@pytest.mark.parametrize("text", [5, "5", "5 parsecs", "-5ns", "5NS", "ns", 1.0])
def test_parse_time_rejects(text: object) -> None:
    with pytest.raises(UnitError, match="expected a time"):
        parse_time(text, 350_000_000)


@pytest.mark.parametrize(("text", "clock", "expected"), [
    ("6.68GB/s", 1, 150), ("700MB/s", 1, 1429), ("2B/cycle", 350_000_000, 1429),
    ("64B/cycle", 3_000_000_000, 5), ("1B/s", 1, 10**12), ("1TB/s", 1, 1),
    ("100TB/s", 1, 1),  # rounds to 0: clamped so bytes are never free
    ("1KiB/s", 1, round(10**12 / 1024)),
])
def test_parse_bandwidth(text: str, clock: int, expected: int) -> None:
    assert parse_bandwidth(text, clock) == expected


@pytest.mark.parametrize("text", ["0GB/s", "6.68GB", "fast/s", "2B/fortnight", 5, "GB/s",
                                  "1/2/s"])
def test_parse_bandwidth_rejects(text: object) -> None:
    with pytest.raises(UnitError, match="bandwidth"):
        parse_bandwidth(text, 350_000_000)


@pytest.mark.parametrize(("text", "expected"), [
    (4, (4, 4)), ("4", (4, 4)), ("1..16", (1, 16)), (" 2 .. 8 ", (2, 8)), ("1..auto", (1, 6)),
])
def test_parse_count(text: object, expected: tuple[int, int],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hwunits.os, "cpu_count", lambda: 6)
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", [0, "0..4", "5..2", "1..", "1-16", True, "auto", 1.5,
                                  "8..auto"])
def test_parse_count_rejects(text: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hwunits.os, "cpu_count", lambda: 6)
    with pytest.raises(UnitError, match="count|range"):
        parse_count(text)


def test_auto_count_without_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hwunits.os, "cpu_count", lambda: None)
    assert parse_count("1..auto") == (1, 1)


@pytest.mark.parametrize(("text", "expected"), [
    ("wram.capacity=32KiB", ("wram.capacity", "32KiB")),
    ("tasklet.count=1..4", ("tasklet.count", "1..4")),
    (" tasklet.count = 8 ", ("tasklet.count", 8)),
    ("compute.cycles.f32.add=12.5", ("compute.cycles.f32.add", 12.5)),
    ('launch="20us"', ("launch", "20us")),
])
def test_parse_override(text: str, expected: tuple[str, object]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["wram.capacity", "=3", "wram.capacity="])
def test_parse_override_rejects(text: str) -> None:
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_override(text)


# ------------------------------------------------------------------------------------------
# A custom model from a file


def test_custom_model(tmp_path: Path) -> None:
    path = write_model(tmp_path, MINI)
    hw = load_hardware(path)
    assert isinstance(hw, Hardware)
    assert hw.name == "mini" and hw.source == path
    assert [(lvl.name, lvl.symbol, lvl.count_min, lvl.count_max) for lvl in hw.levels] == [
        ("top", None, 1, 1), ("unit", "U", 1, 4)]
    main, local = hw.memories
    assert (main.capacity, main.reserved, main.latency_ps, main.ps_per_byte) == (2**20, 0, 0, 0)
    assert (main.rules.min_bytes, main.rules.max_bytes, main.rules.multiple,
            main.rules.align) == (1, None, 1, 1)
    assert (local.capacity, local.reserved, local.usable) == (4096, 1024, 3072)
    assert local.instance_level == "unit" and local.shared_by == "unit"  # the defaults
    assert local.latency_ps == 10_000  # 10 cycles at 1 GHz
    assert local.ps_per_byte == 250  # 4 B/cycle at 1 GHz
    assert hw.launch_ps == 1_000_000
    assert hw.compute.cycles["f32"]["tanh"] == len(OP_CLASSES)
    assert set(hw.host.cycles) == {"i32"}
    assert hw.host.clock_hz == 2 * 10**9
    with pytest.raises(InputError, match="no compute costs for dtype f16"):
        hw.compute.point_ps(Counter({"add": 1}), DType.F16)


def test_mini_error_names_model_memory_and_key(tmp_path: Path) -> None:
    path = write_model(tmp_path, edited('capacity = "4KiB"', 'capacity = "64 furlongs"'))
    with pytest.raises(InputError) as info:
        load_hardware(path)
    assert str(info.value) == (f"hardware {path}: memory 'local': capacity: "
                               "expected a size like '64KiB', got '64 furlongs'")


def test_builtin_error_names_the_builtin() -> None:
    with pytest.raises(InputError) as info:
        load_hardware("upmem", ["wram.capacity=64 furlongs"])
    assert str(info.value) == ("--hw-set wram.capacity=64 furlongs: hardware upmem: memory "
                               "'wram': capacity: expected a size like '64KiB', got "
                               "'64 furlongs'")


# ------------------------------------------------------------------------------------------
# Validation: every rule, and the key its message names

VALIDATION_CASES = [
    # (edit old, edit new, substrings the message must contain)
    ('launch = "1us"', 'lanch = "1us"', ["unknown key 'lanch'", "did you mean 'launch'"]),
    ('launch = "1us"\n', "", ["missing required key 'launch'"]),
    ('launch = "1us"', 'launch = "soon"', ["launch: expected a time"]),
    ('name = "mini"', "name = 3", ["name: expected a non-empty string"]),
    ('description = "a test model"', "description = 1", ["description: expected a string"]),
    ('capacity = "4KiB"', 'capacty = "4KiB"',
     ["memory 'local': unknown key 'capacty'", "did you mean 'capacity'"]),
    ('latency = "10cycles"\n', "", ["memory 'local': missing required key 'latency'"]),
    ('latency = "10cycles"', 'latency = "10 parsecs"', ["memory 'local': latency: expected"]),
    ('bandwidth = "4B/cycle"', 'bandwidth = "fast"', ["memory 'local': bandwidth: expected"]),
    ('bandwidth = "4B/cycle"', 'bandwidth = "0B/cycle"', ["memory 'local': bandwidth:"]),
    ('bandwidth = "4B/cycle"', 'bandwidth = "4B/cycle"\naliased_write = "lots"',
     ["memory 'local': aliased_write: expected a time"]),
    ('symbol = "A"', 'symbol = "A"\naliased_read = "9cycles"',
     ["memory 'main': aliased_read:", "root memory"]),
    ('reserved = "1KiB"', 'reserved = "-1"', ["memory 'local': reserved: expected a size"]),
    ('capacity = "4KiB"', 'capacity = "-1KiB"', ["memory 'local': capacity: expected a size"]),
    ('count = "1..4"', 'count = "0..4"', ["level 'unit': count:", "at least 1"]),
    ('count = "1..4"', 'count = "5..2"', ["level 'unit': count:", "exceeds"]),
    ('count = "1..4"', 'count = "many"', ["level 'unit': count: expected a count"]),
    ('symbol = "U"', 'symbl = "U"', ["level 'unit': unknown key 'symbl'", "'symbol'"]),
    ('symbol = "U"\n', "", ["level 'unit': missing required key 'symbol'"]),
    ('symbol = "U"', 'symbol = "U"\nissue_share = 0', ["level 'unit': issue_share: expected"]),
    ('symbol = "U"', 'symbol = "2x"', ["level 'unit': symbol: '2x' is not a valid identifier"]),
    ('symbol = "B"', 'symbol = "U"',
     ["memory 'local': symbol: 'U' is already the symbol of level 'unit'"]),
    ('symbol = "B"', 'symbol = "A"',
     ["memory 'local': symbol: 'A' is already the symbol of memory 'main'"]),
    ('name = "top"', 'name = "top"\ncount = 2', ["level 'top': count:", "root level"]),
    ('name = "unit"', 'name = "top"', ["level 'top': name: duplicate level name 'top'"]),
    ('name = "local"', 'name = "main"', ["memory 'main': name: duplicate memory name 'main'"]),
    ('level = "unit"', 'level = "unitt"',
     ["memory 'local': level: unknown level 'unitt'", "did you mean 'unit'"]),
    ('level = "unit"', 'level = "unit"\ninstance_level = "nowhere"',
     ["memory 'local': instance_level: unknown level 'nowhere'"]),
    ('level = "unit"', 'level = "unit"\nshared_by = "nowhere"',
     ["memory 'local': shared_by: unknown level 'nowhere'"]),
    ('level = "unit"', 'level = "top"\ninstance_level = "unit"',
     ["memory 'local': instance_level: 'unit' is inside"]),
    ('level = "unit"', 'level = "top"\nshared_by = "unit"',
     ["memory 'local': shared_by: 'unit' is inside"]),
    ('level = "top"', 'level = "unit"', ["memory 'main': level:", "root level 'top'"]),
    ('symbol = "A"', 'symbol = "A"\nlatency = "1ns"', ["memory 'main': latency:", "root memory"]),
    ('symbol = "A"', 'symbol = "A"\ntransfer = { min = "8B" }', ["memory 'main': transfer:"]),
    ('level = "unit"', 'level = "unit"\ndetect = "L4"', ["memory 'local': detect:", "L1d"]),
    ('min = "4B", max = "256B"', 'min = "512B", max = "256B"',
     ["memory 'local': transfer: max:", "below min"]),
    ('max = "256B"', 'max = "258B"', ["memory 'local': transfer: max:", "not a multiple"]),
    ('multiple = "4B"', 'multiple = "0B"',
     ["memory 'local': transfer: multiple: must be at least"]),
    ('align = "4B"', "align = 0", ["memory 'local': transfer: align: must be at least"]),
    ('min = "4B"', 'min = "0B"', ["memory 'local': transfer: min: must be at least"]),
    ('max = "256B"', 'maxx = "256B"',
     ["memory 'local': transfer: unknown key 'maxx'", "did you mean 'max'"]),
    ('max = "256B"', 'max = "lots"', ["memory 'local': transfer: max: expected a size"]),
    ('clock = "1GHz"', 'clock = "0GHz"', ["compute: clock:", "positive"]),
    ('clock = "1GHz"', "clock = 1000", ["compute: clock: expected a frequency"]),
    ('clock = "1GHz"\n', "", ["compute: missing required key 'clock'"]),
    ('clock = "2GHz"', 'clock = "2GHz"\nclocks = 1',
     ["host: unknown key 'clocks'", "did you mean 'clock'"]),
    (_cycles_line("f32"), _cycles_line("f32", skip="tanh"),
     ["compute: cycles: f32: missing op class 'tanh'"]),
    (_cycles_line("f32"), _cycles_line("f32").replace("exp =", "expp ="),
     ["compute: cycles: f32: unknown op class 'expp'", "did you mean 'exp'"]),
    (_cycles_line("f32"), _cycles_line("f32").replace("add = 3", "add = -1"),
     ["compute: cycles: f32: add: expected a number of cycles in 0..2^53"]),
    (_cycles_line("f32"), _cycles_line("f32").replace("add = 3", 'add = "3"'),
     ["compute: cycles: f32: add: expected a number"]),
    (_cycles_line("f32"), _cycles_line("f64"), ["compute: cycles: unknown dtype 'f64'"]),
    ("[host.cycles]\n" + _cycles_line("i32"), "[host.cycles]\n" + _cycles_line("i32", "mov"),
     ["host: cycles: i32: missing op class 'mov'"]),
    ("[host.cycles]\n" + _cycles_line("i32"), "[host.cycles]",
     ["host: cycles: expected at least one dtype"]),
    ('name = "mini"', 'name = "mini"\n[[oops', ["invalid TOML"]),
]


@pytest.mark.parametrize(("old", "new", "expected"), VALIDATION_CASES,
                         ids=[f"{i}:{case[2][0]}" for i, case in enumerate(VALIDATION_CASES)])
def test_validation_names_the_key(tmp_path: Path, old: str, new: str,
                                  expected: list[str]) -> None:
    message = load_error(tmp_path, edited(old, new))
    assert message.startswith("hardware ")
    for part in expected:
        assert part in message


def test_memories_must_be_outermost_first(tmp_path: Path) -> None:
    extra = '\n[[memory]]\nname = "far"\nlevel = "top"\ncapacity = "1KiB"\nsymbol = "F"\n' \
            'latency = 0\nbandwidth = "1GB/s"\n'
    text = edited("[compute]\n", extra + "\n[compute]\n")
    message = load_error(tmp_path, text)
    assert "memory 'far': level: memories are listed outermost first" in message


def test_memory_at_an_outer_level_may_follow_the_root(tmp_path: Path) -> None:
    """A second memory at the root level (a shared L3) is fine: levels only may not go back."""
    text = edited('name = "local"\nlevel = "unit"', 'name = "local"\nlevel = "top"')
    hw = load_hardware(write_model(tmp_path, text))
    assert hw.memory("local").level == "top" and hw.memory("local").shared_by == "top"


def test_root_level_must_have_no_symbol(tmp_path: Path) -> None:
    message = load_error(tmp_path, edited('name = "top"', 'name = "top"\nsymbol = "X"'))
    assert "level 'top': symbol:" in message


def test_level_entry_without_name_is_reported_by_position(tmp_path: Path) -> None:
    message = load_error(tmp_path, edited('name = "unit"\n', ""))
    assert "level #2: missing required key 'name'" in message


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a file"):
        load_hardware(str(tmp_path))


# ------------------------------------------------------------------------------------------
# Overrides


def test_a_reservation_that_leaves_nothing_usable_loads() -> None:
    """Capacity <= reserved is a what-if, not bad input: the capacity constraints then make
    the request infeasible, with an explanation (tests/test_groups.py)."""
    hw = load_hardware("upmem", ["wram.capacity=4"])
    assert hw.memory("wram").usable == 4 - 2048
    assert load_hardware("upmem", ["wram.capacity=0"]).memory("wram").capacity == 0


def test_override_capacity() -> None:
    base = load_hardware("upmem")
    hw = load_hardware("upmem", ["wram.capacity=32KiB"])
    assert base.memory("wram").capacity == 65536
    assert hw.memory("wram").capacity == 32768
    assert hw.memory("mram") == base.memory("mram")


def test_override_count_range_and_fixed() -> None:
    assert load_hardware("upmem", ["tasklet.count=1..4"]).level("tasklet").count_max == 4
    fixed = load_hardware("upmem", ["tasklet.count=12"]).level("tasklet")
    assert (fixed.count_min, fixed.count_max) == (12, 12)


def test_override_adds_optional_key() -> None:
    hw = load_hardware("upmem", ["mram.transfer.max=1KiB"])
    assert hw.memory("mram").rules.max_bytes == 1024
    assert hw.memory("mram").rules.align == 8  # the rest of the table is kept


def test_override_clock_rescales_cycle_units() -> None:
    hw = load_hardware("upmem", ["compute.clock=400MHz"])
    assert hw.compute.cycle_ps == 2500
    assert hw.memory("wram").latency_ps == 192_500  # 77 cycles at 400 MHz
    assert hw.memory("wram").ps_per_byte == 1250  # 2 B/cycle at 400 MHz


def test_override_cycles_and_launch() -> None:
    hw = load_hardware("upmem", ["compute.cycles.f32.exp=2000", "compute.cycles.f32.add=12.5",
                                 "host.launch=1ms"])
    assert hw.compute.cycles["f32"]["exp"] == 2000
    assert hw.compute.cycles["f32"]["add"] == 12.5
    assert hw.launch_ps == 10**9
    assert load_hardware("upmem", ["launch=5us"]).launch_ps == 5_000_000


def test_overrides_apply_in_order() -> None:
    hw = load_hardware("upmem", ["wram.reserved=1KiB", "wram.reserved=4KiB"])
    assert hw.memory("wram").reserved == 4096


def test_override_capacity_beats_detection(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sysfs(tmp_path)
    monkeypatch.setattr(hwunits, "CACHE_DIR", tmp_path)
    hw = load_hardware("cpu", ["l2.capacity=256KiB"])
    assert hw.memory("l2").capacity == 256 * 1024
    assert hw.memory("l1").capacity == 48 * 1024  # still detected


@pytest.mark.parametrize(("key", "suggestion"), [
    ("wram.capcity", "wram.capacity"), ("tasklets.count", "tasklet.count"),
    ("mram.transfer.maxx", "mram.transfer.max"), ("compute.clok", "compute.clock"),
])
def test_override_unknown_key_suggests(key: str, suggestion: str) -> None:
    with pytest.raises(InputError) as info:
        load_hardware("upmem", [f"{key}=1"])
    message = str(info.value)
    assert f"unknown key {key!r}" in message
    assert suggestion in message


def test_override_root_level_has_no_count() -> None:
    with pytest.raises(InputError, match="unknown key 'host.count'"):
        load_hardware("upmem", ["host.count=2"])


def test_override_far_off_key_lists_examples() -> None:
    with pytest.raises(InputError) as info:
        load_hardware("upmem", ["zzz=1"])
    message = str(info.value)
    assert "a level (rank, dpu, tasklet) with symbol|count|issue_share" in message
    assert "a memory (host, mram, wram) with level|" in message
    assert "|capacity|" in message and "transfer.max" in message


def test_override_value_is_validated() -> None:
    with pytest.raises(InputError, match="memory 'mram': transfer: max:"):
        load_hardware("upmem", ["mram.transfer.max=4B"])  # below min 8B
    with pytest.raises(InputError, match="level 'tasklet': count:"):
        load_hardware("upmem", ["tasklet.count=0"])


def test_override_ambiguous_key(tmp_path: Path) -> None:
    text = edited('name = "local"', 'name = "unit"')
    message = load_error(tmp_path, text, ("unit.symbol=X",))
    assert "'unit.symbol' is ambiguous" in message


def test_override_into_a_non_table(tmp_path: Path) -> None:
    text = edited('transfer = { min = "4B", max = "256B", multiple = "4B", align = "4B" }',
                  "transfer = 3")
    message = load_error(tmp_path, text, ("local.transfer.max=8B",))
    assert "--hw-set local.transfer.max: 'transfer' is not a table" in message


def test_override_malformed() -> None:
    with pytest.raises(InputError, match="KEY=VALUE"):
        load_hardware("upmem", ["wram.capacity"])


# ---------------------------------------------------------------- issue 13: new keys

_PUSH_MODEL = (Path(__file__).parent / "data" / "pushy.toml").read_text()


def test_push_and_blocking_keys(tmp_path: Path) -> None:
    path = tmp_path / "pushy.toml"
    path.write_text(_PUSH_MODEL)
    hw = load_hardware(str(path))
    bank, local = hw.memory("bank"), hw.memory("local")
    assert bank.push is not None and bank.push.level == "group"
    assert bank.push.into.one_ps_per_byte == 1000 and bank.push.into.full_ps_per_byte == 125
    assert bank.push.out.full_ps_per_byte == bank.push.out.one_ps_per_byte == 2000  # default
    assert (bank.push.out.latency_ps, bank.push.out.per_unit_ps) == (10**6, 2 * 10**6)
    assert bank.push.cap_ps_per_byte == 250 and bank.latency_ps == 0  # no latency needed
    assert (local.latency_ps, local.store_latency_ps, local.issue_ps) == (10_000, 6000, 3000)
    assert local.blocking and not bank.blocking
    assert (hw.launch_level, hw.launch_per_unit_ps) == ("unit", 100_000)
    assert hw.level("unit").barrier_per_unit_ps == 10**6
    over = load_hardware(str(path), ["bank.push.in.full=2GB/s", "local.issue=5cycles",
                                     "launch_per_unit.time=1us", "unit.barrier_per_unit=0"])
    assert over.memory("bank").push.into.full_ps_per_byte == 500  # type: ignore[union-attr]
    assert over.memory("local").issue_ps == 5000 and over.launch_per_unit_ps == 10**6
    assert over.level("unit").barrier_per_unit_ps == 0


@pytest.mark.parametrize(("old", "new", "messages"), [
    ('full = "8GB/s"', 'full = "0.5GB/s"', ["push: in: full:", "at least one's"]),
    ('level = "group", cap', 'level = "host", cap', ["push: level:", "below the root"]),
    ('level = "group", cap', 'level = "nowhere", cap', ["push: level:", "unknown level"]),
    ('per_unit = "2us"', 'per_units = "2us"', ["push: out: unknown key 'per_units'"]),
    ('in = { one', 'inn = { one', ["push: unknown key 'inn'"]),
    ('blocking = true', 'blocking = "yes"', ["memory 'local': blocking: expected true or false"]),
    ('level = "unit", time', 'level = "host", time', ["launch_per_unit: level:", "below the root"]),
    ('symbol = "L"\n', 'symbol = "L"\npush = { level = "unit", in = { one = "1GB/s" }, '
     'out = { one = "1GB/s" } }\n', ["memory 'local': push:", "only the memory after it"]),
])
def test_push_and_blocking_errors(tmp_path: Path, old: str, new: str,
                                  messages: list[str]) -> None:
    assert old in _PUSH_MODEL
    path = tmp_path / "bad.toml"
    path.write_text(_PUSH_MODEL.replace(old, new, 1))
    with pytest.raises(InputError) as info:
        load_hardware(str(path))
    for message in messages:
        assert message in str(info.value)
