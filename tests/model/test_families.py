"""The checkpoint-family registry: every family has the members of `Family`, checked when the registry is imported,
so a second family that lacks one fails at import (naming it and what it lacks), not at run time."""

from __future__ import annotations

import ast
import importlib
import types

import pytest
from conftest import ROOT

from ttsengine.model import families
from ttsengine.model.families import s1
from ttsengine.model.families.family import MEMBERS, Family, GenerationRules, check


def test_s1_is_a_family():
    assert isinstance(s1, Family)
    assert check(s1) is s1
    assert families.FAMILIES == (s1,)
    assert s1.RULES == GenerationRules(  # the values S1 always had (spec §6; upstream's request model)
        penalty_window=16, prompt_reserve=2048, temperature_range=(0.1, 1.0), top_p_range=(0.1, 1.0),
        repetition_penalty_range=(0.9, 2.0), default_temperature=0.8, default_top_p=0.8,
        default_repetition_penalty=1.1, default_max_new_tokens=1024)


def _family_without(*names: str, **replaced) -> types.ModuleType:
    module = types.ModuleType("ttsengine.model.families.s2")
    for name in set(MEMBERS) - set(names):
        setattr(module, name, replaced.get(name, "s2" if name == "NAME" else getattr(s1, name)))
    return module


def test_a_family_lacking_members_fails_naming_them():
    with pytest.raises(TypeError) as e:
        check(_family_without("build_prefix", "RULES", matches="dual_ar"))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("checkpoint family 's2' (ttsengine.model.families.s2) lacks "
                              "RULES, build_prefix, matches (not callable) ")
    assert not isinstance(_family_without("build_prefix"), Family)
    with pytest.raises(TypeError, match=r"^checkpoint family ttsengine\.model\.families\.s2 lacks NAME "):
        check(_family_without("NAME"))


def test_the_registry_checks_each_family_at_import(monkeypatch):
    monkeypatch.delattr(s1, "normalize_codec_keys")
    try:
        with pytest.raises(TypeError, match=r"^checkpoint family 's1' \(ttsengine\.model\.families\.s1\) lacks "
                                            r"normalize_codec_keys \("):
            importlib.reload(families)
    finally:
        monkeypatch.undo()
        importlib.reload(families)
    assert families.FAMILIES == (s1,)


def test_family_declares_every_member_the_core_reaches():
    """`x.family.NAME`, `family.load_config(...)`: every member read through a family anywhere in the core is one
    of Family's, so the import-time check covers what the run time needs."""
    used = set()
    for path in (ROOT / "container" / "ttsengine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id == "family") or (
                        isinstance(owner, ast.Attribute) and owner.attr == "family"):
                    used.add(node.attr)
    assert {"NAME", "RULES", "build_prompt", "normalize_model_keys"} <= used  # the walk sees the uses
    assert used <= set(MEMBERS), used - set(MEMBERS)
