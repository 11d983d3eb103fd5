"""Sweeps fail fast: every job's settings are checked before any job launches, the GPT-2 XL dry run composes on a
CPU as docs/models.md writes it, and an unreachable hub is found once, in one line naming the offline pairs."""

from __future__ import annotations

import shlex
import socket

import huggingface_hub.constants
import pytest
from conftest import REPO, tiny_overrides
from test_experiments import compose_run, main

from experiments.common import config_checks
from experiments import run as run_app
from experiments.common.config_checks import ConfigError


def config_errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("config error")]


def test_a_setting_that_fails_in_every_job_stops_the_sweep_in_one_line(tiny, tmp_path, monkeypatch, capsys, loads):
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info:
        main(["-m", "draft_length.k=1,2", "strategy=greedy,speculative",
              *tiny_overrides(tiny, max_new_tokens=500), f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    [line] = config_errors(capsys)
    assert exit_info.value.code == 2 and not sweep_dir.exists() and loads["pair"] == 0
    assert line.startswith("config error: max_new_tokens=500 is not allowed: the pair attends over 128 positions")
    assert line.endswith("(every one of the sweep's 4 jobs; none was launched)")


def test_a_setting_that_fails_in_some_jobs_names_the_first_and_launches_none(tiny, tmp_path, monkeypatch, capsys):
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info:
        main(["-m", "draft_length.k=2,200,300", *tiny_overrides(tiny), f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    [line] = config_errors(capsys)
    assert exit_info.value.code == 2 and not sweep_dir.exists()
    assert line.startswith("config error: job 1 (draft_length.k=200): draft_length: drafts of up to 200 tokens")
    assert line.endswith("(2 of the sweep's 3 jobs fail; none was launched)")


def test_a_sweep_whose_every_job_would_be_skipped_stops(tiny, tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["-m", "strategy=greedy", "sampling=t1,t07", *tiny_overrides(tiny),
              f"hydra.sweep.dir={tmp_path / 'sweep'}"], monkeypatch)
    [line] = config_errors(capsys)
    assert exit_info.value.code == 2 and "every one of the sweep's 2 jobs would be skipped (strategy=greedy" in line


def dry_run_command() -> list[str]:
    """The GPT-2 XL dry run as docs/models.md writes it, as arguments."""
    text = (REPO / "docs" / "models.md").read_text()
    [line] = [line.strip() for line in text.splitlines() if "experiment=gpt2_xl_study pair=gpt2-xl-shaped" in line]
    return shlex.split(line)[3:]


@pytest.mark.slow
def test_the_gpt2_xl_dry_run_as_documented_passes_every_jobs_check_on_a_cpu(tmp_path, monkeypatch):
    """Every job of the documented dry run is checked (a CPU machine: the preset's device=cuda would fail them all)
    and launched; the jobs themselves are replaced by a recorder here (each would build GPT-2 XL's shapes)."""
    launched = []
    monkeypatch.setattr(run_app, "run", lambda cfg, job: launched.append((cfg.device, cfg.pair.preset)))
    monkeypatch.setattr("experiments.common.callbacks.write_report", lambda sweep_dir: None)
    command = dry_run_command()
    assert "device=cpu" in command
    main([*command, f"hydra.sweep.dir={tmp_path / 'sweep'}", "logger=none"], monkeypatch)
    assert len(launched) == 2 * 8 and set(launched) == {("cpu", "gpt2-xl-shaped")}


@pytest.fixture
def hub(monkeypatch):
    """An unreachable hub: every connection fails at once, and is counted. The probe's memory and the process's
    offline mode are restored afterwards."""
    attempts = []

    def refuse(address, timeout=None, **kwargs):
        attempts.append((address, timeout))
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    config_checks.hub_unreachable.cache_clear()
    yield attempts
    config_checks.hub_unreachable.cache_clear()


def test_an_unreachable_hub_is_found_once_and_named_in_one_line(hub, tmp_path, loads):
    for pair in ("gpt2-xl", "gpt2-medium"):
        cfg, job = compose_run([f"pair={pair}", "device=cpu", "num_prompts=1"], tmp_path / pair)
        with pytest.raises(ConfigError) as error:
            config_checks.validate(cfg)
        message = str(error.value)
        assert message.startswith(f"pair={pair}: the Hugging Face hub cannot be reached (huggingface.co:443: Name or "
                                  "service not known) and the pair is not in the local cache")
        assert message.endswith("pairs that load offline: embedded, gpt2-xl-shaped, gpt2-large-shaped, "
                                "gpt2-medium-shaped") and "\n" not in message
    assert hub == [(("huggingface.co", 443), config_checks.HUB_PROBE_SECONDS)]  # once, for both pairs
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True and loads["pair"] == 0


def test_pairs_that_need_no_hub_never_probe_it(hub, tiny, tmp_path):
    for overrides in (["pair=embedded"], ["pair=gpt2-xl-shaped"], tiny_overrides(tiny)):
        cfg, _ = compose_run([*overrides, "device=cpu", "num_prompts=1"], tmp_path / "run")
        config_checks.validate(cfg)
    assert hub == []
