"""core.models.hub: a hub model that is not cached, and no network, fail fast with the fix."""

import pytest

import core.models.loading as loading
from core.models import BUNDLED_MODEL, ModelLoadError, load_model


def test_error_hub_offline_not_cached():
    with pytest.raises(ModelLoadError) as err:
        load_model("no-such-org/no-such-model", device="cpu")
    msg = str(err.value)
    assert "'no-such-org/no-such-model' is not in the local Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE is set" in msg and "local model folder" in msg and BUNDLED_MODEL in msg


def test_error_hub_no_network(monkeypatch):
    """Without network the hub is not retried for long: the local cache is used or the load fails fast."""
    monkeypatch.setattr(loading, "hub_offline", lambda: False)
    monkeypatch.setattr(loading, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(ModelLoadError, match="no network connection to huggingface.co"):
        load_model("no-such-org/no-such-model", device="cpu")
