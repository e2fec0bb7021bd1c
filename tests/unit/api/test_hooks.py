"""One table of webhook targets (api.hooks): the configurations and the no-bypass policy derive from it."""

from __future__ import annotations

from cozygpu.api import hooks
from cozygpu.api.names import LABEL_GUARD_PROBE
from cozygpu.runtime.admission import policy, webhooks


def test_each_hook_is_registered_once_at_its_path_for_its_kind_and_operations() -> None:
    """§3, §9, §12: the dev registration names every hook of the table, nothing more, with the table's rule."""
    mutating, validating = webhooks.configurations("https://op", b"ca", 20, "system:serviceaccount:x:op")
    served = {
        w["clientConfig"]["url"].removeprefix("https://op/"): (config["kind"], w["rules"])
        for config in (mutating, validating)
        for w in config["webhooks"]
    }
    assert served == {
        hook.id: (
            "MutatingWebhookConfiguration" if hook.mutating else "ValidatingWebhookConfiguration",
            [{**hook.rule(), "scope": "*"}],
        )
        for hook in hooks.HOOKS
    }
    assert {hook.id for hook in hooks.HOOKS} == webhooks.HOOKS


def test_the_no_bypass_policy_guards_what_the_vmi_and_pod_hooks_admit() -> None:
    """§12.3: the policy matches exactly the VMI and pod creates the mutating hooks see, by the same rules, and pod
    updates, which no hook sees (a GPU-holding pod's guest may not be relabelled away, issue 34 item 1), and the
    guard's probes, ConfigMaps with its label only."""
    spec = policy.policy("system:serviceaccount:kubevirt:kubevirt-controller")["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [
        hooks.VMI.rule(),
        hooks.POD.rule(),
        {**hooks.POD.rule(), "operations": ["UPDATE"]},
        policy.CONFIGMAPS_CREATE,
    ]
    [probes_only] = spec["matchConditions"]
    assert LABEL_GUARD_PROBE in probes_only["expression"]
    assert [h.kind.plural for h in hooks.HOOKS if h.mutating] == ["virtualmachineinstances", "pods"]
