"""core.models.sources: classifying a source string; a missing path is refused before anything loads."""

import pytest

from core.models import BUNDLED_MODEL, ModelLoadError, load_model, resolve_source


def test_resolve_source(tmp_path, tiny_folder):
    folder, _ = tiny_folder
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_source(BUNDLED_MODEL).kind == "bundled"
    assert resolve_source("SmolLM2-135M-Instruct").kind == "bundled"
    assert resolve_source(str(folder)).kind == "folder"
    assert resolve_source(str(gguf)).kind == "gguf"
    hub = resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hub.kind == "hub" and hub.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("path", ["./no/such/folder", "/no/such/model.gguf", "~/no-such-dir/x/y"])
def test_error_local_path_missing(path):
    with pytest.raises(ModelLoadError, match=r"model path .* does not exist; check the path"):
        load_model(path)
