"""The reference pages stay true: every `.syn` example in docs/language.md parses, every
error example gives the message shown; the example model in docs/hardware.md loads, and
every key the loader accepts is documented there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from synth import hwfile
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.lang import parse_workload

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^```(?P<tag>[\w-]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(page: str) -> list[tuple[str, str]]:
    """(tag, body) of every fenced block of a page, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [(m.group("tag"), m.group("body")) for m in FENCE.finditer(text)]


def test_language_examples_parse() -> None:
    examples = [body for tag, body in blocks("language.md") if tag == "syn"]
    assert examples
    for body in examples:
        parse_workload(body, "example.syn", "example")


def error_examples() -> list[tuple[str, str]]:
    found = blocks("language.md")
    pairs = [(body, found[k + 1][1].strip()) for k, (tag, body) in enumerate(found)
             if tag == "syn-error"]
    assert all(found[k + 1][0] == "text" for k, (tag, _) in enumerate(found)
               if tag == "syn-error")
    return pairs


@pytest.mark.parametrize(("source", "message"), error_examples())
def test_language_error_examples(source: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_workload(source, "example.syn", "example")
    assert str(info.value).splitlines()[0] == message


def test_hardware_example_loads(tmp_path: Path) -> None:
    models = [body for tag, body in blocks("hardware.md") if tag == "toml"]
    assert models
    path = tmp_path / "example.toml"
    path.write_text(models[0], encoding="utf-8")
    hw = load_hardware(str(path))
    assert [lv.name for lv in hw.levels] and [m.name for m in hw.memories]


def test_every_hardware_key_is_documented() -> None:
    text = (DOCS / "hardware.md").read_text(encoding="utf-8")
    keys = {*hwfile._TOP_KEYS, *hwfile._LEVEL_KEYS, *hwfile._MEMORY_KEYS,
            *hwfile._TRANSFER_KEYS, *hwfile._COMPUTE_KEYS, *hwfile._INTRINSIC_KEYS}
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, missing
    for symbol in hwfile.RESERVED_SYMBOLS:
        assert f"`{symbol}`" in text


def test_builtin_models_point_to_the_reference() -> None:
    for name in hwfile.list_builtin_hardware():
        head = (hwfile._builtin_dir() / f"{name}.toml").read_text(encoding="utf-8")[:2000]
        assert "docs/hardware.md" in head, name
