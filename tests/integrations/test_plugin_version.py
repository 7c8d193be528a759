"""The plugin checks vLLM's version before it installs anything, and fails open."""

import logging
import sys
import types

import pytest

from tabletune.integrations.vllm import plugin


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(plugin, "_registered", False)
    installed = []
    monkeypatch.setattr(plugin.importlib, "import_module",
                        lambda name: types.SimpleNamespace(install=lambda: installed.append(name)))
    return installed


def fake_vllm(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))


def test_a_vllm_without_per_batch_tables_gets_no_feature(fresh, monkeypatch, caplog):
    fake_vllm(monkeypatch, "0.23.0")
    with caplog.at_level(logging.WARNING, logger="tabletune.plugin"):
        plugin.register()
    assert fresh == []
    assert "plugin off" in caplog.text and "0.24.0 or later" in caplog.text


def test_outside_the_tested_range_it_warns_and_installs(fresh, monkeypatch, caplog):
    fake_vllm(monkeypatch, "0.40.0")
    with caplog.at_level(logging.WARNING, logger="tabletune.plugin"):
        plugin.register()
    assert fresh == list(plugin.FEATURES)
    assert "outside the tested range" in caplog.text


def test_in_range_it_installs_quietly(fresh, monkeypatch, caplog):
    fake_vllm(monkeypatch, "0.26.0")
    with caplog.at_level(logging.WARNING, logger="tabletune.plugin"):
        plugin.register()
    assert fresh == list(plugin.FEATURES) and caplog.text == ""
