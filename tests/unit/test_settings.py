"""Settings (§10): validated, flags over environment over defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cozygpu.settings import Settings


def test_defaults_follow_the_design() -> None:
    """§3: bind timeout 10 s, webhook timeout 20 s; §6.3: grace period 2 minutes."""
    s = Settings()
    assert (s.bind_timeout, s.webhook_timeout, s.grace_period) == (10.0, 20.0, 120.0)


def test_flags_override_environment() -> None:
    """COZYGPU_* variables are read; a flag given wins; a flag not given (None) does not."""
    s = Settings.load(
        {"COZYGPU_GRACE_PERIOD": "30", "COZYGPU_BIND_TIMEOUT": "5"}, {"bind_timeout": 7, "grace_period": None}
    )
    assert (s.grace_period, s.bind_timeout) == (30.0, 7.0)


def test_bind_timeout_must_be_shorter_than_the_webhook_timeout() -> None:
    """§3: bind timeout < webhook timeout <= 30 s, else the tenant never sees the refusal."""
    with pytest.raises(ValidationError, match="bind_timeout"):
        Settings(bind_timeout=20, webhook_timeout=20)
    with pytest.raises(ValidationError, match="webhook_timeout"):
        Settings(webhook_timeout=31)


def test_settings_are_frozen() -> None:
    """No module can change settings behind another's back."""
    s = Settings()
    with pytest.raises(ValidationError):
        s.bind_timeout = 1  # type: ignore[misc]
