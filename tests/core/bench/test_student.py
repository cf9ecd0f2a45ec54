"""The student of a benchmark: a converted copy of the teacher or a converted run's student."""

import pytest

from core.bench import BenchConfig, convert_teacher
from tests.tiny_models import tiny_model


def test_student_checkpoint_is_loaded_from_a_run(tmp_path):
    from core.train.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="does not exist"):
        convert_teacher(tiny_model("llama"), BenchConfig(student_checkpoint=str(tmp_path / "no-such-run")))
