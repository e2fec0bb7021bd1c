"""`cozygpu run`'s flags come from the settings model, their one source (issue 35 item 8): every setting a flag may
set has one, named after it, with its type, description, default and environment variable in its help; a flag
given wins over the environment, a flag not given leaves it."""

from __future__ import annotations

import argparse

from cozygpu import cli
from cozygpu.settings import Settings


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    run: argparse.ArgumentParser = sub.choices["run"]
    return run


def test_every_setting_has_a_flag_with_its_default_and_variable_in_the_help() -> None:
    """A setting added to the model is a flag at once; its help says its default and its COZYGPU_ variable."""
    flags = {a.dest: a for a in _run_parser()._actions}
    for name, field in Settings.model_fields.items():
        if name in {"log_format", "log_level"}:  # the main parser's, before the command
            assert name in {a.dest for a in cli.parser()._actions}
            continue
        if name == "exempt_namespaces":  # built by the repeatable --exempt-namespace
            assert "exempt_namespace" in flags
            continue
        assert name in flags, name
        if flags[name].help != argparse.SUPPRESS:
            assert f"COZYGPU_{name.upper()}" in (flags[name].help or ""), name
            assert (field.description or "") in (flags[name].help or ""), name


def _settings(argv: list[str], env: dict[str, str]) -> Settings:
    """What `cozygpu run` would run with, short of running."""
    args = cli.parser().parse_args(["run", *argv])
    return cli.settings_of(args, env, args.kubeconfig)


def test_a_flag_given_wins_over_the_environment_and_one_not_given_leaves_it() -> None:
    """Typed as the model says (a float, an int, a choice, a boolean with its --no- form)."""
    env = {"COZYGPU_BIND_TIMEOUT": "5", "COZYGPU_MAX_IDLE_MOVES": "7", "COZYGPU_METRICS_AUTH": "false"}
    flags = ["--bind-timeout", "2.5", "--api-concurrency", "16", "--webhook-mode", "off", "--no-leader-election"]
    settings = _settings(flags, env)
    assert (settings.bind_timeout, settings.api_concurrency, settings.webhook_mode) == (2.5, 16, "off")
    assert settings.leader_election is False and settings.metrics_auth is False and settings.max_idle_moves == 7
    assert _settings(["--metrics-auth", "--no-webhooks"], env).metrics_auth is True
    assert _settings(["--no-webhooks"], env).webhook_mode == "off"
    assert _settings(
        ["--exempt-namespace", "lab", "--exempt-namespace", "ci", "--no-webhooks"], {}
    ).exempt_namespaces == (
        "lab",
        "ci",
    )
