"""``rollout.tools`` and ``rollout.max_tool_calls``: bad values and a missing sandbox are one clear error each, at
config time, before any model loads."""

from __future__ import annotations

import pytest

from coevolve.config import ConfigError, check_runtime
from coevolve.recipes import resolve


@pytest.mark.parametrize(("setting", "key"), [("rollout.tools=[shell]", "rollout.tools"),
                                              ("rollout.max_tool_calls=-1", "rollout.max_tool_calls")])
def test_bad_tool_settings_name_their_key(setting, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve("grpo", sets=[setting])


def test_no_tools_is_the_default_and_python_is_accepted():
    config, _, _ = resolve("grpo")
    assert config.rollout.tools == [] and config.rollout.max_tool_calls == 4
    config, _, _ = resolve("grpo", sets=["rollout.tools=[python]", "rollout.max_tool_calls=0"])
    assert config.rollout.tools == ["python"] and config.rollout.max_tool_calls == 0


def test_a_missing_sandbox_is_one_error_at_the_runtime_check(monkeypatch):
    import coevolve.execution

    config, _, _ = resolve("grpo", sets=["rollout.tools=[python]"])
    monkeypatch.setattr(coevolve.execution, "sandbox_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(ConfigError, match=r"config key 'rollout\.tools'.*bubblewrap \(bwrap\) is not installed"):
        check_runtime(config)
    check_runtime(resolve("grpo")[0])  # without tools the sandbox is never asked
