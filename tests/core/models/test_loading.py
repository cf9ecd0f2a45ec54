"""core.models.loading: a local folder loads exactly as saved; bad dtype and device are refused."""

import pytest
import torch

from core.models import ModelLoadError, load_model, max_positions


def test_load_folder_matches_saved_model(tiny_folder):
    folder, original = tiny_folder
    model, tokenizer = load_model(str(folder), device="cpu")
    ids = torch.tensor([[1, 5, 9, 200, 17]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=0)
    assert tokenizer.eos_token == "</s>" and not model.training
    assert max_positions(model) == 256 and max_positions(model.config.to_dict()) == 256


def test_load_folder_dtype(tiny_folder):
    model, _ = load_model(str(tiny_folder[0]), dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_error_bad_dtype_and_device(tiny_folder):
    with pytest.raises(ModelLoadError, match="dtype must be one of float32, bfloat16, float16, got 'int8'"):
        load_model(str(tiny_folder[0]), dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU is visible; use device='cpu'"):
            load_model(str(tiny_folder[0]), device="cuda")


@pytest.mark.gpu
def test_load_folder_on_cuda(tiny_folder):
    model, _ = load_model(str(tiny_folder[0]), device="cuda")
    assert {p.device.type for p in model.parameters()} == {"cuda"}
